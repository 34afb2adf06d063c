"""Whole rows of weights as their softmax, with the output ``weights @ v`` from the same blocks
(:func:`softmax_rows`), with the NaN policy's rows (:func:`headwise.masks.neutral`).

Axis legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads, ``i`` query position,
``j`` key position, ``d`` head dim, ``e`` value head dim.

A row that keeps every key needs no log-sum-exp: its softmax is exact on its own. The rows are
walked in blocks of ``c`` query rows of every selected head at once:

1. scores ``q k^T * scale`` for the block, one batched GEMM per key/value head (grouped-query
   heads read their shared keys as ``(h / g) * c`` rows of one matrix: no repeated k or v),
   into one reused scratch buffer (no page faults);
2. under causality only the keys some row of the block can see, ``j < i_last + 1 + (nk - nq)``:
   the blocks above the diagonal are never multiplied, their weights written as zeros (half
   the products of both GEMMs for a square causal attention); masks and the diagonal's
   causality enter in place (:func:`headwise.weights.lse.mask_scores`);
3. softmax in place, copied into the returned weights, and ``weights @ v`` from the scratch
   while it is still in cache.
"""

from __future__ import annotations

import math

import torch

from headwise import masks as _masks
from headwise.fast import finite
from headwise.fast import large as _large
from headwise.weights.lse import mask_scores
from headwise.weights.select import kv_heads, positions, sub_rows, take

__all__ = ["release_memory", "softmax_rows", "ROW_BLOCK_ELEMENTS"]

# Scores of one block of rows (every selected head): 1M floats = 4 MiB in float32. Measured on
# SmolLM2's shapes (h=9, g=3, d=64, causal, 1 thread, AMD EPYC Zen 4, 1 MiB L2/core): all
# weights and the output at 512 / 2048 tokens took 0.55x / 0.24x HF eager's time with 4 MiB
# blocks, 0.62x / 0.28x with 1 MiB and 0.87x / 0.29x with 16 MiB.
ROW_BLOCK_ELEMENTS = 1 << 20


@torch.no_grad()
def softmax_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None, *,
                 mask: torch.Tensor | None = None, causal: bool = False,
                 scale: float | None = None, heads=None, rows=None,
                 budget: int = ROW_BLOCK_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Whole rows of weights, ``softmax(q k^T * scale + bias)`` over every key, block by block;
    with ``v`` also the output ``weights @ v`` from the same blocks. Fully masked rows get zero
    weights (and zero output). Meant for the CPU (a causal block's key range is read from the
    row indices on the host).

    Args:
        q: ``(b, h, i, d)``; k: ``(b, g, j, d)``; v: ``(b, g, j, e)`` or None.
        mask, causal, scale: as in :func:`headwise.attention` (``causal`` bottom-right).
        heads, rows: resolved selections (slices or index tensors; None = all).
        budget: scores per block (at least one row of every selected head).

    Returns:
        ``(weights (b, hs, is, j) in q.dtype, output (b, hs, is, e) or None)``; not
        differentiable.
    """
    b, h, nq, d = q.shape
    g, nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    heads = slice(0, h) if heads is None else heads
    rows = slice(0, nq) if rows is None else rows
    k, v, bad = _checked(q, k, v, mask, causal, heads, rows)  # the NaN policy
    work = torch.promote_types(q.dtype, torch.float32)
    # every head: the g key/value heads, each read by its h/g query heads as one matrix;
    # a selection: each selected head with its own key/value head (gathered: small)
    grouped = isinstance(heads, slice) and (heads.start, heads.stop) == (0, h)
    kv = slice(0, g) if grouped else kv_heads(heads, h, g, q.device)
    qs = take(take(q, 1, heads), 2, rows)                              # (b, hs, is, d)
    hs, ns = qs.shape[1], qs.shape[2]
    groups = g if grouped else hs
    qg = qs.to(work).reshape(b, groups, hs // groups, ns, d)          # (b, G, R, is, d)
    # contiguous once (q, k, v are usually strided views of one projection): every block's
    # GEMM then reads plain row-major matrices
    kT = take(k, 1, kv).to(work).contiguous().transpose(-1, -2)       # (b, G, d, j)
    vs = None if v is None else take(v, 1, kv).to(work).contiguous()  # (b, G, j, e)
    # recycled, else 4 KiB pages: once a few hundred MiB are held (output_attentions holds
    # every layer's), fresh huge pages were measured slower here than 4 KiB ones
    w = _large.empty((b, hs, ns, nk), q.dtype, q.device, huge_pages=False)
    out = None if v is None else torch.empty(b, hs, ns, v.shape[-1], dtype=q.dtype,
                                             device=q.device)
    step = max(1, budget // max(1, hs * nk))
    scratch = torch.empty(hs * min(step, ns) * nk, dtype=work, device=q.device)
    where = positions(rows, "cpu").tolist() if causal else None       # query positions
    mask = _masks.as_4d(mask)
    for x in range(b):
        bx = None if mask is None else take(mask, 0, slice(x, x + 1), True)
        for r0 in range(0, ns, step):
            r1 = min(ns, r0 + step)
            keys = (nk, nk) if where is None else _seen(where[r0:r1], nq, nk)
            block = (x, r0, r1, keys, sub_rows(rows, r0, r1))
            _block(block, qg, kT, vs, w, out, scratch, bx, heads, scale, nq, nk)
    if bad is not None:  # (no `if any`: a GPU sync)
        w.masked_fill_(bad[0], float("nan"))
        if out is not None:
            out.masked_fill_(bad[1], float("nan"))
    return w, out


def _checked(q, k, v, mask, causal, heads, rows):
    """``(k, v, bad)``: unless one float32 total finds q, k and v finite (``bad`` None; None
    off the CPU too: the masks, always), the masked-NaN rule (:func:`headwise.masks.neutral`:
    bad values put to 0) and ``bad``, the selected rows' ``(weights, output)`` NaN masks."""
    if finite(q, k) if v is None else finite(q, k, v):
        return k, v, None
    k, v, *bad = _masks.neutral(q, k, v, mask, causal)
    return k, v, [take(take(x, 1, heads), 2, rows) for x in bad]


def _seen(where: list[int], nq: int, nk: int) -> tuple[int, int]:
    """``(lo, hi)`` for causal rows at positions ``where``: every key below ``lo`` is seen by
    every row, no key from ``hi`` on by any (bottom-right: row ``i`` sees ``j <= i + nk - nq``)."""
    off = nk - nq
    return (min(nk, max(0, min(where) + off + 1)), min(nk, max(0, max(where) + off + 1)))


def _block(block, qg, kT, vs, w, out, scratch, mask, heads, scale, nq, nk) -> None:
    """One block of rows ``r0:r1`` of batch ``x``: scores over the keys ``0:hi`` that some row
    sees (``lo = hi = nk`` without causality), masked, softmaxed, copied into ``w``, times v."""
    x, r0, r1, (lo, hi), rows = block
    _, groups, per, _, d = qg.shape
    c = r1 - r0
    dest = w[x, :, r0:r1]                                              # (hs, c, j)
    if hi < nk:
        dest[..., hi:].zero_()  # above the diagonal: never multiplied
    if hi == 0:  # no row of the block sees a key (causal with nq > nk)
        if out is not None:
            out[x, :, r0:r1].zero_()
        return
    s = scratch[:groups * per * c * hi].view(groups, per * c, hi)      # (G, R*c, js)
    torch.baddbmm(s, qg[x, :, :, r0:r1].reshape(groups, per * c, d), kT[x, :, :, :hi],
                  beta=0, alpha=scale, out=s)
    s4 = s.view(1, groups * per, c, hi)                                # (1, hs, c, js)
    if mask is not None:
        mask_scores(s4, mask, False, heads, rows, slice(0, hi), nq, nk)
    if lo < hi:  # the diagonal: keys some rows of the block see and others do not
        mask_scores(s4[..., lo:], None, True, heads, rows, slice(lo, hi), nq, nk)
    torch.ops.aten._softmax.out(s, -1, False, out=s)  # a row at a time: in place is safe
    dead = torch.isnan(s[..., :1])  # fully masked rows (all -inf): NaN in every entry
    if dead.any():
        s.masked_fill_(dead, 0.0)
    dest[..., :hi].copy_(s4[0])
    if out is not None:
        o = torch.bmm(s, vs[x, :, :hi])                                # (G, R*c, e)
        out[x, :, r0:r1].copy_(o.view(groups * per, c, -1))


def release_memory() -> None:
    """Give back the memory kept for recycling large weights tensors.

    A weights tensor of 16 MiB or more returned on the CPU is made in memory that headwise keeps
    once the caller drops the tensor (at most 4 sizes, 1/8 of physical memory in all), so the
    next call of the same size writes resident pages instead of faulting fresh ones. Call this
    when no more weights of those sizes will be asked for; nothing else changes."""
    _large.release()
