"""The options of one attention layer, as one frozen dataclass checked once: what
:class:`~headwise.layers.MultiHeadAttention` and the models' blocks take, and the field
``attention`` of every model config (:mod:`headwise.models.config`).

The sizes a layer is built with (``embed_dim`` / ``d_model``, ``num_heads``) stay beside it:
they belong to the model. The checks that need them are :meth:`AttentionConfig.check_heads`,
called by the module and the model configs alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from headwise import limits
from headwise.attend import check_backend

__all__ = ["AttentionConfig"]

# Which maximum of headwise.limits.MAX bounds each optional size.
_SIZES = {"num_kv_heads": "heads", "head_dim": "dim", "window": "length", "rotary_dim": "dim"}


@dataclass(frozen=True, kw_only=True)
class AttentionConfig:
    """How each attention layer attends; every value is checked once, in ``__post_init__``.

    Args:
        num_kv_heads: key/value heads ``g`` (grouped-query attention; 1 = multi-query);
            None: one per query head.
        head_dim: per-head size ``d``; None: ``embed_dim // num_heads``. The hidden size
            ``h * d`` need not equal ``embed_dim``.
        window: sliding window (Mistral): each query sees itself and the ``window - 1`` keys
            before it, as a banded bool mask (it stays on the fused kernels; the decoding step
            reads only the window's slice of the cache); None: every key. Self-attention only:
            cross-attention's keys are the encoder's (:meth:`for_cross`).
        softcap: scores become ``c * tanh(scores / c)`` before masking (Gemma 2), or None.
        sinks: a learned logit per head (parameter ``sinks (h,)``) joins every softmax
            (gpt-oss; rows of weights then sum to at most 1).
        rope_theta: RoPE's base (Su et al. 2021), where the model's positions are rotary.
        rotary_dim: features of each head RoPE rotates (even, ``<= d``); None: all of them.
            RoPE is one stateless :class:`~headwise.rope.RotaryEmbedding` a model builds from
            these two and hands every block (``rope=``): the module itself takes it as given.
        backend: attention backend (``"auto"``: the fused kernel; weights, when asked for,
            are recomputed beside it; ``"eager"``, ``"sdpa"``, ...).
    """

    num_kv_heads: int | None = None
    head_dim: int | None = None
    window: int | None = None
    softcap: float | None = None
    sinks: bool = False
    rope_theta: float = 10000.0
    rotary_dim: int | None = None
    backend: str = "auto"

    def __post_init__(self):
        where = "AttentionConfig"
        for name, kind in _SIZES.items():
            if getattr(self, name) is not None:
                limits.size(getattr(self, name), name, kind, where)
        if self.softcap is not None and (not isinstance(self.softcap, (int, float))
                                         or isinstance(self.softcap, bool)
                                         or not 0 < self.softcap < float("inf")):
            raise ValueError(f"{where}: softcap must be None or > 0, got {self.softcap!r}")
        if not isinstance(self.sinks, bool):
            raise TypeError(f"{where}: sinks must be True or False, got {self.sinks!r}")
        if (not isinstance(self.rope_theta, (int, float)) or isinstance(self.rope_theta, bool)
                or not 0 < self.rope_theta < float("inf")):
            raise ValueError(f"{where}: rope_theta must be > 0, got {self.rope_theta!r}")
        check_backend(self.backend, where)

    # ------------------------------------------------------------------ building and copies
    @classmethod
    def build(cls, config: AttentionConfig | Mapping[str, Any] | None = None,
              where: str = "AttentionConfig", **options) -> AttentionConfig:
        """``config`` (an AttentionConfig, a dict of its fields, or None for the defaults) with
        ``options`` (its field names as keywords) over it: what a module or block that takes
        ``config=`` and the old keywords side by side builds from them."""
        if config is None:
            config = cls()
        elif isinstance(config, Mapping):
            config = cls.from_dict(config, where)
        elif not isinstance(config, cls):
            raise TypeError(f"{where}: the attention config must be an AttentionConfig or a dict "
                            f"of its fields, got {type(config).__name__}")
        if not options:
            return config
        unknown = sorted(set(options) - _field_names())
        if unknown:
            raise TypeError(f"{where}: unknown attention option(s) {unknown}; the options are "
                            f"{sorted(_field_names())} (AttentionConfig's fields)")
        return dataclasses.replace(config, **options)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "AttentionConfig") -> AttentionConfig:
        """Build from ``to_dict()`` output; an unknown key is a ``ValueError`` naming the known."""
        unknown = sorted(set(d) - _field_names())
        if unknown:
            raise ValueError(f"{where}: unknown attention keys {unknown}; known keys are "
                             f"{sorted(_field_names())}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict of every field (``from_dict`` inverts it)."""
        return dataclasses.asdict(self)

    def replace(self, **changes) -> AttentionConfig:
        """A copy with some fields changed (checked again)."""
        return dataclasses.replace(self, **changes)

    def for_cross(self) -> AttentionConfig:
        """Cross-attention's options: these, without the window (its keys, the encoder's, have
        no positions of their own; RoPE is never handed to it)."""
        return self if self.window is None else dataclasses.replace(self, window=None)

    # ------------------------------------------------------- what needs the layer's sizes
    def head_size(self, embed_dim: int, num_heads: int) -> int:
        """Per-head size ``d`` in use: ``head_dim`` or ``embed_dim // num_heads``."""
        return self.head_dim or embed_dim // num_heads

    def kv_heads(self, num_heads: int) -> int:
        """Key/value heads ``g`` in use: ``num_kv_heads`` or ``num_heads``."""
        return self.num_kv_heads or num_heads

    def check_heads(self, embed_dim: int, num_heads: int, where: str,
                    dim_name: str = "embed_dim") -> None:
        """The checks that need the layer's sizes (``dim_name`` is what the caller calls
        ``embed_dim``): the head size divides out, the query heads share the key/value heads
        evenly, RoPE rotates at most the whole head."""
        if self.head_dim is None and embed_dim % num_heads:
            # The hint looks only near num_heads: it costs no more than the check did.
            near = min((x for x in range(1, 2 * num_heads + 1) if embed_dim % x == 0),
                       key=lambda x: (abs(x - num_heads), -x))
            raise ValueError(f"{where}: {dim_name}={embed_dim} is not divisible by num_heads="
                             f"{num_heads}; pass head_dim={max(1, embed_dim // num_heads)} "
                             f"or use num_heads={near}")
        if self.num_kv_heads is not None and num_heads % self.num_kv_heads:
            raise ValueError(f"{where}: num_heads={num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}; each key/value head must serve "
                             "the same number of query heads, so pick a divisor of num_heads")
        size = self.head_size(embed_dim, num_heads)
        if self.rotary_dim is not None and (self.rotary_dim % 2 or self.rotary_dim > size):
            raise ValueError(f"{where}: rotary_dim must be even and <= the head size {size}, "
                             f"got {self.rotary_dim}")


def _field_names() -> set[str]:
    return {f.name for f in dataclasses.fields(AttentionConfig)}
