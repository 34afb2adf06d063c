"""Decoder-only language model (the Trax ``TransformerLM``; GPT).

``tokens (b, n)`` -> Embedding -> (scale) -> PositionalEncoding -> Dropout -> ``num_layers``
causal :class:`DecoderBlock` s without cross-attention -> final LayerNorm (pre-norm only) ->
``lm_head`` -> ``logits (b, n, vocab)``. ``logits[:, t]`` predicts ``tokens[:, t + 1]``: the
"shift right" of the Trax model is done by the caller, who feeds ``[bos] + text[:-1]``.

Llama-style decoders are the same class, chosen by config (every field defaults to the 2017 /
GPT-2 behaviour, so older configs and checkpoints load unchanged)::

    LMConfig(vocab_size=49152, d_model=576, num_heads=9, num_layers=30, d_ff=1536,
             max_len=8192, dropout=0.0, positional="rope", norm="rms", layer_norm_eps=1e-5,
             ffn="glu", activation="silu", bias=False, tie_embeddings=True, pad_id=None,
             attention=AttentionConfig(num_kv_heads=3, rope_theta=100000.0))  # SmolLM2-135M

Parameter names -> Hugging Face ``LlamaForCausalLM`` -> GGUF tensor (block ``i``):

- ``embed.tokens.weight`` -> ``model.embed_tokens.weight`` -> ``token_embd``
- ``blocks.i.attn_norm.weight`` -> ``model.layers.i.input_layernorm`` -> ``blk.i.attn_norm``
- ``blocks.i.self_attn.{q,k,v}_proj.weight`` -> ``...self_attn.{q,k,v}_proj`` ->
  ``blk.i.attn_{q,k,v}`` (*)
- ``blocks.i.self_attn.out_proj.weight`` -> ``...self_attn.o_proj`` -> ``blk.i.attn_output``
- ``blocks.i.ff_norm.weight`` -> ``...post_attention_layernorm`` -> ``blk.i.ffn_norm``
- ``blocks.i.ff.{gate,up,down}.weight`` -> ``...mlp.{gate,up,down}_proj`` ->
  ``blk.i.ffn_{gate,up,down}``
- ``final_norm.weight`` -> ``model.norm.weight`` -> ``output_norm``
- ``lm_head.weight`` -> ``lm_head.weight`` -> ``output`` (absent when tied)

(*) RoPE here is HF's rotate-half form (:mod:`headwise.rope`): GGUF's q/k rows are permuted for
llama.cpp's adjacent-pair form and must be unpermuted when loading. ``self_attn.sinks`` (h,)
exists only with ``attention.sinks``; RoPE has no parameters.
"""

from __future__ import annotations

import torch
from torch import nn

from headwise.cache import KVCache
from headwise.fast import reuse
from headwise.models import _checks
from headwise.models._select import select
from headwise.models.blocks import DecoderBlock
from headwise.models.config import LMConfig
from headwise.models.embedding import add_output_head, build_stack
from headwise.models.heads import head_counts, layer_head_masks
from headwise.models.pruned import restructure
from headwise.observe import StepKind, record

__all__ = ["TransformerLM"]


class TransformerLM(nn.Module):
    """A decoder-only Transformer language model built from one :class:`LMConfig`.

    Submodules: ``embed`` (:class:`Embeddings`), ``blocks`` (``DecoderBlock`` s),
    ``final_norm`` (LayerNorm for pre-norm models, else Identity), ``lm_head``
    (``Linear(m, vocab, bias=False)``, sharing ``embed.tokens.weight`` with
    ``tie_embeddings``).
    """

    def __init__(self, config: LMConfig):
        super().__init__()
        if not isinstance(config, LMConfig):
            raise TypeError(f"TransformerLM expects an LMConfig, got {type(config).__name__}")
        c = config
        build_stack(self, c, c.vocab_size, DecoderBlock, c.num_layers, cross_attention=False)
        add_output_head(self, c.vocab_size)
        restructure(self)
        self._no_cache = [None] * c.num_layers
        self._no_weights = [False] * c.num_layers

    def forward(self, tokens: torch.Tensor, *, return_weights=False, cache: KVCache | None = None,
                head_mask=None) -> tuple[torch.Tensor, dict[str, list] | None]:
        """Next-token logits for every position.

        Args:
            tokens: ``(b, n)`` ids in ``[0, vocab_size)``, ``n <= max_len``.
            return_weights: ``False``, ``True``, or a selection such as
                ``{"decoder_self": [0, -1]}`` (other layers stay on the fused path).
            cache: a :class:`KVCache` from :meth:`new_cache`; ``tokens`` are then the positions
                after the ``cache.length`` already decoded, and the cache advances by ``n``.
            head_mask: multiplies each head's output (0 removes the head): ``(layers, h)`` or
                ``(layers, b, h)``, a list of per-layer ``(h,)`` / ``(b, h)`` masks or None, or
                ``{"decoder_self": ...}`` (:func:`headwise.models.layer_head_masks`).

        Returns:
            ``(logits (b, n, vocab), {"decoder_self": [per layer (b, h, n, j) or None]} | None)``
            with ``j = n`` (``cache.length + n`` with a cache).
        """
        if cache is not None:
            _checks.cache(cache, self.config, self.config.num_layers, "TransformerLM", False)
        offset = 0 if cache is None else cache.length
        self.check(tokens, offset, cache)
        selection = select(return_weights, {"decoder_self": self.config.num_layers})
        want = self._no_weights if selection is None else selection["decoder_self"]
        masks = None if head_mask is None else layer_head_masks(
            head_mask, head_counts(self), tokens.shape[0], "TransformerLM")["decoder_self"]
        logits, weights = self._forward(tokens, cache, want, masks=masks)
        return logits, (None if selection is None else {"decoder_self": weights})

    def attention_layers(self) -> dict[str, list]:
        """``{"decoder_self": [each block's self_attn]}`` (the head tools' map of this model)."""
        return {"decoder_self": [block.self_attn for block in self.blocks]}

    def check(self, tokens: torch.Tensor, offset: int = 0, cache: KVCache | None = None) -> None:
        """Raise a clear error unless ``tokens`` fit this model (ids, length, cache rows)."""
        _checks.tokens(tokens, self.config.vocab_size, "tokens", "TransformerLM")
        _checks.length(tokens.shape[1], offset, self.config.max_len, "tokens", "TransformerLM")
        if cache is not None:
            _checks.same_batch("TransformerLM", tokens=tokens.shape[0], cache=cache.batch)
            _checks.length(tokens.shape[1], offset, cache.max_len, "tokens",
                           "TransformerLM (KV cache)")

    @reuse.buffers
    def _forward(self, tokens: torch.Tensor, cache: KVCache | None, want: list[bool],
                 last_only: bool = False, masks: list | None = None,
                 ) -> tuple[torch.Tensor, list]:
        """Unchecked forward (inputs already validated): ``(logits, per-layer weights)``;
        ``masks``: a head mask or None per layer."""
        x = self.embed(tokens, 0 if cache is None else cache.length)
        layers = self._no_cache if cache is None else cache.layers
        weights = []
        for block, layer_cache, w, m in zip(self.blocks, layers, want, masks or self._no_cache,
                                            strict=True):
            x, (self_w, _) = block(x, cache=layer_cache, return_weights=w, head_mask=m)
            weights.append(self_w)
        if cache is not None:
            cache.advance(tokens.shape[1])
        if last_only and x.shape[1] > 1:  # generation needs only the newest position
            x = x[:, -1:]
        logits = reuse.linear(self.lm_head, self.final_norm(x))
        record(StepKind.LOGITS, logits)
        return logits, weights

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        """An empty :class:`KVCache` for ``batch`` rows of up to ``max_len`` positions."""
        c = self.config
        max_len = c.max_len if max_len is None else max_len
        p = self.lm_head.weight
        return KVCache(c.num_layers, batch, c.layer_kv_heads("decoder_self"), c.head_size,
                       max_len, dtype=p.dtype, device=p.device)

    def num_parameters(self) -> int:
        """Distinct parameters (a tied matrix counts once)."""
        return sum(p.numel() for p in self.parameters())
