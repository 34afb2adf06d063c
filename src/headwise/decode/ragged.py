"""The head-wise KV cache: per layer, the key/value groups a :class:`~headwise.kvplan.KVPlan`
keeps whole in one buffer and its streaming groups in a ring of ``S + W`` slots.

Axis legend: ``b`` rows, ``h`` query heads, ``g`` key/value groups, ``i`` query positions,
``j`` cached positions, ``s`` ring slots (``S + W``), ``d`` head dim.

Why. A streaming group needs only its first ``S`` positions and the ``W`` latest (the rule:
:func:`headwise.kvplan.streaming_allowed`), so it gets a buffer of ``S + W`` slots, not a full
one masked: the bytes are really saved, and a decoding step reads only them. Keys are stored
already turned by RoPE at their true positions and each query is turned at its own, so where a
key sits in the ring does not matter: attention over a set of keys ignores their order.

One :class:`RaggedLayer` per layer, used by headwise's module path (prefill:
:meth:`RaggedLayer.attend`), the decoding step (:meth:`RaggedLayer.attend`, one position; the C
kernel over each part's own buffer where it applies) and transformers'
(:class:`headwise.hf.HeadwiseKVCache`). Left padding is read from the prefill's mask: each row's
sinks are its first real positions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from headwise import limits
from headwise.attend import dispatch, fused_path
from headwise.cache import LayerCache, Ragged
from headwise.fast import finite
from headwise.fast import native as _native
from headwise.kvplan import KVPlan, slot, streaming_allowed

__all__ = ["HeadwiseCache", "RaggedLayer", "headwise_cache"]


class RaggedLayer(Ragged):
    """One layer's keys/values as ``plan`` says: ``kf, vf (b, |F|, L, d)`` for the full groups
    and ``kr, vr (b, |S|, S+W, d)`` for the streaming ones. ``n``: positions seen (the next
    key's position); ``starts (b,)``: each row's first real position (its left padding)."""

    ready = False  # (as a self-attention cache: it always projects the new positions)

    def __init__(self, plan: KVPlan, layer: int, batch: int, max_len: int, *, dtype, device):
        self.sinks, self.window, self.groups = plan.sinks, plan.window, plan.groups
        self.full, self.stream = plan.full(layer), plan.streaming[layer]
        self.max_len, d = max_len, plan.head_dim
        ring = plan.sinks + plan.window
        self.kf, self.vf = (torch.zeros(batch, len(self.full), max_len, d, dtype=dtype,
                                        device=device) for _ in range(2))
        self.kr, self.vr = (torch.zeros(batch, len(self.stream), ring, d, dtype=dtype,
                                        device=device) for _ in range(2))
        self.n, self.clean, self.vouch = 0, True, None
        self.starts = torch.zeros(batch, dtype=torch.long, device=device)
        self.uniform = True  # every row starts at 0 (no left padding)
        self._heads = {}

    @property
    def offset(self) -> int:
        return self.n

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kf, self.vf, self.kr, self.vr))

    def heads(self, groups: tuple[int, ...], h: int, device) -> torch.Tensor:
        """The query heads of ``groups`` (group ``c`` serves heads ``c*r .. c*r + r-1``)."""
        key = (groups, h)
        if key not in self._heads:
            r = h // self.groups
            self._heads[key] = torch.tensor([c * r + i for c in groups for i in range(r)],
                                            dtype=torch.long, device=device)
        return self._heads[key]

    def _index(self, groups: tuple[int, ...], device) -> torch.Tensor:
        """``groups`` as an index tensor, made once."""
        if groups not in self._heads:
            self._heads[groups] = torch.tensor(groups, dtype=torch.long, device=device)
        return self._heads[groups]

    # ------------------------------------------------------------------ attention
    def attend(self, q, k, v, *, mask=None, causal=True, scale=None, **kw) -> torch.Tensor:
        """Write the new ``k, v (b, g, i, d)`` as the plan keeps them and attend ``q (b, h, i,
        d)``: the full groups over every position, the streaming ones under the sinks + window
        rule. ``i`` > 1 only for the first call (the prompt); ``mask (b, 1, i, j)`` bool over
        the logical positions (True = may attend) or None; ``kw``: :func:`dispatch`'s backend,
        softcap, sinks. Returns ``(b, h, i, d)``."""
        i, h = q.shape[2], q.shape[1]
        if i > 1 and self.n:
            raise ValueError(f"HeadwiseCache: a head-wise cache takes the prompt in one call, "
                             f"then one position per step; got {i} positions after {self.n}")
        if self.n + i > self.max_len:
            raise ValueError(f"HeadwiseCache: {self.n + i} positions do not fit a cache of "
                             f"max_len={self.max_len}; create it with a larger max_len")
        if mask is not None and mask.dtype != torch.bool:
            mask = mask == 0  # (an additive mask: 0 where allowed)
        if self.n == 0:
            self._read_starts(mask, q.shape[0])
        self.clean = self.clean and finite(k, v) is True
        out = q.new_empty(q.shape[0], h, i, v.shape[3])
        parts = ((self.full, self._full), (self.stream, self._ring))
        for groups, part in parts:
            if not groups:
                continue
            idx = self.heads(groups, h, q.device)
            g = self._index(groups, k.device)
            own = kw if kw.get("sinks") is None else {**kw, "sinks": kw["sinks"][idx]}
            o = part(q.index_select(1, idx), k.index_select(1, g), v.index_select(1, g), mask,
                     causal, scale, own)
            out.index_copy_(1, idx, o.to(out.dtype))
        self.n += i
        return out

    def _full(self, q, k, v, mask, causal, scale, kw):
        n, i = self.n, q.shape[2]
        self.kf.narrow(2, n, i).copy_(k)
        self.vf.narrow(2, n, i).copy_(v)
        k, v = self.kf.narrow(2, 0, n + i), self.vf.narrow(2, 0, n + i)
        if i == 1 and mask is None:
            return self._one(q, k, v, scale, kw)
        return dispatch(q, k, v, mask=mask, causal=causal and mask is None, scale=scale, **kw)[0]

    def _ring(self, q, k, v, mask, causal, scale, kw):
        if q.shape[2] > 1:  # the prompt: attend under the rule, keep what the rule keeps
            rel = torch.arange(q.shape[2], device=q.device) - self.starts.view(-1, 1)
            allowed = streaming_allowed(rel[:, None, :, None], rel[:, None, None, :],
                                        self.sinks, self.window)
            if mask is not None:
                allowed = allowed & mask
            out = dispatch(q, k, v, mask=allowed, scale=scale, **kw)[0]
            self._keep(k, v)
            return out
        n = self.n
        slots = self._slots(n)
        idx = slots.view(-1, 1, 1, 1).expand(-1, k.shape[1], 1, k.shape[3])
        self.kr.scatter_(2, idx, k.to(self.kr.dtype))
        self.vr.scatter_(2, idx, v.to(self.vr.dtype))
        if self.uniform and mask is None:
            filled = min(n + 1, self.sinks + self.window)
            return self._one(q, self.kr.narrow(2, 0, filled), self.vr.narrow(2, 0, filled),
                             scale, kw)
        held = self.positions(n + 1)  # (b, s) absolute positions, -1 empty
        allowed = held >= 0
        if mask is not None:
            allowed = allowed & mask[:, 0, -1].gather(1, held.clamp(min=0))
        return dispatch(q, self.kr, self.vr, mask=allowed[:, None, None, :], scale=scale,
                        **kw)[0]

    def _one(self, q, k, v, scale, kw):
        """One new query per row over ``k, v`` with no mask: the C kernel where it applies."""
        d = q.shape[3]
        if self.clean and fused_path(kw.get("backend", "auto"), kw.get("softcap"),
                                     kw.get("sinks")) and (scale is None or
                                                           math.isclose(scale, d ** -0.5)):
            out = _native.attend_rows(q, k, v)
            if out is None:
                out = F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])
            return out.view(q.shape[0], q.shape[1], 1, -1)
        return dispatch(q, k, v, scale=scale, **kw)[0]

    # ------------------------------------------------------------------ the ring's contents
    def _read_starts(self, mask, b: int) -> None:
        """Each row's first real position, from the prompt's mask: the first key some query
        may see (a left-padded row's pads are seen by none; a sliding window hides early keys
        from the last query only)."""
        if mask is None:
            return
        real = mask[:, 0].any(-2).expand(b, -1)
        first = torch.where(real.any(-1), real.int().argmax(-1), 0)
        self.starts.copy_(first)
        self.uniform = not bool(first.any())

    def _slots(self, n: int) -> torch.Tensor:
        """``(b,)`` the slot each row's position ``n`` goes to."""
        if self.uniform:
            return torch.full((self.kr.shape[0],), slot(n, self.sinks, self.window),
                              dtype=torch.long, device=self.kr.device)
        rel = n - self.starts
        return torch.where(rel < self.sinks, rel,
                           self.sinks + (rel - self.sinks).remainder(self.window))

    def positions(self, n: int) -> torch.Tensor:
        """``(b, s)``: the absolute position each slot holds once ``n`` positions are seen
        (-1: empty), from the rule alone."""
        S, W = self.sinks, self.window
        c = torch.arange(S + W, device=self.kr.device)
        last = (n - 1 - self.starts).view(-1, 1)  # each row's latest relative position
        t = last - S
        k = t - (t - (c - S)).remainder(W)  # the latest cycle index <= t in slot c's class
        rel = torch.where(c < S, c.expand_as(k), S + k)
        ok = torch.where(c < S, c <= last, k >= 0)
        return torch.where(ok, rel + self.starts.view(-1, 1), -1)

    def _keep(self, k, v) -> None:
        """Write the prompt's kept positions ``k, v (b, |S|, n, d)`` into their slots."""
        n = k.shape[2]
        held = self.positions(n)  # (b, s)
        ok = held >= 0
        idx = held.clamp(min=0)[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
        keep = ok[:, None, :, None]
        self.kr.copy_(torch.where(keep, k.gather(2, idx), 0).to(self.kr.dtype))
        self.vr.copy_(torch.where(keep, v.gather(2, idx), 0).to(self.vr.dtype))

    def reorder(self, index: torch.Tensor) -> None:
        """Keep rows ``index (b,)`` (beam search), in place."""
        for t in (self.kf, self.vf, self.kr, self.vr):
            t.copy_(t.index_select(0, index))
        self.starts.copy_(self.starts.index_select(0, index))


class HeadwiseCache(Ragged):
    """A :class:`~headwise.cache.KVCache` for a decoder-only model whose layers are
    :class:`RaggedLayer` s (``layers[i].self_attn``); each layer counts its own positions, so
    :meth:`advance` has nothing to do."""

    def __init__(self, plan: KVPlan, batch: int, max_len: int, *, dtype=torch.float32,
                 device=None):
        for name, n in (("batch", batch), ("max_len", max_len)):
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"HeadwiseCache: {name} must be a positive int, got {n!r}")
        size = torch.empty((), dtype=dtype).element_size()
        limits.check_memory(plan.kv_bytes(batch, max_len, size),
                            f"a head-wise KV cache of {batch:,} rows x {max_len:,} positions",
                            "HeadwiseCache", "pass a smaller max_len")
        self.plan = plan
        self.layers = [LayerCache(RaggedLayer(plan, i, batch, max_len, dtype=dtype,
                                              device=device), None)
                       for i in range(plan.layers)]

    @property
    def length(self) -> int:
        return self.layers[0].self_attn.n

    @property
    def max_len(self) -> int:
        return self.layers[0].self_attn.max_len

    @property
    def batch(self) -> int:
        return self.layers[0].self_attn.kf.shape[0]

    @property
    def k(self) -> torch.Tensor:  # (what the step's device checks look at)
        return self.layers[0].self_attn.kf

    def advance(self, n: int) -> None:
        """Nothing to do: each layer advanced itself when it attended."""

    def reorder(self, index: torch.Tensor) -> None:
        for layer in self.layers:
            layer.self_attn.reorder(index)

    def nbytes(self) -> int:
        """Bytes of every layer's key/value buffers (exact)."""
        return sum(layer.self_attn.nbytes() for layer in self.layers)

    def __repr__(self) -> str:
        p = self.plan
        return (f"HeadwiseCache(layers={p.layers}, batch={self.batch}, streaming="
                f"{p.fraction:.0%}, sinks={p.sinks}, window={p.window}, max_len={self.max_len}, "
                f"length={self.length}, bytes={self.nbytes():,})")


def headwise_cache(model, plan: KVPlan, batch: int, max_len: int | None = None) -> HeadwiseCache:
    """A :class:`HeadwiseCache` for a headwise :class:`~headwise.models.TransformerLM` (its
    shape checked against ``plan``'s)."""
    dec = getattr(model, "decoder", model)
    if getattr(model, "encoder", None) is not None:
        raise ValueError("headwise_cache: a head-wise cache holds a decoder-only model's "
                         "self-attention; this model has an encoder; use model.new_cache")
    c = model.config
    heads = set(c.layer_kv_heads("decoder_self"))
    if len(heads) != 1:
        raise ValueError(f"headwise_cache: the layers have {sorted(heads)} key/value heads; a "
                         f"plan takes one count for all layers")
    plan.check((c.num_layers, heads.pop(), c.head_size))
    p = dec.lm_head.weight
    return HeadwiseCache(plan, batch, c.max_len if max_len is None else max_len,
                         dtype=p.dtype, device=p.device)
