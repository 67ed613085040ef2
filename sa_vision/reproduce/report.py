""" The results of a reproduction: evaluation on the test split in float32, the results and ablation tables (CSV
and Markdown, written from one list of columns each), the paper's figures and the explorer page of the trained
attention models """
import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..io import atomic_write, atomic_write_text
from ..models import SA_MODEL_ARGS
from ..tables import format_duration, markdown_table
from ..train.checkpoint import read_checkpoint
from ..train.data import dataset_info
from .profiles import TRAINED_MODELS

__all__ = ['EVAL_PRECISION', 'say', 'model_input_size', 'Column', 'RESULT_COLUMNS', 'ABLATION_COLUMNS',
           'evaluate_on_test_split', 'run_row', 'train_minutes', 'center_shift_median', 'write_table', 'draw_figures',
           'read_table', 'write_zoo_explorer']

EVAL_PRECISION = 'float32'


def say(msg: str) -> None:
    """Print a line of the reproduction's log at once (a training subprocess writes to the same terminal)."""
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
                              img_size=model_input_size(model))
    loader = torch.utils.data.DataLoader(ds, batch_size=500, shuffle=False)
    dtype = {'float32': None, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[precision]
    amp_ctx = (lambda: torch.autocast('cpu', dtype=dtype)) if dtype else contextlib.nullcontext
    return evaluate(model.float(), loader, 'cpu', amp_ctx=amp_ctx)


def model_input_size(model) -> int:
    """The image size a model takes (a kept model that pads its input takes the dataset's unpadded images)."""
    from timm.data import resolve_data_config
    return resolve_data_config({}, model=model)['input_size'][-1]


def draw_figures(folders: List[Path], out: Path, redraw: bool = False) -> List[Path]:
    """The paper's figures of the attention models in ``folders``: centres (Figs. 3-4), maps (Figs. 5-6) and, where
    the folder keeps its epochs, centre trajectories (Fig. 3). Existing files newer than their folder's weights are
    kept unless ``redraw``."""
    from ..research.analysis import GAUSSIAN_KINDS
    from ..research.plots import plot_attention_maps, plot_center_trajectories, plot_centers
    from ..train.positional_epochs import POSITIONAL_EPOCHS_FILE, load_positional_trajectory, models_at_epochs
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    made = []

    def figure(name, draw, weights_mtime):
        path = out / name
        # of weights exported again since (a stage trained anew): drawn again, as an export of a newer checkpoint is
        stale = path.is_file() and path.stat().st_mtime_ns < weights_mtime
        if redraw or stale or not path.is_file():  # sa_vision.research.plots draws on its own Figure objects
            with atomic_write(path) as tmp:
                draw(str(tmp))
        made.append(path)

    for folder in folders:
        model_name = folder.name.split('.')[0]
        if model_name not in SA_MODEL_ARGS:
            continue
        trained = read_checkpoint(folder).create_model()
        exported = max(f.stat().st_mtime_ns for f in folder.iterdir())
        gaussian = SA_MODEL_ARGS[model_name].get('attn_kind', 'quadratic') in GAUSSIAN_KINDS
        if gaussian:
            figure(f'centers_{model_name}.png', lambda p, m=trained: plot_centers(m, p), exported)
        figure(f'maps_{model_name}.png', lambda p, m=trained: plot_attention_maps(m, p), exported)
        epochs_file = folder / POSITIONAL_EPOCHS_FILE
        if gaussian and model_name in TRAINED_MODELS and epochs_file.is_file():  # not the fine-tuned pruning
            epochs = load_positional_trajectory(epochs_file)
            figure(f'trajectories_{model_name}.png', lambda p, m=trained, e=epochs: plot_center_trajectories(
                models_at_epochs(m, e), p, labels=list(e)), exported)
    say(f'figures: {", ".join(p.name for p in made)} in {out}')
    return made


def _training_precision(args: Dict[str, Any]) -> str:
    """A run's precision: its autocast dtype, or float32 where ``--amp auto`` turned autocast off (``amp_used``)."""
    used = args.get('amp_used', args.get('amp'))
    if used is True or used == 'auto':
        return args.get('amp_dtype', 'bfloat16')
    return used if isinstance(used, str) and used else 'float32'


def train_minutes(meta: Dict[str, Any]) -> float:
    """A run's training time in minutes (3 decimals): the sum of its epochs' ``train_time``."""
    return round(sum(h.get('train_time', 0.) for h in meta.get('history', [])) / 60, 3)


def center_shift_median(run_dir: Path, final_state) -> Optional[float]:
    """Median centre shift of the run in ``run_dir`` (grid units, 3 decimals); None without centres or epoch-000."""
    from ..research.analysis import center_shift_median as shift_median
    from ..train.positional_epochs import initial_positions
    initial = initial_positions(run_dir)  # kept by the trainer before the first step
    if initial is None:
        return None
    shift = shift_median(initial, final_state)
    return None if shift is None else round(shift, 3)


def run_row(ckpt, run_dir: Path, dataset: str, metrics: Dict[str, float]) -> Dict[str, Any]:
    """What the results table and the ablation both say of a finished run: ``metrics`` (top-1 / top-5) and how it
    was trained."""
    meta, args = ckpt.meta, ckpt.meta.get('args') or {}
    return {'dataset': dataset, 'epochs': meta['epoch'], 'top1': round(metrics['top1'], 2),
            'top5': round(metrics['top5'], 2), 'train_minutes': train_minutes(meta),
            'center_shift_median': center_shift_median(run_dir, ckpt.state_dict), 'amp': _training_precision(args),
            'pos_lr_scale': args.get('pos_lr_scale', 1.0)}


@dataclass(frozen=True)
class Column:
    """A column of a results table: the row's key (the CSV header), its Markdown title (None: in the CSV only),
    alignment and cell."""
    name: str
    title: Optional[str] = None
    align: str = 'r'
    cell: Callable[[Any], Any] = str


def _dash(cell: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: '-' if value is None else cell(value)


def _duration(minutes: float) -> str:
    return format_duration(minutes * 60)


_PERCENT = '{:.2f}'.format
# the one list of each table's columns: results.csv / .md and ablation.csv / .md are written from these.
# center_shift_median: median |final - initial centre| over all heads in grid units (empty without centres);
# top1 / top5 in float32: the same figures on any CPU, where bfloat16 depends on the CPU's arithmetic
RESULT_COLUMNS = (
    Column('model', 'model', 'l', '`{}`'.format), Column('dataset', 'dataset', 'l', lambda v: dataset_info(v).title),
    Column('epochs', 'epochs'), Column('parameters', 'parameters', cell='{:,}'.format),
    Column('macs_g', 'MACs (G)', cell='{:.3f}'.format), Column('top1', 'top-1 %', cell=_PERCENT),
    Column('top5', 'top-5 %', cell=_PERCENT), Column('eval_precision'),
    Column('train_minutes', 'training time', cell=_duration),
    Column('center_shift_median', 'median centre shift', cell=_dash(_PERCENT)),
    Column('amp', 'precision', 'l', lambda v: v or '-'),
    Column('pos_lr_scale', 'positional lr scale', cell='{:g}'.format),
    Column('paper_cifar10_top1', 'paper, CIFAR-10 top-1 %', cell=_dash(str)),
)
ABLATION_COLUMNS = (
    Column('variant', 'variant', 'l'), Column('run'), Column('model'), Column('dataset'), Column('epochs', 'epochs'),
    Column('pos_init'), Column('pos_lr_scale'), Column('amp'), Column('top1', 'top-1 %', cell=_PERCENT),
    Column('top5', 'top-5 %', cell=_PERCENT),
    Column('center_shift_median', 'median centre shift (grid units)', cell=_dash(_PERCENT)),
    Column('train_minutes', 'training time', cell=_duration),
)


def write_table(out: Path, stem: str, columns: Sequence[Column], rows: List[Dict[str, Any]], note: str = '') -> str:
    """``out/<stem>.csv`` (every column) and ``out/<stem>.md`` (the titled ones, then ``note``); the Markdown table
    (without the note: a caller that prints the table as it grows says the note once)."""
    with atomic_write(out / f'{stem}.csv') as tmp, open(tmp, 'w', encoding='utf-8', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=[column.name for column in columns])
        writer.writeheader()
        writer.writerows(rows)
    shown = [column for column in columns if column.title]
    markdown = markdown_table([column.title for column in shown],
                              [[column.cell(row[column.name]) for column in shown] for row in rows],
                              ''.join(column.align for column in shown)) + '\n'
    atomic_write_text(out / f'{stem}.md', markdown + (f'\n{note}\n' if note else ''))
    return markdown


def read_table(path: Path) -> List[Dict[str, Any]]:
    """The rows of a CSV that :func:`write_table` wrote, each cell as it was given: '' is None, numbers are numbers."""
    def cell(value: str) -> Any:
        if value == '':
            return None
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
        return value
    with open(path, encoding='utf-8', newline='') as f:
        return [{k: cell(v) for k, v in row.items()} for row in csv.DictReader(f)]


def write_zoo_explorer(folders: List[Path], path: Path, data_dir: Optional[str], title: str) -> Path:
    """``path``: the attention explorer page of the attention models among the Hub ``folders``; kept when it is
    newer than every folder's card."""
    from ..research.explorer import resolve_explorer_model, write_explorer
    folders = [f for f in folders if f.name.split('.')[0] in SA_MODEL_ARGS]
    newest = max(f.joinpath('README.md').stat().st_mtime for f in folders)
    if path.is_file() and path.stat().st_mtime >= newest:
        say(f'explorer: {path} up to date, skipped')
        return path
    write_explorer([resolve_explorer_model(str(f)) for f in folders], path, data_dir=data_dir, title=title)
    say(f'explorer: {path} ({path.stat().st_size / 1e6:.2f} MB); open it in a browser')
    return path
