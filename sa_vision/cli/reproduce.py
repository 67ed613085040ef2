""" The zoo, reproduced: train the four models, prune and fine-tune the fifth, evaluate, export (and publish)

    # 2-core CPU, offline: narrower models on Fashion-MNIST (Debian's dataset-fashion-mnist), about 100 minutes
    sa-vision-reproduce --profile cpu --out output/reproduce-fmnist
    # the paper: CIFAR-10 with the recipes unchanged, on a GPU
    sa-vision-reproduce --profile paper --data-dir data --dataset-download --out output/reproduce-cifar10
    # the mechanics in two minutes
    sa-vision-reproduce --profile tiny --out output/reproduce-tiny
    # the ablation of the positional parameters (the quadratic model, paper or conv init, positional lr x1 or x30)
    sa-vision-reproduce --profile cpu --ablation --epochs 2 --out output/ablation-fmnist

Killed at any moment, the same command continues: finished stages are skipped and a training run resumes from its
last epoch. ``--publish`` uploads the five Hub folders (a dry run lists them otherwise). See
:mod:`sa_vision.reproduce`.
"""
import argparse
import sys

from sa_vision.errors import command
from sa_vision.reproduce import PROFILES, Reproduction, StageFailed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--profile', default='cpu', choices=sorted(PROFILES),
                        help='; '.join(f'{p.name}: {p.description}' for p in PROFILES.values()))
    parser.add_argument('--dataset', default=None,
                        help="default: the profile's (paper: torch/cifar10, cpu: fashion-mnist, tiny: digits)")
    parser.add_argument('--data-dir', default=None, metavar='DIR')
    parser.add_argument('--dataset-download', action='store_true', default=False)
    parser.add_argument('--epochs', type=int, default=None, help="every training stage's epochs (fine-tuning aside)")
    parser.add_argument('--out', required=True, metavar='DIR', help='the reproduction folder (rerun to continue)')
    parser.add_argument('--ablation', action='store_true', default=False,
                        help='train only the ablation of the positional parameters (ablation.md / ablation.csv)')
    parser.add_argument('--publish', action='store_true', default=False,
                        help='upload the five Hub folders (needs a write token: HF_TOKEN or `hf auth login`)')
    args = parser.parse_args(argv)
    try:
        reproduction = Reproduction(args.out, args.profile, dataset=args.dataset, data_dir=args.data_dir,
                                    download=args.dataset_download, epochs=args.epochs)
        if args.ablation:
            reproduction.ablation()
        else:
            reproduction.run(publish=args.publish)
    except StageFailed as e:
        print(f'error: {e}. Finished stages are kept in {args.out}; fix the cause and run the same command to '
              f'continue', file=sys.stderr)
        return 1
    return 0


cli = command(__name__)


if __name__ == '__main__':
    sys.exit(cli())
