"""Transformer models built on headwise's :class:`~headwise.MultiHeadAttention`.

The tree is the architecture: ``blocks`` (feed-forward, positions, encoder/decoder blocks),
``config`` (one frozen dataclass per family).
"""

from headwise.models.blocks import (
    DecoderBlock,
    EncoderBlock,
    FeedForward,
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
)
from headwise.models.config import CONFIGS, LMConfig, TransformerConfig, config_from_dict

__all__ = [
    "CONFIGS",
    "DecoderBlock",
    "EncoderBlock",
    "FeedForward",
    "LMConfig",
    "LearnedPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "TransformerConfig",
    "config_from_dict",
]
