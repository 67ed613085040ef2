""" One self-contained HTML page to look into the attention heads of sa_vision models

    sa-vision-explore local-dir:zoo/fashion-mnist-cpu/sa_quadratic_cifar --out explorer.html
    sa-vision-explore output/train/<run> other/last.pth.tar hf-hub:sa-vision/sa_gen_cifar.cifar10 --out page.html

A MODEL is anything sa-vision-validate takes: a run folder, a checkpoint file, a Hub folder, local-dir:<folder>,
hf-hub:<repo> or a timm name (with its published weights); --no-pretrained builds each at random. The page opens
from file:// and fetches nothing.
"""
import argparse
import sys
import time

from sa_vision.errors import UserError, command
from sa_vision.io import file_problem
from sa_vision.research.explorer import explorer_data, page_size_note, resolve_explorer_model, write_explorer_page
from sa_vision.train.data import datasets_held_out_as_test, named_datasets


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('models', nargs='+', metavar='MODEL', help='run folder, checkpoint, Hub folder, local-dir:, '
                                                                   'hf-hub: or timm name')
    parser.add_argument('--out', required=True, metavar='FILE', help='the HTML page to write')
    parser.add_argument('--dataset', default=None,
                        help="the gallery's dataset (default: the one the models were trained on)")
    parser.add_argument('--data-dir', default=None, metavar='DIR')
    parser.add_argument('--val-split', '--split', default=None, metavar='NAME',
                        help="the gallery's split (default: the --val-split of the runs that trained the models, "
                             f"else the dataset's held-out split: 'test' for {datasets_held_out_as_test()}; "
                             "'validation' for an image folder); --split, as sa-vision-validate takes it, is the same")
    parser.add_argument('--dataset-download', action='store_true', default=False,
                        help="download the gallery's dataset into --data-dir where it is not there: " + ', '.join(
                            info.name for info in named_datasets() if info.downloads) + ' or another timm '
                        '<type>/<name> (torch/<name>: the torchvision dataset of that name)')
    parser.add_argument('--images', type=int, default=24, metavar='N',
                        help="images of that split in the gallery (default 24)")
    parser.add_argument('--title', default='sa_vision attention explorer')
    parser.add_argument('--pretrained', action=argparse.BooleanOptionalAction, default=True,
                        help='load the weights (default), or build each model at random: a timm name as timm '
                             'does, weights as their architecture (shown on the data they were trained on)')
    args = parser.parse_args(argv)
    if args.images < 1:
        raise UserError(f'--images is {args.images}, it must be at least 1')
    problem = file_problem(args.out) or ('' if args.out.lower().endswith(('.html', '.htm')) else
                                         'the page is HTML: name a .html file')
    if problem:
        raise UserError(f'--out {args.out}: {problem}')
    started = time.time()
    models = []
    for spec in args.models:
        print(f'loading {spec} ...', flush=True)
        models.append(resolve_explorer_model(spec, pretrained=args.pretrained))
    data = explorer_data(models, dataset=args.dataset, num_images=args.images, data_dir=args.data_dir,
                         download=args.dataset_download, title=args.title, val_split=args.val_split)
    shown = data['images']['count']
    for record in data['models']:
        if 'trained_on' in record:
            print(f'{record["name"]} was trained on {record["trained_on"]}: the page names its predictions by its '
                  f'own classes and does not score them against the {data["dataset"]["title"]} labels')
    if shown < args.images:
        print(f'the {data["dataset"]["title"]} {data["dataset"]["split"]} split has {shown} images: the gallery '
              f'shows them all')
    out = write_explorer_page(data, args.out)
    print(f'wrote {out} ({out.stat().st_size / 1e6:.2f} MB, {len(models)} model(s), {shown} images) in '
          f'{time.time() - started:.0f} s; open it in a browser (file://, no server needed)')
    note = page_size_note(data, out.stat().st_size)
    if note:
        print(f'warning: {note}', file=sys.stderr)
    return 0


cli = command(__name__)


if __name__ == '__main__':
    sys.exit(cli())
