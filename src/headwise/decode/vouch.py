"""The KV cache's NaN vouching: which cached positions are known finite, and the one-call
self-attention that relies on it.

Axis legend: ``b`` rows, ``h`` query heads, ``g`` key/value heads, ``d`` head dim, ``j`` cached
positions.

Why. The fused attention kernels take no NaN policy of their own: a NaN or inf in a query, key
or value must reach exactly the outputs the module path's policy gives it (the eager reference of
:func:`headwise.attend.dispatch` applies it). Reading the whole cache for NaN every step would
cost a pass over it per layer and token, so a :class:`Vouch` remembers how many leading positions
of one layer's :class:`~headwise.cache.SelfAttentionCache` were found finite: the prompt's are
read once, then each step's new position is checked with its query (one total) and vouched for.

Every rule of that bookkeeping lives here. The cache only tells its vouch (if one is attached:
:func:`vouched`) where it rewrote positions (``update``) or wrote behind its back (``write``);
:meth:`Vouch.attend_new` returns one type, :class:`Attended`, for all its outcomes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headwise.fast import finite, host
from headwise.fast import native as _native

__all__ = ["Attended", "DECLINED", "Vouch", "vouched"]


@dataclass(frozen=True, slots=True)
class Attended:
    """What :meth:`Vouch.attend_new` did, one type for every outcome.

    - ``heads (b, h*d)``: it attended (every input finite): the attention's output;
    - ``q (b, h, 1, d)``, ``k``, ``v (b, g, j, d)``: it wrote this position's k and v but some
      query, key or value is not finite (or it could not attend): the caller applies the NaN
      policy to these, as :meth:`~headwise.cache.SelfAttentionCache.update` would return them;
    - all None (:attr:`declined`): the kernel does not apply and nothing was done.
    """

    heads: torch.Tensor | None = None
    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    @property
    def declined(self) -> bool:
        return self.heads is None and self.q is None


#: nothing done: the kernel does not apply
DECLINED = Attended()


class Vouch:
    """Positions ``0 .. upto - 1`` of one layer's self-attention cache hold no NaN or inf.

    Attached to its cache by :func:`vouched` (the cache's ``vouch`` slot), so the word given
    outlives one :class:`~headwise.decode.step.DecodeStep`, as the cache's contents do. It holds
    the cache's buffers ``k, v (b, g, L, d)``, not the cache: a reference back would make a cycle
    that keeps the buffers alive until the garbage collector's next pass."""

    __slots__ = ("k", "v", "upto")

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k, self.v, self.upto = k, v, 0

    def rewritten(self, start: int) -> None:
        """The cache wrote positions from ``start`` on: they are unchecked again."""
        self.upto = min(self.upto, start)

    def forget(self) -> None:
        """The cache was written where this cannot tell (the fixed-shape form's ``write`` at a
        position tensor): every position is read again if asked."""
        self.upto = 0

    def vouch(self, end: int) -> None:
        """The caller found positions up to ``end - 1`` finite itself (the bound step's one-call
        attention, which checks each new position with its query)."""
        self.upto = end

    def all_finite(self, end: int, vouched: int = 0) -> bool:
        """Whether the keys/values of positions ``0 .. end - 1`` hold no NaN or inf, reading only
        the positions not found finite before (the prompt's once, then one new position per step,
        instead of the whole cache every step); the caller found the last ``vouched`` of them
        finite itself (the step checks a new position's q, k and v in one total). CPU only:
        elsewhere the answer would cost a device sync, and this says False (the caller applies
        the policy as usual)."""
        k, v = self.k, self.v
        if not host(k):
            return False
        if self.upto < end - vouched:
            new = (slice(None), slice(None), slice(self.upto, end - vouched))
            if not finite(k[new], v[new]):
                return False
        self.upto = max(self.upto, end)
        return True

    def attend_new(self, cache, rows: torch.Tensor, rot, heads: int, r: int,
                   window: int | None) -> Attended:
        """The decoding step's self-attention of one new position per row in one C call
        (:func:`headwise.fast.native.self_rows`): RoPE on ``rows (b, (heads + 2 g) d)`` (a
        fused q|k|v projection; ``rot``, ``r`` as that function takes them) in place, its k and
        v written into ``cache`` (this vouch's :class:`~headwise.cache.SelfAttentionCache`) as
        its ``update`` writes them, and the new queries' attention over every cached position
        (the last ``window`` with a sliding window) when this position's and all earlier
        keys/values are finite."""
        start = cache.offset
        end = start + 1
        cache.fits(end)
        self.rewritten(start)  # (as update: a rewritten position)
        before = self.all_finite(start)  # (the earlier positions: read once, then known)
        first = 0 if window is None else max(0, end - window)
        got = _native.self_rows(rows, rot, self.k, self.v, start, first, heads, r, before)
        if got is None:
            return DECLINED
        if got[1] is not None:
            self.upto = end  # (this position's k and v were found finite with its q)
            return Attended(heads=got[1])
        b, d = rows.shape[0], self.k.shape[3]
        q = rows[:, :heads * d].view(b, heads, 1, d)
        return Attended(q=q, k=self.k.narrow(2, 0, end), v=self.v.narrow(2, 0, end))


def vouched(cache) -> Vouch:
    """The :class:`Vouch` of a :class:`~headwise.cache.SelfAttentionCache`, attached on first
    use (a fresh cache vouches for nothing)."""
    if cache.vouch is None:
        cache.vouch = Vouch(cache.k, cache.v)
    return cache.vouch
