"""Static per-head heatmaps: a matplotlib grid with rows = layers and columns = heads.

Drawn on a bare :class:`matplotlib.figure.Figure` with the Agg canvas, so it never touches
pyplot's global state or needs a display.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from headwise import limits
from headwise.viz.display import Heatmaps
from headwise.viz.inputs import layer_list

__all__ = ["heatmaps"]

MAX_LABELLED_TOKENS = 48  # above this, ticks show positions instead of every token
MAX_CELLS = 384  # longer axes are max-pooled to this many cells (a panel is <= ~420 px wide)


def heatmaps(weights, *, query_tokens: Sequence[str] | None, key_tokens: Sequence[str] | None,
             path: str | os.PathLike | None = None, layers: Sequence[int] | None = None,
             heads: Sequence[int] | None = None, title: str | None = None,
             cmap: str = "Blues", dpi: int = 130) -> Heatmaps:
    """Draw a grid of attention heatmaps (rows = layers, columns = heads); save it as PNG, SVG
    or PDF when ``path`` is given. In Jupyter the result displays inline (``_repr_png_``).

    Args:
        weights: ``(layers, heads, i, j)`` tensor/array, or a list over layers of ``(h, i, j)``
            tensors (batch already chosen; ``None`` entries for unrecorded layers are skipped).
        query_tokens: ``i`` labels for the rows of each heatmap (``None``: positions).
        key_tokens: ``j`` labels for the columns (``None``: positions).
        path: output file; the format comes from the extension (``.png``, ``.svg``, ``.pdf``).
            ``None``: not written (``.save(path)`` later, or display it in a notebook).
        layers, heads: indices to draw (default all), in the order given.
        title: optional figure title.
        cmap: matplotlib colormap; the default runs light (0) to dark (max).
        dpi: resolution of PNG output.

    Returns:
        A :class:`~headwise.viz.display.Heatmaps` (``.figure``, ``.path``, ``.png()``; path-like
        once saved). Each panel is titled ``L{l} H{h}``; one colour bar is shared by all
        panels (0 to the largest weight shown).
    """
    if path is not None and Path(path).suffix.lower() not in Heatmaps.FORMATS:
        raise ValueError(f"heatmaps path {str(path)!r} has extension {Path(path).suffix!r}; "
                         f"expected one of {sorted(Heatmaps.FORMATS)} (e.g. heads.png)")
    per_layer, layers, heads = _chosen(weights, layers, heads)
    n_i, n_j = per_layer[layers[0]].shape[1:]
    q_labels = _labels("query_tokens", query_tokens, n_i)
    k_labels = _labels("key_tokens", key_tokens, n_j)
    fig = _draw(per_layer, layers, heads, q_labels, k_labels, (n_i, n_j), title=title, cmap=cmap)
    result = Heatmaps(fig, dpi=dpi)
    return result if path is None else result.save(path)


def _chosen(weights, layers, heads) -> tuple[list, list[int], list[int]]:
    """``(weights per layer, layers, heads)`` to draw, every choice checked: recorded layers, a
    grid no larger than the panel limit, one ``(i, j)`` for all layers, heads that exist."""
    per_layer = _as_layer_list(weights)
    layers = _pick("layers", layers, [l for l, w in enumerate(per_layer) if w is not None])
    for l in layers:
        if per_layer[l] is None:
            raise ValueError(f"layer {l} has no recorded weights (None); drop it from layers=")
    n_heads = max(per_layer[l].shape[0] for l in layers)
    heads = _pick("heads", heads, list(range(n_heads)))
    if len(layers) * len(heads) > limits.MAX["panels"]:
        raise ValueError(f"heatmaps: {len(layers)} layers x {len(heads)} heads = "
                         f"{len(layers) * len(heads)} panels, over the maximum "
                         f"{limits.MAX['panels']} for one figure; pick some with layers= and "
                         "heads=")
    n_i, n_j = per_layer[layers[0]].shape[1:]
    for l in layers:
        if per_layer[l].shape[1:] != (n_i, n_j):
            raise ValueError(f"layer {l} weights are {tuple(per_layer[l].shape)}, but layer "
                             f"{layers[0]} gives (i, j) = ({n_i}, {n_j}); all layers must match")
        if max(heads) >= per_layer[l].shape[0]:
            raise ValueError(f"heads={list(heads)} asks for head {max(heads)} but layer {l} has "
                             f"{per_layer[l].shape[0]} heads")
    return per_layer, layers, heads


def _draw(per_layer, layers, heads, q_labels, k_labels, size, *, title, cmap) -> Figure:
    """The grid of ``size = (i, j)`` panels (rows = layers, columns = heads) on one colour scale,
    0 to the largest weight shown, and its colour bar."""
    n_i, n_j = size
    vmax = max(float(per_layer[l][heads].max()) for l in layers) or 1.0
    # Fixed layout in inches (matplotlib's constrained layout costs seconds for big grids).
    panel = float(np.clip(0.16 * max(n_i, n_j), 1.7, 3.2))  # heatmap side
    gap_w, gap_h = 0.15, 0.32  # between panels; the vertical gap holds each "L{l} H{h}" title
    left = 0.45 + _label_inches(q_labels)
    bottom = 0.4 + _label_inches(k_labels)
    top, right = 0.35 + 0.35 * bool(title), 1.15
    n_rows, n_cols = len(layers), len(heads)
    width = left + n_cols * panel + (n_cols - 1) * gap_w + right
    height = top + n_rows * panel + (n_rows - 1) * gap_h + bottom
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    axes = fig.subplots(n_rows, n_cols, squeeze=False, gridspec_kw=dict(
        left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
        wspace=gap_w / panel, hspace=gap_h / panel))
    image = None
    for r, l in enumerate(layers):
        for c, h in enumerate(heads):
            ax = axes[r, c]
            image = ax.imshow(_pool(per_layer[l][h], MAX_CELLS), cmap=cmap, vmin=0.0,
                              vmax=vmax, interpolation="nearest", aspect="auto",
                              extent=(-0.5, n_j - 0.5, n_i - 0.5, -0.5))
            ax.set_title(f"L{l} H{h}", fontsize=9, pad=3)
            for spine in ax.spines.values():
                spine.set_edgecolor("#9aa3ad")
            _ticks(ax, q_labels, k_labels, first_col=c == 0, last_row=r == len(layers) - 1)
    axes[-1, 0].set_xlabel("key", fontsize=8)
    axes[-1, 0].set_ylabel("query", fontsize=8)
    grid_h = n_rows * panel + (n_rows - 1) * gap_h
    bar_h = min(grid_h, max(1.5, 0.6 * grid_h))
    bar_ax = fig.add_axes(((width - right + 0.25) / width, (bottom + (grid_h - bar_h) / 2) / height,
                           0.14 / width, bar_h / height))
    bar = fig.colorbar(image, cax=bar_ax)
    bar.set_label("attention weight", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    if title:
        fig.suptitle(title, fontsize=11, y=1 - 0.15 / height, va="top")
    return fig


def _label_inches(labels) -> float:
    """Room for tick labels: tokens when they are shown, else position numbers."""
    if labels is None or len(labels) > MAX_LABELLED_TOKENS:
        return 0.3
    return min(1.4, 0.12 + 0.065 * max(len(t) for t in labels))


def _pool(m: np.ndarray, size: int) -> np.ndarray:
    """Max-pool an (i, j) matrix to at most size x size cells: a panel has fewer pixels than a
    long sequence has positions, and max (unlike the renderer's averaging) keeps sharp peaks."""
    for axis in (0, 1):
        n = m.shape[axis]
        if n > size:
            m = np.maximum.reduceat(m, np.linspace(0, n, size + 1).astype(int)[:-1], axis=axis)
    return m


def _ticks(ax, q_labels, k_labels, *, first_col: bool, last_row: bool) -> None:
    for labels, axis in ((q_labels, ax.yaxis), (k_labels, ax.xaxis)):
        if labels is not None and len(labels) <= MAX_LABELLED_TOKENS:
            axis.set_ticks(range(len(labels)))
            axis.set_ticklabels(labels, fontsize=7)
        ax.tick_params(axis="both", length=2, labelsize=7)
    ax.tick_params(axis="x", labelrotation=90, labelbottom=last_row)
    ax.tick_params(axis="y", labelleft=first_col)


def _labels(name: str, tokens, n: int) -> list[str] | None:
    if tokens is None:
        return None
    if isinstance(tokens, str) or not isinstance(tokens, Sequence):
        raise TypeError(f"{name} must be a list of {n} strings, got {type(tokens).__name__}")
    if len(tokens) != n:
        raise ValueError(f"{name} has {len(tokens)} labels but the weights have {n} positions "
                         "on that axis; pass one label per position")
    return [_display(str(t)) for t in tokens]


def _display(token: str) -> str:
    """Make whitespace tokens visible in labels."""
    token = token.replace("\n", "⏎")
    return "␣" * len(token) if token.strip() == "" else token


def _pick(name: str, chosen, available: list[int]) -> list[int]:
    if chosen is None:
        return available
    chosen = [int(x) for x in chosen]
    bad = [x for x in chosen if x not in available]
    if not chosen or bad:
        raise ValueError(f"{name}={chosen} must be a non-empty subset of {available}")
    return chosen


def _as_layer_list(weights) -> list[np.ndarray | None]:
    out: list[np.ndarray | None] = []
    for l, t in enumerate(layer_list(weights, ranks=(3,), shape="(h, i, j)",
                                     hint="; pick one example first (w[0] of a layer, w[:, 0] of a "
                                          "stack)")):
        a = None if t is None else t.to("cpu", torch.float32).numpy()
        if a is not None and 0 in a.shape:
            raise ValueError(f"layer {l} weights have shape {a.shape} = (h, i, j): no head or "
                             "no position, nothing to draw")
        if a is not None and not np.isfinite(a).all():
            raise ValueError(f"layer {l} weights contain NaN or inf")
        out.append(a)
    if all(w is None for w in out):
        raise ValueError("every layer is None: nothing to draw (record weights with "
                         "return_weights=True)")
    return out

