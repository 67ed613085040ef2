""" Markdown tables: the one formatter of the results, ablation, benchmark, analysis, card and model tables; and
counted nouns and durations in the text around them """
from datetime import timedelta
from typing import Optional, Sequence

__all__ = ['markdown_table', 'plural', 'format_duration']


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]], align: Optional[str] = None,
                   pad: bool = False) -> str:
    """``header`` and ``rows`` (cells are str()-ed) as a Markdown table, no final newline; ``align`` is one letter
    per column, ``l`` or ``r``; ``pad`` widens every cell to its column for reading in a terminal."""
    cells = [[str(c) for c in row] for row in rows]
    if any(len(row) != len(header) for row in cells):
        raise ValueError(f'every row needs {len(header)} cells (the header\'s)')
    align = align or 'l' * len(header)
    widths = [max([len(h)] + [len(row[i]) for row in cells]) if pad else 0 for i, h in enumerate(header)]

    def line(values):
        return '| ' + ' | '.join(v.rjust(w) if a == 'r' else v.ljust(w)
                                 for v, w, a in zip(values, widths, align)) + ' |'

    rule = '|' + '|'.join('-' * max(3, w + 1) + (':' if a == 'r' else '-') for w, a in zip(widths, align)) + '|'
    return '\n'.join([line(header), rule] + [line(row) for row in cells])


def plural(count: int, noun: str) -> str:
    """``1 epoch``, ``2 epochs``: a count with its noun."""
    return f'{count} {noun}{"" if count == 1 else "s"}'


def format_duration(seconds: float) -> str:
    """``2.5 s`` below a minute, else H:MM:SS (whole seconds)."""
    return f'{seconds:.1f} s' if seconds < 60 else str(timedelta(seconds=int(seconds)))
