"""Streaming per-head attention statistics, chunk by chunk, never holding ``(i, j)``.

Axis legend: ``b`` batch, ``h`` heads, ``i`` query position, ``j`` key position, ``k`` top-k.

:func:`head_stats` takes ``q``, ``k`` and (optionally) the fused kernel's log-sum-exp, and
recomputes the weights of ``chunk`` query rows at a time (:func:`headwise.weights.from_lse`),
reducing each chunk to per-row and per-key numbers before the next: working memory is a few
chunks of ``(b, h, chunk, j)``, whatever ``n`` is. :func:`collect` does it for every
:class:`~headwise.MultiHeadAttention` in a model during a forward pass.

Positions are bottom-right aligned as in causal attention: query ``i`` sits at key position
``i + j_len - i_len`` (self-attention: the same position).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch

from headwise import weights as _weights

__all__ = ["HeadStats", "head_stats", "collect", "observing"]


@dataclass
class HeadStats:
    """Per-row and per-key statistics of one attention call (fully masked rows are 0).

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
        live: ``(b, h, i)`` True for rows with at least one allowed key.
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


@torch.no_grad()
def head_stats(q: torch.Tensor, k: torch.Tensor, *, mask: torch.Tensor | None = None,
               causal: bool = False, scale: float | None = None, lse: torch.Tensor | None = None,
               token_ids: torch.Tensor | None = None, top_k: int = 5,
               budget: int = _weights.CHUNK_ELEMENTS) -> HeadStats:
    """Statistics of the attention of ``q (b, h, i, d)`` over ``k (b, g, j, d)``.

    Args:
        mask, causal, scale: as in :func:`headwise.attention`.
        lse: ``(b, h, i)`` the row log-sum-exp from the fused kernel (computed in a chunked pass
            when not given).
        token_ids: ``(b, j)`` ids of the key sequence (self-attention) for the induction score.
        top_k: keys kept per query row (at most ``j``).
        budget: elements of one chunk of weights.
    """
    b, h, nq, _ = q.shape
    nk = k.shape[2]
    _check(q, k, token_ids, top_k)
    if lse is None:
        lse = _weights.logsumexp(q, k, mask=mask, causal=causal, scale=scale, budget=budget)
    top_k = min(top_k, nk)
    acc = _Accumulator(b, h, nq, nk, top_k, q.device, token_ids)
    for r0, r1 in _weights._chunks(nq, b * h * nk, budget):
        w = _weights.from_lse(q, k, lse, mask=mask, causal=causal, scale=scale, budget=budget,
                              selection=_weights.Selection(rows=slice(r0, r1)))
        acc.add(w.float(), r0, r1)
    return acc.result()


class _Accumulator:
    """Reduces chunks of weights ``(b, h, c, j)`` to the rows and keys of :class:`HeadStats`."""

    def __init__(self, b, h, nq, nk, top_k, device, token_ids):
        rows = lambda: torch.zeros(b, h, nq, device=device)  # noqa: E731
        self.entropy, self.max_weight, self.sink = rows(), rows(), rows()
        self.live = torch.zeros(b, h, nq, dtype=torch.bool, device=device)
        self.prev_token, self.distance = rows(), rows()
        self.induction = rows() if token_ids is not None else None
        self.received = torch.zeros(b, h, nk, device=device)
        self.top_values = torch.zeros(b, h, nq, top_k, device=device)
        self.top_keys = torch.zeros(b, h, nq, top_k, dtype=torch.long, device=device)
        self.nq, self.nk, self.top_k, self.ids = nq, nk, top_k, token_ids
        self.keys = torch.arange(nk, device=device)

    def add(self, w: torch.Tensor, r0: int, r1: int) -> None:
        pos = torch.arange(r0, r1, device=w.device) + (self.nk - self.nq)  # (c,) key positions
        self.live[:, :, r0:r1] = w.sum(-1) > 0.5  # a live row sums to 1, a dead one to 0
        self.entropy[:, :, r0:r1] = torch.special.entr(w).sum(-1)
        self.max_weight[:, :, r0:r1] = w.amax(-1)
        self.received += w.sum(2)
        self.sink[:, :, r0:r1] = w[..., 0]
        prev = (pos - 1).clamp(min=0)
        self.prev_token[:, :, r0:r1] = (w.gather(-1, prev.expand(*w.shape[:2], -1)[..., None])
                                        [..., 0] * (pos >= 1))
        gap = (pos[:, None] - self.keys[None, :]).abs().to(w.dtype)  # (c, j)
        self.distance[:, :, r0:r1] = (w * gap).sum(-1)
        values, keys = w.topk(self.top_k, dim=-1)
        self.top_values[:, :, r0:r1], self.top_keys[:, :, r0:r1] = values, keys
        if self.induction is not None:
            self.induction[:, :, r0:r1] = (w * self._induction_targets(pos)[:, None]).sum(-1)

    def _induction_targets(self, pos: torch.Tensor) -> torch.Tensor:
        """``(b, c, j)`` 1.0 at key ``j`` when token ``j - 1`` equals the query's token and
        ``j - 1 < `` the query's position (Olsson et al. 2022, induction heads)."""
        ids = self.ids
        current = ids.gather(1, pos.clamp(max=self.nk - 1).expand(ids.shape[0], -1))  # (b, c)
        before = torch.cat([ids.new_full((ids.shape[0], 1), -1), ids[:, :-1]], dim=1)  # (b, j)
        same = before[:, None, :] == current[:, :, None]
        earlier = self.keys[None, :] - 1 < pos[:, None]
        return (same & earlier[None] & (self.keys >= 1)).to(torch.float32)

    def result(self) -> HeadStats:
        return HeadStats(self.entropy, self.max_weight, self.received, self.sink,
                         self.prev_token, self.induction, self.distance, self.top_values,
                         self.top_keys, self.live)


def _check(q, k, token_ids, top_k) -> None:
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ValueError(f"head_stats: top_k must be an int >= 1, got {top_k!r}")
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"head_stats: q and k must be (b, h, i, d) and (b, g, j, d), got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    if token_ids is not None and tuple(token_ids.shape) != (k.shape[0], k.shape[2]):
        raise ValueError(f"head_stats: token_ids must be (b, j)=({k.shape[0]}, {k.shape[2]}) "
                         f"(the key sequence's ids), got {tuple(token_ids.shape)}")


_collector = None


def collecting() -> bool:
    """True inside :func:`collect` (MultiHeadAttention then reports its q, k and mask)."""
    return _collector is not None


def observe(module, q, k, mask, causal, scale, self_attention: bool) -> None:
    """Called by MultiHeadAttention while :func:`collect` is active."""
    if _collector is not None:
        _collector(module, q, k, mask, causal, scale, self_attention)


@contextmanager
def collect(model: torch.nn.Module, *, token_ids: torch.Tensor | None = None, top_k: int = 5,
            budget: int = _weights.CHUNK_ELEMENTS):
    """Collect :class:`HeadStats` of every attention call of ``model`` during the block::

        with hw.stats.collect(lm, token_ids=tokens) as found:
            lm(tokens)
        found["blocks.0.self_attn"][0].per_head("entropy")   # (b, h)

    Yields a dict module path -> list of HeadStats (one per call). ``token_ids (b, n)`` feed
    the induction score of self-attention calls whose key length is ``n``.
    """
    paths = {id(m): name for name, m in model.named_modules()}
    found: dict[str, list[HeadStats]] = {}

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
    kernel got them). :func:`collect` is one such callback; the head catalogue
    (:mod:`headwise.head_catalogue`) is another. Blocks nest: the innermost callback is active."""
    global _collector
    previous, _collector = _collector, callback
    try:
        yield
    finally:
        _collector = previous
