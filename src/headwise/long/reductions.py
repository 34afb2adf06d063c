"""Reductions over tiles: the protocol every statistic of the long-context pass follows, the
built-ins written with it, and :class:`MaxLogit`, the example of a user-defined one.

Axis legend: ``b`` batch, ``h`` profiled query heads, ``c`` rows of a tile, ``kj`` its keys,
``I`` query blocks, ``J`` key blocks, ``D`` distance bins, ``k`` top keys, ``j`` keys.

A reduction is an object with

- ``name``: where its result goes (``profile.reduced[name]``; a ``(h,)`` result also becomes
  the per-head score ``profile.scores[name]``);
- ``shape(call) -> tuple``: the shape :meth:`finish` returns for one layer (the pass checks it
  on a small dry run before any work, so a wrong shape is one line, not an hour lost);
- ``init(call)``: called before the first tile of each attention call (a :class:`~headwise.long.
  tiles.Call`: ``b``, ``h``, ``nq``, ``nk``, ``block``, ``sinks``, ``window``, ``device``);
- ``update(tile)``: once per :class:`~headwise.long.tiles.Tile` (rows ``r0:r1`` over keys
  ``0:kj``: ``scores``, ``probs``, ``live``, ``rows``, ``allowed``, ``block_sums``,
  ``cumulative``; read only), keeping only what is linear in ``n``;
- ``finish() -> tensor`` of ``shape(call)``: the layer's result (batch already reduced).

Every tile of a call is seen exactly once and covers whole query blocks, so a sum over tiles
is a sum over the attention; masked keys have probability 0 and score ``-inf``.
"""

from __future__ import annotations

import math

import torch

__all__ = ["BUILT_INS", "BlockMap", "Distance", "MaxLogit", "Received", "RowMasses", "TopKeys",
           "check_reduction", "distance_edges"]


def distance_edges(n: int) -> torch.Tensor:
    """Bin edges of the distance profile: 0, 1, 2, 4, ..., then ``n`` (``i - j`` in
    ``[e_d, e_{d+1})``: distance 0 (the query's own key), 1, 2-3, 4-7, ...)."""
    edges = [0, 1] + [2 ** t for t in range(1, max(1, math.ceil(math.log2(max(n, 2)))))]
    return torch.tensor([e for e in edges if e < n] + [n], dtype=torch.long)


def _row_counts(live: torch.Tensor, block: int) -> torch.Tensor:
    """``(b, h, I)`` live rows per query block of a tile's ``live (b, h, c)``."""
    b, h, c = live.shape
    pad = (-c) % block
    x = torch.nn.functional.pad(live.to(torch.float64), (0, pad))
    return x.view(b, h, -1, block).sum(-1)


class BlockMap:
    """``(h, I, J)``: the mean over query block I's live rows of the mass on key block J."""

    name = "maps"

    def shape(self, call):
        return (call.h, call.query_blocks, call.key_blocks)

    def init(self, call):
        self.call = call
        self.sums = torch.zeros(call.b, call.h, call.query_blocks, call.key_blocks,
                                dtype=torch.float64, device=call.device)
        self.rows = torch.zeros(call.b, call.h, call.query_blocks, dtype=torch.float64,
                                device=call.device)

    def update(self, tile):
        blk, sums = self.call.block, tile.block_sums                     # (b, h, I, kj)
        kj, I0 = tile.kj, tile.r0 // blk
        full = kj // blk * blk
        out = self.sums[:, :, I0:I0 + sums.shape[2]]
        out[..., :kj // blk] += sums[..., :full].reshape(*sums.shape[:3], -1, blk).sum(-1)
        if full < kj:
            out[..., kj // blk] += sums[..., full:].sum(-1)
        self.rows[:, :, I0:I0 + sums.shape[2]] += _row_counts(tile.live, blk)

    def finish(self):
        return (self.sums / self.rows.clamp(min=1)[..., None]).mean(0)


class Received:
    """``(h, j)``: the attention each key receives, summed over query rows (batch mean)."""

    name = "received"

    def shape(self, call):
        return (call.h, call.nk)

    def init(self, call):
        self.out = torch.zeros(call.b, call.h, call.nk, dtype=torch.float64, device=call.device)

    def update(self, tile):
        self.out[..., :tile.kj] += tile.block_sums.sum(2)

    def finish(self):
        return self.out.mean(0)


class TopKeys:
    """``(h, I, 2, k)``: per query block the ``k`` keys with the most mean mass over its live
    rows (all the batch's) (``[..., 0, :]``, float64: exact integers) and that mass
    (``[..., 1, :]``); ``k`` at most the keys."""

    name = "topk"

    def __init__(self, k: int = 8):
        self.k = k

    def shape(self, call):
        return (call.h, call.query_blocks, 2, min(self.k, call.nk))

    def init(self, call):
        self.call, k = call, min(self.k, call.nk)
        self.out = torch.zeros(call.h, call.query_blocks, 2, k, dtype=torch.float64,
                               device=call.device)
        self.out[:, :, 0] = torch.arange(k, dtype=torch.float64)
        # a block cut into pieces: its mass so far over the keys, and its live rows
        self.pending = torch.zeros(call.h, call.nk, dtype=torch.float64, device=call.device)
        self.pending_rows = torch.zeros(call.h, dtype=torch.float64, device=call.device)

    def update(self, tile):
        blk, I0 = self.call.block, tile.r0 // self.call.block
        sums, rows = tile.block_sums.sum(0).double(), _row_counts(tile.live, blk).sum(0)
        end = min((I0 + 1) * blk, self.call.nq)
        if tile.r0 % blk == 0 and (tile.r1 % blk == 0 or tile.r1 == self.call.nq) \
                and tile.r1 >= end:  # whole blocks
            self._top(I0, sums / rows.clamp(min=1)[..., None])
            return
        self.pending[:, :tile.kj] += sums[:, 0]
        self.pending_rows += rows[:, 0]
        if tile.r1 == end:  # the block's last piece
            self._top(I0, (self.pending / self.pending_rows.clamp(min=1)[:, None])[:, None])
            self.pending.zero_()
            self.pending_rows.zero_()

    def _top(self, I0: int, mean: torch.Tensor) -> None:
        """Keep the top keys of ``mean (h, I, keys)``, the mean mass of blocks ``I0..``."""
        k = min(self.out.shape[-1], mean.shape[-1])
        mass, keys = mean.topk(k, dim=-1)
        I1 = I0 + mean.shape[1]
        self.out[:, I0:I1, 0, :k], self.out[:, I0:I1, 1, :k] = keys.double(), mass

    def finish(self):
        return self.out


class Distance:
    """``(h, D)``: the mean over live rows of the mass at distances in each bin of
    :func:`distance_edges` (batch mean)."""

    name = "distance"

    def shape(self, call):
        return (call.h, distance_edges(call.nk).numel() - 1)

    def init(self, call):
        self.edges = distance_edges(call.nk).to(call.device)
        self.out = torch.zeros(call.b, call.h, self.edges.numel() - 1, dtype=torch.float64,
                               device=call.device)
        self.rows = torch.zeros(call.b, call.h, dtype=torch.float64, device=call.device)

    def update(self, tile):
        # keys j with e_d <= i - j < e_{d+1}: the mass before i - e_d + 1 less the mass before
        # i - e_{d+1} + 1, every bound of every row in one gather of the cumulative sums
        cum = tile.cumulative
        bounds = (tile.rows[:, None] - self.edges[None, :] + 1).clamp_(0, tile.kj)  # (c, D+1)
        before = cum.gather(-1, bounds.expand(*cum.shape[:2], *bounds.shape))
        self.out += (before[..., :-1] - before[..., 1:]).sum(2)
        self.rows += tile.live.sum(-1)

    def finish(self):
        return (self.out / self.rows.clamp(min=1)[..., None]).mean(0)


class RowMasses:
    """``(h, 5)``: the mean over live rows of the mass on the sink keys (``j < sinks``), in
    the local window (``0 <= i - j < window``), on either (the streaming mass), further back
    than ``far`` tokens and not a sink (``i - j > far``, ``j >= sinks``: a head parked on the
    first token does not read far back), and the mean look-back ``sum_j p_j max(i - j, 0)``."""

    name = "row_masses"
    COLUMNS = ("sink", "local", "streaming", "far", "mean_distance")

    def shape(self, call):
        return (call.h, len(self.COLUMNS))

    def init(self, call):
        self.call = call
        self.out = torch.zeros(call.b, call.h, 5, dtype=torch.float64, device=call.device)
        self.rows = torch.zeros(call.b, call.h, dtype=torch.float64, device=call.device)

    def update(self, tile):
        c = self.call
        pos, zero = tile.rows, torch.zeros_like(tile.rows)
        sink = tile.mass_between(zero, zero + c.sinks)
        local = tile.mass_between(pos - c.window + 1, pos + 1)
        both = tile.mass_between(torch.maximum(pos - c.window + 1, zero + c.sinks), pos + 1)
        far = tile.mass_between(zero + c.sinks, pos - c.far)  # the sinks aside
        keys = torch.arange(tile.kj, device=pos.device, dtype=tile.probs.dtype)
        if c.causal:  # every key at or before its query: sum_j p_j (i - j) = i sum p - p . j
            mean = pos.to(keys.dtype) * tile.row_mass - tile.probs @ keys
        else:  # later keys are no look-back: distance 0
            back = (pos[:, None].to(keys.dtype) - keys[None, :]).clamp_(min=0)
            mean = (tile.probs * back).sum(-1)
        for x, v in enumerate((sink, local, sink + both, far, mean)):
            self.out[..., x] += v.sum(-1)
        self.rows += tile.live.sum(-1)

    def finish(self):
        return (self.out / self.rows.clamp(min=1)[..., None]).mean(0)


class MaxLogit:
    """``(h,)``: the largest logit each head's softmax saw (over allowed keys and the batch;
    ``-inf`` for a head with none): the quantity MuonClip caps. The example of a user
    reduction: three methods and a shape."""

    name = "max_logit"

    def shape(self, call):
        return (call.h,)

    def init(self, call):
        self.top = torch.full((call.h,), float("-inf"), dtype=torch.float64, device=call.device)

    def update(self, tile):
        self.top = torch.maximum(self.top, tile.scores.amax(dim=(0, 2, 3)).double())

    def finish(self):
        return self.top


BUILT_INS = (BlockMap, Received, TopKeys, Distance, RowMasses)


def check_reduction(r, call) -> None:
    """ValueError (one line) unless ``r`` follows the protocol and its :meth:`finish` on a
    small dry run returns ``r.shape(call)``; run before any work."""
    missing = [m for m in ("name", "shape", "init", "update", "finish") if not hasattr(r, m)]
    if missing:
        raise ValueError(f"headwise.long: reduction {type(r).__name__} lacks {missing}; a "
                         "reduction has name, shape(call), init(call), update(tile), finish()")
    from headwise.long.tiles import tiles

    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(call.b, call.h, call.nq, 8, generator=g)
    k = torch.randn(call.b, call.h, call.nk, 8, generator=g)
    r.init(call)
    for tile in tiles(q, k, call, mask=None, causal=True, scale=None, softcap=None, sinks=None,
                      budget=call.block * call.nk * call.h * call.b):
        r.update(tile)
    got, want = tuple(r.finish().shape), tuple(r.shape(call))
    if got != want:
        raise ValueError(f"headwise.long: reduction {r.name!r} returned shape {got} where its "
                         f"shape(call) says {want} (h={call.h}, nq={call.nq}, nk={call.nk}, "
                         f"block={call.block}); make finish() return shape(call)")
