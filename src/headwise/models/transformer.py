"""The encoder-decoder Transformer (Vaswani et al. 2017; d2l.ai chapter 11).

Attention appears in three places, each with its own mask (True = may attend):

- encoder self-attention: source padding, ``(b, 1, 1, j)``;
- decoder self-attention: causal (bottom-right) and target padding;
- cross-attention: queries from the decoder, keys/values from the encoder output, source padding.

``Encoder`` and ``Decoder`` work alone; ``Transformer`` is the pair.
"""

from __future__ import annotations

import torch
from torch import nn

from headwise import masks as _masks
from headwise.cache import KVCache
from headwise.fast import reuse
from headwise.models import _checks
from headwise.models._select import select
from headwise.models.blocks import DecoderBlock, EncoderBlock
from headwise.models.config import TransformerConfig
from headwise.models.embedding import add_output_head, build_stack, init_weights
from headwise.models.heads import head_counts, layer_head_masks
from headwise.models.pruned import restructure
from headwise.observe import StepKind, record

__all__ = ["Decoder", "Encoder", "Transformer"]


def _masks_of(model, head_mask, batch: int, where: str) -> dict[str, list]:
    """The model-level ``head_mask`` per kind and layer (empty when None)."""
    if head_mask is None:
        return {}
    return layer_head_masks(head_mask, head_counts(model), batch, where)


def _check_config(config, where: str) -> None:
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"{where} expects a TransformerConfig, got {type(config).__name__}")


class Encoder(nn.Module):
    """Source tokens -> memory. Submodules: ``embed``, ``blocks`` (``EncoderBlock`` s),
    ``final_norm`` (LayerNorm for pre-norm, else Identity)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        _check_config(config, "Encoder")
        build_stack(self, config, config.src_vocab_size, EncoderBlock, config.num_layers)
        init_weights(self)
        restructure(self)

    def forward(self, src: torch.Tensor, *, src_valid_lens: torch.Tensor | None = None,
                return_weights=False, head_mask=None,
                ) -> tuple[torch.Tensor, dict[str, list] | None]:
        """``src (b, j)`` ids; ``src_valid_lens (b,)``; ``return_weights`` and ``head_mask`` as
        in :class:`Transformer`. Returns ``(memory (b, j, m), {"encoder_self": [...]} | None)``."""
        mask = self.source_mask(src, src_valid_lens)
        selection = select(return_weights, {"encoder_self": self.config.num_layers})
        want = None if selection is None else selection["encoder_self"]
        masks = _masks_of(self, head_mask, src.shape[0], "Encoder")
        memory, weights = self._forward(src, mask, want, masks.get("encoder_self"))
        return memory, (None if selection is None else {"encoder_self": weights})

    def attention_layers(self) -> dict[str, list]:
        """``{"encoder_self": [each block's self_attn]}`` (the head tools' map of this model)."""
        return {"encoder_self": [block.self_attn for block in self.blocks]}

    def source_mask(self, src: torch.Tensor, src_valid_lens=None) -> torch.Tensor | None:
        """Check ``src`` and return its key-padding mask ``(b, 1, 1, j)`` or None."""
        c = self.config
        _checks.tokens(src, c.src_vocab_size, "src", "Encoder")
        _checks.length(src.shape[1], 0, c.max_len, "src", "Encoder")
        lens = _checks.valid_lens(src_valid_lens, src.shape[0], "src_valid_lens", "Encoder",
                                  src.device)
        return _checks.key_mask(src, lens, src.shape[1], c.pad_id)

    @reuse.buffers
    def _forward(self, src, mask, want, masks=None) -> tuple[torch.Tensor, list]:
        x = self.embed(src)
        weights = []
        for i, block in enumerate(self.blocks):
            x, w = block(x, mask=mask, return_weights=want[i] if want else False,
                         head_mask=masks[i] if masks else None)
            weights.append(w)
        x = self.final_norm(x)
        record(StepKind.MEMORY, x)
        return x, weights


class Decoder(nn.Module):
    """Target tokens + memory -> logits. Submodules: ``embed``, ``blocks``
    (``DecoderBlock`` s), ``final_norm``, ``lm_head`` (tied to ``embed.tokens.weight`` with
    ``tie_embeddings``)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        _check_config(config, "Decoder")
        c = config
        build_stack(self, c, c.tgt_vocab_size, DecoderBlock, c.decoder_layers)
        add_output_head(self, c.tgt_vocab_size)
        restructure(self)
        self._no_cache = [None] * c.decoder_layers
        self._no_weights = [False] * c.decoder_layers

    def forward(self, tgt: torch.Tensor, memory: torch.Tensor, *,
                memory_mask: torch.Tensor | None = None, src_valid_lens=None,
                tgt_valid_lens=None, return_weights=False, cache: KVCache | None = None,
                head_mask=None) -> tuple[torch.Tensor, dict[str, list] | None]:
        """Decode ``tgt (b, i)`` against ``memory (b, j, m)``.

        Args:
            memory_mask: True = may attend, ``(b, 1, 1, j)`` (e.g. ``Encoder.source_mask``);
                AND-ed with ``src_valid_lens (b,)``.
            tgt_valid_lens: ``(b,)`` target lengths (keys past them are masked).
            return_weights: as in :class:`Transformer` (kinds ``decoder_self``, ``cross``).
            cache: a :class:`KVCache` (``tgt`` continues its ``cache.length`` positions).
            head_mask: as in :class:`Transformer` (kinds ``decoder_self``, ``cross``).

        Returns ``(logits (b, i, vocab), {"decoder_self": [...], "cross": [...]} | None)``.
        """
        c = self.config
        if cache is not None:
            _checks.cache(cache, c, c.decoder_layers, "Decoder", True)
        offset = 0 if cache is None else cache.length
        _checks.tokens(tgt, c.tgt_vocab_size, "tgt", "Decoder")
        _checks.length(tgt.shape[1], offset, c.max_len, "tgt", "Decoder")
        if not isinstance(memory, torch.Tensor) or memory.dim() != 3 \
                or memory.shape[-1] != c.d_model:
            raise ValueError(f"Decoder: memory must be (b, j, d_model={c.d_model}), got "
                             f"{tuple(getattr(memory, 'shape', ()))}")
        b = tgt.shape[0]
        _checks.same_batch("Decoder", tgt=b, memory=memory.shape[0],
                           **({} if cache is None else {"cache": cache.batch}))
        if cache is not None and tgt_valid_lens is not None:
            raise ValueError("Decoder: tgt_valid_lens cannot be combined with a KV cache; "
                             "decode with a cache one unpadded step at a time")
        src_lens = _checks.valid_lens(src_valid_lens, b, "src_valid_lens", "Decoder", tgt.device)
        tgt_lens = _checks.valid_lens(tgt_valid_lens, b, "tgt_valid_lens", "Decoder", tgt.device)
        if memory_mask is not None:
            _masks.check(memory_mask, "Decoder: memory_mask", (b, 1, 1, memory.shape[1]))
        memory_mask = _masks.combine(memory_mask,
                                     _checks.key_mask(None, src_lens, memory.shape[1], None))
        self_mask = _checks.key_mask(None, tgt_lens, tgt.shape[1], None)
        selection = select(return_weights, {"decoder_self": c.decoder_layers,
                                            "cross": c.decoder_layers})
        want = (self._no_weights, self._no_weights) if selection is None else \
            (selection["decoder_self"], selection["cross"])
        masks = _masks_of(self, head_mask, b, "Decoder")
        logits, self_w, cross_w = self._forward(tgt, memory, memory_mask, self_mask, cache, want,
                                                masks=masks)
        return logits, (None if selection is None else {"decoder_self": self_w, "cross": cross_w})

    def attention_layers(self) -> dict[str, list]:
        """``{"decoder_self": [...], "cross": [...]}``, one module per block."""
        return {"decoder_self": [block.self_attn for block in self.blocks],
                "cross": [block.cross_attn for block in self.blocks]}

    @reuse.buffers
    def _forward(self, tgt, memory, memory_mask, self_mask, cache, want, last_only=False,
                 masks=None):
        """Unchecked forward: ``(logits, self weights per layer, cross weights per layer)``;
        ``masks``: ``{kind: [head mask or None per layer]}`` or None."""
        x = self.embed(tgt, 0 if cache is None else cache.length)
        layers = self._no_cache if cache is None else cache.layers
        masks = masks or {}
        self_ms = masks.get("decoder_self") or self._no_cache
        cross_ms = masks.get("cross") or self._no_cache
        self_ws, cross_ws = [], []
        for block, layer_cache, ws, wc, ms, mc in zip(self.blocks, layers, *want, self_ms,
                                                      cross_ms, strict=True):
            x, (self_w, cross_w) = block(x, memory, self_mask=self_mask, memory_mask=memory_mask,
                                         cache=layer_cache, return_weights=(ws, wc),
                                         head_mask=ms, cross_head_mask=mc)
            self_ws.append(self_w)
            cross_ws.append(cross_w)
        if cache is not None:
            cache.advance(tgt.shape[1])
        if last_only and x.shape[1] > 1:  # generation needs only the newest position
            x = x[:, -1:]
        logits = self.lm_head(self.final_norm(x))
        record(StepKind.LOGITS, logits)
        return logits, self_ws, cross_ws


class Transformer(nn.Module):
    """Encoder-decoder Transformer from one :class:`TransformerConfig`.

    Submodules: ``encoder`` (:class:`Encoder`), ``decoder`` (:class:`Decoder`).
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        _check_config(config, "Transformer")
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, *, src_valid_lens=None,
                tgt_valid_lens=None, return_weights=False, head_mask=None,
                ) -> tuple[torch.Tensor, dict[str, list] | None]:
        """Teacher-forced logits.

        Args:
            src: ``(b, j)`` source ids. tgt: ``(b, i)`` decoder input ids (``[bos] + y[:-1]``).
            src_valid_lens / tgt_valid_lens: ``(b,)`` lengths; keys past them are masked (and
                source ids equal to ``config.pad_id`` when it is set).
            return_weights: ``False``, ``True``, a kind or set of kinds (``"encoder_self"``,
                ``"decoder_self"``, ``"cross"``), or ``{kind: [layer indices]}``; layers not
                asked for stay on the fused path.
            head_mask: ``{kind: mask}`` multiplying each head's output (0 removes the head);
                ``mask`` is ``(layers, h)``, ``(layers, b, h)`` or a list of per-layer ``(h,)`` /
                ``(b, h)`` masks or None; kinds left out are not masked.

        Returns:
            ``(logits (b, i, tgt_vocab), attentions | None)``; ``attentions[kind][layer]`` is
            ``(b, h, i, j)`` or None for layers not asked for.
        """
        c = self.config
        _checks.tokens(tgt, c.tgt_vocab_size, "tgt", "Transformer")
        _checks.tokens(src, c.src_vocab_size, "src", "Transformer")
        _checks.same_batch("Transformer", src=src.shape[0], tgt=tgt.shape[0])
        _checks.length(tgt.shape[1], 0, c.max_len, "tgt", "Transformer")
        selection = select(return_weights, {"encoder_self": c.num_layers,
                                            "decoder_self": c.decoder_layers,
                                            "cross": c.decoder_layers})
        masks = _masks_of(self, head_mask, src.shape[0], "Transformer")
        memory, memory_mask, enc_w = self._encode(src, src_valid_lens,
                                                  selection and selection["encoder_self"],
                                                  masks.get("encoder_self"))
        tgt_lens = _checks.valid_lens(tgt_valid_lens, tgt.shape[0], "tgt_valid_lens",
                                      "Transformer", tgt.device)
        self_mask = _checks.key_mask(None, tgt_lens, tgt.shape[1], None)
        want = ((self.decoder._no_weights,) * 2 if selection is None
                else (selection["decoder_self"], selection["cross"]))
        logits, self_w, cross_w = self.decoder._forward(tgt, memory, memory_mask, self_mask,
                                                        None, want, masks=masks)
        if selection is None:
            return logits, None
        return logits, {"encoder_self": enc_w, "decoder_self": self_w, "cross": cross_w}

    def attention_layers(self) -> dict[str, list]:
        """``{"encoder_self": [...], "decoder_self": [...], "cross": [...]}``."""
        return {**self.encoder.attention_layers(), **self.decoder.attention_layers()}

    def encode(self, src: torch.Tensor, src_valid_lens=None,
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(memory (b, j, m), memory_mask (b, 1, 1, j) | None)`` for ``src (b, j)``."""
        memory, mask, _ = self._encode(src, src_valid_lens, None)
        return memory, mask

    def _encode(self, src, src_valid_lens, want, masks=None):
        mask = self.encoder.source_mask(src, src_valid_lens)
        memory, weights = self.encoder._forward(src, mask, want, masks)
        return memory, mask, weights

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        """An empty decoder :class:`KVCache` (self- and cross-attention) for ``batch`` rows."""
        c = self.config
        max_len = c.max_len if max_len is None else max_len
        p = self.decoder.lm_head.weight
        return KVCache(c.decoder_layers, batch, c.layer_kv_heads("decoder_self"), c.head_size,
                       max_len, cross_attention=True, dtype=p.dtype, device=p.device)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
