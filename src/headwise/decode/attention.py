"""Multi-head attention for one new position per row: the cached decoding step's form of
:class:`~headwise.layers.MultiHeadAttention` (chosen for it by :data:`headwise.decode.forms.FORMS`).

Axis legend: ``b`` rows, ``m`` model dim, ``h`` query heads, ``g`` key/value heads, ``d`` head
dim, ``j`` cached positions, ``r`` rotated features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from headwise.attend import dispatch, fused_path
from headwise.decode.vouch import vouched
from headwise.fast import finite
from headwise.fast import native as _native
from headwise.fast import rows as _rows

__all__ = ["AttentionRow"]


class AttentionRow:
    """A :class:`~headwise.layers.MultiHeadAttention` for decoding rows ``x (b, m)``, one new
    position each.

    The same projections (as :mod:`headwise.fast.rows` weights), the same RoPE, the same attention
    dispatch (backend, soft-capping, sinks) and the same :class:`~headwise.cache.KVCache` as the
    module; only the bookkeeping is gone. A sliding window reads the last ``window`` cached
    positions instead of masking the rest (the single newest query needs no mask at all).
    """

    __slots__ = ("qkv", "q", "k", "v", "out", "h", "g", "d", "rope", "window", "kw", "vouch")

    def __init__(self, attn, *, transpose: bool, fuse: bool, cross: bool):
        t = transpose
        self.h, self.g, self.d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.out = _rows.of_linear(attn.out_proj, t)
        self.rope, self.window = attn.rope, attn.window
        sinks = None if attn.sinks is None else attn.sinks.detach()
        self.kw = dict(backend=attn.backend, softcap=attn.softcap, sinks=sinks)
        # the fused path takes the step's word on NaN; the eager one reads for itself
        self.vouch = fused_path(attn.backend, attn.softcap, attn.sinks)
        self.qkv = self.k = self.v = None
        self.q = _rows.of_linear(attn.q_proj, t)
        if cross:
            return
        # one product over cat(W_q, W_k, W_v): their joined storage (_rows.lay_out) or shared
        # 4-bit codes, or with fuse a copy made once per generation
        self.qkv = next((_rows.of_group(group, t) for group in attn.joint_linears()), None)
        if self.qkv is None and fuse:
            self.qkv = _rows.weight(*attn.qkv_weight(), t)
        if self.qkv is not None:
            self.q = None
        else:
            self.k, self.v = _rows.of_linear(attn.k_proj, t), _rows.of_linear(attn.v_proj, t)

    def self_attend(self, x: torch.Tensor, cache, rot) -> torch.Tensor:
        """``x (b, m)`` -> heads ``(b, h*d)``; appends this position's k, v to ``cache``.
        ``rot``: this position's RoPE ``(cos, signed sin)`` from
        :meth:`~headwise.rope.RotaryEmbedding.angles` (None without RoPE)."""
        if getattr(cache, "ragged", False):  # each group over its own part of the cache
            return self._ragged(x, cache, rot)
        row = got = None
        if self.qkv is not None and self.vouch:  # RoPE, the cache write and the attention
            row = _rows.linear(x, self.qkv)      # in one C call where it applies
            r = 0 if self.rope is None else self.rope.rotary_dim
            got = vouched(cache).attend_new(cache, row, rot, self.h, r, self.window)
            if got.heads is not None:
                return got.heads
        if got is not None and not got.declined:  # (written; some input not finite: the policy)
            q, k, v, finite = got.q, got.k, got.v, False
        else:
            q, k, v, fresh = self._project(x, rot, row)
            k, v = cache.update(k, v)
            # NaN policy: this position's q, k, v were looked at once; the cache's vouch stands
            # for the others, so with every input known finite the fused kernel needs no policy
            finite = fresh and vouched(cache).all_finite(k.shape[2], vouched=1)
        if self.window is not None and k.shape[2] > self.window:
            k, v = k[:, :, -self.window:], v[:, :, -self.window:]
        # a single newest query sees every cached key: no causal mask (bottom-right alignment)
        if not finite:
            return dispatch(q, k, v, **self.kw)[0].view(x.shape[0], -1)
        out = _native.attend_rows(q, k, v)  # headwise's C kernel where it applies
        if out is None:
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=self.h != self.g)
        return out.view(x.shape[0], -1)

    def bind(self, plan, x: torch.Tensor, cache, angles, pos: int, out: torch.Tensor) -> bool:
        """Add :meth:`self_attend`'s one-call path for rows ``x (b, m)`` to ``plan``
        (:class:`headwise.fast.plan.Plan`), heads into ``out (b, h*d)`` in ``x``'s dtype: the
        q|k|v product, the C call of RoPE (``angles``: every position's, or None), the cache
        write at the step's position and the attention (as of position ``pos``), in bfloat16
        the rounding of its float32 output; False where :meth:`self_attend` takes another path
        (then the step runs unbound)."""
        if self.qkv is None or not self.vouch or getattr(cache, "ragged", False):
            return False
        r = 0 if self.rope is None else self.rope.rotary_dim
        row = plan.buffer("q|k|v", (self.h + 2 * self.g) * self.d, x.dtype)
        heads = (out if x.dtype is torch.float32
                 else plan.buffer("heads float32", self.h * self.d, torch.float32))
        return (_rows.bind(plan, x, self.qkv, row)
                and plan.self_attention(row, angles if r else None, cache.k, cache.v, self.h,
                                        r, self.window, pos, heads)
                and (heads is out or plan.to_bf16(heads, out)))

    def static_attend(self, x: torch.Tensor, cache, rot, at) -> torch.Tensor:
        """The fixed-shape form of :meth:`self_attend` (a device's step, see
        :func:`headwise.fast.fixed_shapes`): ``at = (pos (1,), allowed (1, 1, 1, L) bool,
        bias (1, 1, 1, L) additive)`` from the step, built once per token for every layer.
        The new k, v go into the cache at ``pos``; attention runs over all ``L`` positions with
        the later ones (and those before a sliding window) masked. NaN policy: the fused kernels
        spread a NaN of a query row to that row and of a key/value to every query that sees it,
        and the one new query sees every filled position, which is the policy here (unfilled
        positions hold zeros); the eager reference (soft-capping, sinks, a named backend) applies
        it itself."""
        if getattr(cache, "ragged", False):  # (Python-int positions: no CUDA graph)
            return self._ragged(x, cache, rot)
        pos, allowed, bias = at
        q, k, v, _ = self._project(x, rot)
        k, v = cache.write(k, v, pos)
        b = x.shape[0]
        if not self.vouch:
            return dispatch(q, k, v, mask=allowed, **self.kw)[0].reshape(b, -1)
        # the h/g query heads that share a key/value head attend as h/g rows of that head (one
        # position, so no causal mask): no copy of the cache's heads, any kernel takes it
        q = q.reshape(b, self.g, self.h // self.g, self.d)
        # (the CUDA kernels may lay the output out as (b, h/g, g, d): reshape, not view)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias).reshape(b, -1)

    def _ragged(self, x: torch.Tensor, cache, rot) -> torch.Tensor:
        """Self-attention through a head-wise cache layer (:mod:`headwise.decode.ragged`):
        it writes this position's k, v as its plan keeps them and attends each part of the
        cache with the C kernel where it applies."""
        q, k, v, _ = self._project(x, rot)
        return cache.attend(q, k, v, **self.kw).reshape(x.shape[0], -1)

    def _project(self, x: torch.Tensor, rot, row: torch.Tensor | None = None):
        """``(q (b, h, 1, d), k (b, g, 1, d), v (b, g, 1, d), fresh)``: the projections, RoPE
        turned; ``fresh``: all three were found finite (only asked where the fused path reads
        the answer). ``row``: the fused q|k|v projection of ``x``, if already made."""
        b, h, g, d = x.shape[0], self.h, self.g, self.d
        turned = None  # the C kernel's answer: q and k turned in place, is every q/k/v finite?
        if self.qkv is not None:  # q and k side by side: RoPE turns them in one pass
            row = _rows.linear(x, self.qkv) if row is None else row
            if self.rope is not None:
                turned = _native.rope_rows(row, *rot, h + g, d, self.rope.rotary_dim)
            qk, v = row.split_with_sizes((h * d + g * d, g * d), dim=-1)
        else:
            qk = torch.cat([_rows.linear(x, w) for w in (self.q, self.k)], dim=-1)
            v = _rows.linear(x, self.v)
            if self.rope is not None:  # (its answer covers q and k; v's is asked here)
                turned = _native.rope_rows(qk, *rot, h + g, d, self.rope.rotary_dim)
                if turned and self.vouch:
                    turned = finite(v) is True
        qk = qk.view(b, h + g, 1, d)
        if self.rope is not None and turned is None:
            qk = self.rope.rotate(qk, *rot)
        q, k = qk.split_with_sizes((h, g), dim=1)
        fresh = self.vouch and (turned if turned is not None else finite(qk, v) is True)
        return q, k, v.view(b, g, 1, d), fresh

    def cross_attend(self, x: torch.Tensor, cache, mask) -> torch.Tensor:
        """``x (b, m)`` against the encoder keys/values the prompt step stored in ``cache``."""
        b = x.shape[0]
        q = _rows.linear(x, self.q).view(b, self.h, 1, self.d)
        out, _ = dispatch(q, cache.k, cache.v, mask=mask, **self.kw)
        return out.reshape(b, -1)

