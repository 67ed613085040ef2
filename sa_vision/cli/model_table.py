"""Print the table of models: parameters and MACs counted with a FLOP counter (attention included)
next to the paper's figures. The table of docs/models.md; `--format csv` for machines.

    sa-vision-model-table
"""
import argparse
import csv
import sys

from sa_vision.errors import command
from sa_vision.measure.benchmark import count_macs
from sa_vision.models import MODEL_NAMES, create_named_model
from sa_vision.paper import PAPER_RESULTS
from sa_vision.tables import markdown_table
from sa_vision.train.checkpoint import load_model, weights_path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--format', choices=('markdown', 'csv'), default='markdown')
    # the paper's models in its table's order, then ours it has no row of
    paper_first = [*PAPER_RESULTS, *(name for name in MODEL_NAMES if name not in PAPER_RESULTS)]
    parser.add_argument('-m', '--models', '--model', nargs='+', default=paper_first,
                        help='model names or weights (local-dir:<folder>, a checkpoint file), as the other '
                             'commands take them with -m / --model; counted at their input size')
    args = parser.parse_args(argv)

    rows = []
    for name in args.models:
        # weights are built as their files say; a name (hf-hub: too) as timm builds it, from its config alone
        model = load_model(name) if weights_path(name) is not None else create_named_model(name)
        paper = PAPER_RESULTS.get(name)
        macs = count_macs(model, model.pretrained_cfg['input_size'])
        rows.append({
            'model': name,
            'params': sum(p.numel() for p in model.parameters()),
            'gmacs': macs / 1e9,
            'paper_params': paper.params if paper else None,
            'paper_gflops_linear_only': paper.gflops if paper else None,
            'paper_top1': paper.top1 if paper else None,
        })
    if args.format == 'csv':
        writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        return 0
    def fmt(value, spec, unit=''):
        return '-' if value is None else format(value, spec) + unit

    print(markdown_table(
        ['model', 'parameters', 'GMACs (counted, attention included)', 'paper GFLOPs',
         'paper top-1 CIFAR-10'],
        [[f'`{r["model"]}`', f'{r["params"]:,}', f'{r["gmacs"]:.2f}', fmt(r['paper_gflops_linear_only'], '.1f'),
          fmt(r['paper_top1'], '.1f', ' %')] for r in rows], 'lrrrr'))
    return 0


cli = command(__name__)


if __name__ == '__main__':
    sys.exit(cli())
