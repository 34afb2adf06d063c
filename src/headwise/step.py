"""One cached decoding step, built from the components' own one-row forms.

Axis legend: ``b`` rows (batch x beams), ``m`` model dim, ``h`` query heads, ``g`` key/value
heads, ``d`` head dim, ``f`` feed-forward width, ``v`` vocabulary, ``j`` cached positions,
``r`` rotated features.

Why it exists. After the prompt, a KV-cached decoder feeds one token per row per step: every
matrix product is a matrix-*vector* product (``(b, m) @ (m, f)`` with ``b`` small), so a step
costs one pass over all the weights plus a fixed cost per operation. The module tree
(:class:`~headwise.models.DecoderBlock` -> :class:`~headwise.MultiHeadAttention` -> ...) is
written for inspection: named steps, shape checks, trace hooks, ``(b, n, m)`` tensors. Run one
position at a time that bookkeeping costs more than the arithmetic.

One decoder, not two. Every component supplies its one-row form beside its ``forward``, and
this module only strings them together, so a new component is written once:

- ``Embeddings.row()`` (token embedding, scale, additive positions);
- ``DecoderBlock.row()`` -> :class:`~headwise.models.blocks.BlockRow`: the residual order, with
  ``MultiHeadAttention.row()`` (:class:`~headwise.layers.row.AttentionRow`: projections,
  RoPE at the cached position, grouped key/value heads, sliding window as a slice of the cache,
  the attention dispatch with soft-capping / sinks), ``LayerNorm.row()`` / ``RMSNorm.row()`` and
  ``FeedForward.row()`` / ``GatedFeedForward.row()``;
- RoPE's angles, computed here once per generation for every position and layer
  (:meth:`~headwise.rope.RotaryEmbedding.angles`; each layer only rotates).

What makes the step fast (see :mod:`headwise.fast.rows`): rows ``(b, m)`` instead of ``(b, 1, m)``;
residual additions fused into the output products (``torch.addmm``); for small models
(:data:`COPY_BUDGET`) self-attention's ``cat(W_q, W_k, W_v)`` and the gated feed-forward's
``cat(W_gate, W_up)`` copied once per generation so each is one product, and for a single row
(batch 1, no beams) over 128 steps or more every weight copied transposed to ``(in, out)``, the
layout a vector-matrix product streams fastest here; on the CPU in float32, oneDNN disabled for
the step (``torch._C._set_mkldnn_enabled``): its exact-GELU primitive costs ~20 us per call
whatever the size, the native kernel ~4 us. The flag is process-wide and restored after each
step. Larger models use the modules' own weights: no copy, so memory stays at the weights plus
the cache; their storage is laid out for the step's row count (:func:`headwise.fast.rows.lay_out`:
self-attention's q/k/v and a gated feed-forward's gate/up each stored as blocks of one matrix,
multiplied as one product through a view; for one row the wide matrices, those two joined ones
and the vocabulary head, stored ``(in, out)``, 72 -> 60 ms per SmolLM2-135M step at one thread;
for 2-4 rows ``(out, in)``). On an x86-64 CPU with AVX2 the products of 1-4 rows and the
attention of the one new query run headwise's own C kernels (:mod:`headwise.fast.native`: the
weights read at 20-24 GB/s where MKL's kernels reach 12-20 for one row and ~10 for 2-4; a
SmolLM2-135M step at one thread 36.4 -> 29-30 ms with the huge-page layout). The layout stays
after the generation (a run of generations at one batch size pays the copy once); values,
shapes and parameters are untouched, and the module path multiplies either layout.

It is used by :func:`headwise.generate` for every step after the prompt when the cache is on,
unless an observer is active (:mod:`headwise.observe`: a trace, head statistics, an ablation) or
a module of the decoder has hooks (both need the module path).
``tests/test_step.py`` checks it against the module path for every combination of the config
axes.
"""

from __future__ import annotations

import torch
from torch import nn

from headwise.cache import KVCache
from headwise.fast import applies
from headwise.fast import int4 as _int4
from headwise.fast import rows as _rows
from headwise.observe import observed

__all__ = ["COPY_BUDGET", "DecodeStep", "usable"]

# Weight copies (fused products, transposed layouts) are made only for decoders whose weights
# take at most this many bytes: they double the memory of what they copy.
COPY_BUDGET = 64 * 2**20


def usable(decoder: nn.Module) -> bool:
    """False while an observer is active (:func:`headwise.observe.observed`) or some module of
    ``decoder`` has forward hooks: both must see the module path, which the step bypasses."""
    if observed() or nn.modules.module._global_forward_hooks \
            or nn.modules.module._global_forward_pre_hooks:
        return False
    return not any(m._forward_hooks or m._forward_pre_hooks for m in decoder.modules())


class DecodeStep:
    """``step(ids (b,)) -> logits (b, v)``: feed the newest token of every row to a decoder
    whose :class:`KVCache` already holds the earlier positions; the cache advances by one.

    Args:
        model: a :class:`~headwise.models.TransformerLM` or
            :class:`~headwise.models.Transformer` in eval mode (no dropout is applied).
        cache: the cache the prompt step filled (for the encoder-decoder: with its cross-
            attention keys/values).
        memory_mask: the source padding mask ``(b, 1, 1, j)`` (True = may attend) or None.
        steps: how many steps the caller will run, if known: the transposed copies a single row
            uses cost about what ~100 steps gain, so they are made only from 128 steps on.
    """

    def __init__(self, model: nn.Module, cache: KVCache, memory_mask: torch.Tensor | None = None,
                 *, steps: int | None = None):
        dec = getattr(model, "decoder", model)
        self.cache, self.memory_mask = cache, memory_mask
        self.embed = dec.embed.row()
        p = dec.lm_head.weight
        # 4-bit codes attached by a loader are the step's weights already: no further copies
        small = (sum(q.numel() * q.element_size() for q in dec.parameters()) <= COPY_BUDGET
                 and not _int4.quantized(dec))
        # One row: vector-matrix products stream W^T (in, out) faster than W (out, in) here
        # (1.3-1.5x per step measured), worth a transposed copy of the decoder's weights for a
        # long enough generation; from two rows on the (out, in) layout is the faster one.
        t = small and cache.batch == 1 and (steps is None or steps >= 128)
        # No copies for larger models: their own weights, stored as the rows read them best (the
        # one-row layout costs a copy of the wide matrices, what ~30 steps gain)
        if not small and (cache.batch > 1 or steps is None or steps >= 32):
            _rows.lay_out(dec, cache.batch)
        self.layers = [block.row(layer_cache, transpose=t, fuse=small)
                       for block, layer_cache in zip(dec.blocks, cache.layers, strict=True)]
        self.rope = dec.blocks[0].self_attn.rope
        # every position's angles at once (the same values, elementwise): a step takes a view
        # instead of a dozen small kernels
        self.angles = (None if self.rope is None
                       else self.rope.angles(0, cache.max_len, p))
        self.final_norm = None if isinstance(dec.final_norm, nn.Identity) else dec.final_norm.row()
        self.head = _rows.of_linear(dec.lm_head, t)
        self.like = p
        self.native = applies(p, autograd=True)  # (the step only reads its weights)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.native:
            return self._step(ids)
        onednn = torch._C._get_mkldnn_enabled()
        torch._C._set_mkldnn_enabled(False)
        try:
            return self._step(ids)
        finally:
            torch._C._set_mkldnn_enabled(onednn)

    def _step(self, ids: torch.Tensor) -> torch.Tensor:
        pos = self.cache.length
        x = self.embed(ids, pos)
        rot = None if self.rope is None else self._angles(pos)
        for layer in self.layers:
            x = layer(x, rot, self.memory_mask)
        self.cache.advance(1)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return _rows.linear(x, self.head)

    def _angles(self, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's ``(cos, signed sin)`` of position ``pos``, ``(1, 2, r/2)`` each."""
        if pos >= self.cache.max_len:  # (the cache's update then says what went wrong)
            return self.rope.angles(pos, 1, self.like)
        cos, sin = self.angles
        return cos[pos:pos + 1], sin[pos:pos + 1]
