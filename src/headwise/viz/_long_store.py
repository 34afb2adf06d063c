"""How the long-document view stores numbers inside its page: masses on one log scale in uint8,
block maps pooled to fewer blocks, exact rows of weights kept sparse, bytes deflated in base64.

Axis legend: ``l`` layers, ``h`` heads, ``I`` query blocks, ``J`` key blocks, ``r`` query rows
of an exact tile, ``j`` key positions.
"""

from __future__ import annotations

import base64
import zlib

import numpy as np

__all__ = ["DECADES", "log_quantise", "log_value", "pack", "pool_maps", "sparse_rows"]

DECADES = 6  # a log scale spans top * 10**-DECADES .. top; below it is stored as 0


def log_quantise(x: np.ndarray, top: float, decades: int = DECADES) -> np.ndarray:
    """Non-negative masses -> uint8 on one log scale: 0 below ``top * 10**-decades``, else
    ``1 + round(254 * (log10(x / top) + decades) / decades)`` (relative error <=
    ``10**(decades / 508) - 1``, 2.8% for 6 decades). :func:`log_value` inverts it."""
    x = np.asarray(x, dtype=np.float64)
    if top <= 0:
        return np.zeros(x.shape, dtype=np.uint8)
    with np.errstate(divide="ignore"):
        t = (np.log10(np.maximum(x, 0.0) / top) + decades) / decades
    q = np.where(t >= 0, 1 + np.rint(np.clip(t, 0.0, 1.0) * 254), 0)
    return q.astype(np.uint8)


def log_value(q: np.ndarray, top: float, decades: int = DECADES) -> np.ndarray:
    """The masses :func:`log_quantise` stored as ``q`` (0 -> 0)."""
    q = np.asarray(q, dtype=np.float64)
    return np.where(q > 0, top * 10.0 ** ((q - 1) / 254 * decades - decades), 0.0)


def pool_maps(maps: np.ndarray, n: int, block: int, factor: int) -> np.ndarray:
    """Block maps ``(..., I, J)`` of ``block``-token blocks over ``n`` tokens to blocks of
    ``factor * block`` tokens, exactly: a coarse row is the query-weighted mean of its rows (the
    last block may be short), a coarse column the sum of its columns."""
    if factor == 1:
        return np.asarray(maps, dtype=np.float64)
    blocks = maps.shape[-2]
    sizes = np.minimum(block, n - block * np.arange(blocks)).astype(np.float64)
    edges = np.arange(0, blocks, factor)
    summed = np.add.reduceat(np.asarray(maps, np.float64), edges, axis=-1)
    weighted = np.add.reduceat(summed * sizes[:, None], edges, axis=-2)
    return weighted / np.add.reduceat(sizes, edges)[:, None]


def sparse_rows(w: np.ndarray, cap: int, cover: float = 0.999) -> dict:
    """Exact rows ``(r, j)`` kept sparse: each row's largest weights, in falling order, until
    they hold ``cover`` of the row's mass or ``cap`` keys. Returns ``counts`` (r,) uint16,
    ``keys`` (sum counts,) uint16 or uint32 (by ``j``), ``values`` uint16 with
    ``weight = value / 65535 * rowmax`` (error <= rowmax / 131070), ``rowmax`` float32 and
    ``rest``, the mass of each row's keys left out."""
    w = np.asarray(w, dtype=np.float64)
    order = np.argsort(-w, axis=1, kind="stable")[:, :cap]
    top = np.take_along_axis(w, order, axis=1)
    total = w.sum(axis=1)
    # keep key t while the mass before it is short of cover (so at least one key per row)
    before = np.cumsum(top, axis=1) - top
    keep = before < cover * total[:, None]
    counts = keep.sum(axis=1)
    rowmax = top[:, 0] if top.shape[1] else np.zeros(w.shape[0])
    safe = np.where(rowmax > 0, rowmax, 1.0)[:, None]
    values = np.rint(np.clip(top / safe, 0.0, 1.0) * 65535).astype(np.uint16)
    dtype = np.uint16 if w.shape[1] <= 1 << 16 else np.uint32
    return {"counts": counts.astype(np.uint16), "keys": order[keep].astype(dtype),
            "values": values[keep], "rowmax": rowmax.astype(np.float32),
            "rest": np.maximum(total - np.where(keep, top, 0.0).sum(axis=1), 0.0)}


def pack(parts: list[np.ndarray], level: int = 6) -> str:
    """The arrays' bytes, one after another, deflated (zlib) and base64-encoded."""
    raw = b"".join(np.ascontiguousarray(p).tobytes() for p in parts)
    return base64.b64encode(zlib.compress(raw, level)).decode("ascii")
