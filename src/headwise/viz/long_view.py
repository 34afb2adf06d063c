"""The long-document head view: one self-contained, offline HTML file for a whole document.

Made from a long-context profile (:class:`headwise.long.LongProfile`: block maps, distance
profiles, sink / local / received mass, each query block's top keys, head scores) and, for the
query rows asked for, exact per-token weights (from the weights-from-LSE path). The page
(``assets/long_view.js`` + ``.css``, inlined) shows:

- a layers x heads grid of block-map thumbnails on one shared log colour scale, sortable by any
  score (a sorted grid is a ranking, best first);
- one head opened: its block map, its distance profile, its received mass as a strip and as
  colour over the document's text (scrollable, tokens readable), the top keys of a chosen query
  block outlined in the text, and the exact tiles: the weights of each asked-for query row on
  every key, as a picture and as colour over the text.

Storage: per-head data (map, received mass, top keys, sparse exact rows) sit deflated in inert
``<script type="application/octet-stream">`` blocks at the end of the body and are inflated
when their head is opened; the header holds tokens, scores, distance profiles and pooled
thumbnails, so the grid paints first. A page that would exceed ``max_mb`` is made again with
fewer keys per exact row, then fewer, larger blocks, and says so at its top. Tokens are set as
text, never parsed as HTML; no request of any kind leaves the page.

Axis legend: ``l`` layers, ``h`` heads, ``I`` query blocks, ``J`` key blocks, ``D`` distance
bins, ``r`` exact query rows, ``j`` key positions, ``k`` top keys per query block.
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from headwise.viz import _long_store as store
from headwise.viz.display import HeadView, asset

__all__ = ["PLANS", "long_view"]

# (keys kept per exact row, block-map pooling factor), tried in order until the page fits
PLANS = ((256, 1), (64, 1), (16, 1), (16, 2), (8, 4), (4, 8))
THUMB = 32  # thumbnails: at most THUMB x THUMB blocks


def long_view(profile, path: str | os.PathLike | None = None, *,
              tiles: Mapping[str, tuple] | None = None, title: str | None = None,
              layer: int | None = None, head: int | None = None, sort: str | None = None,
              max_mb: float | None = 25.0, compress_level: int = 6) -> HeadView:
    """Make the long-document head view of ``profile``; write it to ``path`` when given.

    Returns a :class:`~headwise.viz.display.HeadView` (``.html``, ``.save(path)``; path-like
    once saved), shown inline and offline in Jupyter.

    Args:
        profile: a :class:`headwise.long.LongProfile` (read through its fields ``n``,
            ``block``, ``layers``, ``maps`` (l, h, I, J), ``distance`` (l, h, D),
            ``distance_edges`` (D + 1,), ``sink`` / ``local`` (l, h), ``received`` (l, h, j),
            ``topk_keys`` / ``topk_mass`` (l, h, I, k), ``scores`` {name: (l, h)} and
            ``tokens``).
        tiles: exact rows to draw, ``{label: (rows, weights)}``: ``rows`` the query positions
            (ints), ``weights`` one ``(h, r, j)`` (or ``(1, h, r, j)``) array per profiled
            layer, e.g. what :func:`headwise.hf.weights` returns for those rows.
        title: page title (default "headwise long-document view").
        layer, head: the head the page opens on (an index into ``profile.layers``; default:
            the head with the largest first score).
        sort: the score the grid opens sorted by (default: layer order).
        max_mb: the file's size budget; ``None``: no budget.
        compress_level: zlib level (1 fastest .. 9 smallest).
    """
    if path is not None and Path(path).suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"long_view path {str(path)!r} must end in .html (e.g. long.html)")
    p = _checked_profile(profile)
    checked_tiles = _checked_tiles(tiles, p)
    meta = _meta(p, checked_tiles, title, layer, head, sort)
    view = HeadView(_fitted_page(meta, p, checked_tiles, max_mb, compress_level), height=900)
    return view if path is None else view.save(path)


# ----------------------------------------------------------------------------- checking

def _array(profile, name: str, ndim: int) -> np.ndarray:
    value = getattr(profile, name, None)
    if value is None:
        raise TypeError(f"long_view expects a headwise.long.LongProfile; "
                        f"{type(profile).__name__} has no {name!r}")
    a = torch.as_tensor(value).detach().to("cpu").numpy() if not isinstance(value, np.ndarray) \
        else value
    if a.ndim != ndim:
        raise ValueError(f"profile.{name} must have {ndim} axes, got shape {a.shape}")
    return a


def _checked_profile(profile) -> dict:
    p = {name: _array(profile, name, nd) for name, nd in
         (("maps", 4), ("distance", 3), ("distance_edges", 1), ("sink", 2), ("local", 2),
          ("received", 3), ("topk_keys", 4), ("topk_mass", 4))}
    n, block = int(profile.n), int(profile.block)
    tokens = [str(t) for t in profile.tokens]
    l, h, blocks, _ = p["maps"].shape
    if len(tokens) != n or p["received"].shape != (l, h, n):
        raise ValueError(f"profile has n={n} but {len(tokens)} tokens and received mass of "
                         f"shape {p['received'].shape}; expected ({l}, {h}, {n})")
    if blocks != math.ceil(n / block) or p["maps"].shape[3] != blocks:
        raise ValueError(f"profile.maps has shape {p['maps'].shape}; n={n} in blocks of {block}"
                         f" needs ({l}, {h}, {math.ceil(n / block)}, {math.ceil(n / block)})")
    for name in ("maps", "distance", "received", "topk_mass"):
        if not np.isfinite(p[name]).all() or (p[name] < 0).any():
            raise ValueError(f"profile.{name} must hold finite, non-negative masses")
    scores = {str(k): _array_of(v, (l, h), k) for k, v in dict(profile.scores).items()}
    for name in ("sink", "local"):
        scores.setdefault(name, p[name].astype(np.float64))
    layers = [int(x) for x in getattr(profile, "layers", range(l))]
    return {**p, "n": n, "block": block, "tokens": tokens, "shape": (l, h, blocks),
            "scores": scores, "layers": layers}


def _array_of(value, shape: tuple, name: str) -> np.ndarray:
    a = np.asarray(torch.as_tensor(value).detach().to("cpu", torch.float64))
    if a.shape != shape:
        raise ValueError(f"profile.scores[{name!r}] has shape {a.shape}; expected {shape} "
                         "(layers, heads)")
    return a


def _checked_tiles(tiles, p: dict) -> list[dict]:
    if tiles is None:
        return []
    if not isinstance(tiles, Mapping):
        raise TypeError("tiles must be {label: (rows, per-layer (h, r, j) weights)}, got "
                        f"{type(tiles).__name__}")
    l, h, _ = p["shape"]
    out = []
    for label, (rows, weights) in tiles.items():
        rows = [int(r) for r in rows]
        if not rows or any(not 0 <= r < p["n"] for r in rows):
            raise ValueError(f"tiles[{label!r}]: rows must be positions in 0..{p['n'] - 1}, "
                             f"got {len(rows)} rows from {min(rows, default=None)}")
        if len(weights) != l:
            raise ValueError(f"tiles[{label!r}] has {len(weights)} layers of weights; the "
                             f"profile has {l} (one (h, r, j) array per profiled layer)")
        per_layer = []
        for i, w in enumerate(weights):
            a = np.asarray(torch.as_tensor(w).detach().to("cpu", torch.float32))
            a = a[0] if a.ndim == 4 and a.shape[0] == 1 else a
            if a.shape != (h, len(rows), p["n"]):
                raise ValueError(f"tiles[{label!r}] layer {i} weights have shape {a.shape}; "
                                 f"expected ({h}, {len(rows)}, {p['n']}) (heads, rows, keys)")
            per_layer.append(a)
        out.append({"label": str(label), "rows": rows, "weights": per_layer})
    return out


# ----------------------------------------------------------------------------- header

def _meta(p: dict, tiles: list[dict], title, layer, head, sort) -> dict:
    l, h, blocks = p["shape"]
    names = list(p["scores"])
    if sort is not None and sort not in names:
        raise ValueError(f"sort={sort!r} is not a score of this profile; choose one of {names}")
    first = p["scores"][names[0]]
    best = np.unravel_index(int(np.nanargmax(np.where(np.isfinite(first), first, -np.inf))),
                            first.shape) if np.isfinite(first).any() else (0, 0)
    layer = int(best[0]) if layer is None else layer
    head = int(best[1]) if head is None else head
    if not (0 <= layer < l and 0 <= head < h):
        raise ValueError(f"layer={layer}, head={head} is outside the profile's {l} layers x {h}"
                         f" heads (layer is an index into profile.layers {p['layers']})")
    map_top, recv_top = float(p["maps"].max()), float(p["received"].max())
    return {
        "title": title or "headwise long-document view", "n": p["n"], "block": p["block"],
        "blocks": blocks, "layers": p["layers"], "heads": h, "tokens": p["tokens"],
        "scores": {k: [[_finite(x) for x in row] for row in v.tolist()]
                   for k, v in p["scores"].items()},
        "distance": np.round(p["distance"].astype(np.float64), 6).tolist(),
        "distanceEdges": [int(e) for e in p["distance_edges"]],
        "topk": int(p["topk_keys"].shape[3]), "decades": store.DECADES,
        "mapTop": map_top, "recvTop": recv_top, "thumbs": _thumbs(p, map_top),
        "tiles": [{"label": t["label"], "rows": t["rows"]} for t in tiles],
        "initial": {"layer": layer, "head": head, "sort": sort},
    }


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _thumbs(p: dict, top: float) -> dict:
    l, h, blocks = p["shape"]
    factor = max(1, math.ceil(blocks / THUMB))
    pooled = store.pool_maps(p["maps"], p["n"], p["block"], factor)
    q = store.log_quantise(pooled, top)
    return {"size": int(pooled.shape[-1]), "data": store.pack([q], 9)}


# ----------------------------------------------------------------------------- blocks

def _head_blocks(p: dict, factor: int, level: int) -> list[str]:
    """One ``m/l/h`` block per head: the map (uint8, log scale) pooled by ``factor``, the
    received mass (uint8, log scale), the top keys (int32) and their masses (float32)."""
    maps = store.pool_maps(p["maps"], p["n"], p["block"], factor)
    qm = store.log_quantise(maps, float(p["maps"].max()))
    qr = store.log_quantise(p["received"], float(p["received"].max()))
    keys = p["topk_keys"].astype(np.int32)
    mass = p["topk_mass"].astype(np.float32)
    l, h, _ = p["shape"]
    jobs = [(f"m/{a}/{b}", [qm[a, b], qr[a, b], _pad4(qm[a, b].size + qr[a, b].size),
                            keys[a, b], mass[a, b]]) for a in range(l) for b in range(h)]
    return _blocks(jobs, level)


def _tile_blocks(p: dict, tiles: list[dict], cap: int, level: int) -> tuple[list[str], list]:
    """One ``t/l/h`` block per head holding every tile's sparse rows (see
    :func:`headwise.viz._long_store.sparse_rows`); returns the blocks and each tile's
    per-head ``[count of keys kept, mass left out]`` summary rows for the header."""
    if not tiles:
        return [], []
    l, h, _ = p["shape"]
    jobs, summary = [], [[[None] * h for _ in range(l)] for _ in tiles]
    for a in range(l):
        for b in range(h):
            parts = []
            for t, tile in enumerate(tiles):
                s = store.sparse_rows(tile["weights"][a][b], cap)
                parts += [s["rowmax"], s["counts"], s["values"], s["keys"]]
                summary[t][a][b] = float(s["rest"].max())
            jobs.append((f"t/{a}/{b}", parts))
    return _blocks(jobs, level), summary


def _pad4(nbytes: int) -> np.ndarray:
    return np.zeros((-nbytes) % 4, dtype=np.uint8)


def _blocks(jobs: list[tuple[str, list]], level: int) -> list[str]:
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:  # zlib frees the GIL
        data = list(pool.map(lambda job: store.pack(job[1], level), jobs))
    return [f'<script type="application/octet-stream" data-key="{key}">{d}</script>'
            for (key, _), d in zip(jobs, data, strict=True)]


def _fitted_page(meta: dict, p: dict, tiles: list[dict], max_mb, level: int) -> str:
    """The page at the first plan of :data:`PLANS` whose file fits ``max_mb`` (the last when
    none does); ``meta["budget"]`` says which, and the page says when it had to coarsen."""
    head_cache, tile_cache = {}, {}
    for step, (cap, factor) in enumerate(PLANS):
        factor = min(factor, meta["blocks"])
        if factor not in head_cache:
            head_cache[factor] = _head_blocks(p, factor, level)
        if cap not in tile_cache:
            tile_cache[cap] = _tile_blocks(p, tiles, cap, level)
        blocks, rest = tile_cache[cap]
        meta["mapBlocks"] = math.ceil(meta["blocks"] / factor)
        meta["budget"] = {"mb": max_mb, "cap": cap, "factor": factor, "coarsened": step > 0,
                          "tileRest": rest}
        page = _page(meta, head_cache[factor] + blocks)
        if max_mb is None or len(page.encode("utf-8")) <= max_mb * 1e6:
            return page
        if step == len(PLANS) - 1:
            meta["budget"]["over"] = True
            return _page(meta, head_cache[factor] + blocks)
    raise AssertionError("unreachable")


def _page(meta: dict, blocks: Sequence[str]) -> str:
    # "<" escaped so no token can close the <script> element
    text = json.dumps(meta, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:;\">",
        f"<title>{html.escape(meta['title'])}</title><style>{asset('long_view.css')}</style>",
        "</head>\n<body>", f'<script type="application/json" id="hl-meta">{text}</script>\n',
        f"<script>{asset('long_view.js')}</script>\n", "\n".join(blocks),
        "\n<script>window.headwiseLong && window.headwiseLong._dataLoaded();</script>",
        "</body></html>\n"])
