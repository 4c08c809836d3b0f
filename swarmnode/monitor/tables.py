"""Tables that fit an 80-column terminal: two values stacked per cell, light borders, folding, never ``…``.

Every table the CLI prints (``top`` of a swarm, ``peers``, ``report``, the ``swarm up`` view) is built here or with
:func:`narrow_table`: a wide row of N values becomes N/2 columns of two stacked lines each (the header likewise:
``"step\\nupdated"``), so that a row keeps all its values at 80 columns, and a cell too long for its column folds
onto the next line instead of being cut to ``…``.
"""

from __future__ import annotations

from typing import Any, Sequence

from rich import box
from rich.table import Table
from rich.text import Text


def narrow_table(title: str | None, headers: Sequence[str], left: Sequence[str] = ()) -> Table:
    """A table for 80 columns: simple horizontal rules, one space between columns, cells fold (never ``…``).

    Args:
        title: shown above (wrapped when longer than the width).
        headers: column headers; ``"a\\nb"`` stacks two names in one column.
        left: headers justified left (the others right).
    """
    t = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, collapse_padding=True)
    for h in headers:
        t.add_column(h, justify="left" if h in left else "right", overflow="fold")
    return t


def stack(a: Any, b: Any) -> Text:
    """Two values in one cell, one per line (plain text: cells from peers are hostile input, never markup)."""
    out = a.copy() if isinstance(a, Text) else Text(str(a))
    out.append("\n")
    out.append_text(b if isinstance(b, Text) else Text(str(b)))
    return out
