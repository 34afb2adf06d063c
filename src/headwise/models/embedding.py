"""Token ids to vectors: embedding, optional ``sqrt(m)`` scale, positions, dropout."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from headwise.models.blocks import (
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    block_args,
    drop,
    final_norm,
)
from headwise.observe import StepKind, record

__all__ = ["Embeddings", "add_output_head", "init_weights"]


class Embeddings(nn.Module):
    """``forward(ids (b, n), offset=0) -> (b, n, m)``: ``drop(pos(E[ids] * scale, offset))``.

    Submodules: ``tokens`` (``nn.Embedding``), ``positions`` (None with ``"rope"``: positions
    then rotate q and k inside attention), ``dropout``. ``scale`` is
    ``sqrt(m)`` with ``scale_embeddings`` (Vaswani et al. 2017, section 3.4), else 1.
    """

    def __init__(self, vocab_size: int, d_model: int, max_len: int, *, positional: str,
                 dropout: float, scale: bool):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, d_model)
        # "rope": positions enter every self-attention's q and k instead (headwise.rope)
        pe = {"sinusoidal": SinusoidalPositionalEncoding, "learned": LearnedPositionalEncoding,
              "rope": None}
        self.positions = None if pe[positional] is None else pe[positional](d_model, max_len)
        self.dropout = nn.Dropout(dropout)
        self.scale = math.sqrt(d_model) if scale else 1.0

    @classmethod
    def from_config(cls, c, vocab_size: int) -> Embeddings:
        """The embeddings a model config (``LMConfig`` / ``TransformerConfig``) describes, over
        ``vocab_size`` ids."""
        return cls(vocab_size, c.d_model, c.max_len, positional=c.positional,
                   dropout=c.dropout, scale=c.scale_embeddings)

    def forward(self, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """``ids: (b, n)`` -> ``(b, n, m)``; ``offset`` = positions already decoded."""
        x = self.tokens(ids)
        record(StepKind.EMBED, x)
        if self.scale != 1.0:
            x = x * self.scale
            record(StepKind.SCALE_EMBEDDING, x, scale=self.scale)
        if self.positions is not None:
            x = self.positions(x, offset)
            record(StepKind.ADD_POSITIONS, x, offset=offset)
        return drop(self, x)

    def extra_repr(self) -> str:
        return f"scale={self.scale:.4g}"


def init_weights(module: nn.Module) -> None:
    """GPT-2 style: linear and embedding weights ~ N(0, 0.02), biases 0 (LayerNorm: 1 and 0).

    Embeddings scaled by ``sqrt(m)`` start at N(0, 1/m) instead, so that the scaled vectors have
    unit-size entries (as fairseq's Transformer)."""
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            nn.init.normal_(sub.weight, std=0.02)
            if sub.bias is not None:
                nn.init.zeros_(sub.bias)
        elif isinstance(sub, Embeddings):
            std = 0.02 if sub.scale == 1.0 else 1.0 / sub.scale
            nn.init.normal_(sub.tokens.weight, std=std)


def add_output_head(model: nn.Module, vocab_size: int) -> None:
    """Finish a model that ends in logits: give it ``lm_head`` (``Linear(m, vocab, bias=False)``),
    initialise every weight (:func:`init_weights`), then, with ``config.tie_embeddings``, make
    ``lm_head`` share ``embed.tokens.weight`` (after the initialisation, so the shared matrix
    keeps the embedding's)."""
    model.lm_head = nn.Linear(model.config.d_model, vocab_size, bias=False)
    init_weights(model)
    if model.config.tie_embeddings:
        model.lm_head.weight = model.embed.tokens.weight


def build_stack(model: nn.Module, config, vocab_size: int, block: Callable[..., nn.Module],
                layers: int, **block_kwargs) -> None:
    """What every stack (encoder, decoder, language model) is made of, in this order (the order
    its parameters are registered and drawn in): ``model.config``, ``embed`` (``vocab_size``
    tokens), ``blocks`` (``layers`` of ``block(m, h, d_ff, **block_kwargs, **block_args)``)
    and ``final_norm``."""
    c = model.config = config
    model.embed = Embeddings.from_config(c, vocab_size)
    model.blocks = nn.ModuleList(block(c.d_model, c.num_heads, c.d_ff, **block_kwargs,
                                       **block_args(c)) for _ in range(layers))
    model.final_norm = final_norm(c)
