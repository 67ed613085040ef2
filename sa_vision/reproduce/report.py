""" The results of a reproduction: evaluation on the test split in float32, the results and ablation tables
(CSV and Markdown) and the paper's figures of the trained attention models """
import csv
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..io import atomic_write
from ..models import SA_MODEL_ARGS
from ..tables import markdown_table
from ..train.checkpoint import read_checkpoint
from ..train.data import dataset_info
from ..train.runtime import format_duration
from .profiles import TRAINED_MODELS

__all__ = ['TABLE_COLUMNS', 'ABLATION_COLUMNS', 'EVAL_PRECISION', 'evaluate_on_test_split', 'draw_figures']

# center_shift_median: median |final - initial centre| over all heads in grid units (empty without centres);
# top1 / top5 in float32: the same figures on any CPU, where bfloat16 depends on the CPU's arithmetic
TABLE_COLUMNS = ('model', 'dataset', 'epochs', 'parameters', 'macs_g', 'top1', 'top5', 'eval_precision',
                 'train_minutes', 'center_shift_median', 'amp', 'pos_lr_scale', 'paper_cifar10_top1')
ABLATION_COLUMNS = ('variant', 'run', 'model', 'dataset', 'epochs', 'pos_init', 'pos_lr_scale', 'amp', 'top1', 'top5',
                    'center_shift_median', 'train_minutes')
EVAL_PRECISION = 'float32'


def _say(msg: str) -> None:
    print(msg, flush=True)


def evaluate_on_test_split(model, dataset: str, data_dir: Optional[str] = None, download: bool = False,
                           precision: str = EVAL_PRECISION) -> Dict[str, float]:
    """Top-1 / top-5 / loss of ``model`` on ``dataset``'s held-out split, on the CPU, in ``precision``."""
    import contextlib

    import torch

    from ..train.data import create_image_dataset
    from ..train.evaluation import evaluate
    info = dataset_info(dataset)
    ds = create_image_dataset(info.name, info.eval_split, is_training=False, data_dir=data_dir, download=download,
                              img_size=_input_size(model))
    loader = torch.utils.data.DataLoader(ds, batch_size=500, shuffle=False)
    dtype = {'float32': None, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[precision]
    amp_ctx = (lambda: torch.autocast('cpu', dtype=dtype)) if dtype else contextlib.nullcontext
    return evaluate(model.float(), loader, 'cpu', amp_ctx=amp_ctx)


def _input_size(model) -> int:
    """The image size a model takes (a kept model that pads its input takes the dataset's unpadded images)."""
    from timm.data import resolve_data_config
    return resolve_data_config({}, model=model)['input_size'][-1]


def draw_figures(folders: List[Path], out: Path, redraw: bool = False) -> List[Path]:
    """The paper's figures of the attention models in ``folders``: centres (Figs. 3-4), maps (Figs. 5-6) and, where
    the folder keeps its epochs, centre trajectories (Fig. 2). Existing files are kept unless ``redraw``."""
    from ..research.analysis import GAUSSIAN_KINDS
    from ..research.explorer import POSITIONAL_EPOCHS_FILE, load_positional_trajectory, models_at_epochs
    from ..research.plots import plot_attention_maps, plot_center_trajectories, plot_centers
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    made = []

    def figure(name, draw):
        path = out / name
        if redraw or not path.is_file():  # sa_vision.research.plots draws on its own Figure objects (no pyplot state)
            with atomic_write(path) as tmp:
                draw(str(tmp))
        made.append(path)

    for folder in folders:
        model_name = folder.name.split('.')[0]
        if model_name not in SA_MODEL_ARGS:
            continue
        trained = read_checkpoint(folder).create_model()
        gaussian = SA_MODEL_ARGS[model_name].get('attn_kind', 'quadratic') in GAUSSIAN_KINDS
        if gaussian:
            figure(f'centers_{model_name}.png', lambda p, m=trained: plot_centers(m, p))
        figure(f'maps_{model_name}.png', lambda p, m=trained: plot_attention_maps(m, p))
        epochs_file = folder / POSITIONAL_EPOCHS_FILE
        if gaussian and model_name in TRAINED_MODELS and epochs_file.is_file():  # not the fine-tuned pruning
            epochs = load_positional_trajectory(epochs_file)
            figure(f'trajectories_{model_name}.png', lambda p, m=trained, e=epochs: plot_center_trajectories(
                models_at_epochs(m, e), p, labels=list(e)))
    _say(f'figures: {", ".join(p.name for p in made)} in {out}')
    return made


def _training_precision(args: Dict[str, Any]) -> str:
    """A run's precision: its autocast dtype, or float32 where ``--amp auto`` turned autocast off (``amp_used``)."""
    used = args.get('amp_used', args.get('amp'))
    if used is True or used == 'auto':
        return args.get('amp_dtype', 'bfloat16')
    return used if isinstance(used, str) and used else 'float32'


def _duration(minutes: float) -> str:
    return format_duration(minutes * 60)


def _write_csv_atomic(path: Path, columns, rows: List[Dict[str, Any]]) -> None:
    with atomic_write(path) as tmp, open(tmp, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def _markdown_table(rows: List[Dict[str, Any]], dataset_title: str) -> str:
    header = ['model', 'dataset', 'epochs', 'parameters', 'MACs (G)', 'top-1 %', 'top-5 %', 'training time',
              'median centre shift', 'precision', 'positional lr scale', 'paper, CIFAR-10 top-1 %']
    cells = [[f'`{r["model"]}`', dataset_title, r['epochs'], f'{r["parameters"]:,}', f'{r["macs_g"]:.3f}',
              f'{r["top1"]:.2f}', f'{r["top5"]:.2f}', _duration(r['train_minutes']),
              '-' if r.get('center_shift_median') is None else f'{r["center_shift_median"]:.2f}',
              r.get('amp') or '-', f'{r.get("pos_lr_scale", 1.0):g}',
              '-' if r['paper_cifar10_top1'] is None else r['paper_cifar10_top1']] for r in rows]
    return markdown_table(header, cells, 'llrrrrrrrlrr') + '\n'
