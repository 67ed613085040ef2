"""How close each layer's Gaussian centres come to a 3x3 kernel d * {-1, 0, 1}^2 (d = 1, 2, 3), heads and offsets
matched one to one (sa_vision.research.kernel_match; the paper's Theorem 1 and Lemma 2 against its Figs. 3-4), for
a kept zoo's Gaussian models, their kept epochs (epoch-000 is the run's own random start), the paper's random init
(Sec. 4.2) of the zoo's quadratic architecture (seeds 0, 1, 2) and Theorem 1's init (pos_init='conv').

    OMP_NUM_THREADS=1 python docs/probes/cpu/kernel_match.py zoo/fashion-mnist-cpu > kernel_match_<date>.log

Each cell is "mean matched distance in grid units (best dilation)"; layers are counted from 1 as in the paper's
figures (and as sa-vision-plot --kernel-match counts them).
"""
import json
import sys
from pathlib import Path

import timm
import torch

import sa_vision  # noqa: F401
from sa_vision.models.sa_state_dict import CENTERS, block_key, layer_indices
from sa_vision.research.analysis import load_model
from sa_vision.research.kernel_match import kernel_match, layer_kernel_matches
from sa_vision.tables import markdown_table
from sa_vision.train.positional_epochs import POSITIONAL_EPOCHS_FILE, load_positional_trajectory

GAUSSIAN_MODELS = ('sa_quadratic_cifar', 'sa_gen_cifar', 'sa_gen_pruned')


def cells(matches):
    return [f'{m.mean_distance:.2f} (d={m.dilation})' for m in matches]


def model_row(label, model):
    rows = layer_kernel_matches(model)
    best = min(rows, key=lambda r: r['mean_distance'])
    return [label, *[f"{r['mean_distance']:.2f} (d={r['best_dilation']})" for r in rows],
            f"{best['mean_distance']:.2f} (layer {best['layer']})"]


def epoch_rows(name, folder):
    epochs = load_positional_trajectory(folder / POSITIONAL_EPOCHS_FILE)
    rows = []
    for label, state in epochs.items():
        matches = [kernel_match(state[block_key(i, CENTERS)]) for i in layer_indices(state)]
        best = min(range(len(matches)), key=lambda i: matches[i].mean_distance)
        rows.append([f'{name} {label}', *cells(matches), f'{matches[best].mean_distance:.2f} (layer {best + 1})'])
    return rows


def main(zoo: Path) -> None:
    rows = []
    for name in GAUSSIAN_MODELS:
        if (zoo / name).is_dir():
            rows.append(model_row(f'{name} (trained)', load_model(f'local-dir:{zoo / name}')))
    model_args = json.loads((zoo / 'sa_quadratic_cifar' / 'config.json').read_text())['model_args']
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        rows.append(model_row(f'paper init, seed {seed}', timm.create_model('sa_quadratic_cifar', **model_args)))
    conv_args = dict(model_args, pos_init='conv')
    rows.append(model_row("Theorem 1's init", timm.create_model('sa_quadratic_cifar', **conv_args)))
    for name in GAUSSIAN_MODELS:
        if (zoo / name / POSITIONAL_EPOCHS_FILE).is_file():
            rows.extend(epoch_rows(name, zoo / name))
    depth = len(rows[0]) - 2
    header = ['weights', *[f'layer {i + 1}' for i in range(depth)], 'best layer']
    print(f'# {zoo}: mean matched distance to a 3x3 kernel, grid units (best dilation d)')
    print(markdown_table(header, rows, 'l' + 'r' * (depth + 1), pad=True))


if __name__ == '__main__':
    main(Path(sys.argv[1] if len(sys.argv) > 1 else 'zoo/fashion-mnist-cpu'))
