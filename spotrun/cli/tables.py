"""Tables that fit a real terminal: whole ids, low-priority columns dropped before any cell is cut.

Each column has a priority (0 = always shown). At the console's width (a pipe or
`COLUMNS` unset: 80) the lowest-priority columns go first, and a note names them;
`--wide` shows every column whatever the width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table

# Rich's default box: one border and two padding characters per column, one at the end.
_PER_COLUMN = 3


@dataclass(frozen=True)
class Column:
    """One table column: its key in the rows, header, priority (0 = never dropped)."""

    key: str
    header: str
    priority: int = 0
    justify: str = "left"


def _width(col: Column, rows: Sequence[dict[str, str]]) -> int:
    cells = [len(str(r.get(col.key, ""))) for r in rows]
    return max([len(col.header)] + cells)


def fit_columns(columns: Sequence[Column], rows: Sequence[dict[str, str]], width: int,
                wide: bool = False) -> tuple[list[Column], list[Column]]:
    """(shown, dropped): drop the lowest priorities (rightmost first) until the table fits."""
    shown = list(columns)
    if wide:
        return shown, []
    dropped: list[Column] = []
    while True:
        total = sum(_width(c, rows) + _PER_COLUMN for c in shown) + 1
        if total <= width:
            return shown, dropped
        candidates = [c for c in shown if c.priority > 0]
        if not candidates:
            return shown, dropped
        worst = max(candidates, key=lambda c: (c.priority, shown.index(c)))
        shown.remove(worst)
        dropped.append(worst)


def print_table(console: Console, title: str | None, columns: Sequence[Column],
                rows: Sequence[dict[str, str]], *, wide: bool = False,
                bold_rows: Sequence[int] = (), row_styles: Sequence[str | None] = (),
                sections_after: Sequence[int] = ()) -> None:
    """Print rows (key -> cell text) as a table that fits console.width (or all, with wide).

    row_styles: a rich style per row (overrides bold_rows); sections_after: row indexes
    followed by a rule (a reference row above the ranked ones, say).
    """
    shown, dropped = fit_columns(columns, rows, console.width, wide)
    t = Table(title=title)
    for c in shown:
        # Cells never wrap or elide: what does not fit was dropped as a whole column.
        t.add_column(c.header, justify=c.justify, no_wrap=True,  # type: ignore[arg-type]
                     min_width=_width(c, rows))
    for i, r in enumerate(rows):
        style = row_styles[i] if i < len(row_styles) else ("bold" if i in bold_rows else None)
        t.add_row(*[str(r.get(c.key, "")) for c in shown], style=style,
                  end_section=i in sections_after)
    if wide:
        Console(width=max(console.width, sum(_width(c, rows) + _PER_COLUMN for c in shown) + 1),
                file=console.file, force_terminal=console.is_terminal,
                no_color=console.no_color).print(t)
    else:
        console.print(t)
    if dropped:
        console.print(f"(not shown at {console.width} columns: "
                      f"{', '.join(c.header for c in dropped)}; --wide shows all)",
                      style="dim", highlight=False)


def cells(values: dict[str, Any]) -> dict[str, str]:
    """Row values as text ('-' for None)."""
    return {k: "-" if v is None else str(v) for k, v in values.items()}
