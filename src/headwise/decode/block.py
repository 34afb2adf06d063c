"""A block's one-row form: :class:`~headwise.models.DecoderBlock` for decoding rows ``x (b, m)``.

Axis legend: ``b`` rows, ``m`` model dim, ``h`` query heads, ``d`` head dim.
"""

from __future__ import annotations

import torch

from headwise.fast import rows as _rows

__all__ = ["BlockRow"]


class BlockRow:
    """A block for decoding rows ``x (b, m)``: its sublayers' one-row forms (attention, norms,
    feed-forward; built by :func:`headwise.decode.forms.form_of`) in the block's residual order,
    each output projection with the residual addition fused (``x + y @ W^T`` as one ``addmm``).
    Dropout is off (eval).

    Args:
        pre: pre-norm (the block's ``norm_first``). cache: the block's
            :class:`~headwise.cache.LayerCache`.
        self_attn, cross_attn: :class:`~headwise.decode.attention.AttentionRow` forms
            (``cross_attn`` None in a language model).
        attn_norm, cross_norm, ff_norm: the norms' forms. ff: the feed-forward's
            ``(inner, down)``.
    """

    __slots__ = ("pre", "self_attn", "attn_norm", "cross_attn", "cross_norm", "ff_inner",
                 "ff_out", "ff_norm", "cache")

    def __init__(self, *, pre: bool, cache, self_attn, attn_norm, cross_attn, cross_norm, ff,
                 ff_norm):
        self.pre, self.cache = pre, cache
        self.self_attn, self.attn_norm, self.ff_norm = self_attn, attn_norm, ff_norm
        self.cross_attn, self.cross_norm = cross_attn, cross_norm
        self.ff_inner, self.ff_out = ff

    def __call__(self, x: torch.Tensor, rot, memory_mask, at=None) -> torch.Tensor:
        """``x (b, m)`` -> ``(b, m)``; ``rot``: this position's RoPE ``(cos, sin)`` or None;
        ``at``: the fixed-shape step's position and masks (``AttentionRow.static_attend``) or
        None (the growing cache)."""
        attn, cache = self.self_attn, self.cache.self_attn
        x = self._sublayer(x, self.attn_norm, attn.out,
                           (lambda y: attn.self_attend(y, cache, rot)) if at is None else
                           (lambda y: attn.static_attend(y, cache, rot, at)))
        if self.cross_attn is not None:
            cross = self.cross_attn
            x = self._sublayer(x, self.cross_norm, cross.out, lambda y: cross.cross_attend(
                y, self.cache.cross_attn, memory_mask))
        return self._sublayer(x, self.ff_norm, self.ff_out, self.ff_inner)

    def bind(self, plan, x: torch.Tensor, y: torch.Tensor, angles, pos: int):
        """Add this block's ops for rows ``x (b, m)`` -> ``y (b, m)`` to ``plan``
        (:class:`headwise.fast.plan.Plan`; ``angles``, ``pos`` as
        :meth:`~headwise.decode.attention.AttentionRow.bind` takes them): norm, attention, output
        product with the residual, norm, the feed-forward's inner product, its activation, its
        down product with the residual. Returns True, or where the plan leaves the activation to
        torch (:meth:`~headwise.decode.feedforward.GatedRow.bind`) the call to make for it
        between the two stretches the block then is; None where the block has no bound form
        (post-norm, cross-attention, a form without ``bind``, a declined kernel): the step runs
        unbound."""
        attn, norms = self.self_attn, (self.attn_norm, self.ff_norm)
        if (not self.pre or self.cross_attn is not None
                or not all(hasattr(f, "bind") for f in (*norms, self.ff_inner))):
            return None
        m, dtype = x.shape[1], x.dtype
        normed, mid = plan.buffer("normed", m, dtype), plan.buffer("mid", m, dtype)
        heads = plan.buffer("heads", attn.h * attn.d, dtype)
        inner = (self.attn_norm.bind(plan, x, normed)
                 and attn.bind(plan, normed, self.cache.self_attn, angles, pos, heads)
                 and _rows.bind(plan, heads, attn.out, mid, res=x)
                 and self.ff_norm.bind(plan, mid, normed) and self.ff_inner.bind(plan, normed))
        if not inner:
            return None
        rest, act = inner
        if rest is not None:
            plan.cut()
        return (rest or True) if _rows.bind(plan, act, self.ff_out, y, res=mid) else None

    def _sublayer(self, x, norm, out_w, inner):
        """Pre-norm ``x + inner(norm(x)) @ W``, post-norm ``norm(x + inner(x) @ W)``."""
        if self.pre:
            return _rows.residual(x, inner(norm(x)), out_w)
        return norm(_rows.residual(x, inner(x), out_w))
