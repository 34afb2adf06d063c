"""The split/merge diagram learners draw by hand, drawn from a real run.

``draw(mha, query, key, value, path)`` runs a :class:`~headwise.MultiHeadAttention` once and
draws, for one example of the batch:

1. the inputs ``x`` (and a cross-attention's key/value inputs);
2. the projected ``Q``, ``K``, ``V`` matrices with each head's column block in its own colour
   (column block ``x`` of ``Q`` is head ``x``'s query: ``split heads`` is only a reshape);
3. each head's ``(i, j)`` attention weights, in the head's colour, masked keys hatched;
4. the merged heads ``(i, h*d)``: head ``x``'s output ``A_x V_x`` lands in column block ``x``;
5. the output projection ``(i, out_dim)``.

Every cell's shade is the real value from the run (normalised per matrix). Grouped-query
attention colours a key/value head like the first query head it serves and says which heads
share it.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from einops import rearrange

from headwise import masks as _masks
from headwise import observe
from headwise.heads import MERGE, SPLIT
from headwise.layers import MultiHeadAttention

__all__ = ["draw", "head_colors"]

_INK = "#263238"
_MUTED = "#607d8b"
_ARROW = "#78909c"
# Tableau-10 hues without grey; more heads cycle through evenly spaced HSV hues.
_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#bcbd22", "#17becf"]


def head_colors(h: int) -> list[str]:
    """One distinct colour per head (hex strings)."""
    if h <= len(_PALETTE):
        return _PALETTE[:h]
    import colorsys

    from matplotlib.colors import to_hex
    return [to_hex(colorsys.hsv_to_rgb(x / h, 0.7, 0.8)) for x in range(h)]


def draw(mha: MultiHeadAttention, query: torch.Tensor, key: torch.Tensor | None = None,
         value: torch.Tensor | None = None, path: str | Path = "heads.png", *,
         mask: torch.Tensor | None = None, valid_lens: torch.Tensor | None = None,
         causal: bool = False, example: int = 0, dpi: int = 150) -> Path:
    """Draw the split/merge diagram of ``mha`` on these inputs and write it to ``path``.

    Args:
        mha: the module (its real weights are used; it is run once in no-grad mode).
        query: ``(b, i, m)``; key ``(b, j, kdim)`` and value ``(b, j, vdim)`` default to it.
        mask, valid_lens, causal: as in :meth:`MultiHeadAttention.forward`.
        example: which batch example to draw.
        path: ``.png``, ``.svg`` or ``.pdf``.

    Returns:
        the written path.
    """
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if not isinstance(mha, MultiHeadAttention):
        raise TypeError(f"draw expects headwise.MultiHeadAttention, got {type(mha).__name__}")
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ValueError(f"diagram: unsupported file type {path.suffix!r} for {path}; use .png, "
                         ".svg or .pdf")
    cross = key is not None and key is not query
    key = query if key is None else key
    value = key if value is None else value
    if not 0 <= example < query.shape[0]:
        raise ValueError(f"diagram: example={example} but the batch has {query.shape[0]} "
                         "examples")
    run = _run(mha, query, key, value, mask, valid_lens, causal, example)
    fig = _figure(mha, run, cross, causal, plt)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, facecolor="white")
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------- the run
def _run(mha, query, key, value, mask, valid_lens, causal, b) -> dict[str, np.ndarray]:
    """Everything the picture shows, taken from one real forward pass."""
    captured = {}

    def keep(module, heads):  # heads (b, h, i, d); the merge of them is out_proj's input
        captured["merged"] = rearrange(heads, MERGE)
        return heads

    with torch.no_grad(), observe.observing(observe.Observer(heads=keep)):
        out, weights = mha(query, key, value, mask=mask, valid_lens=valid_lens, causal=causal,
                           return_weights=True)
        q, k, v = mha.q_proj(query), mha.k_proj(key), mha.v_proj(value)
    nq, nk = query.shape[1], key.shape[1]
    allowed = _masks.combine(
        mask, None if valid_lens is None else _masks.from_valid_lens(
            torch.as_tensor(valid_lens), nk, nq),
        _masks.causal(nq, nk, device=query.device) if causal else None)
    if allowed is None:
        allowed = torch.ones(nq, nk, dtype=torch.bool)
    elif allowed.dtype != torch.bool:
        allowed = torch.isfinite(allowed) & (allowed > -1e30)
    allowed = allowed.expand(query.shape[0], mha.num_heads, nq, nk)
    def as_np(t: torch.Tensor) -> np.ndarray:
        t = t[b].detach().cpu()
        return t.numpy() if t.dtype == torch.bool else t.float().numpy()

    return {"x": as_np(query), "key": as_np(key), "value": as_np(value), "q": as_np(q),
            "k": as_np(k), "v": as_np(v), "weights": as_np(weights),
            "allowed": as_np(allowed), "merged": as_np(captured["merged"]), "out": as_np(out)}


# ---------------------------------------------------------------------------- the figure
def _figure(mha, run, cross, causal, plt):
    L = _layout(mha, run)
    fig = plt.figure(figsize=(L.width, L.height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, L.width)
    ax.set_ylim(L.height, 0)
    ax.axis("off")
    c = _Canvas(ax, L.sy)
    colors = head_colors(mha.num_heads)
    # ---- title
    c.text(0.6, 0.45, f"{_describe(mha)}: where the heads are split and merged", size=14,
           fontweight="bold", va="center")
    c.text(0.6, 0.9, f"each colour is one head: its columns of W_q, W_k, W_v, its attention "
           f"weights, its block of the merged output.  "
           f"{'cross' if cross else 'self'}-attention"
           f"{', causal' if causal else ''}; shades are real values of one run",
           size=9.5, color=_MUTED, va="center")
    inputs = _draw_inputs(c, L, mha, run, cross)
    _draw_qkv(c, L, mha, run, cross, inputs, colors)
    _draw_weights(c, L, mha, run, colors)
    _draw_merge(c, L, mha, run, colors)
    return fig


def _layout(mha, run) -> SimpleNamespace:
    """Where everything goes. Units are inches at the final size: rows (positions) share one
    height, feature columns one width, so the same axis has the same size everywhere."""
    h, g, d = mha.num_heads, mha.num_kv_heads, mha.head_dim
    nq, nk = run["x"].shape[0], run["key"].shape[0]
    L = SimpleNamespace(nq=nq, nk=nk)
    L.sy = min(0.3, 2.1 / max(nq, nk))
    widest = max(mha.embed_dim, mha.kdim, mha.vdim, h * d, mha.out_dim)
    L.sx = min(0.3, 3.4 / widest)
    gap_y, gap_x = 1.05, 1.9
    L.rows_h = [nq * L.sy, nk * L.sy, nk * L.sy]
    L.col_top = col_top = 1.95
    L.row_y = [col_top, col_top + L.rows_h[0] + gap_y,
               col_top + L.rows_h[0] + L.rows_h[1] + 2 * gap_y]
    L.col_h = col_h = sum(L.rows_h) + 2 * gap_y
    L.x_in = 0.6
    L.x_qkv = L.x_in + max(mha.embed_dim, mha.kdim, mha.vdim) * L.sx + gap_x
    L.x_sc = L.x_qkv + max(h, g) * d * L.sx + gap_x
    # Score panels: a grid of h (i, j) matrices, as many rows as fit beside Q, K, V.
    cell = min(L.sy, 0.3)
    L.pw, L.ph = nk * cell, nq * cell
    grid_rows = max(1, min(h, int((col_h + 0.55) // (L.ph + 0.55))))
    L.grid_cols = math.ceil(h / grid_rows)
    grid_rows = math.ceil(h / L.grid_cols)
    L.pgap_x, L.pgap_y = 0.35, 0.55
    L.grid_w = L.grid_cols * L.pw + (L.grid_cols - 1) * L.pgap_x
    L.grid_h = grid_rows * L.ph + (grid_rows - 1) * L.pgap_y
    L.grid_top = col_top + (col_h - L.grid_h) / 2
    L.x_merge = L.x_sc + L.grid_w + gap_x
    L.merge_w = h * d * L.sx
    L.x_out = L.x_merge + L.merge_w + gap_x
    L.out_w = mha.out_dim * L.sx
    L.width = L.x_out + max(L.out_w, 1.9) + 0.5
    L.height = col_top + max(col_h, L.grid_h) + 1.2
    L.y_mid = col_top + (col_h - nq * L.sy) / 2
    return L


class _Canvas:
    """The drawing primitives: shaded matrices, head-coloured column blocks, text, arrows."""

    def __init__(self, ax, sy: float):
        self.ax, self.sy = ax, sy

    def matrix(self, data, x, y, w, hgt, cmap, *, vmin=None, vmax=None, edge=None, hatch=None,
               numbers=False):
        from matplotlib.patches import Rectangle

        lo = float(np.min(data)) if vmin is None else vmin
        hi = float(np.max(data)) if vmax is None else vmax
        self.ax.imshow(data, cmap=cmap, vmin=lo, vmax=hi if hi > lo else lo + 1,
                       extent=(x, x + w, y + hgt, y), interpolation="nearest", aspect="auto",
                       zorder=1)
        self._grid_and_hatch(data.shape, x, y, w, hgt, hatch)
        if numbers:
            self._numbers(data, x, y, w, hgt, lo, hi, hatch)
        self.ax.add_patch(Rectangle((x, y), w, hgt, fill=False, lw=1.3, edgecolor=edge or _INK,
                                    zorder=4))

    def _grid_and_hatch(self, shape, x, y, w, hgt, hatch):
        from matplotlib.collections import LineCollection, PatchCollection
        from matplotlib.patches import Rectangle

        r, c = shape
        if r <= 40 and c <= 40:  # cell grid where cells are big enough to count
            segs = [[(x, yy), (x + w, yy)] for yy in np.linspace(y, y + hgt, r + 1)[1:-1]]
            segs += [[(xx, y), (xx, y + hgt)] for xx in np.linspace(x, x + w, c + 1)[1:-1]]
            self.ax.add_collection(LineCollection(segs, colors="white", linewidths=0.6,
                                                  zorder=2))
        if hatch is not None:
            cells = [Rectangle((x + ci * w / c, y + ri * hgt / r), w / c, hgt / r)
                     for ri, ci in zip(*np.nonzero(hatch), strict=True)]
            self.ax.add_collection(PatchCollection(cells, facecolor="#eceff1",
                                                   edgecolor="#b0bec5", hatch="////",
                                                   linewidths=0.0, zorder=3))

    def _numbers(self, data, x, y, w, hgt, lo, hi, hatch):
        r, c = data.shape
        if not (w / c >= 0.27 and hgt / r >= 0.2):
            return
        span = (hi - lo) or 1.0
        for ri in range(r):
            for ci in range(c):
                if hatch is not None and hatch[ri, ci]:
                    continue
                dark = (data[ri, ci] - lo) / span > 0.45
                self.ax.text(x + (ci + 0.5) * w / c, y + (ri + 0.5) * hgt / r,
                             f"{data[ri, ci]:.2f}".lstrip("0"), ha="center", va="center",
                             fontsize=6.5, color="white" if dark else _INK, zorder=5)

    def blocks(self, data, x, y, heads, width_per_head, hcolors, labels):
        """A projection matrix with each head's column block shaded in the head's colour."""
        lo, hi = float(np.min(data)), float(np.max(data))
        per = data.shape[1] // heads
        for n in range(heads):
            part = data[:, n * per:(n + 1) * per]
            self.matrix(part, x + n * width_per_head, y, width_per_head, data.shape[0] * self.sy,
                        _ramp(hcolors[n]), vmin=lo, vmax=hi, edge=hcolors[n])
            if labels:
                label = labels[n] if width_per_head >= 0.09 * len(labels[n]) else f"{n}"
                self.ax.text(x + (n + 0.5) * width_per_head, y - 0.07, label, ha="center",
                             va="bottom", fontsize=8, color=hcolors[n], fontweight="bold")

    def text(self, x, y, s, size=10, color=_INK, **kw):
        self.ax.text(x, y, s, fontsize=size, color=color, **kw)

    def arrow(self, x0, y0, x1, y1, label=None, above=True, rad=0.0, color=_ARROW, lw=1.4):
        self.ax.annotate("", xy=(x1, y1), xytext=(x0, y0), zorder=0,
                         arrowprops=dict(arrowstyle="-|>", color=color, lw=lw, shrinkA=2,
                                         shrinkB=2, connectionstyle=f"arc3,rad={rad}"))
        if label:
            self.ax.text((x0 + x1) / 2, (y0 + y1) / 2 + (-0.08 if above else 0.1), label,
                         ha="center", va="bottom" if above else "top", fontsize=8.5,
                         color=_MUTED, bbox=dict(facecolor="white", edgecolor="none", pad=1.0),
                         zorder=6)


def _draw_inputs(c: _Canvas, L, mha, run, cross) -> list[tuple]:
    nq, nk = L.nq, L.nk
    if cross:
        inputs = [("query x", run["x"], mha.embed_dim, "m", L.row_y[0], nq),
                  ("key input", run["key"], mha.kdim, "kdim", L.row_y[1], nk),
                  ("value input", run["value"], mha.vdim, "vdim", L.row_y[2], nk)]
    else:
        inputs = [("x", run["x"], mha.embed_dim, "m", L.y_mid, nq)]
    for name, data, feat, fname, y, n in inputs:
        c.matrix(data, L.x_in, y, feat * L.sx, n * L.sy, _grey())
        pos = "i" if name.startswith(("query", "x")) else "j"
        c.text(L.x_in, y - 0.12, f"{name}  ({pos}={n}, {fname}={feat})", size=9.5, va="bottom")
    return inputs


def _draw_qkv(c: _Canvas, L, mha, run, cross, inputs, colors) -> None:
    h, g, d = mha.num_heads, mha.num_kv_heads, mha.head_dim
    nq, nk, sx, sy = L.nq, L.nk, L.sx, L.sy
    kv_colors = [colors[y * (h // g)] for y in range(g)]
    head_labels = [f"head {n}" for n in range(h)] if h <= 12 else None
    kv_labels = ([f"kv {y} → heads {y * (h // g)}–{(y + 1) * (h // g) - 1}" for y in range(g)]
                 if g != h else head_labels)
    specs = [("Q = x W_q", run["q"], h, colors, head_labels, "i", nq, "h", mha.embed_dim),
             ("K = " + ("key" if cross else "x") + " W_k", run["k"], g, kv_colors, kv_labels,
              "j", nk, "g" if g != h else "h", mha.kdim),
             ("V = " + ("value" if cross else "x") + " W_v", run["v"], g, kv_colors, kv_labels,
              "j", nk, "g" if g != h else "h", mha.vdim)]
    sources = inputs if cross else inputs * 3
    for (name, data, heads, hc, labels, pos, n, ax_name, fin), y, src in zip(
            specs, L.row_y, sources, strict=True):
        c.blocks(data, L.x_qkv, y, heads, d * sx, hc, labels)
        c.text(L.x_qkv, y - 0.42, f"{name}   ({pos}={n}, ({ax_name} d)={heads}·{d}="
               f"{heads * d})", size=10, va="bottom", fontweight="bold")
        _, _, src_feat, _, src_y, src_n = src
        c.arrow(L.x_in + src_feat * sx, src_y + src_n * sy / 2, L.x_qkv, y + n * sy / 2,
                f"W_{name[0].lower()}: {fin}×{heads * d}")
    split_note = f"split heads = {SPLIT}:\nhead x is column block x (no new parameters)"
    if g != h:
        split_note += (f"\n{g} key/value heads: kv head y serves query heads "
                       f"y·{h // g} … y·{h // g}+{h // g - 1}")
    c.text(L.x_qkv, L.row_y[2] + L.rows_h[2] + 0.25, split_note, size=8.5, color=_MUTED,
           va="top")


def _panel(L, x: int) -> tuple[float, float]:
    """Top-left corner of head ``x``'s weights panel."""
    r, col = divmod(x, L.grid_cols)
    return L.x_sc + col * (L.pw + L.pgap_x), L.grid_top + r * (L.ph + L.pgap_y)


def _draw_weights(c: _Canvas, L, mha, run, colors) -> None:
    h, g, d = mha.num_heads, mha.num_kv_heads, mha.head_dim
    wmax = float(np.max(run["weights"])) or 1.0
    for x in range(h):
        px, py = _panel(L, x)
        blocked = ~run["allowed"][x]
        c.matrix(run["weights"][x], px, py, L.pw, L.ph, _ramp(colors[x]), vmin=0.0, vmax=wmax,
                 edge=colors[x], hatch=blocked if blocked.any() else None, numbers=True)
        c.text(px + L.pw / 2, py - 0.06, f"head {x}", size=8.5, color=colors[x], ha="center",
               va="bottom", fontweight="bold")
    c.text(L.x_sc, L.grid_top - 0.42, f"weights A_x = softmax(q_x k_xᵀ/√{d})   (h={h}, "
           f"i={L.nq}, j={L.nk})", size=10, va="bottom", fontweight="bold")
    note = "rows: queries i, columns: keys j"
    if run["allowed"].size and not run["allowed"].all():
        note += "; hatched = masked (weight 0)"
    c.text(L.x_sc, L.grid_top + L.grid_h + 0.2, note, size=8.5, color=_MUTED, va="top")
    kv_w = g * d * L.sx
    k_label = "k_x" if g == h else f"k_(x // {h // g})"
    for x in range(h):  # every head gets its own q_x and k_x, in its colour
        px, py = _panel(L, x)
        c.arrow(L.x_qkv + h * d * L.sx, L.row_y[0] + L.rows_h[0] / 2, px, py + L.ph * 0.3,
                "q_x" if x == 0 else None, color=colors[x], lw=1.0)
        c.arrow(L.x_qkv + kv_w, L.row_y[1] + L.rows_h[1] / 2, px, py + L.ph * 0.7,
                k_label if x == 0 else None, above=False, color=colors[x], lw=1.0)


def _draw_merge(c: _Canvas, L, mha, run, colors) -> None:
    h, g, d = mha.num_heads, mha.num_kv_heads, mha.head_dim
    nq, sx, sy = L.nq, L.sx, L.sy
    head_labels = [f"head {n}" for n in range(h)] if h <= 12 else None
    merge_y = L.col_top + (L.col_h - nq * sy) / 2
    c.blocks(run["merged"], L.x_merge, merge_y, h, d * sx, colors, head_labels)
    c.text(L.x_merge, merge_y - 0.42, f"merged heads   (i={nq}, (h d)={h}·{d}={h * d})",
           size=10, va="bottom", fontweight="bold")
    c.text(L.x_merge, merge_y - 0.62, f"merge heads = {MERGE}: block x is A_x V_x", size=8.5,
           color=_MUTED, va="bottom")
    c.arrow(L.x_sc + L.grid_w, L.grid_top + L.grid_h / 2, L.x_merge, merge_y + nq * sy / 2,
            "A_x V_x")
    # V goes around the weights to the merged heads: the weights pick rows of each v_x
    y_v = L.row_y[2] + L.rows_h[2] / 2
    y_route = max(y_v, L.grid_top + L.grid_h + 0.75)
    x_turn, x_up = L.x_sc - 0.6, L.x_merge + L.merge_w * 0.5
    c.ax.plot([L.x_qkv + g * d * sx + 0.03, x_turn, x_turn, x_up], [y_v, y_v, y_route, y_route],
              color=_ARROW, lw=1.4, zorder=0, solid_joinstyle="round")
    c.arrow(x_up, y_route, x_up, merge_y + nq * sy, None)
    c.ax.text((x_turn + x_up) / 2, y_route + 0.08, "v_x  (A_x V_x: each query's weighted mix "
              "of the values)", ha="center", va="top", fontsize=8.5, color=_MUTED)
    # ---- output projection
    c.matrix(run["out"], L.x_out, merge_y, L.out_w, nq * sy, _grey())
    out_axis = "m" if mha.out_dim == mha.embed_dim else "out"
    c.text(L.x_out, merge_y - 0.42, f"output   (i={nq}, {out_axis}={mha.out_dim})", size=10,
           va="bottom", fontweight="bold")
    c.arrow(L.x_merge + L.merge_w, merge_y + nq * sy / 2, L.x_out, merge_y + nq * sy / 2,
            f"W_o: {h * d}×{mha.out_dim}")


def _grey():
    """The colormap of what belongs to no single head (inputs, output)."""
    return _ramp("#546e7a")


def _ramp(color: str):
    """A colormap from a pale tint of ``color`` to a dark shade of it."""
    from matplotlib.colors import LinearSegmentedColormap, to_rgb

    rgb = np.array(to_rgb(color))
    pale = 0.88 * np.ones(3) + 0.12 * rgb
    dark = 0.55 * rgb
    return LinearSegmentedColormap.from_list(color, [pale, rgb, dark])


def _describe(mha: MultiHeadAttention) -> str:
    parts = [f"{mha.embed_dim}", f"{mha.num_heads}", f"head_dim={mha.head_dim}"]
    parts += [f"{name}={size}" for name, size in mha.changed_sizes().items()]
    return f"MultiHeadAttention({', '.join(parts)})"
