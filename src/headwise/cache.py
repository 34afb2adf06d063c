"""Key/value cache for incremental decoding, preallocated once per generation.

Axis legend: ``l`` layer, ``b`` batch, ``g`` key/value heads, ``j`` key position, ``d`` head dim.

Decoding one token with a Transformer recomputes nothing but the newest position: every layer's
self-attention keys/values of earlier positions are kept here. All layers share two tensors
``k, v: (l, b, g, L, d)`` allocated up front (``L`` = the longest sequence the generation can
reach), so a step writes one position in place: no ``torch.cat``, no allocation growing with the
sequence, and reordering beams is one ``index_select`` per tensor, not one per layer. Grouped-query
attention caches only its ``g`` key/value heads.

Cross-attention (encoder-decoder) keys/values depend only on the source: they are projected on
the first step and reused on every later one.

A :class:`MultiHeadAttention` receives one layer's :class:`SelfAttentionCache` or
:class:`CrossAttentionCache` as ``cache=``; both expose ``ready``, ``k``, ``v`` and
``update(k, v) -> (k, v)``; the self-attention cache also ``write(k, v, pos)``, the form with a
position tensor that a device's fixed-shape decoding step uses (:mod:`headwise.decode.step`).
Which cached positions are known finite (the decoding step's NaN vouching) is kept by
:mod:`headwise.decode.vouch`; the cache only tells it where it wrote.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from headwise import limits

__all__ = ["CrossAttentionCache", "Filled", "KVCache", "LayerCache", "Ragged",
           "SelfAttentionCache"]


class Ragged:
    """Base of the head-wise cache and its layers (:mod:`headwise.decode.ragged`): each key/value
    group kept as a :class:`~headwise.kvplan.KVPlan` says, in buffers of different lengths, so
    no one ``k`` tensor holds a layer; the module path hands such a layer the attention itself
    (``attend``) instead of asking it for every cached key."""

    ragged = True


class Filled:
    """The number of filled positions, shared by a :class:`KVCache` and its layers' views.

    A back-reference from each layer to the cache would make a reference cycle: the buffers
    would outlive the generation until the garbage collector's next pass instead of being freed
    when the last reference goes."""

    __slots__ = ("n",)

    def __init__(self):
        self.n = 0


class SelfAttentionCache:
    """One layer's view of the shared buffers: ``k, v: (b, g, L, d)``.

    ``update(k, v)`` writes the new positions ``(b, g, n, d)`` at the current length
    (``filled``, shared with the owning :class:`KVCache`) and returns every position so far,
    ``(b, g, length + n, d)`` (views, no copy). The owner advances the length once per model
    step, after all layers. ``vouch``: the :class:`~headwise.decode.vouch.Vouch` that knows which
    positions are finite, once a decoding step attached one (None before); every write tells it.
    """

    __slots__ = ("filled", "k", "v", "vouch")
    ready = False  # self-attention always projects the new positions

    def __init__(self, filled: Filled, k: torch.Tensor, v: torch.Tensor):
        self.filled, self.k, self.v = filled, k, v
        self.vouch = None

    @property
    def offset(self) -> int:
        """Positions already cached: the position of the next key written."""
        return self.filled.n

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.filled.n
        end = start + k.shape[2]
        self.fits(end)
        self.k.narrow(2, start, end - start).copy_(k)  # narrow + copy_: cheaper than k[..] = ..
        self.v.narrow(2, start, end - start).copy_(v)
        if self.vouch is not None:
            self.vouch.rewritten(start)  # rewritten positions are unchecked again
        return self.k.narrow(2, 0, end), self.v.narrow(2, 0, end)

    def fits(self, end: int) -> None:
        """Raise a clear error unless ``end`` positions fit the buffers."""
        if end > self.k.shape[2]:
            raise ValueError(f"KVCache: {end} positions do not fit a cache of max_len="
                             f"{self.k.shape[2]}; create the cache with a larger max_len")

    def write(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed-shape form of :meth:`update` (the device's decoding step): write one new
        position ``k, v (b, g, 1, d)`` at ``pos`` (a ``(1,)`` long tensor on the cache's device,
        gpt-fast's ``input_pos``) and return the *whole* buffers ``(b, g, L, d)``; the caller
        masks the positions after ``pos``. No Python int, no host read, the same shapes every
        step: what a CUDA graph can replay. The owner still advances ``length``."""
        # (in the cache's dtype, as update's copy_ casts: under autocast k, v come out of the
        # projections in bfloat16 while a float32 model's cache is float32)
        if k.dtype != self.k.dtype:
            k, v = k.to(self.k.dtype), v.to(self.v.dtype)
        self.k.index_copy_(2, pos, k)
        self.v.index_copy_(2, pos, v)
        if self.vouch is not None:
            self.vouch.forget()  # (written at a tensor position: it reads again if asked)
        return self.k, self.v


class CrossAttentionCache:
    """Keys/values ``(b, g, j, d)`` of the encoder output, stored on first use."""

    __slots__ = ("k", "v")

    def __init__(self):
        self.k = self.v = None

    @property
    def ready(self) -> bool:
        return self.k is not None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k, self.v = k, v
        return k, v


class LayerCache:
    """What one decoder block needs: ``self_attn`` and ``cross_attn`` (None in an LM)."""

    __slots__ = ("self_attn", "cross_attn")

    def __init__(self, self_attn: SelfAttentionCache, cross_attn: CrossAttentionCache | None):
        self.self_attn, self.cross_attn = self_attn, cross_attn


class KVCache:
    """Preallocated keys/values for ``num_layers`` decoder blocks.

    Args:
        num_layers: decoder blocks ``l``. batch: rows ``b`` (batch * beams for beam search).
        num_kv_heads: ``g``, or one count per layer (a pruned model's layers differ: the
            buffers hold the largest, each layer a view of its first ``g_l`` heads).
        head_dim: ``d``. max_len: ``L``, the longest sequence to hold.
        cross_attention: also hold per-layer cross-attention keys/values.
        dtype, device: of the buffers (the model's).

    ``cache.layers[i]`` goes to block ``i``; ``cache.length`` positions are filled; the model
    calls :meth:`advance` once per step.
    """

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int | Sequence[int],
                 head_dim: int, max_len: int, *, cross_attention: bool = False,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        per_layer = list(num_kv_heads) if isinstance(num_kv_heads, Sequence) else None
        for name, n in (("num_layers", num_layers), ("batch", batch), ("head_dim", head_dim),
                        ("max_len", max_len),
                        *(("num_kv_heads", g) for g in (per_layer or [num_kv_heads]))):
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"KVCache: {name} must be a positive int, got {n!r}")
        per_layer = per_layer or [num_kv_heads] * num_layers
        if len(per_layer) != num_layers:
            raise ValueError(f"KVCache: num_kv_heads lists {len(per_layer)} layers, expected "
                             f"num_layers={num_layers}; give one count per layer or one int")
        shape = (num_layers, batch, max(per_layer), max_len, head_dim)
        limits.check_memory(2 * math.prod(shape) * torch.empty((), dtype=dtype).element_size(),
                            f"a KV cache of {batch:,} rows x {max_len:,} positions", "KVCache",
                            "pass a smaller max_len (the longest sequence you will decode)")
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.kv_heads = tuple(per_layer)
        self.filled = Filled()
        # (select + narrow: the views k[i, :, :g]; Python indexing needs a device guard that
        # tests/fake_cuda.py's fake CUDA tensors lack)
        self.layers = [LayerCache(SelfAttentionCache(self.filled,
                                                     self.k.select(0, i).narrow(1, 0, g),
                                                     self.v.select(0, i).narrow(1, 0, g)),
                                  CrossAttentionCache() if cross_attention else None)
                       for i, g in enumerate(per_layer)]

    @property
    def length(self) -> int:
        """Positions filled so far."""
        return self.filled.n

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def advance(self, n: int) -> None:
        """Mark ``n`` more positions as filled (called by the model after all layers)."""
        self.filled.n += n

    def reorder(self, index: torch.Tensor) -> None:
        """Keep rows ``index (b,)`` (beam search: each surviving beam's parent), in place."""
        n = self.length
        for buf in (self.k, self.v):
            buf[:, :, :, :n] = buf[:, index, :, :n]
        for layer in self.layers:
            cross = layer.cross_attn
            if cross is not None and cross.ready:
                cross.k, cross.v = cross.k[index], cross.v[index]

    def nbytes(self) -> int:
        """Bytes held by the self-attention buffers."""
        return self.k.numel() * self.k.element_size() * 2

    def __repr__(self) -> str:
        l, b, g, L, d = self.k.shape
        g = g if len(set(self.kv_heads)) == 1 else list(self.kv_heads)
        return (f"KVCache(layers={l}, batch={b}, kv_heads={g}, max_len={L}, head_dim={d}, "
                f"length={self.length}, cross={self.layers[0].cross_attn is not None})")
