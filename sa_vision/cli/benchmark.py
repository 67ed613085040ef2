""" Throughput / memory / MAC benchmark for the sa_vision models (in the spirit of timm's benchmark.py)

Examples
  sa-vision-benchmark --model sa_quadratic_cifar -b 32 --compare paper,dense --matmul-peak
  sa-vision-benchmark --model sa_quadratic_cifar sa_learned_cifar --results-format csv
  sa-vision-benchmark --model sa_quadratic_cifar --model-kwargs embed_dim=16 depth=1 -b 2
  sa-vision-benchmark --model sa_quadratic_cifar --reproduce-profile cpu --compare resnet18_cifar -b 100 --amp
  sa-vision-benchmark --model sa_quadratic_cifar --reproduce-profile cpu --compare vit_peer,convit_peer -b 50

With --compare, each model is timed alternately (A, B, A, B, ...) in one process against the named
variants; the ratio model / variant of every round (the two ran back to back) and their median are
reported: those ratios are the speed figures we quote. 'dense' runs the same weights through the plain
dense formula (sa_vision.layers.dense_attention), 'separable' by the separable factors (the CPU's default; on
CUDA, where dense is the default, the alternative); 'batched' the same weights on the batched-heads path
(sa_vision.layers.batched_heads: the path GPUs, autocast and torch.compile take by themselves); 'fused' the same
weights with attention and Value in one Triton kernel (sa_vision.layers.fused_mix_and_project; a CUDA device, or
TRITON_INTERPRET=1 on the CPU); 'projfirst' the same weights dense and projected first (dense_attention and
sa_vision.layers.project_first: the Value per head, then one mixing GEMM; batched steps only); 'paper' runs the
same weights through the paper's dense formulation (sa_vision.research.paper_reference, part of the package);
'vit_peer' and 'convit_peer' are timm's VisionTransformer and ConVit at patch 2 (a grid like ours) and about the
narrow SA models' parameters, built for --img-size (sa_vision.measure.peers).
--model also takes weights, as timm's benchmark.py takes local-dir:<folder> (an export) or a checkpoint file:
measured at their own input size (28 for a kept Fashion-MNIST export, which pads it itself) unless told; a
registered model at its pretrained config's (224 for timm's ImageNet ViT), as timm's benchmark.py measures it.
Columns named as timm's benchmark.py names them count in other units: param_count is the raw parameter
count (timm's: millions), macs the raw MACs of one image's forward (timm's infer_gmacs: GMACs); --amp
autocasts to --amp-dtype bfloat16 by default (timm's: float16). See docs/performance.md, 'What is measured'.
All measuring code lives in sa_vision.measure.benchmark; this file is the command line only.
"""
import argparse
import sys
from pathlib import Path

import torch

from sa_vision.errors import UserError, command
from sa_vision.io import atomic_write_text, file_problem
from sa_vision.layers.triton_mixing import kernel_problem
from sa_vision.measure import RESULTS_FORMATS, format_results
from sa_vision.measure import benchmark as sab
from sa_vision.measure.peers import is_peer
from sa_vision.models import DEFAULT_MODEL, MODEL_NAMES
from sa_vision.models.factory import create_named_model
from sa_vision.train.arg_groups import ModelKwargs
from sa_vision.train.arg_values import check_compile_backend, check_value_bounds
from sa_vision.train.caller_settings import caller_settings_kept
from sa_vision.train.checkpoint import weights_path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description='sa_vision benchmark', formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    p.add_argument('--model', '-m', nargs='+', default=[DEFAULT_MODEL], help='model name(s), or weights')
    p.add_argument('--model-list', default='', help='text file with one model name per line')
    p.add_argument('--model-kwargs', nargs='*', default={}, action=ModelKwargs,
                   help='extra model arguments, e.g. embed_dim=16 depth=1 heads_per_layer=2')
    p.add_argument('--bench', default='both', choices=('both', 'train', 'inference'))
    p.add_argument('--batch-size', '-b', type=int, default=32)
    p.add_argument('--img-size', type=int, default=None, help="square input size (default: the model's own, else 32)")
    p.add_argument('--input-size', type=int, nargs=3, default=None, metavar='N', help='C H W')
    p.add_argument('--num-classes', type=int, default=None)
    p.add_argument('--device', default='auto', help='auto (cuda if available, else cpu), cpu, cuda, cuda:1')
    p.add_argument('--threads', type=int, default=None, help='torch.set_num_threads (default: torch default)')
    p.add_argument('--flush-denormal', action='store_true',
                   help='torch.set_flush_denormal(True) for the whole run (x86 FTZ/DAZ): subnormal floats count '
                        'as zero, so formulations that compute with them (the paper\'s far Gaussian '
                        'probabilities) no longer pay the slow microcode path; see docs/performance.md')
    p.add_argument('--amp', action='store_true', help='mixed precision autocast')
    p.add_argument('--amp-dtype', default='bfloat16', choices=('bfloat16', 'float16'))
    p.add_argument('--precision', default='float32', choices=('float32', 'float16', 'bfloat16'),
                   help='model and input dtype (without --amp)')
    p.add_argument('--channels-last', action='store_true')
    p.add_argument('--torchcompile', nargs='?', const='inductor', default=None, metavar='BACKEND',
                   help='torch.compile the models (default backend inductor)')
    p.add_argument('--fuse', action='store_true', help='time inference on model.fuse()d copies of it and its switches')
    p.add_argument('--num-warm-iter', type=int, default=1, help='plain warm-up steps per variant and kind')
    p.add_argument('--num-bench-iter', type=int, default=1, help='steps per timed run')
    p.add_argument('--runs', type=int, default=3,
                   help='timed runs per variant; medians are reported (0: no timing, e.g. with --profile)')
    p.add_argument('--no-memory', action='store_true', help='skip the peak-memory step (compiled steps skip it)')
    p.add_argument('--compare', default='',
                   help='comma list to time against: the switches dense, separable, batched, fused (Triton) '
                        'and projfirst (dense, projected first), each refused where it changes no layer\'s path (a '
                        'model without its layers; the device\'s own form: dense on CUDA, separable on the CPU, '
                        'batched on a GPU, under --amp, in bf16 or compiled; projfirst unbatched); paper, a '
                        'peer (vit_peer, convit_peer: timm\'s ViT / ConViT at the narrow SA size, patch 2, for the '
                        'input size; sa_vision.measure.peers) or a model name (e.g. resnet18_cifar; built with the '
                        '--reproduce-profile arguments, not --model-kwargs)')
    p.add_argument('--reproduce-profile', default='', metavar='NAME',
                   help='build every model (and compared model) as this profile of sa_vision.reproduce builds it, '
                        'e.g. cpu: the narrow SA models, the ResNet18 with halved stages; --model-kwargs update it')
    p.add_argument('--retain-freed-memory', action='store_true',
                   help='keep freed memory in the process (glibc mallopt) instead of page-faulting the step\'s '
                        'large tensors in again every step, as sa-vision-train does on the CPU '
                        '(sa_vision.train.runtime.retain_freed_memory)')
    p.add_argument('--matmul-peak', action='store_true',
                   help='time the torch.mm rate (GFLOP/s) in every round, alternately with the models, in the dtype '
                        'the models compute in (the --amp-dtype with --amp, else --precision), and report training '
                        'throughput (3x forward unavoidable MACs, matmul_fraction) and inference throughput '
                        '(forward unavoidable MACs, infer_matmul_fraction) as fractions of it')
    p.add_argument('--matmul-size', type=int, default=2048)
    p.add_argument('--profile', action='store_true',
                   help='print a torch.profiler table of one training step per model as configured (device, '
                        'precision, --amp, --channels-last, --torchcompile): top ops by self device time on CUDA, '
                        'by self CPU time on the CPU')
    p.add_argument('--results-file', default='', help='write results here (its folder is made), .csv/.json as named')
    p.add_argument('--results-format', choices=RESULTS_FORMATS, help='table (default), csv or json; wins over a suffix')
    p.add_argument('--quiet', action='store_true')
    return p


def _check_args(args, compare, device) -> None:
    """Refuse what would fail only after models were built or timed (the timings would be lost)."""
    check_value_bounds(args)
    check_compile_backend(args.torchcompile)
    if args.torchcompile == 'auto':  # sa-vision-train's choice for a run: here both sides are the measurement
        raise UserError('--torchcompile auto chooses for a training run (sa-vision-train); here name the backend to '
                        'time (--torchcompile, inductor) and compare with a run without it')
    if args.input_size and min(args.input_size) < 1:
        raise UserError(f'--input-size {" ".join(map(str, args.input_size))}: channels, height and width are at '
                        f'least 1')
    if args.amp and args.precision != 'float32':  # autocast of a half-precision model fails in its first layer
        raise UserError(f'--amp autocasts a float32 model to --amp-dtype; --precision {args.precision} makes the '
                        f'model {args.precision} itself: pass one of them')
    problem = args.results_file and file_problem(args.results_file)
    if problem:
        raise UserError(f'--results-file {args.results_file}: {problem}')
    if args.reproduce_profile:
        from sa_vision.reproduce import PROFILES
        if args.reproduce_profile not in PROFILES:
            raise UserError(f'--reproduce-profile {args.reproduce_profile!r} is not one of {sorted(PROFILES)}')
    problem = 'fused' in compare and kernel_problem(device)
    if problem:
        raise UserError(f'--compare fused: {problem}')


_SIZE_ARGS = {'embed_dim', 'channels'}  # the arguments that set a model's width (the attention models', the ResNet's)


def _check_model(name: str, profile: str, model_kwargs, compared: bool = False) -> None:
    """A model name that is none, or one that a --reproduce-profile which sizes its models would build at its full
    size: one the profile does not size (sa_gen_pruned, made from a sized model's weights, or a model outside it),
    given no size of its own (a compared model takes none: --model-kwargs is the timed model's)."""
    from sa_vision.reproduce import PROFILES
    sab.check_model_name(name)
    if is_peer(name) or weights_path(name) is not None:  # a peer's size is fixed, weights carry theirs
        return
    given = {**_profile_kwargs(profile, name), **({} if compared else model_kwargs)}
    sized = [m for m, changes in PROFILES[profile].per_model.items()
             if _SIZE_ARGS & set(changes.get('model_kwargs', {}))] if profile else []
    if sized and not _SIZE_ARGS & set(given):
        raise UserError(f'--reproduce-profile {profile} sizes {", ".join(sized)}, not {name}: ' + (
            'time it without the profile' if compared else "give its size with --model-kwargs (embed_dim=..., or "
            "channels=... of a ResNet; the compared models keep the profile's), or leave the profile out"))
    if not compared:  # a keyword a later model does not take ended the run after the first one's timings
        with torch.device('meta'):  # no memory, no time
            create_named_model(name, **given)


def _profile_kwargs(profile: str, name: str) -> dict:
    """The model arguments of ``name`` in the --reproduce-profile ``profile`` (empty without one)."""
    if not profile:
        return {}
    from sa_vision.reproduce import PROFILES
    return dict(PROFILES[profile].per_model.get(name, {}).get('model_kwargs', {}))


def _model_names(args):
    """--model, or the names of --model-list."""
    if not args.model_list:
        return list(args.model)
    try:
        with open(args.model_list, encoding='utf-8') as f:
            return [line.strip() for line in f if line.strip() and not line.strip().startswith('#')]
    except OSError as e:
        raise UserError(f'--model-list {args.model_list} cannot be read ({e.strerror or e})') from None


@caller_settings_kept(run_log=False)
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    compare = [c.strip() for c in args.compare.split(',') if c.strip()]
    device = sab.resolve_device(args.device)
    _check_args(args, compare, device)
    sab.hold_compiled_copies()
    models = _model_names(args)
    model_kwargs = {**args.model_kwargs, **({} if args.num_classes is None else {'num_classes': args.num_classes})}
    for name in [*models, *(c for c in compare if c in MODEL_NAMES)]:  # said before any model is timed
        _check_model(name, args.reproduce_profile, model_kwargs, compared=name not in models)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.flush_denormal and not torch.set_flush_denormal(True):
        print('--flush-denormal: this CPU does not support flushing subnormals (needs SSE3)', file=sys.stderr)
        return 2
    if args.retain_freed_memory:
        from sa_vision.train.runtime import retain_freed_memory
        if not retain_freed_memory():
            print('--retain-freed-memory: needs glibc\'s malloc; running without it', file=sys.stderr)
    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    given_size = tuple(args.input_size) if args.input_size else (3, args.img_size, args.img_size) if args.img_size \
        else None

    # how every step runs: the timed ones and the profiled one
    step_kwargs = dict(precision=args.precision, amp=args.amp, amp_dtype=args.amp_dtype,
                       channels_last=args.channels_last, torchcompile=args.torchcompile)

    compare_kwargs = {c: _profile_kwargs(args.reproduce_profile, c) for c in compare}
    all_rows = []
    for name in models:
        input_size = given_size or sab.input_size_of(name)
        kwargs = {**_profile_kwargs(args.reproduce_profile, name), **model_kwargs}
        variants = sab.build_variants(name, compare, fuse=args.fuse, compare_kwargs=compare_kwargs,
                                      input_size=input_size, **kwargs)
        rows = sab.benchmark_variants(
            variants, batch_size=args.batch_size, input_size=input_size, device=device, bench=args.bench,
            warmup=args.num_warm_iter, runs=args.runs, iters=args.num_bench_iter,
            measure_memory=not args.no_memory, log=log,
            matmul_size=args.matmul_size if args.matmul_peak else None, **step_kwargs,
        )
        for v, row in zip(variants, rows):
            row['flush_denormal'] = args.flush_denormal
            if hasattr(v.model, 'attn_kind'):
                row['unavoidable_macs'] = sab.unavoidable_macs(v.model, input_size)
                infer_macs = row['unavoidable_macs']
                if v.infer_model is not None and v.infer_model is not v.model:  # --fuse: inference avoids more
                    infer_macs = row['infer_unavoidable_macs'] = sab.unavoidable_macs(v.infer_model, input_size)
                if row.get('matmul_gflops') and 'train_samples_per_sec' in row:
                    gflops = row['train_samples_per_sec'] * 3 * row['unavoidable_macs'] * 2 / 1e9
                    row['train_unavoidable_gflops'] = gflops
                    row['matmul_fraction'] = gflops / row['matmul_gflops']
                if row.get('matmul_gflops') and 'infer_samples_per_sec' in row:
                    gflops = row['infer_samples_per_sec'] * infer_macs * 2 / 1e9
                    row['infer_unavoidable_gflops'] = gflops
                    row['infer_matmul_fraction'] = gflops / row['matmul_gflops']
        all_rows.extend(rows)
        if args.profile:
            print(f'## profile: one training step of {name}, batch {args.batch_size}, {device}, '
                  f'{args.amp_dtype + " autocast" if args.amp else args.precision}'
                  f'{", compiled" if args.torchcompile else ""}')
            print(sab.profile_train_step(variants[0].model, args.batch_size, input_size, device=device,
                                         **step_kwargs))

    suffix = Path(args.results_file).suffix.lstrip('.').lower()
    text = format_results(all_rows, args.results_format or (suffix if suffix in RESULTS_FORMATS else 'table'))
    try:  # the file before the output, whose reader may be gone (| head); the figures shown if it fails
        if args.results_file:
            Path(args.results_file).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(args.results_file, text if text.endswith('\n') else text + '\n')
    finally:
        print(text)
    return 0


cli = command(__name__)


if __name__ == '__main__':
    sys.exit(cli())
