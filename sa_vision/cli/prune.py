""" Prune the degenerate heads of a Gaussian sa_vision model (paper, appendix A.1; how sa_gen_pruned is made)

    sa-vision-prune run/sa_gen_cifar.safetensors --out pruned.safetensors
    sa-vision-prune sa_gen_cifar --heads 1,2 1,2,3,4 1 1,2 1,2,3,4,5,6 "" --out pruned.pth

A head is degenerate when its precision M_h = S_h S_h^T has largest eigenvalue < --max-eigenvalue-below (1e-5) or
condition number > --max-condition (1000; App. A.1 says 1e5, the authors' script 1000); a layer whose heads are all
degenerate keeps its least degenerate one. The rule needs M_h, so it is defined for the Gaussian kinds (generalized,
and quadratic, where M_h = s_h^2 I and only the eigenvalue test can fire); prune other kinds with --heads. The
output holds the pruned state dict with the kept heads (``model_args``) as an ``sa_gen_pruned`` model (generalized
weights) or as the model of its kind, so every loader opens it and the pruned recipe fine-tunes it:

    sa-vision-train -c sa_gen_pruned --initial-checkpoint pruned.pth ...

Pruned weights keep their source's preprocessing (input size, mean / std, label names, the border a model of a padded
dataset adds itself: a Hub folder's config.json, an hf-hub: repository's too, a training checkpoint's dataset),
which sa-vision-validate and the other commands apply, and the model arguments no weight shows (global_pool, ...).
timm reads neither from the file: the last lines print the create_model call and the arguments of timm's train.py
that build the pruned model and feed it as its source was fed.

Layers and heads are numbered from 1, here and in the figures, the explorer and sa-vision-plot's tables.
"""
import argparse
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from sa_vision.errors import command
from sa_vision.io import file_problem
from sa_vision.models.factory import RATE_KEYWORD
from sa_vision.paper import PRUNED_HEADS_PER_LAYER
from sa_vision.research.analysis import GAUSSIAN_KINDS, attention_layers
from sa_vision.research.pruning import (
    MAX_CONDITION,
    MAX_EIGENVALUE_BELOW,
    PruningError,
    check_thresholds,
    find_degenerate_heads,
    head_eigenvalues,
    head_indices,
    numbered_heads,
    prune_heads,
    pruned_arch,
    pruned_model_args,
    save_pruned,
    select_heads_to_prune,
)
from sa_vision.train.checkpoint import (
    BEST_CHECKPOINT,
    RUN_CHECKPOINT,
    WEIGHT_SUFFIXES,
    Checkpoint,
    load_model,
    read_checkpoint,
    weights_path,
)
from sa_vision.train.timm_args import TIMM_MODEL_KWARGS

# what timm's data config takes from a pretrained_cfg: printed as create_model's overlay and train.py's flags
_DATA_CFG_FLAGS = {'input_size': '--input-size', 'mean': '--mean', 'std': '--std', 'crop_pct': '--crop-pct'}
# what the pretrained_cfg says the weights are (their dataset's tag, its class names): printed in the overlay too
_LABEL_CFG = ('tag', 'label_names')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('source', help='timm model name, checkpoint file or Hub folder')
    parser.add_argument('--out', required=True, help='.safetensors (kwargs in its metadata) or a torch .pth file; '
                                                      'its folder is created')
    parser.add_argument('--max-eigenvalue-below', type=float, default=None,
                        help=f'a head is degenerate below this largest eigenvalue (default {MAX_EIGENVALUE_BELOW:g})')
    parser.add_argument('--max-condition', type=float, default=None,
                        help=f'a head is degenerate above this condition number (default {MAX_CONDITION:g})')
    parser.add_argument('--heads', nargs='+', help='prune these heads instead: one comma list of heads per layer ("" '
                                                   'for none), numbered from 1 as the figures and tables number them')
    parser.add_argument('--pretrained', action='store_true', help='load pretrained timm weights for a model name')
    args = parser.parse_args(argv)
    problem = file_problem(args.out)  # before any work
    if not problem and not args.out.endswith(WEIGHT_SUFFIXES):
        problem = (f'not a name of weights: name a .safetensors file, or a torch file ending in '
                   f'{", ".join(s for s in WEIGHT_SUFFIXES if s != ".safetensors")}')
    if problem:
        raise PruningError(f'--out {args.out}: {problem}')
    if args.heads is not None and (args.max_eigenvalue_below, args.max_condition) != (None, None):
        raise PruningError('--heads names the heads to prune, which --max-eigenvalue-below and --max-condition would '
                           'choose otherwise: pass either --heads or the thresholds')
    if args.heads is None:
        if args.max_eigenvalue_below is None:
            args.max_eigenvalue_below = MAX_EIGENVALUE_BELOW
        if args.max_condition is None:
            args.max_condition = MAX_CONDITION
        check_thresholds(args.max_eigenvalue_below, args.max_condition)

    path = weights_path(args.source)
    if path is not None and _writes_into_source(Path(args.out), path):
        raise PruningError(f'--out {args.out} would write into the weights it prunes ({path}): name a file outside '
                           f'them, e.g. {path.with_name(path.stem.split(".")[0] + "_pruned.safetensors")}')
    out = Path(args.out)
    run_files = (RUN_CHECKPOINT, BEST_CHECKPOINT)
    if out.name in run_files and any((out.parent / name).is_file() for name in (*run_files, 'args.yaml')):
        raise PruningError(f'--out {args.out} would replace a checkpoint of the training run in {out.parent}: name '
                           f'another file, e.g. {out.parent / "pruned.safetensors"}')
    source = read_checkpoint(path) if path is not None else None
    model = source.create_model() if source is not None else load_model(args.source, pretrained=args.pretrained)
    hub_folder = _cached_hub_folder(model) if source is None else None
    if hub_folder is not None:  # read as its local-dir: folder is: the config.json states how it was fed
        source = read_checkpoint(hub_folder)
        model = source.create_model()
    kind = attention_layers(model)[0].kind
    if kind not in GAUSSIAN_KINDS and args.heads is None:
        raise PruningError(f'degenerate-head detection needs the Gaussian precision M_h, which {kind!r} attention '
                           f'does not have (kinds with one: {", ".join(GAUSSIAN_KINDS)}); name the heads to prune '
                           f'with --heads')
    report = []  # printed once the pruned weights are written: the output's reader may be gone (| head)
    if args.heads is not None:
        heads = _heads_argument(args.heads, model.heads_per_layer)
    else:
        thresholds = (args.max_eigenvalue_below, args.max_condition)
        heads = select_heads_to_prune(model, *thresholds)
        degenerate = find_degenerate_heads(model, *thresholds)
        numbered = zip(head_eigenvalues(model), numbered_heads(heads), numbered_heads(degenerate))
        for layer, (eig, drop, bad) in enumerate(numbered, start=1):
            kept = f' (all degenerate: keeps its least degenerate head {sorted(set(bad) - set(drop))[0]})' \
                if len(bad) > len(drop) else ''
            report.append(f'layer {layer}: eigenvalues of M_h (small, large) of heads 1-{len(eig)} '
                          + ' '.join(f'({a:.2g},{b:.2g})' for a, b in eig.tolist()) + f' -> prune {drop}{kept}')
    pruned = prune_heads(model, heads)
    report.append(f'pruned {[len(h) for h in heads]} heads per layer, kept {list(pruned.heads_per_layer)}, '
                  f'{sum(p.numel() for p in pruned.parameters()):,} parameters')
    if kind == 'generalized' and tuple(pruned.heads_per_layer) == PRUNED_HEADS_PER_LAYER and pruned.embed_dim == 400:
        report.append('this is the paper\'s layout: timm.create_model("sa_gen_pruned") loads it strictly')
    unseen, cfg = _preprocessing(source, pruned) if source is not None else ({}, {})
    try:  # the file before the output, whose reader may be gone (| head); the report shown if it fails
        model_args = save_pruned(pruned, args.out, heads, model_args=unseen, pretrained_cfg=cfg)
    finally:
        print('\n'.join(report))
    arch = pruned_arch(kind)
    print(f'wrote {args.out} ({arch}{" for " + cfg["tag"] if cfg.get("tag") else ""})')
    print(_timm_usage(arch, args.out, model_args, cfg))
    return 0


def _writes_into_source(out: Path, source: Path) -> bool:
    """Whether ``out`` is the weights file pruned, or lies in the run or Hub folder pruned (a pruned file there would
    replace its checkpoint or weights, or sit beside them as if it were the folder's), or is the other checkpoint of
    the run a checkpoint pruned is in (pruning last.pth.tar into its model_best.pth.tar)."""
    out, source = out.resolve(), source.resolve()
    run_files = (RUN_CHECKPOINT, BEST_CHECKPOINT)
    return out == source or (source.is_dir() and source in out.parents) or (
        source.name in run_files and out.parent == source.parent and out.name in run_files)


def _heads_argument(values: List[str], heads_per_layer: Sequence[int]) -> List[List[int]]:
    """The head indices per layer that ``--heads`` numbers (from 1), or a :class:`PruningError` in its terms."""
    try:
        numbers = [[int(h) for h in layer.split(',') if h.strip()] for layer in values]
    except ValueError:
        raise PruningError(f'--heads takes one comma list of heads per layer ("" for none), numbered from 1, got '
                           f'{values}') from None
    try:
        return head_indices(numbers, heads_per_layer)
    except PruningError as e:
        raise PruningError(f'--heads: {e}') from None


def _warn_of_no_preprocessing(source: Checkpoint) -> None:
    """The pruned file of a bare weights file, which says nothing of how it was fed, records no preprocessing rather
    than its architecture's CIFAR-10 defaults: a warning says how to keep the source's."""
    folder = Path(source.source).parent
    hint = (f'prune its Hub folder (local-dir:{folder}) to keep the input size, mean / std and border its '
            f'config.json states' if (folder / 'config.json').is_file() else
            'loaders will feed the pruned weights with the architecture\'s defaults (CIFAR-10\'s)')
    print(f'warning: {source.source} states no preprocessing (no dataset, input size or mean / std), so the pruned '
          f'file records none; {hint}', file=sys.stderr)


def _cached_hub_folder(model) -> Optional[Path]:
    """The folder of the Hub cache that timm has just read ``model`` from (``hf-hub:<repo>``, or published
    weights), holding its config.json and weights; None for a model read from no repository."""
    from huggingface_hub import try_to_load_from_cache
    from timm.models._hub import hf_split
    hub_id = (getattr(model, 'pretrained_cfg', None) or {}).get('hf_hub_id')
    if not hub_id:
        return None
    repo, revision = hf_split(hub_id)
    config = try_to_load_from_cache(repo, 'config.json', revision=revision)
    return Path(config).parent if isinstance(config, str) else None


# arguments that shape no output of trained weights (the initialisation; the drop rates, which the recipe that
# fine-tunes the pruned model sets): left to that recipe
_TRAINING_ONLY_ARGS = frozenset({'attn_kind', 'pos_init', 'pos_init_alpha'})


def _preprocessing(source: Checkpoint, pruned) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(model_args its weights do not show, timm's pretrained_cfg) of the pruned weights: the source's arguments
    that shape its outputs but its heads' (``global_pool``, the border it adds to its input, ...), and what the Hub
    export would write of them to config.json (sa_vision.hub.export.exported_config), so that they are fed as the
    source was; no preprocessing where the source states none."""
    from sa_vision.hub.export import exported_config
    from sa_vision.train.checkpoint import infer_model_args
    shown = infer_model_args(pruned.state_dict())
    unseen = {k: v for k, v in source.model_args.items() if k not in shown and k not in _TRAINING_ONLY_ARGS
              and not RATE_KEYWORD.search(k)}
    if not (source.preprocessing or source.dataset):
        _warn_of_no_preprocessing(source)
        return unseen, {}
    # labelled as the pruned file's own model (its kept heads), not the source's; with all the source says of its
    # data: a run's arguments tell an unnamed image folder (--data-dir) from no dataset, and hold its label names
    ckpt = Checkpoint(*pruned_model_args(pruned, unseen), pruned.state_dict(), source.source, source.format,
                      dict(source.meta))
    model_config, pad_args, data_cfg = exported_config(ckpt, pruned)
    cfg = {**data_cfg, **model_config['pretrained_cfg']}
    if 'label_names' in model_config:
        cfg['label_names'] = model_config['label_names']
    return {**unseen, **pad_args}, cfg


def _timm_usage(arch: str, path: str, model_args: Dict[str, Any], cfg: Optional[Dict[str, Any]]) -> str:
    """How timm builds the pruned model: create_model with every model argument (timm reads none from the file)
    and the data config, tag and label names as an overlay; for train.py, --model-kwargs but for the keywords it
    passes from flags of its own (--num-classes, ...), and the data config as flags."""
    data = {k: tuple(v) if isinstance(v, list) else v for k, v in (cfg or {}).items() if k in _DATA_CFG_FLAGS}
    label = {k: tuple(v) if isinstance(v, list) else v for k, v in (cfg or {}).items() if k in _LABEL_CFG}
    overlay = ', '.join(f'{k}={v!r}' for k, v in {'file': str(path), **data, **label}.items())
    call = (f'timm.create_model({arch!r}, pretrained=True, pretrained_cfg_overlay=dict({overlay})'
            + ''.join(f', {k}={v!r}' for k, v in model_args.items()) + ')')
    flags = [f'--{TIMM_MODEL_KWARGS[k].replace("_", "-")} {v}' for k, v in model_args.items() if k in TIMM_MODEL_KWARGS]
    flags += [f'{_DATA_CFG_FLAGS[k]} ' + (' '.join(map(str, v)) if isinstance(v, tuple) else str(v))
              for k, v in data.items()]
    kwargs = ' '.join(shlex.quote(f'{k}={v}' if isinstance(v, str) else f'{k}={v!r}')
                      for k, v in model_args.items() if k not in TIMM_MODEL_KWARGS)
    return (f'timm:          {call}\n'
            f'timm train.py: --model {arch} --initial-checkpoint {shlex.quote(str(path))} --model-kwargs {kwargs} '
            + ' '.join(flags))


cli = command(__name__)


if __name__ == '__main__':
    sys.exit(cli())
