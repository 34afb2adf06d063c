"""headwise: multi-head attention that is fast and see-through.

Axis legend used everywhere: ``b`` batch, ``h`` heads, ``g`` key/value heads, ``i`` query
position, ``j`` key position, ``d`` head dim, ``m`` model dim. Masks: True = may attend.
"""

from headwise import masks, models
from headwise.attention import BACKENDS, attention, attention_weights, register_backend
from headwise.cache import KVCache
from headwise.decoding import generate
from headwise.heads import merge_heads, split_heads
from headwise.layers import MultiHeadAttention
from headwise.per_head import PerHeadAttention, fuse, unfuse
from headwise.trace import Trace, trace

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "KVCache",
    "MultiHeadAttention",
    "PerHeadAttention",
    "attention",
    "attention_weights",
    "fuse",
    "generate",
    "masks",
    "models",
    "merge_heads",
    "register_backend",
    "split_heads",
    "trace",
    "Trace",
    "unfuse",
]
