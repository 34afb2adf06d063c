"""Streaming per-head attention statistics, chunk by chunk, never holding ``(i, j)``.

Axis legend: ``b`` batch, ``h`` heads, ``i`` query position, ``j`` key position, ``k`` top-k.

:func:`head_stats` takes ``q``, ``k`` and (optionally) the fused kernel's log-sum-exp, and
recomputes the weights of a chunk of query rows at a time, whole rows (so the softmax is exact on
its own), reducing each chunk to per-row and per-key numbers before the next. The scores and the
weights of a chunk live in two buffers of at most ``budget`` elements, reused for every chunk;
a causal chunk computes only the keys up to its last row (the rest are masked), which halves the
work. Working memory is those two buffers plus the ``(b, h, i)`` results: linear in ``n``.
:func:`collect` does it for every :class:`~headwise.MultiHeadAttention` in a model during a
forward pass.

Off the CPU nothing is read back to the host, and the work is sized for the device
(:mod:`headwise.fast` decides): on CUDA one Triton kernel walks the keys in registers like
flash attention and writes only the results (:mod:`headwise.fast.stats_triton`); elsewhere
(or ``HEADWISE_TRITON=0``) this torch path runs in blocks of
:data:`headwise.fast.DEVICE_BLOCK_ELEMENTS` (a causal block of short rows takes more rows).
The CPU keeps its cache-sized chunks.

Positions are bottom-right aligned as in causal attention: query ``i`` sits at key position
``i + j_len - i_len`` (self-attention: the same position).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch

from headwise import fast as _fast
from headwise import finders
from headwise import masks as _masks
from headwise import observe as _observe
from headwise import weights as _weights
from headwise.fast import finite

__all__ = ["Collected", "HeadStats", "head_stats", "collect", "observing"]

COLUMNS = {"entropy": "{:.2f}", "max_weight": "{:.3f}", "sink": "{:.3f}", "prev_token": "{:.3f}",
           "induction": "{:.3f}", "distance": "{:.1f}"}  # a HeadStats' repr: attribute -> format
NOTE = "per head: the mean over live query rows and the batch (the raw tensors: {})"


@dataclass
class HeadStats:
    """Per-row and per-key statistics of one attention call (fully masked rows are 0; a row
    whose query, or a head whose keys, hold NaN or inf has NaN statistics, as its output would).

    Attributes:
        entropy: ``(b, h, i)`` entropy of each query row's weights, in nats.
        max_weight: ``(b, h, i)`` the largest weight of each row.
        received: ``(b, h, j)`` attention each key receives (column sums over query rows).
        sink: ``(b, h, i)`` weight on the first key position.
        prev_token: ``(b, h, i)`` weight on the key just before the query's own position.
        induction: ``(b, h, i)`` weight on the positions right after earlier occurrences of
            the query's token (None without ``token_ids``).
        distance: ``(b, h, i)`` mean ``|query position - key position|`` under the weights.
        top_values, top_keys: ``(b, h, i, k)`` the ``k`` largest weights of each row and their
            key positions.
        live: ``(b, h, i)`` True for rows with at least one allowed key (NaN rows included).
    """

    entropy: torch.Tensor
    max_weight: torch.Tensor
    received: torch.Tensor
    sink: torch.Tensor
    prev_token: torch.Tensor
    induction: torch.Tensor | None
    distance: torch.Tensor
    top_values: torch.Tensor
    top_keys: torch.Tensor
    live: torch.Tensor

    def per_head(self, name: str) -> torch.Tensor:
        """``(b, h)``: a per-row statistic averaged over live rows (``received``: over keys)."""
        x = getattr(self, name)
        if name == "received":
            return x.mean(-1)
        live = self.live.to(x.dtype)
        return (x * live).sum(-1) / live.sum(-1).clamp(min=1)

    def as_dict(self) -> dict[str, torch.Tensor | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def table(self, title: str) -> list[str]:
        """The repr: ``title``, shapes, a row per head of :data:`COLUMNS` (:meth:`per_head`)."""
        (b, h, i), j = self.entropy.shape, self.received.shape[-1]
        cols = [(name, fmt, self.per_head(name).double().mean(0).tolist())
                for name, fmt in COLUMNS.items() if getattr(self, name) is not None]
        head = "  head " + " ".join(f"{c:>10}" for c, *_ in cols)
        return [f"{title} b={b} h={h} i={i} j={j}", head,
                *(f"  {x:>4} " + " ".join(f"{f.format(v[x]):>10}" for _, f, v in cols)
                  for x in range(h))]

    def __repr__(self) -> str:
        return "\n".join([NOTE.format(".entropy"), *self.table("HeadStats")])


class Collected(dict):
    """What :func:`collect` yields: a dict module path -> [:class:`HeadStats` per call], whose
    repr is a table per layer (heads x statistics) of each layer's first call."""

    def __repr__(self) -> str:
        lines = [NOTE.format("[path][call].entropy")] if self else ["Collected({}): no call seen"]
        for path, calls in self.items():
            lines += calls[0].table(f"[{path!r}][0] of {len(calls)} call(s):")
        return "\n".join(lines)


@torch.no_grad()
def head_stats(q: torch.Tensor, k: torch.Tensor, *, mask: torch.Tensor | None = None,
               causal: bool = False, scale: float | None = None, lse: torch.Tensor | None = None,
               token_ids: torch.Tensor | None = None, top_k: int = 5,
               budget: int | None = None) -> HeadStats:
    """Statistics of the attention of ``q (b, h, i, d)`` over ``k (b, g, j, d)``.

    Args:
        mask, causal, scale: as in :func:`headwise.attention`.
        lse: ``(b, h, i)`` the row log-sum-exp from the fused kernel, used as each row's shift
            (without it, the row's largest score; the weights are the same, exact either way).
        token_ids: ``(b, j)`` integer ids of the key sequence (self-attention) for the
            induction score.
        top_k: keys kept per query row (at most ``j``).
        budget: elements of one chunk of weights (``b x h x rows x keys``); working memory is
            two such chunks plus the ``(b, h, i)`` results, so it grows linearly in ``n``.
            Default: :func:`headwise.fast.block_elements` (the CPU's cache-sized chunks, or
            a few hundred MiB on a GPU).

    On a CUDA device (:func:`headwise.fast.triton`, ``top_k`` up to 16) one Triton kernel
    computes everything without writing weights (:mod:`headwise.fast.stats_triton`; with
    ``lse`` given it is used as is, not renormalised: the weights are ``exp(s - lse)``).
    Nothing reads a value back to the host on a GPU.
    """
    _check(q, k, token_ids, top_k, lse)
    b, h, nq, _ = q.shape
    nk = k.shape[2]
    top_k = min(top_k, nk)
    # the NaN policy of headwise.attention (not the 0 of a masked row); masked keys: as if 0
    k, _, bad, _ = (k, 0, None, 0) if finite(q, k) else _masks.neutral(q, k, None, mask, causal)
    if _triton_kernel(q, k, top_k):
        from headwise.fast import stats_triton
        stats = HeadStats(**stats_triton.head_stats(
            q, k, mask=_masks.as_4d(mask), causal=causal, scale=scale, lse=lse,
            token_ids=token_ids, top_k=top_k))
    else:
        budget = budget or _fast.block_elements(q, k, cpu=_weights.CHUNK_ELEMENTS)
        acc = _Accumulator(b, h, nq, nk, top_k, q.device, token_ids)
        for chunk in _chunks(q, k, lse, mask=mask, causal=causal, scale=scale, budget=budget):
            acc.add(chunk)
        stats = acc.result()
    if bad is not None:
        _nan_rows(stats, bad)
    return stats


def _triton_kernel(q: torch.Tensor, k: torch.Tensor, top_k: int) -> bool:
    """The Triton kernel's reach: the device rule, then what the kernel takes."""
    if not _fast.triton(q, k):
        return False
    from headwise.fast.stats_triton import DTYPES, MAX_TOP_K
    return (1 <= top_k <= MAX_TOP_K and q.dtype == k.dtype and q.dtype in DTYPES
            and q.numel() > 0)


def _nan_rows(stats: HeadStats, bad: torch.Tensor) -> None:
    """NaN statistics for the rows ``bad (b, h, i, 1)`` (their query holds NaN or inf, or a key
    they may attend does: their output is NaN); a 0 there would read as a focused head."""
    for name in ("entropy", "max_weight", "sink", "prev_token", "induction", "distance"):
        if getattr(stats, name) is not None:
            getattr(stats, name).masked_fill_(bad[..., 0], float("nan"))
    stats.top_values.masked_fill_(bad, float("nan"))
    stats.live |= bad[..., 0]  # it has keys: its NaN counts in per_head


@dataclass
class _Chunk:
    """Rows ``r0:r1`` of one call: ``w (b, h, c, kj)`` their weights over keys ``0:kj`` (a
    causal chunk stops at its last row's position: every later key is masked for all its rows),
    the per-row statistics that fall out of the softmax, and ``spare``, a free buffer the size
    of ``w`` for products."""

    r0: int
    r1: int
    w: torch.Tensor
    entropy: torch.Tensor     # (b, h, c)
    max_weight: torch.Tensor  # (b, h, c)
    live: torch.Tensor        # (b, h, c)
    spare: torch.Tensor


def _chunks(q, k, lse, *, mask, causal, scale, budget) -> Iterator[_Chunk]:
    """The weights of ``q``'s rows, a chunk at a time, through two reused buffers of at most
    ``budget`` elements (scores, then weights): no page faults, no (i, j) tensor."""
    b, h, nq, d = q.shape
    g, nk = k.shape[1], k.shape[2]
    work = torch.promote_types(q.dtype, torch.float32)
    qs = q.to(work) * (1.0 / math.sqrt(d) if scale is None else scale)
    # contiguous once (q, k are usually strided views of one projection)
    kT = (k if g == h else k.repeat_interleave(h // g, dim=1)).to(work).contiguous()
    kT = kT.transpose(-1, -2)                                           # (b, h, d, j)
    mask = _masks.as_4d(mask)
    # a causal chunk reads keys up to its last row's position (bottom-right aligned); rows
    # that see no key (causal with more queries than keys) are in no chunk (not live)
    reach = (lambda r1: min(nk, r1 + nk - nq)) if causal else (lambda r1: nk)  # noqa: E731
    if _fast.host(q, k):  # as many rows as the budget holds at full width (tuned for cache)
        step = _weights.chunk_rows(b * h * nk, budget)
        spans = [(r0, min(nq, r0 + step)) for r0 in range(0, nq, step)]
    else:  # few large blocks: under causal, early blocks (short rows) take more rows
        spans = _spans(nq, reach, b * h, budget)
    spans = [(r0, r1) for r0, r1 in spans if reach(r1) > 0]
    size = max((b * h * (r1 - r0) * reach(r1) for r0, r1 in spans), default=0)
    buf = torch.empty(2, size, dtype=work, device=q.device)
    for r0, r1 in spans:
        kj = reach(r1)
        shape = (b, h, r1 - r0, kj)
        s = buf[0, :math.prod(shape)].view(shape)
        torch.matmul(qs[:, :, r0:r1], kT[..., :kj], out=s)
        masked = _mask(s, mask, causal, r0, r1, nq, nk)
        shift = None if lse is None else lse[:, :, r0:r1, None].to(work)
        yield _softmax(s, buf[1, :s.numel()].view(shape), shift, masked, r0, r1)


def _spans(nq: int, reach, heads: int, budget: int) -> list[tuple[int, int]]:
    """Row spans ``(r0, r1)`` whose ``heads x rows x reach(r1)`` weights fit ``budget``
    (at least one row each): Python integers only, so no value is read from the device."""
    spans, r0 = [], 0
    while r0 < nq:
        low, high = 1, nq - r0  # bisection for the most rows that fit
        while low < high:
            mid = (low + high + 1) // 2
            fits = heads * mid * max(1, reach(r0 + mid)) <= budget
            low, high = (mid, high) if fits else (low, mid - 1)
        spans.append((r0, r0 + low))
        r0 += low
    return spans


def _mask(s, mask, causal, r0, r1, nq, nk) -> tuple[int, int] | None:
    """Mask the scores ``s (b, h, c, kj)`` of rows ``r0:r1`` in place; return the key range
    that may hold masked (``-inf``) scores, or None."""
    h, kj = s.shape[1], s.shape[-1]
    rows = slice(r0, r1)
    first = max(0, r0 + nk - nq + 1)  # causal: keys before it are allowed for every row
    if causal and first < kj:
        _weights.mask_scores(s[..., first:], None, True, slice(0, h), rows,
                              slice(first, kj), nq, nk)
    if mask is not None:
        _weights.mask_scores(s, mask, False, slice(0, h), rows, slice(0, kj), nq, nk)
        return 0, kj
    return (first, kj) if causal and first < kj else None


def _softmax(s, w, shift, masked, r0, r1) -> _Chunk:
    """``w = softmax(s)`` row by row (fully masked rows 0), with each row's entropy and max
    weight from the same passes: for any shift ``m`` and ``z = sum_j exp(s_j - m)``,
    ``w_j = exp(s_j - m) / z``, ``entropy = log z - sum_j w_j (s_j - m)`` (no log per
    weight), and with ``m = max_j s_j`` the max weight is ``1 / z``."""
    top = shift is None
    shift = s.amax(-1, keepdim=True) if top else shift
    shift = shift.masked_fill(torch.isneginf(shift), 0.0)  # fully masked: -inf - 0 = -inf
    s.sub_(shift)
    torch.exp(s, out=w)
    z = w.sum(-1, keepdim=True)
    w.div_(z.clamp(min=torch.finfo(w.dtype).tiny))
    if masked is not None:  # 0 x -inf would be NaN in the entropy's sum
        s[..., masked[0]:masked[1]].clamp_(min=torch.finfo(s.dtype).min)
    z = z[..., 0]
    live = z > 0
    entropy = (z.log() - torch.mul(w, s, out=s).sum(-1)).masked_fill_(~live, 0.0)
    biggest = (1.0 / z).masked_fill_(~live, 0.0) if top else w.amax(-1)
    return _Chunk(r0, r1, w, entropy, biggest, live, spare=s)


class _Accumulator:
    """Reduces chunks of weights ``(b, h, c, kj)`` to the rows and keys of :class:`HeadStats`."""

    def __init__(self, b, h, nq, nk, top_k, device, token_ids):
        rows = lambda: torch.zeros(b, h, nq, device=device)  # noqa: E731
        self.entropy, self.max_weight, self.sink = rows(), rows(), rows()
        self.live = torch.zeros(b, h, nq, dtype=torch.bool, device=device)
        self.prev_token, self.distance = rows(), rows()
        self.induction = rows() if token_ids is not None else None
        self.received = torch.zeros(b, h, nk, device=device)
        self.top_values = torch.zeros(b, h, nq, top_k, device=device)
        # a causal chunk with kj < top_k keys fills top_keys[..., :kj]; the rest name keys
        # kj.. (past its reach: weight 0), as do rows of no chunk (no key in reach)
        self.top_keys = torch.arange(top_k, device=device).expand(b, h, nq, -1).clone()
        self.nq, self.nk, self.top_k, self.ids = nq, nk, top_k, token_ids
        self.keys = torch.arange(nk, device=device)

    def add(self, c: _Chunk) -> None:
        w, rows, kj = c.w, slice(c.r0, c.r1), c.w.shape[-1]
        pos = torch.arange(c.r0, c.r1, device=w.device) + (self.nk - self.nq)  # key positions
        self.live[:, :, rows], self.entropy[:, :, rows] = c.live, c.entropy
        self.max_weight[:, :, rows] = c.max_weight
        self.received[..., :kj] += w.sum(2)
        self.sink[:, :, rows] = w[..., 0]
        prev = (pos - 1).clamp(min=0)
        self.prev_token[:, :, rows] = (w.gather(-1, prev.expand(*w.shape[:2], -1)[..., None])
                                       [..., 0] * (pos >= 1))
        gap = (pos[:, None] - self.keys[None, :kj]).abs().to(w.dtype)  # (c, kj)
        self.distance[:, :, rows] = torch.mul(w, gap, out=c.spare).sum(-1)
        top = min(self.top_k, kj)
        values, keys = w.topk(top, dim=-1)
        self.top_values[:, :, rows, :top], self.top_keys[:, :, rows, :top] = values, keys
        if self.induction is not None:
            targets = self._induction_targets(pos, kj)[:, None]  # (b, 1, c, kj)
            self.induction[:, :, rows] = torch.mul(w, targets, out=c.spare).sum(-1)

    def _induction_targets(self, pos: torch.Tensor, kj: int) -> torch.Tensor:
        """``(b, c, kj)`` 1.0 at key ``j`` when token ``j - 1`` equals the query's token and
        ``j - 1 < `` the query's position (Olsson et al. 2022, induction heads)."""
        ids, keys = self.ids, self.keys[:kj]
        current = ids.gather(1, pos.clamp(0, self.nk - 1).expand(ids.shape[0], -1))  # (b, c)
        before = torch.cat([ids.new_full((ids.shape[0], 1), -1), ids[:, :kj - 1]], dim=1)
        same = before[:, None, :] == current[:, :, None]
        earlier = keys[None, :] - 1 < pos[:, None]
        return (same & earlier[None] & (keys >= 1)).to(torch.float32)

    def result(self) -> HeadStats:
        return HeadStats(self.entropy, self.max_weight, self.received, self.sink,
                         self.prev_token, self.induction, self.distance, self.top_values,
                         self.top_keys, self.live)


def _check(q, k, token_ids, top_k, lse=None) -> None:
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ValueError(f"head_stats: top_k must be an int >= 1, got {top_k!r}")
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"head_stats: q and k must be (b, h, i, d) and (b, g, j, d), got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    _check_ids(token_ids)
    if lse is not None and tuple(lse.shape) != tuple(q.shape[:3]):
        raise ValueError(f"head_stats: lse must be (b, h, i)={tuple(q.shape[:3])}, got "
                         f"{tuple(lse.shape)}; cuDNN's (b, h, i, 1) is lse[..., 0], efficient "
                         "attention's (rows padded to a multiple of 32) is lse[..., :i]")
    if token_ids is not None and tuple(token_ids.shape) != (k.shape[0], k.shape[2]):
        raise ValueError(f"head_stats: token_ids must be (b, j)=({k.shape[0]}, {k.shape[2]}) "
                         f"(the key sequence's ids), got {tuple(token_ids.shape)}")


def _check_ids(token_ids) -> None:
    if token_ids is None:
        return
    if not isinstance(token_ids, torch.Tensor) or token_ids.is_floating_point() or \
            token_ids.is_complex() or token_ids.dtype == torch.bool:
        got = (str(token_ids.dtype).removeprefix("torch.") if isinstance(token_ids, torch.Tensor)
               else type(token_ids).__name__)
        raise TypeError(f"head_stats: token_ids must be an integer tensor (int64 or int32, the "
                        f"tokenizer's ids), got {got}; pass the ids before any embedding")
    if token_ids.device.type == "meta":
        raise ValueError("head_stats: token_ids is a meta tensor (no ids); pass them on q's device")


@contextmanager
def collect(model: torch.nn.Module, *, token_ids: torch.Tensor | None = None, top_k: int = 5,
            budget: int | None = None):
    """Collect :class:`HeadStats` of every attention call of ``model`` during the block::

        with hw.stats.collect(lm, token_ids=tokens) as found:
            lm(tokens)
        found["blocks.0.self_attn"][0].per_head("entropy")   # (b, h)

    Yields a :class:`Collected`, a dict module path -> list of HeadStats (one per call), which
    prints as a table per layer. ``token_ids (b, n)`` feed
    the induction score of self-attention calls whose key length is ``n``. A transformers model
    must run ``attn_implementation="headwise"`` (:func:`headwise.hf.use`), else ValueError: on
    another implementation its heads never report, and the dict would stay empty.
    """
    _check_ids(token_ids)
    finders.layers(model, "headwise.stats.collect")  # another library's model: ValueError unless
    # its layers report to headwise (headwise.hf registers the finder; the core never imports it)
    paths = {id(m): name for name, m in model.named_modules()}
    found = Collected()

    def add(module, q, k, mask, causal, scale, self_attention):
        ids = (token_ids if self_attention and token_ids is not None
               and tuple(token_ids.shape) == (k.shape[0], k.shape[2]) else None)
        stats = head_stats(q, k, mask=mask, causal=causal, scale=scale, token_ids=ids,
                           top_k=top_k, budget=budget)
        found.setdefault(paths.get(id(module), type(module).__name__), []).append(stats)

    with observing(add):
        yield found


@contextmanager
def observing(callback):
    """Call ``callback(module, q, k, mask, causal, scale, self_attention)`` for every
    :class:`~headwise.MultiHeadAttention` call inside the block (``q (b, h, i, d)``,
    ``k (b, g, j, d)`` after the head split and rotary positions; ``mask`` and ``causal`` as the
    kernel got them): an observer of :mod:`headwise.observe`'s attention calls. :func:`collect`
    is one such callback; the head catalogue (:mod:`headwise.analysis.catalogue`) is another.
    Blocks nest: the innermost callback is active."""
    with _observe.observing(_observe.Observer(attention=callback)):
        yield
