"""How the head view stores weights inside its page: each ``(i, j)`` matrix quantised per row
to ``levels`` steps, zlib-compressed and base64-encoded in a ``<script>`` block the page decodes;
thumbnails max-pooled to a small square."""

from __future__ import annotations

import base64
import zlib

import numpy as np

__all__ = ["LEVELS", "block", "quantise", "thumbnail"]

LEVELS = (255, 63, 15)  # quantisation levels per row, tried in order until the file fits


def quantise(m: np.ndarray, levels: int = 255) -> bytes:
    """(i, j) float -> row maxima as float32 (4 i bytes) then uint8 q (i j bytes), where
    ``w[i, j] ~= q[i, j] / levels * rowmax[i]`` (error <= rowmax[i] / (2 levels))."""
    rowmax = m.max(axis=1).astype(np.float32)
    safe = np.where(rowmax > 0, rowmax, 1.0)[:, None]
    q = np.rint(np.clip(m / safe, 0.0, 1.0) * levels).astype(np.uint8)
    return rowmax.tobytes() + q.tobytes()


def block(key: str, m: np.ndarray, levels: int, compress_level: int) -> str:
    data = base64.b64encode(zlib.compress(quantise(m, levels), compress_level)).decode("ascii")
    return f'<script type="application/octet-stream" data-key="{key}">{data}</script>'


def thumbnail(m: np.ndarray, size: int) -> str:
    """Max-pool an (i, j) matrix to at most size x size, scale to its max, uint8, base64:
    ``"{rows}x{cols}:{max}:{base64}"`` (the page rescales to a shared maximum)."""
    for axis in (0, 1):
        n = m.shape[axis]
        if n > size:
            edges = np.linspace(0, n, size + 1).astype(int)[:-1]
            m = np.maximum.reduceat(m, edges, axis=axis)
    top = float(m.max()) if m.size else 0.0
    q = np.rint(m / (top if top > 0 else 1.0) * 255.0).astype(np.uint8)
    return f"{m.shape[0]}x{m.shape[1]}:{top:.6g}:" + base64.b64encode(q.tobytes()).decode("ascii")
