"""Transformer models built on headwise's :class:`~headwise.MultiHeadAttention`.

The tree is the architecture: ``blocks`` (feed-forward, positions, encoder/decoder blocks),
``embedding`` (ids -> vectors), ``lm`` (decoder-only :class:`TransformerLM`), ``transformer``
(:class:`Encoder`, :class:`Decoder`, the encoder-decoder :class:`Transformer`), ``config`` (one
frozen dataclass per family; :func:`build` turns one into its model).

``pruned`` holds the pruned structure a config records (the models rebuild it at load).
May import: the core (layers, cache, masks, observe) and :mod:`headwise.fast`; never
:mod:`headwise.analysis`, :mod:`headwise.train` or the command line.
"""

from torch import nn

from headwise.layers import AttentionConfig
from headwise.models import _checks
from headwise.models._heads import attention_layers, check_heads, head_counts, layer_head_masks
from headwise.models.blocks import (
    DecoderBlock,
    EncoderBlock,
    FeedForward,
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
)
from headwise.models.config import CONFIGS, LMConfig, TransformerConfig, config_from_dict
from headwise.models.embedding import Embeddings
from headwise.models.lm import TransformerLM
from headwise.models.transformer import Decoder, Encoder, Transformer

__all__ = [
    "CONFIGS",
    "AttentionConfig",
    "Decoder",
    "DecoderBlock",
    "Embeddings",
    "Encoder",
    "EncoderBlock",
    "FeedForward",
    "LMConfig",
    "LearnedPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "Transformer",
    "TransformerConfig",
    "TransformerLM",
    "attention_layers",
    "build",
    "check_heads",
    "config_from_dict",
    "head_counts",
    "layer_head_masks",
]

MODELS: dict[str, type[nn.Module]] = {"lm": TransformerLM, "transformer": Transformer}


def build(config: LMConfig | TransformerConfig) -> nn.Module:
    """The model a config describes: ``LMConfig`` -> :class:`TransformerLM`,
    ``TransformerConfig`` -> :class:`Transformer`."""
    if not isinstance(config, (LMConfig, TransformerConfig)):
        raise TypeError(f"build expects an LMConfig or TransformerConfig, got "
                        f"{type(config).__name__}")
    _checks.model_memory(config)
    return MODELS[config.kind](config)
