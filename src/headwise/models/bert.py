"""BERT (Devlin et al. 2019): token + segment + learned position embeddings, then post-norm
encoder blocks built from headwise's :class:`~headwise.MultiHeadAttention`.

Axis legend: ``b`` batch, ``n`` token position (``i`` as a query, ``j`` as a key), ``h`` heads,
``m`` model (hidden) dim.

This module knows nothing about Hugging Face parameter names: the checkpoint mapping lives at the
edge, in :mod:`headwise.pretrained` (a table applied once, at load time), so ``forward`` reads
like the architecture.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import ClassVar

import torch
from torch import nn

from headwise.fast import host, reuse
from headwise.layers import checks
from headwise.models._select import select
from headwise.models.blocks import EncoderBlock, LearnedPositionalEncoding
from headwise.models.config import ModelConfig
from headwise.models.heads import head_counts, layer_head_masks
from headwise.models.pruned import restructure
from headwise.observe import StepKind, record

__all__ = ["BertConfig", "BertEmbeddings", "BertModel"]

@dataclass(frozen=True)
class BertConfig(ModelConfig):
    """A BERT-family encoder.

    Args:
        vocab_size: word-piece vocabulary (the one positional argument; the rest are keywords).
        d_model: hidden size ``m``. num_heads: ``h`` (``d = m // h``). num_layers: encoder
            blocks. d_ff: feed-forward ("intermediate") width. max_len: learned positions
            (longest input). type_vocab_size: segment ids.
        layer_norm_eps: every LayerNorm's epsilon (BERT: 1e-12).
        dropout: on embeddings, sublayer outputs and after the activation (HF
            ``hidden_dropout_prob``). attention_dropout: on attention probabilities.
        activation: feed-forward activation (``"gelu"`` = exact erf, as BERT).
        pad_id: the padding token id.
        pooler: whether the model has BERT's ``tanh(W x_[CLS] + b)`` pooler.
        attention: the attention options (:class:`~headwise.layers.AttentionConfig`; BERT's
            are the defaults, ``backend`` the one usually set: ``"auto"`` = the fused kernel).

    All-MiniLM-L6-v2 is ``BertConfig(30522, d_model=384, num_heads=12, num_layers=6,
    d_ff=1536)``.
    """

    kind: ClassVar[str] = "bert"
    _INTS: ClassVar[tuple[str, ...]] = (*ModelConfig._INTS, "type_vocab_size")
    _BOOLS: ClassVar[tuple[str, ...]] = ("pooler",)
    _PROBABILITIES: ClassVar[tuple[str, ...]] = ("dropout", "attention_dropout")
    _VOCABS: ClassVar[tuple[str, ...]] = ("vocab_size",)
    _PAD_OPTIONAL: ClassVar[bool] = False

    vocab_size: int = 30522
    _: KW_ONLY
    d_model: int = 768
    num_heads: int = 12
    num_layers: int = 12
    d_ff: int = 3072
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    attention_dropout: float = 0.1
    activation: str = "gelu"
    pad_id: int = 0
    pooler: bool = True

    @classmethod
    def _from_dict_hint(cls) -> str:
        return " (for a Hugging Face config.json use headwise.pretrained.bert_config_from_hf)"


class BertEmbeddings(nn.Module):
    """``norm(word[ids] + token_type[types] + position[n])``, then dropout.

    Submodules: ``word``, ``token_type`` (``nn.Embedding``), ``position``
    (:class:`~headwise.models.LearnedPositionalEncoding`), ``norm``, ``dropout``.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_id)
        self.token_type = nn.Embedding(config.type_vocab_size, config.d_model)
        self.position = LearnedPositionalEncoding(config.d_model, config.max_len)
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                ) -> torch.Tensor:
        """``input_ids (b, n)``, ``token_type_ids (b, n)`` (default all 0) -> ``(b, n, m)``."""
        x = self.word(input_ids)
        record(StepKind.TOKEN_EMBEDDING, x)
        # the segment table's row 0 when no segments are given (BERT's default type ids)
        x = x + (self.token_type.weight[0] if token_type_ids is None
                 else self.token_type(token_type_ids))
        x = self.position(x)
        record(StepKind.SEGMENT_AND_POSITION, x)
        x = self.dropout(self.norm(x))
        record(StepKind.EMBEDDING_NORM, x)
        return x


class BertModel(nn.Module):
    """A BERT encoder: embeddings, ``num_layers`` post-norm :class:`EncoderBlock` s, optional
    pooler.

    ``forward`` takes Hugging Face's argument meanings (``attention_mask`` 1 = real token) and
    returns ``(last_hidden_state (b, n, m), attentions | None)`` where ``attentions`` is
    ``{"encoder_self": [weights (b, h, n, n) | None per layer]}``.

    Submodules: ``embeddings``, ``layers`` (each with ``self_attn``, ``attn_norm``, ``ff``,
    ``ff_norm``), ``pooler`` (``nn.Linear`` or None).
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        if not isinstance(config, BertConfig):
            raise TypeError(f"BertModel expects a BertConfig, got {type(config).__name__}")
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(_block(config) for _ in range(config.num_layers))
        self.pooler = nn.Linear(config.d_model, config.d_model) if config.pooler else None
        self.apply(_init_weights)
        restructure(self)
        self._no_masks = [None] * config.num_layers

    @reuse.buffers
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, *,
                head_mask: torch.Tensor | None = None,
                return_weights: bool | Iterable | Mapping = False,
                ) -> tuple[torch.Tensor, dict[str, list[torch.Tensor | None]] | None]:
        """Encode a batch.

        Args:
            input_ids: ``(b, n)`` token ids.
            attention_mask: ``(b, n)``, 1/True = real token, 0/False = padding (Hugging Face's
                meaning); becomes a ``(b, 1, 1, j)`` True = may attend key mask.
            token_type_ids: ``(b, n)`` segment ids (default all 0).
            head_mask: ``(num_layers, h)`` or ``(num_layers, b, h)``, a list of per-layer
                ``(h,)`` / ``(b, h)`` masks or None, or ``{"encoder_self": ...}``; multiplies each
                head's output (0 removes the head).
            return_weights: ``True``/``False``, ``"encoder_self"``, or
                ``{"encoder_self": [layer, ...]}`` (negative = from the end) to keep every other
                layer on the fused path (the selection shared by every headwise model).

        Returns:
            ``(last_hidden_state (b, n, m), {"encoder_self": [(b, h, n, n) | None] * layers}
            or None)``.
        """
        mask = self._check_inputs(input_ids, attention_mask, token_type_ids)
        masks = (self._no_masks if head_mask is None else layer_head_masks(
            head_mask, head_counts(self), input_ids.shape[0], "BertModel")["encoder_self"])
        selection = select(return_weights, {"encoder_self": self.config.num_layers})
        wanted = [False] * len(self.layers) if selection is None else selection["encoder_self"]
        x = self.embeddings(input_ids, token_type_ids)
        weights: list[torch.Tensor | None] = []
        for index, layer in enumerate(self.layers):
            x, w = layer(x, mask=mask, head_mask=masks[index], return_weights=wanted[index])
            weights.append(w)
        return x, (None if selection is None else {"encoder_self": weights})

    def attention_layers(self) -> dict[str, list]:
        """``{"encoder_self": [each layer's self_attn]}`` (the head tools' map of this model)."""
        return {"encoder_self": [layer.self_attn for layer in self.layers]}

    def pool(self, last_hidden_state: torch.Tensor) -> torch.Tensor:
        """BERT's pooler: ``tanh(W h_[CLS] + b)``: ``(b, n, m) -> (b, m)``."""
        if self.pooler is None:
            raise ValueError("BertModel.pool: this model has no pooler (config.pooler=False; "
                             "the checkpoint carried no pooler weights)")
        return torch.tanh(self.pooler(last_hidden_state[:, 0]))

    def _check_inputs(self, input_ids, attention_mask, token_type_ids):
        """Validate once; return the ``(b, 1, 1, j)`` bool key mask, or None if nothing is
        padded (the fused kernel then runs without a mask)."""
        cfg = self.config
        checks.batched(input_ids, "input_ids", 2, "(b, n)", "BertModel", var="ids")
        if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
            raise TypeError(f"BertModel: input_ids must be integer token ids, got "
                            f"{input_ids.dtype}")
        b, n = input_ids.shape
        if n > cfg.max_len:
            raise ValueError(f"BertModel: {n} tokens exceed max_len={cfg.max_len} learned "
                             f"positions; truncate the input to {cfg.max_len} tokens")
        _check_ids(input_ids, cfg.vocab_size, "input_ids", "vocab_size")
        if token_type_ids is not None:
            if not isinstance(token_type_ids, torch.Tensor) or token_type_ids.shape != (b, n):
                raise ValueError(f"BertModel: token_type_ids must be a (b, n)=({b}, {n}) tensor,"
                                 f" got {_shape(token_type_ids)}")
            _check_ids(token_type_ids, cfg.type_vocab_size, "token_type_ids", "type_vocab_size")
        if attention_mask is None:
            return None
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != (b, n):
            raise ValueError(f"BertModel: attention_mask must be a (b, n)=({b}, {n}) tensor of "
                             f"1 (real token) / 0 (padding), got {_shape(attention_mask)}")
        valid = attention_mask.bool()
        if host(valid) and bool(valid.all()):  # (a read: a device sync off the CPU)
            return None
        return valid[:, None, None, :]  # (b, 1, 1, j): True = may attend


def _block(config: BertConfig) -> EncoderBlock:
    block = EncoderBlock(config.d_model, config.num_heads, config.d_ff, dropout=config.dropout,
                         norm_first=False, activation=config.activation,
                         layer_norm_eps=config.layer_norm_eps, attention=config.attention)
    # BERT has its own rate for attention probabilities (attention_probs_dropout_prob)
    block.self_attn.dropout_p = config.attention_dropout
    return block


def _init_weights(module: nn.Module) -> None:
    """BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorms."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def _check_ids(ids: torch.Tensor, size: int, name: str, field: str) -> None:
    """Ids in range, read on the CPU only (:func:`headwise.fast.host`; a device sync on a GPU,
    where an id out of range fails inside the embedding kernel instead)."""
    if host(ids) and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= size):
        raise ValueError(f"BertModel: {name} must lie in [0, {size}) ({field}), got values in "
                         f"[{int(ids.min())}, {int(ids.max())}]; use the checkpoint's own "
                         "tokenizer")


def _shape(x) -> str:
    return f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
