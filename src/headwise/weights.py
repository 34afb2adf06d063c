"""Exact per-head attention weights from the row log-sum-exp, in chunks of query rows.

Axis legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads, ``i`` query position,
``j`` key position, ``d`` head dim.

A fused kernel never builds the ``(b, h, i, j)`` probabilities, but it does return (or a cheap
chunked pass recovers) each row's log-sum-exp ``lse[b, h, i] = log sum_j exp(s_ij)`` of the
masked scores ``s_ij = q_i . k_j * scale + bias_ij``. With it every weight is one exact formula,

    w[b, h, i, j] = exp(s_ij - lse[b, h, i])        (0 where masked, 0 for a fully masked row)

so the weights of any heads, query rows and key range are recomputed for only what was asked,
``chunk`` rows at a time: working memory beyond the returned tensor is O(chunk x j), never
``(b, h, i, j)`` unless the caller asked for all of it. When every key of a row is selected the
row is also divided by its sum (1 up to the LSE's rounding), which removes the kernel's LSE
rounding (~1e-5 relative on long rows of large scores).

Fully masked rows: the CPU flash kernel reports ``lse = 0`` for them (and zero output);
:func:`logsumexp` does the same, so ``exp(-inf - 0) = 0`` gives them zero weights.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from headwise import masks as _masks
from headwise.fast import finite
from headwise.fast import large as _large

__all__ = ["Selection", "as_selection", "chunk_rows", "from_lse", "logsumexp", "mask_scores",
           "nonfinite_rows", "release_memory", "row_chunks", "softmax_rows", "take", "CHUNK_ELEMENTS"]

# Elements of one chunk of scores in the chunked LSE pass and the statistics (b x heads x rows x
# keys): 4M floats = 16 MiB in float32.
CHUNK_ELEMENTS = 1 << 22
# Weights are recomputed in blocks of at most this many (4M floats = 16 MiB, within this CPU's
# 32 MiB L3). Smaller blocks mean more, smaller ops: with 2 threads on a shared 2-core machine
# each op's thread barrier costs more than the cache saves (1 MiB blocks measured 8x slower at
# n=1024 under load; 16 MiB blocks 3x; 1 thread: 1.3x the fused core for every size).
BLOCK_ELEMENTS = 1 << 22

Index = int | Sequence[int] | slice | torch.Tensor | None


@dataclass(frozen=True)
class Selection:
    """Which weights to return: ``heads`` (query heads), ``rows`` (query positions) and
    ``keys`` (key positions); each ``None`` (all), an int, a sequence of ints or a slice
    (negative values count from the end), or a 1-D integer tensor; anything else (a bool mask,
    floats, a string) is a TypeError. The result has shape
    ``(b, len(heads), len(rows), len(keys))``; an int keeps its axis, of length 1.

    ``hw.attention(q, k, v, return_weights=hw.Selection(heads=[3]))`` returns only head 3's
    weights, ``Selection(rows=slice(-16, None))`` the last 16 query rows of every head.
    """

    heads: Index = None
    rows: Index = None
    keys: Index = None

    def __post_init__(self):
        for name in ("heads", "rows", "keys"):
            _check_index(getattr(self, name), name)

    @property
    def everything(self) -> bool:
        """True when every head, row and key is selected by default (``return_weights=True``)."""
        return self.heads is None and self.rows is None and self.keys is None

    def resolve(self, h: int, i: int, j: int, device) -> tuple:
        """``(heads, rows, keys)`` as slices (when contiguous) or index tensors; ValueError for
        an index out of range or an empty selection."""
        return tuple(_axis(v, n, name, device) for v, n, name in
                     ((self.heads, h, "heads"), (self.rows, i, "rows"), (self.keys, j, "keys")))


def as_selection(return_weights) -> Selection | None:
    """``return_weights`` (False/None, True, a :class:`Selection` or a dict with keys ``heads``,
    ``rows``, ``keys``) to a Selection, or None when no weights are wanted."""
    if return_weights is None or return_weights is False:
        return None
    if return_weights is True:
        return Selection()
    if isinstance(return_weights, Selection):
        return return_weights
    if isinstance(return_weights, dict):
        unknown = set(return_weights) - {"heads", "rows", "keys"}
        if unknown:
            raise ValueError(f"return_weights: unknown selection keys {sorted(unknown)}; use "
                             "heads, rows and keys")
        return Selection(**return_weights)
    raise TypeError("return_weights must be a bool, a headwise.Selection or a dict with heads/"
                    f"rows/keys, got {type(return_weights).__name__}")


def _is_int(x) -> bool:  # numpy ints too; not bools
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_index(value, name: str) -> None:
    """TypeError unless ``value`` is None, an int, a sequence of ints, a slice of ints or a
    1-D integer tensor: a bool mask, a float or a string would otherwise be read as (other)
    indices without a word."""
    where = f"Selection: {name}={value!r}"
    if value is None or _is_int(value):
        return
    if isinstance(value, slice):
        parts = (value.start, value.stop, value.step)
        if all(p is None or _is_int(p) for p in parts):
            return
        raise TypeError(f"{where} has non-integer bounds; pass ints, e.g. slice(0, 4)")
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool:
            raise TypeError(f"Selection: {name} is a bool tensor, but indices are expected; "
                            f"pass its positions: {name}=mask.nonzero().flatten()")
        if value.is_floating_point() or value.is_complex() or value.dim() > 1:
            raise TypeError(f"Selection: {name} must be a 0-D or 1-D integer tensor, got "
                            f"{str(value.dtype).removeprefix('torch.')} of shape "
                            f"{tuple(value.shape)}; pass e.g. torch.tensor([0, 2])")
        return
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{where} is a string; pass ints, e.g. {name}=[1, 2]")
    if isinstance(value, Sequence):
        bad = [x for x in value if not _is_int(x)]
        if bad:
            raise TypeError(f"{where} holds {bad[0]!r} ({type(bad[0]).__name__}); indices must "
                            f"be ints, e.g. {name}=[0, 2]")
        return
    raise TypeError(f"Selection: {name} must be an int, a sequence of ints, a slice or an "
                    f"integer tensor, got {type(value).__name__}; pass e.g. {name}=[0, 2]")


def _axis(value: Index, n: int, name: str, device):
    if value is None:
        return slice(0, n)
    if isinstance(value, slice):
        picked = range(n)[value]
        if len(picked) == 0:
            raise ValueError(f"return_weights: empty selection of {name} ({value} of {n}); "
                             "select at least one")
        if picked.step == 1:
            return slice(picked.start, picked.stop)
        return torch.tensor(list(picked), device=device)
    values = ([int(value)] if _is_int(value) else value.reshape(-1).tolist()  # types: checked
              if isinstance(value, torch.Tensor) else [int(x) for x in value])  # at __init__
    if not values:
        raise ValueError(f"return_weights: empty selection of {name}; select at least one")
    bad = [x for x in values if not -n <= x < n]
    if bad:
        raise ValueError(f"return_weights: {name} index {bad[0]} out of range for {n} {name} "
                         f"(use 0..{n - 1} or negative from the end)")
    values = [x % n for x in values]
    if values == list(range(values[0], values[0] + len(values))):
        return slice(values[0], values[0] + len(values))
    return torch.tensor(values, device=device)


def take(x: torch.Tensor, dim: int, index, broadcast: bool = False) -> torch.Tensor:
    """``x`` indexed along ``dim`` (a view for a slice); with ``broadcast`` (masks) an axis of
    size 1 stays as it is."""
    if broadcast and x.shape[dim] == 1:
        return x
    if isinstance(index, slice):
        return x.narrow(dim, index.start, index.stop - index.start)
    return x.index_select(dim, index.to(x.device))


def _positions(index, device) -> torch.Tensor:
    return (torch.arange(index.start, index.stop, device=device) if isinstance(index, slice)
            else index.to(device))


def _length(index) -> int:
    return index.stop - index.start if isinstance(index, slice) else index.numel()


def row_chunks(rows: int, per_row: int, budget: int) -> Iterator[tuple[int, int]]:
    """``(r0, r1)`` blocks of ``rows`` query rows, each at most ``budget`` elements when one
    row costs ``per_row`` (at least one row per block)."""
    step = max(1, budget // max(1, per_row))
    for r0 in range(0, rows, step):
        yield r0, min(rows, r0 + step)


def chunk_rows(per_row: int, budget: int = CHUNK_ELEMENTS) -> int:
    """Query rows per chunk when one row costs ``per_row`` elements."""
    return max(1, budget // max(1, per_row))


def _kv_heads(heads, h: int, g: int, device):
    """The key/value head each selected query head reads (grouped-query: ``x // (h // g)``)."""
    if g == h:
        return heads
    return _positions(heads, device) // (h // g)


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
        allowed = _masks.causal_block(_positions(rows, s.device), _positions(keys, s.device),
                                      nq, nk)
        _masks.fill(s, allowed, inplace=True)


def release_memory() -> None:
    """Give back the memory kept for recycling large weights tensors.

    A weights tensor of 16 MiB or more returned on the CPU is made in memory that headwise keeps
    once the caller drops the tensor (at most 4 sizes, 1/8 of physical memory in all), so the
    next call of the same size writes resident pages instead of faulting fresh ones. Call this
    when no more weights of those sizes will be asked for; nothing else changes."""
    _large.release()


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
    kT = take(take(k, 1, _kv_heads(heads, h, g, q.device)), 2, keys).transpose(-1, -2)
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
            mask_scores(chunk[None], bx, causal, _sub(heads, h0, h1), _sub(rows, r0, r1),
                         keys, nq, nk)
            chunk.exp_()
            if whole_rows:  # the kernel's LSE is good to ~1e-5 relative over long rows: one
                # division by the row sum makes it exact (fully masked rows stay 0)
                chunk.div_(chunk.sum(-1, keepdim=True).clamp_(min=torch.finfo(work).tiny))
            if chunk is not dest:
                dest.copy_(chunk)
    return w


@torch.no_grad()
def softmax_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None, *,
                 mask: torch.Tensor | None = None, causal: bool = False,
                 scale: float | None = None, heads=None, rows=None,
                 budget: int = BLOCK_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Whole rows of weights, ``softmax(q k^T * scale + bias)`` over every key, block by block;
    with ``v`` also the output ``weights @ v`` from the same blocks.

    A row that keeps every key needs no log-sum-exp: its softmax is exact on its own. Each
    block of scores is computed into one reused scratch buffer (no page faults), masked there,
    and softmaxed straight into the returned tensor; ``weights @ v`` then reads that block while
    it is still in cache. Fully masked rows get zero weights (and zero output).

    Args:
        q: ``(b, h, i, d)``; k: ``(b, g, j, d)``; v: ``(b, g, j, e)`` or None.
        mask, causal, scale: as in :func:`headwise.attention` (``causal`` bottom-right).
        heads, rows: resolved selections (slices or index tensors; None = all).

    Returns:
        ``(weights (b, hs, is, j) in q.dtype, output (b, hs, is, e) or None)``; not
        differentiable.
    """
    b, h, nq, d = q.shape
    g, nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    heads = slice(0, h) if heads is None else heads
    rows = slice(0, nq) if rows is None else rows
    work = torch.promote_types(q.dtype, torch.float32)
    kv_heads = _kv_heads(heads, h, g, q.device)
    qs = take(take(q, 1, heads), 2, rows).to(work)                    # (b, hs, is, d)
    # contiguous once (q, k, v are usually strided views of one projection): every block's
    # matmul then reads plain row-major matrices
    kT = take(k, 1, kv_heads).to(work).contiguous().transpose(-1, -2)  # (b, hs, d, j)
    vs = None if v is None else take(v, 1, kv_heads).to(work).contiguous()  # (b, hs, j, e)
    hs, ns = qs.shape[1], qs.shape[2]
    w = _large.empty((b, hs, ns, nk), q.dtype, q.device)
    out = None if v is None else torch.empty(b, hs, ns, v.shape[-1], dtype=q.dtype,
                                             device=q.device)
    scratch = torch.empty(min(hs * ns * nk, max(budget, nk)), dtype=work, device=q.device)
    mask = _masks.as_4d(mask)
    for x in range(b):
        bx = None if mask is None else take(mask, 0, slice(x, x + 1), True)
        for h0, h1, r0, r1 in _blocks(hs, ns, nk, budget):
            s = scratch[:(h1 - h0) * (r1 - r0) * nk].view(h1 - h0, r1 - r0, nk)
            torch.baddbmm(s, qs[x, h0:h1, r0:r1], kT[x, h0:h1], beta=0, alpha=scale, out=s)
            mask_scores(s[None], bx, causal, _sub(heads, h0, h1), _sub(rows, r0, r1),
                         slice(0, nk), nq, nk)
            dest = w[x, h0:h1, r0:r1]
            _softmax_into(s, dest)
            if out is not None:
                o = out[x, h0:h1, r0:r1]
                if work == q.dtype:
                    torch.matmul(dest, vs[x, h0:h1], out=o)
                else:
                    o.copy_(torch.matmul(dest.to(work), vs[x, h0:h1]))
    _nan_rows(w, take(take(q, 1, heads), 2, rows), take(k, 1, kv_heads))
    return w, out


def _nan_rows(w: torch.Tensor, qs: torch.Tensor, ks: torch.Tensor) -> None:
    """The NaN policy on weights ``w (b, hs, is, j)``, in place (see :func:`nonfinite_rows`)."""
    if not finite(qs, ks):  # the common case (on the CPU): one total instead of a mask
        w.masked_fill_(nonfinite_rows(qs, ks), float("nan"))  # (no `if any`: a GPU sync)


def nonfinite_rows(qs: torch.Tensor, ks: torch.Tensor) -> torch.Tensor:
    """``(b, hs, is, 1)`` True for the rows the NaN policy makes NaN: their query ``qs (b, hs,
    is, d)`` holds NaN or inf, or their head's keys ``ks (b, hs, j, d)`` do."""
    bad = ~torch.isfinite(qs.sum(dim=-1, keepdim=True, dtype=torch.float32))
    return bad | ~torch.isfinite(ks.sum(dim=(-2, -1), dtype=torch.float32))[..., None, None]


def _softmax_into(s: torch.Tensor, dest: torch.Tensor) -> None:
    """``dest = softmax(s, -1)`` with fully masked (all ``-inf``) rows set to 0. A row of
    softmax is NaN in every entry or in none, so its first entry tells: one strided read per
    row instead of a pass over the block. (Rows made NaN by NaN inputs are zeroed here too;
    the caller's NaN policy marks them again.)"""
    if dest.dtype == s.dtype:
        torch.ops.aten._softmax.out(s, -1, False, out=dest)
    else:
        dest.copy_(torch.softmax(s, dim=-1))
    dead = torch.isnan(dest[..., :1])
    if dead.any():
        dest.masked_fill_(dead, 0.0)


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


def _sub(index, r0: int, r1: int):
    """Rows ``r0:r1`` of a selection of rows (slice or index tensor)."""
    if isinstance(index, slice):
        return slice(index.start + r0, index.start + r1)
    return index[r0:r1]
