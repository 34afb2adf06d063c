"""Weights from the row log-sum-exp: :func:`logsumexp` (a chunked pass, for kernels that
expose none), :func:`from_lse` (any selection, key ranges included) and :func:`mask_scores`,
the one way a mask and causality enter a block of scores.

Axis legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads, ``i`` query position,
``j`` key position, ``d`` head dim.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from headwise import masks as _masks
from headwise.weights.select import (
    BLOCK_ELEMENTS,
    CHUNK_ELEMENTS,
    Selection,
    kv_heads,
    positions,
    row_chunks,
    sub_rows,
    take,
)

__all__ = ["from_lse", "logsumexp", "mask_scores"]


def logsumexp(q: torch.Tensor, k: torch.Tensor, *, mask: torch.Tensor | None = None,
              causal: bool = False, scale: float | None = None,
              budget: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """``lse (b, h, i)`` of the masked scores, one chunk of query rows at a time (for kernels
    that expose none). ``q (b, h, i, d)``, ``k (b, g, j, d)``; ``mask`` and ``causal`` as in
    :func:`headwise.attention`. Fully masked rows get 0, as the flash kernel reports."""
    b, h, nq, d = q.shape
    g, nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    kT = (k if g == h else k.repeat_interleave(h // g, dim=1)).transpose(-1, -2)
    mask = _masks.as_4d(mask)
    out = torch.empty(b, h, nq, dtype=torch.promote_types(q.dtype, torch.float32),
                      device=q.device)
    keys = slice(0, nk)
    for r0, r1 in row_chunks(nq, b * h * nk, budget):
        rows = slice(r0, r1)
        s = torch.matmul(q[:, :, r0:r1], kT).to(out.dtype).mul_(scale)  # (b, h, c, j)
        mask_scores(s, mask, causal, slice(0, h), rows, keys, nq, nk)
        out[:, :, r0:r1] = torch.logsumexp(s, dim=-1)
    return out.masked_fill_(torch.isneginf(out), 0.0)


def mask_scores(s, mask, causal, heads, rows, keys, nq, nk) -> None:
    """Put ``-inf`` on the masked scores of a block ``s (b, hs, c, js)`` in place (an additive
    mask is added): ``heads``, ``rows`` and ``keys`` (slices or index tensors) say which block
    of the ``(b, h, nq, nk)`` scores it is; ``mask`` 4-D (:func:`headwise.masks.as_4d`)."""
    if mask is not None:
        _masks.fill(s, take(take(take(mask, 1, heads, True), 2, rows, True), 3, keys, True),
                    inplace=True)
    if causal:
        allowed = _masks.causal_block(positions(rows, s.device), positions(keys, s.device),
                                      nq, nk)
        _masks.fill(s, allowed, inplace=True)



@torch.no_grad()
def from_lse(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, *,
             mask: torch.Tensor | None = None, causal: bool = False, scale: float | None = None,
             selection: Selection | None = None, budget: int = BLOCK_ELEMENTS) -> torch.Tensor:
    """The weights ``exp(q k^T * scale + bias - lse)`` of ``selection`` (default: everything).

    Args:
        q: ``(b, h, i, d)``; k: ``(b, g, j, d)``; lse: ``(b, h, i)`` from the same masked scores.
        mask, causal, scale: exactly what the kernel that produced ``lse`` saw.
        selection: heads / rows / keys to return.

    Returns:
        ``(b, hs, is, js)`` in ``q.dtype`` (computed in at least float32); not differentiable
        (use ``backend="eager"`` for gradients through the weights).
    """
    b, h, nq, d = q.shape
    g, nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    heads, rows, keys = (selection or Selection()).resolve(h, nq, nk, q.device)
    qs = take(take(q, 1, heads), 2, rows)                              # (b, hs, is, d)
    kT = take(take(k, 1, kv_heads(heads, h, g, q.device)), 2, keys).transpose(-1, -2)
    if kT.shape[1] != qs.shape[1]:  # one key/value head (g = 1) serves every query head
        kT = kT.expand(-1, qs.shape[1], -1, -1)
    lses = take(take(lse, 1, heads), 2, rows).unsqueeze(-1)            # (b, hs, is, 1)
    hs, ns, js = qs.shape[1], qs.shape[2], kT.shape[-1]
    work = torch.promote_types(q.dtype, torch.float32)
    qs, kT, lses = (qs.to(work) * scale), kT.to(work), lses.to(work)
    w = torch.empty(b, hs, ns, js, dtype=q.dtype, device=q.device)
    mask = _masks.as_4d(mask)
    # every key of a row, each once (a list like [0, 0, 0] has nk entries but is not the row)
    whole_rows = isinstance(keys, slice) and (keys.start, keys.stop) == (0, nk)
    for x in range(b):
        bx = None if mask is None else take(mask, 0, slice(x, x + 1), True)
        for h0, h1, r0, r1 in _blocks(hs, ns, js, budget):
            dest = w[x, h0:h1, r0:r1]  # contiguous: whole rows of whole heads, or one head
            chunk = dest if work == q.dtype else torch.empty(dest.shape, dtype=work,
                                                             device=q.device)
            torch.matmul(qs[x, h0:h1, r0:r1], kT[x, h0:h1], out=chunk)
            chunk.sub_(lses[x, h0:h1, r0:r1])
            mask_scores(chunk[None], bx, causal, sub_rows(heads, h0, h1), sub_rows(rows, r0, r1),
                         keys, nq, nk)
            chunk.exp_()
            if whole_rows:  # the kernel's LSE is good to ~1e-5 relative over long rows: one
                # division by the row sum makes it exact (fully masked rows stay 0)
                chunk.div_(chunk.sum(-1, keepdim=True).clamp_(min=torch.finfo(work).tiny))
            if chunk is not dest:
                dest.copy_(chunk)
    return w



def _blocks(hs: int, ns: int, js: int, budget: int) -> Iterator[tuple[int, int, int, int]]:
    """``(h0, h1, r0, r1)`` blocks of at most ``budget`` weights, each contiguous in a
    ``(hs, ns, js)`` tensor: several whole heads, or rows of one head."""
    if ns * js <= budget:
        step = max(1, budget // max(1, ns * js))  # no keys (j = 0): all heads at once
        for h0 in range(0, hs, step):
            yield h0, min(hs, h0 + step), 0, ns
        return
    for hh in range(hs):
        for r0, r1 in row_chunks(ns, js, budget):
            yield hh, hh + 1, r0, r1
