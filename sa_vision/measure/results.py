""" Benchmark rows (:func:`~sa_vision.measure.benchmark.benchmark_variants`) as an aligned table, CSV or JSON

Columns: docs/performance.md, "What is measured". """
import csv
import io
import json
from typing import Any, Dict, Optional, Sequence

from ..errors import UserError
from ..tables import markdown_table

__all__ = ['TABLE_COLUMNS', 'RESULTS_FORMATS', 'format_results']

RESULTS_FORMATS = ('table', 'csv', 'json')

TABLE_COLUMNS = (
    'model', 'batch_size', 'train_samples_per_sec', 'infer_samples_per_sec', 'train_peak_mb', 'infer_peak_mb',
    'macs', 'param_count', 'train_ratio', 'infer_ratio', 'train_mem_ratio',
    'unavoidable_macs', 'train_unavoidable_gflops', 'matmul_gflops', 'matmul_fraction', 'infer_matmul_fraction',
)

# which way round the ratios are: a reader of the table has no docs at hand
RATIO_NOTE = ('ratios (rows after the first): train_ratio / infer_ratio = the first row\'s images/s over this '
              'row\'s, the median of rounds run back to back (> 1: the first is faster); train_mem_ratio = the first '
              'row\'s peak memory over this row\'s (< 1: the first needs less)')


def _fmt(value) -> str:
    if value is None:
        return ''
    if isinstance(value, float):
        if abs(value) >= 100:
            return f'{value:.1f}'
        return f'{value:.3f}'
    if isinstance(value, list):
        return ' '.join(_fmt(v) for v in value)
    return str(value)


def format_results(rows: Sequence[Dict[str, Any]], fmt: str = 'table', columns: Optional[Sequence[str]] = None) -> str:
    """Render result rows as an aligned text table (markdown pipes), CSV or JSON."""
    if fmt == 'json':
        return json.dumps(list(rows), indent=2)
    columns = list(columns or [c for c in TABLE_COLUMNS if any(c in r for r in rows)])
    if fmt == 'csv':  # every field, the table keeps to the main ones
        columns += [k for k in dict.fromkeys(k for r in rows for k in r) if k not in columns]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, extrasaction='ignore', lineterminator='\n')
        writer.writeheader()
        for r in rows:
            writer.writerow({c: _fmt(r.get(c)) if isinstance(r.get(c), list) else r.get(c, '') for c in columns})
        return buf.getvalue()
    if fmt != 'table':
        raise UserError(f'unknown format {fmt!r}; use one of {", ".join(RESULTS_FORMATS)}')
    table = markdown_table(columns, [[_fmt(r.get(c)) for c in columns] for r in rows], pad=True)
    return table + ('\n\n' + RATIO_NOTE if any(c.endswith('_ratio') for c in columns) else '')
