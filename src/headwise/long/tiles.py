"""The streaming pass over one attention call: query chunks of whole blocks, their keys up to
the diagonal, each chunk's exact probabilities handed to the reductions as a :class:`Tile`.

Axis legend: ``b`` batch, ``h`` profiled query heads, ``i`` query position, ``j`` key
position, ``c`` rows of a chunk, ``kj`` its keys, ``I`` query blocks of a chunk, ``D`` bins.

A chunk is ``c`` query rows (whole ``block``-row query blocks, or a piece of one) over the keys
``0:kj`` some row of it may see (under causality ``kj`` stops at its last row: the key blocks
above the diagonal are never multiplied). Its scores are computed into one reused buffer and
its softmax into another, whole rows at a time, so the softmax is exact on its own (no
log-sum-exp is needed, and none is trusted: a kernel's LSE is good to ~1e-5 relative on long
rows). Working memory is those two buffers, at most ``budget`` elements each, plus what the
reductions keep: ``O(c x n)`` per head, linear in ``n``, never ``(i, j)`` for a whole head.

The scores are the model's own: ``q k^T * scale``, then soft-capping (Gemma 2:
``softcap * tanh(s / softcap)``, before the mask, as :func:`headwise.attention_weights` does),
then the mask and causality through :func:`headwise.weights.mask_scores` (the one way a mask
enters a block of scores), and the softmax over the keys and, with sinks (gpt-oss), one more
logit per head that takes mass and carries no value. Positions are bottom-right aligned: query
``i`` sits at key position ``i + nk - nq``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

import torch

from headwise import weights as _weights

__all__ = ["Call", "Tile", "tiles"]


@dataclass(frozen=True)
class Call:
    """One attention call as the reductions see it before its first tile: ``b`` batch,
    ``h`` profiled heads, ``nq`` queries, ``nk`` keys, ``block`` tokens per block, ``sinks`` /
    ``window`` (the sink keys and the local window), the work ``dtype`` and ``device``,
    ``far`` (the far score's distance) and ``causal`` (no key after its query)."""

    b: int
    h: int
    nq: int
    nk: int
    block: int
    sinks: int
    window: int
    dtype: torch.dtype
    device: torch.device
    far: int = 1000
    causal: bool = True

    @property
    def offset(self) -> int:
        """Key position of query 0 (bottom-right alignment)."""
        return self.nk - self.nq

    @property
    def query_blocks(self) -> int:
        return math.ceil(self.nq / self.block)

    @property
    def key_blocks(self) -> int:
        return math.ceil(self.nk / self.block)


@dataclass
class Tile:
    """Query rows ``r0:r1`` of one call over keys ``0:kj``.

    Attributes:
        call: the :class:`Call`.
        r0, r1: the rows (query indices): whole query blocks, or a piece of one block (when
            one block's rows over their keys would not fit the budget).
        scores: ``(b, h, c, kj)`` the logits the softmax saw (scaled, capped), ``-inf`` where
            masked. Read only (as every field).
        probs: ``(b, h, c, kj)`` the model's attention probabilities (0 where masked).
        live: ``(b, h, c)`` rows with at least one allowed key.

    Derived (computed once per tile, shared by the reductions): :attr:`rows` (key positions of
    the rows), :attr:`allowed`, :attr:`block_sums` (mass summed over each query block's rows)
    and :attr:`cumulative` (each row's mass up to each key).
    """

    call: Call
    r0: int
    r1: int
    scores: torch.Tensor
    probs: torch.Tensor
    live: torch.Tensor
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def kj(self) -> int:
        return self.probs.shape[-1]

    @cached_property
    def rows(self) -> torch.Tensor:
        """``(c,)`` the rows' key positions (``i + nk - nq``)."""
        return torch.arange(self.r0, self.r1, device=self.probs.device) + self.call.offset

    @cached_property
    def allowed(self) -> torch.Tensor:
        """``(b, h, c, kj)`` True where the key may be attended (a finite score)."""
        return torch.isfinite(self.scores)

    @cached_property
    def block_sums(self) -> torch.Tensor:
        """``(b, h, I, kj)`` each query block's mass on each key, summed over its rows (the
        chunk's last block may be short)."""
        b, h, c, kj = self.probs.shape
        full = c // self.call.block * self.call.block
        sums = self.probs[:, :, :full].reshape(b, h, -1, self.call.block, kj).sum(3)
        if full < c:
            sums = torch.cat([sums, self.probs[:, :, full:].sum(2, keepdim=True)], dim=2)
        return sums

    @cached_property
    def cumulative(self) -> torch.Tensor:
        """``(b, h, c, kj + 1)`` each row's mass on keys ``0:j`` at index ``j`` (0 first)."""
        b, h, c, kj = self.probs.shape
        room = self._cache.get("scratch")
        out = (room[:b * h * c * (kj + 1)].view(b, h, c, kj + 1) if room is not None else
               torch.empty(b, h, c, kj + 1, dtype=self.probs.dtype, device=self.probs.device))
        out[..., 0] = 0
        torch.cumsum(self.probs, dim=-1, out=out[..., 1:])
        return out

    @property
    def row_mass(self) -> torch.Tensor:
        """``(b, h, c)`` each row's total mass (1, less a sink's share; 0 for a dead row)."""
        return self.cumulative[..., -1]

    def mass_between(self, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """``(b, h, c)`` each row's mass on keys ``lo[r] <= j < hi[r]`` (``(c,)`` tensors,
        clamped to ``0..kj``): differences of :attr:`cumulative`."""
        cum, kj = self.cumulative, self.kj
        lo, hi = lo.clamp(0, kj), hi.clamp(0, kj)
        hi = torch.maximum(lo, hi)
        shape = (*cum.shape[:2], -1, 1)
        take = lambda x: cum.gather(-1, x.view(1, 1, -1, 1).expand(shape))[..., 0]  # noqa: E731
        return take(hi) - take(lo)


def tiles(q: torch.Tensor, k: torch.Tensor, call: Call, *, mask, causal: bool, scale,
          softcap: float | None, sinks: torch.Tensor | None, budget: int) -> Iterator[Tile]:
    """The tiles of the attention of ``q (b, h, i, d)`` over ``k (b, g, j, d)`` (query head
    ``x`` reads key head ``x // (h / g)``: grouped heads share one GEMM, no key is repeated),
    chunk by chunk through buffers of at most ``budget`` elements (one row at least)."""
    b, h, nq, d = q.shape
    g, nk, work = k.shape[1], k.shape[2], call.dtype
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    kT = k.to(work).contiguous().transpose(-1, -2)                      # (b, g, d, j)
    reach = (lambda r1: max(0, min(nk, r1 + call.offset))) if causal else (lambda r1: nk)  # noqa: E731
    spans = _spans(nq, call.block, reach, b * h, budget)
    size = max((b * h * (r1 - r0) * (reach(r1) + 1) for r0, r1 in spans), default=0)
    buf = torch.empty(3, size, dtype=work, device=q.device)  # scores, probs, cumulative sums
    sink = None if sinks is None else sinks.to(work).view(1, h, 1, 1)
    for r0, r1 in spans:
        kj = reach(r1)
        if kj == 0:
            continue
        shape = (b, h, r1 - r0, kj)
        s = buf[0, :math.prod(shape)].view(shape)
        qc = (q[:, :, r0:r1].to(work) * scale).reshape(b, g, -1, d)    # (b, g, (h/g) c, d)
        torch.matmul(qc, kT[..., :kj], out=s.view(b, g, -1, kj))
        if softcap is not None:  # before the mask, as the model's attention does
            s.div_(softcap).tanh_().mul_(softcap)
        _mask(s, mask, causal, r0, r1, nq, nk)
        p, live = _softmax(s, buf[1, :s.numel()].view(shape), sink)
        yield Tile(call, r0, r1, s, p, live, {"scratch": buf[2]})


def _mask(s, mask, causal, r0, r1, nq, nk) -> None:
    """The mask and causality on the scores ``s (b, h, c, kj)`` of rows ``r0:r1`` in place
    (:func:`headwise.weights.mask_scores`); causality only on the keys past the first row's
    position (every row sees the keys before it)."""
    h, kj = s.shape[1], s.shape[-1]
    if mask is not None:
        _weights.mask_scores(s, mask, False, slice(0, h), slice(r0, r1), slice(0, kj), nq, nk)
    first = max(0, r0 + nk - nq + 1)
    if causal and first < kj:
        _weights.mask_scores(s[..., first:], None, True, slice(0, h), slice(r0, r1),
                             slice(first, kj), nq, nk)


def _spans(nq: int, block: int, reach, heads: int, budget: int) -> list[tuple[int, int]]:
    """Chunks of whole query blocks, as many as fit ``budget`` at their reach; a block that
    alone does not fit is cut into pieces of rows that do (one row at least), so a chunk never
    straddles two blocks."""
    spans, r0 = [], 0
    while r0 < nq:
        end = min(nq, r0 + block)
        if heads * (end - r0) * reach(end) > budget:  # pieces of this block
            step = max(1, budget // max(1, heads * reach(end)))
            spans += [(a, min(end, a + step)) for a in range(r0, end, step)]
            r0 = end
            continue
        r1 = end
        while r1 < nq and heads * (min(nq, r1 + block) - r0) * reach(min(nq, r1 + block)) \
                <= budget:
            r1 = min(nq, r1 + block)
        spans.append((r0, r1))
        r0 = r1
    return spans


def _softmax(s: torch.Tensor, p: torch.Tensor, sink: torch.Tensor | None):
    """``p = softmax(s)`` over the keys (and the sink logit); fully masked rows 0."""
    if sink is None:  # one fused softmax; a fully masked row comes out NaN, then 0 (a row of
        torch.ops.aten._softmax.out(s, -1, False, out=p)  # NaN scores stays NaN: the NaN policy)
        nan = torch.isnan(p[..., 0])
        if not bool(nan.any()):
            return p, ~nan
        dead = torch.isneginf(s.amax(-1))
        p.masked_fill_(dead[..., None], 0.0)
        return p, ~dead
    top = torch.maximum(s.amax(-1, keepdim=True), sink.expand(*s.shape[:-1], 1))
    top = top.masked_fill(torch.isneginf(top), 0.0)
    torch.sub(s, top, out=p)
    p.exp_()
    z = p.sum(-1, keepdim=True)
    live = z[..., 0] > 0
    z = z + torch.exp(sink - top)
    p.div_(z.clamp(min=torch.finfo(p.dtype).tiny))
    return p, live
