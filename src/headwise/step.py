"""One cached decoding step, flattened: the decoder's blocks as a list of matrices.

Axis legend: ``b`` rows (batch x beams), ``m`` model dim, ``h`` query heads, ``g`` key/value
heads, ``d`` head dim, ``f`` feed-forward width, ``v`` vocabulary, ``j`` cached positions.

Why it exists. After the prompt, a KV-cached decoder feeds one token per row per step: every
matrix product is a matrix-*vector* product (``(b, m) @ (m, f)`` with ``b`` small), so a step
costs one pass over all the weights plus a fixed cost per operation. The module tree
(:class:`~headwise.models.DecoderBlock` -> :class:`~headwise.MultiHeadAttention` -> ...) is
written for inspection: named steps, shape checks, trace hooks, ``(b, n, m)`` tensors. Run one
position at a time that bookkeeping costs more than the arithmetic. :class:`DecodeStep` runs
the same mathematics with:

- rows ``(b, m)`` instead of ``(b, 1, m)``: no reshapes around each product;
- for a single row (batch 1, no beams) and 128 steps or more, every weight copied once,
  transposed to ``(in, out)``: the layout a vector-matrix product streams fastest on the CPU,
  at the price of one extra copy of the decoder weights while the generation runs (otherwise
  the module's own ``(out, in)`` weights are used; only self-attention's
  ``cat(W_q, W_k, W_v)`` is a copy, made once per generation instead of once per step);
- residual additions fused into the products (``torch.addmm(x, y, W.t())`` is
  ``x + y @ W^T``, the kernel ``F.linear`` runs for its bias);
- the key/value cache and the attention backend shared with the modules (the same
  :class:`~headwise.cache.KVCache` and :data:`headwise.BACKENDS` function), so masking, grouped
  heads and fully masked rows behave exactly as in the module path;
- on the CPU in float32, oneDNN disabled for the step (``torch._C._set_mkldnn_enabled``): its
  exact-GELU primitive costs ~20 us per call whatever the size, the native kernel ~4 us. The
  flag is process-wide and restored after each step.

It is used by :func:`headwise.generate` for every step after the prompt when the cache is on,
unless a trace is recording or a module of the decoder has hooks (both need the module path).
``tests/test_generate.py`` checks it against the module path and against recomputation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from headwise.attention import BACKENDS
from headwise.cache import KVCache
from headwise.models.blocks import ACTIVATIONS, LearnedPositionalEncoding

__all__ = ["DecodeStep", "usable"]


def usable(decoder: nn.Module) -> bool:
    """False when some module of ``decoder`` has forward hooks (they must see the module path)."""
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return False
    return not any(m._forward_hooks or m._forward_pre_hooks for m in decoder.modules())


Weight = tuple  # (matrix, bias | None, transposed): W (out, in), or a copy of W^T (in, out)


def _weight(w: torch.Tensor, bias: torch.Tensor | None, transpose: bool) -> Weight:
    w = w.detach()
    return (w.t().contiguous(), bias, True) if transpose else (w, bias, False)


def _linear(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """``x @ W^T + bias``."""
    m, bias, transposed = w
    if not transposed:
        return F.linear(x, m, bias)
    return torch.mm(x, m) if bias is None else torch.addmm(bias, x, m)


def _residual(x: torch.Tensor, y: torch.Tensor, w: Weight) -> torch.Tensor:
    """``x + (y @ W^T + bias)``: one product with the addition fused (as ``F.linear`` fuses
    its bias), plus one add when there is a bias."""
    m, bias, transposed = w
    out = torch.addmm(x, y, m if transposed else m.t())
    return out if bias is None else out.add_(bias)


def _norm(norm: nn.Module) -> tuple | None:
    return None if isinstance(norm, nn.Identity) else (norm.normalized_shape, norm.weight,
                                                       norm.bias, norm.eps)


class _Attention:
    """One attention sublayer: its projections, head counts and attention backend."""

    __slots__ = ("qkv", "q", "out", "h", "g", "d", "sizes", "core")

    def __init__(self, attn, core, *, fused: bool, t: bool):
        self.h, self.g, self.d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.sizes = (self.h * self.d, self.g * self.d, self.g * self.d)
        self.out, self.core = _weight(attn.out_proj.weight, attn.out_proj.bias, t), core
        if fused:  # self-attention: one product over cat(W_q, W_k, W_v), made once here
            self.qkv, self.q = _weight(*attn._qkv_weight(), t), None
        else:
            self.qkv, self.q = None, _weight(attn.q_proj.weight, attn.q_proj.bias, t)

    def self_attend(self, x: torch.Tensor, cache) -> torch.Tensor:
        """``x (b, m)`` -> heads ``(b, h*d)``; appends this position's k, v to ``cache``."""
        b = x.shape[0]
        q, k, v = _linear(x, self.qkv).split_with_sizes(self.sizes, dim=-1)
        k, v = cache.update(k.view(b, self.g, 1, self.d), v.view(b, self.g, 1, self.d))
        # a single newest query sees every cached key: no causal mask (bottom-right alignment)
        out, _ = self.core(q.view(b, self.h, 1, self.d), k, v, mask=None, causal=False,
                           dropout_p=0.0, scale=None, return_weights=False)
        return out.view(b, -1)

    def cross_attend(self, x: torch.Tensor, cache, mask) -> torch.Tensor:
        """``x (b, m)`` against the encoder keys/values the prompt step stored in ``cache``."""
        b = x.shape[0]
        q = _linear(x, self.q).view(b, self.h, 1, self.d)
        out, _ = self.core(q, cache.k, cache.v, mask=mask, causal=False, dropout_p=0.0,
                           scale=None, return_weights=False)
        return out.view(b, -1)


class _Layer:
    """A :class:`~headwise.models.DecoderBlock` as matrices: attention(s), norms, feed-forward."""

    __slots__ = ("pre", "self_attn", "attn_norm", "cross_attn", "cross_norm", "up", "down",
                 "act", "ff_norm", "cache")

    def __init__(self, block, cache, core, t):
        self.pre = block.norm_first
        self.self_attn = _Attention(block.self_attn, core, fused=True, t=t)
        self.attn_norm = _norm(block.attn_norm)
        self.cross_attn = (None if block.cross_attn is None
                           else _Attention(block.cross_attn, core, fused=False, t=t))
        self.cross_norm = None if block.cross_norm is None else _norm(block.cross_norm)
        self.up = _weight(block.ff.up.weight, block.ff.up.bias, t)
        self.down = _weight(block.ff.down.weight, block.ff.down.bias, t)
        self.act, self.ff_norm = ACTIVATIONS[block.ff.activation], _norm(block.ff_norm)
        self.cache = cache

    def __call__(self, x: torch.Tensor, memory_mask) -> torch.Tensor:
        x = self._sublayer(x, self.attn_norm, self.self_attn.out,
                           lambda y: self.self_attn.self_attend(y, self.cache.self_attn))
        if self.cross_attn is not None:
            x = self._sublayer(x, self.cross_norm, self.cross_attn.out, lambda y:
                               self.cross_attn.cross_attend(y, self.cache.cross_attn, memory_mask))
        return self._sublayer(x, self.ff_norm, self.down, lambda y: self.act(_linear(y, self.up)))

    def _sublayer(self, x, norm, out_w, inner):
        """Pre-norm ``x + inner(norm(x)) @ W``, post-norm ``norm(x + inner(x) @ W)``."""
        if self.pre:
            return _residual(x, inner(torch.layer_norm(x, *norm)), out_w)
        return torch.layer_norm(_residual(x, inner(x), out_w), *norm)


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
        c = model.config  # the backend every MultiHeadAttention of the model was built with
        core = BACKENDS["sdpa" if c.backend == "auto" else c.backend]
        self.cache, self.memory_mask = cache, memory_mask
        embed = dec.embed
        self.tokens, self.scale = embed.tokens.weight, embed.scale
        pos = embed.positions
        table = pos.weight if isinstance(pos, LearnedPositionalEncoding) else pos.pe
        self.positions = table.detach().to(self.tokens.dtype)
        # One row: vector-matrix products stream W^T (in, out) faster than W (out, in) here
        # (1.3-1.5x per step measured), worth a transposed copy of the decoder's weights for a
        # long enough generation; from two rows on the (out, in) layout is the faster one.
        t = cache.batch == 1 and (steps is None or steps >= 128)
        self.layers = [_Layer(block, layer_cache, core, t)
                       for block, layer_cache in zip(dec.blocks, cache.layers, strict=True)]
        self.final_norm = _norm(dec.final_norm)
        self.head = _weight(dec.lm_head.weight, dec.lm_head.bias, t)
        p = self.tokens
        self.native = p.device.type == "cpu" and p.dtype == torch.float32

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
        x = F.embedding(ids, self.tokens)
        x = (x * self.scale if self.scale != 1.0 else x) + self.positions[pos]
        for layer in self.layers:
            x = layer(x, self.memory_mask)
        self.cache.advance(1)
        if self.final_norm is not None:
            x = torch.layer_norm(x, *self.final_norm)
        return _linear(x, self.head)
