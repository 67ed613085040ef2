""" Prune the degenerate heads of a Gaussian sa_vision model (paper, appendix A.1; how sa_gen_pruned is made)

    sa-vision-prune run/sa_gen_cifar.safetensors --out pruned.safetensors
    sa-vision-prune sa_gen_cifar --heads 0,1 0,1,2,3 0 0,1 0,1,2,3,4,5 "" --out pruned.pth

A head is degenerate when its precision M_h = S_h S_h^T has largest eigenvalue < --max-eigenvalue-below (1e-5) or
condition number > --max-condition (1000; App. A.1 says 1e5, the authors' script 1000); a layer whose heads are all
degenerate keeps its least degenerate one. The rule needs M_h, so it is defined for the Gaussian kinds (generalized,
and quadratic, where M_h = s_h^2 I and only the eigenvalue test can fire); prune other kinds with --heads. The
output holds the pruned state dict with the kept heads (``model_args``) as an ``sa_gen_pruned`` model (generalized
weights) or as the model of its kind, so every loader opens it and the pruned recipe fine-tunes it:

    sa-vision-train -c sa_gen_pruned --initial-checkpoint pruned.pth ...
"""
import argparse
import sys

from sa_vision.errors import command
from sa_vision.paper import PRUNED_HEADS_PER_LAYER
from sa_vision.research.analysis import GAUSSIAN_KINDS, attention_layers
from sa_vision.research.pruning import (
    MAX_CONDITION,
    MAX_EIGENVALUE_BELOW,
    PruningError,
    find_degenerate_heads,
    head_eigenvalues,
    prune_heads,
    pruned_arch,
    save_pruned,
    select_heads_to_prune,
)
from sa_vision.train.checkpoint import load_model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('source', help='timm model name, checkpoint file or Hub folder')
    parser.add_argument('--out', required=True, help='.safetensors (kwargs in its metadata) or a torch .pth file')
    parser.add_argument('--max-eigenvalue-below', type=float, default=MAX_EIGENVALUE_BELOW)
    parser.add_argument('--max-condition', type=float, default=MAX_CONDITION)
    parser.add_argument('--heads', nargs='+', help='prune these heads instead: one comma list per layer ("" for none)')
    parser.add_argument('--pretrained', action='store_true', help='load pretrained timm weights for a model name')
    args = parser.parse_args(argv)

    model = load_model(args.source, pretrained=args.pretrained)
    kind = attention_layers(model)[0].kind
    if kind not in GAUSSIAN_KINDS and args.heads is None:
        raise PruningError(f'degenerate-head detection needs the Gaussian precision M_h, which {kind!r} attention '
                           f'does not have (kinds with one: {", ".join(GAUSSIAN_KINDS)}); name the heads to prune '
                           f'with --heads')
    if args.heads is not None:
        try:
            heads = [[int(h) for h in layer.split(',') if h.strip()] for layer in args.heads]
        except ValueError:
            raise PruningError(f'--heads takes one comma list of head indices per layer ("" for none), got '
                               f'{args.heads}') from None
    else:
        thresholds = (args.max_eigenvalue_below, args.max_condition)
        heads = select_heads_to_prune(model, *thresholds)
        degenerate = find_degenerate_heads(model, *thresholds)
        for layer, (eig, drop, bad) in enumerate(zip(head_eigenvalues(model), heads, degenerate)):
            kept = f' (all degenerate: keeps its least degenerate head {sorted(set(bad) - set(drop))[0]})' \
                if len(bad) > len(drop) else ''
            print(f'layer {layer + 1}: eigenvalues of M_h (small, large) '
                  + ' '.join(f'({a:.2g},{b:.2g})' for a, b in eig.tolist()) + f' -> prune {drop}{kept}')
    pruned = prune_heads(model, heads)
    print(f'pruned {[len(h) for h in heads]} heads per layer, kept {list(pruned.heads_per_layer)}, '
          f'{sum(p.numel() for p in pruned.parameters()):,} parameters')
    if kind == 'generalized' and tuple(pruned.heads_per_layer) == PRUNED_HEADS_PER_LAYER and pruned.embed_dim == 400:
        print('this is the paper\'s layout: timm.create_model("sa_gen_pruned") loads it strictly')
    save_pruned(pruned, args.out, heads)
    print(f'wrote {args.out} ({pruned_arch(kind)} with heads_per_layer={list(pruned.heads_per_layer)})')
    return 0


cli = command(__name__)


if __name__ == '__main__':
    sys.exit(cli())
