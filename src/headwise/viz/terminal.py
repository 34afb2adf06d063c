"""One head's attention as a small heatmap in the terminal (rich): rows = queries, columns =
keys, each cell a shade from white (0) to dark blue (the largest weight shown), on the same
Blues ramp as the head view and the PNG heatmaps."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from rich.console import Group
from rich.table import Table
from rich.text import Text

__all__ = ["terminal_heatmap"]

# matplotlib's Blues at 0, 1/8, ..., 1 (the head view's ramp)
_BLOCKS = " ░▒▓█"  # the same scale without colour (a pipe, a log file)
_BLUES = [(247, 251, 255), (222, 235, 247), (198, 219, 239), (158, 202, 225), (107, 174, 214),
          (66, 146, 198), (33, 113, 181), (8, 81, 156), (8, 48, 107)]


def _shade(v: float) -> str:
    t = min(max(v, 0.0), 1.0) * (len(_BLUES) - 1)
    i = min(int(t), len(_BLUES) - 2)
    f = t - i
    r, g, b = (round(a * (1 - f) + c * f) for a, c in zip(_BLUES[i], _BLUES[i + 1], strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def terminal_heatmap(weights, query_tokens: Sequence[str], key_tokens: Sequence[str], *,
                     title: str | None = None) -> Group:
    """``weights`` ``(i, j)`` (one head, one example) as shaded cells, for ``console.print``.

    ``console.print(terminal_heatmap(w, q, k))``; each row is labelled with its query token,
    each column with its key token, and the caption gives the scale (0 .. largest weight)."""
    w = torch.as_tensor(weights).detach().to("cpu", torch.float32).numpy()
    if w.ndim != 2:
        raise ValueError(f"weights must be one head's (i, j) matrix, got shape {w.shape}; pick "
                         "an example and a head first, e.g. att['cross'][layer][0, head]")
    if (len(query_tokens), len(key_tokens)) != w.shape:
        raise ValueError(f"{len(query_tokens)} query and {len(key_tokens)} key tokens for "
                         f"weights of shape {w.shape}; give one token per row and per column")
    top = float(w.max()) if w.size and np.isfinite(w).all() and w.max() > 0 else 1.0
    table = Table(box=None, padding=(0, 0), show_edge=False)
    table.add_column("", justify="right", no_wrap=True)
    for k in key_tokens:
        table.add_column(Text(str(k)[:2], justify="center"), justify="center", width=2,
                         no_wrap=True)
    for q, row in zip(query_tokens, w, strict=True):
        cells = [Text(_BLOCKS[round(v / top * (len(_BLOCKS) - 1))] * 2, style=_shade(v / top))
                 for v in row.tolist()]
        table.add_row(Text(f"{q} ", style="bold"), *cells)
    caption = Text(f"shade: 0 (light) .. {top:.2f} (dark); rows = queries, columns = keys",
                   style="dim")
    return Group(*([Text(title, style="bold")] if title else []), table, caption)
