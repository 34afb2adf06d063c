"""One frozen dataclass per model family; every value checked once, here.

``LMConfig`` builds a decoder-only :class:`~headwise.models.TransformerLM`; ``TransformerConfig``
an encoder-decoder :class:`~headwise.models.Transformer`. Both round-trip through JSON with
``to_dict()`` / ``from_dict(d)`` and carry a ``kind`` class attribute (``"lm"`` /
``"transformer"``) that checkpoints store next to the dict.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["CONFIGS", "LMConfig", "TransformerConfig", "config_from_dict"]

_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
_POSITIONALS = ("sinusoidal", "learned", "rope")
_NORMS = ("layer", "rms")
_OPTIONAL_INTS = ("num_kv_heads", "head_dim", "num_decoder_layers", "rotary_dim",
                  "sliding_window")
_FFNS = ("mlp", "glu")


class _Config:
    """Shared checks and (de)serialisation; subclasses are frozen dataclasses."""

    kind: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict of every field (``from_dict`` inverts it)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        """Build from ``to_dict()`` output; unknown or missing keys raise ``ValueError``."""
        if not isinstance(d, dict):
            raise TypeError(f"{cls.__name__}.from_dict expects a dict, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown keys {unknown}; known keys are "
                             f"{sorted(names)}")
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.name not in d]
        if required:
            raise ValueError(f"{cls.__name__}: missing required keys {required}")
        return cls(**d)

    def replace(self, **changes):
        """A copy with some fields changed (checked again)."""
        return dataclasses.replace(self, **changes)

    @property
    def head_size(self) -> int:
        """Per-head size ``d``: ``head_dim`` or ``d_model // num_heads``."""
        return self.head_dim or self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads ``g`` (``num_heads`` unless grouped-query attention)."""
        return self.num_kv_heads or self.num_heads

    def _check(self, ints: tuple[str, ...], vocabs: tuple[str, ...]) -> None:
        name = type(self).__name__
        for field in ints:
            value = getattr(self, field)
            if value is None and field in _OPTIONAL_INTS:
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name}: {field} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"{name}: {field} must be >= 1, got {value}")
        for field in ("norm_first", "tie_embeddings", "scale_embeddings", "bias",
                      "attention_sinks"):
            if not isinstance(getattr(self, field), bool):
                raise TypeError(f"{name}: {field} must be True or False, got "
                                f"{getattr(self, field)!r}")
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(f"{name}: d_model={self.d_model} is not divisible by num_heads="
                             f"{self.num_heads}; pass head_dim={max(1, self.d_model // self.num_heads)}"
                             " or change num_heads")
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"{name}: num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}; pick a divisor of num_heads")
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"{name}: dropout must be in [0, 1), got {self.dropout!r}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"{name}: activation must be one of {_ACTIVATIONS}, got "
                             f"{self.activation!r}")
        if self.positional not in _POSITIONALS:
            raise ValueError(f"{name}: positional must be one of {_POSITIONALS}, got "
                             f"{self.positional!r}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"{name}: layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        self._check_modern(name)
        if self.pad_id is not None:
            smallest = min(getattr(self, v) for v in vocabs)
            if (not isinstance(self.pad_id, int) or isinstance(self.pad_id, bool)
                    or not 0 <= self.pad_id < smallest):
                raise ValueError(f"{name}: pad_id must be None or an id in [0, {smallest}), got "
                                 f"{self.pad_id!r}")
        from headwise.attention import BACKENDS
        if self.backend != "auto" and self.backend not in BACKENDS:
            raise ValueError(f"{name}: unknown backend {self.backend!r}; choose 'auto' or one "
                             f"of {sorted(BACKENDS)}")

    def _check_modern(self, name: str) -> None:
        """The Llama-era fields: norm, ffn, RoPE, sliding window, soft-capping."""
        for field, choices in (("norm", _NORMS), ("ffn", _FFNS)):
            if getattr(self, field) not in choices:
                raise ValueError(f"{name}: {field} must be one of {choices}, got "
                                 f"{getattr(self, field)!r}")
        if not isinstance(self.rope_theta, (int, float)) or not self.rope_theta > 0:
            raise ValueError(f"{name}: rope_theta must be > 0, got {self.rope_theta!r}")
        if self.rotary_dim is not None:
            if self.positional != "rope":
                raise ValueError(f"{name}: rotary_dim={self.rotary_dim} needs positional='rope', "
                                 f"got positional={self.positional!r}")
            if self.rotary_dim % 2 or self.rotary_dim > self.head_size:
                raise ValueError(f"{name}: rotary_dim must be even and <= the head size "
                                 f"{self.head_size}, got {self.rotary_dim}")
        if self.attn_softcap is not None and (
                not isinstance(self.attn_softcap, (int, float)) or not self.attn_softcap > 0):
            raise ValueError(f"{name}: attn_softcap must be None or > 0, got "
                             f"{self.attn_softcap!r}")

    @property
    def rotary_size(self) -> int:
        """How many features of each head RoPE rotates (``rotary_dim`` or the whole head)."""
        return self.rotary_dim or self.head_size


@dataclass(frozen=True)
class LMConfig(_Config):
    """A decoder-only language model (the Trax ``TransformerLM``, GPT).

    Args:
        vocab_size: number of token ids. d_model: ``m``. num_heads: ``h``.
        num_layers: decoder blocks. d_ff: feed-forward width. max_len: longest sequence.
        dropout: everywhere (embeddings, attention probabilities, sublayer outputs).
        num_kv_heads: ``g`` < ``h`` for grouped-query attention (1 = multi-query).
        head_dim: per-head size ``d`` (default ``d_model // num_heads``).
        norm_first: pre-norm (with a final LayerNorm) or post-norm.
        activation: ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"silu"``.
        positional: ``"sinusoidal"``, ``"learned"`` or ``"rope"`` (see below).
        tie_embeddings: the output projection shares the token embedding matrix.
        pad_id: the padding id (ignored by the loss, written after ``eos`` in generation),
            or None.
        scale_embeddings: multiply token embeddings by ``sqrt(d_model)`` (Vaswani et al.).
        layer_norm_eps, bias, backend: passed to every block.
        norm: ``"layer"`` (LayerNorm) or ``"rms"`` (RMSNorm, Zhang & Sennrich 2019; Llama);
            ``layer_norm_eps`` is the epsilon of either.
        ffn: ``"mlp"`` (``down(act(up(x)))``) or ``"glu"`` (``down(act(gate(x)) * up(x))``,
            Shazeer 2020; with ``activation="silu"`` this is Llama's SwiGLU).
        positional ``"rope"``: rotary positions on q and k after the head split (Su et al.
            2021, the rotate-half form of GPT-NeoX / HF Llama), base ``rope_theta``, on the
            first ``rotary_dim`` features of each head (default all).
        sliding_window: each query sees itself and the ``sliding_window - 1`` keys before it
            (Mistral), or None.
        attn_softcap: scores become ``c * tanh(scores / c)`` before masking (Gemma 2), or None.
        attention_sinks: a learned logit per head joins every softmax (gpt-oss; rows of
            weights then sum to at most 1).
    """

    kind: ClassVar[str] = "lm"

    vocab_size: int
    d_model: int = 512
    num_heads: int = 8
    num_layers: int = 6
    d_ff: int = 2048
    max_len: int = 2048
    dropout: float = 0.1
    num_kv_heads: int | None = None
    head_dim: int | None = None
    norm_first: bool = True
    activation: str = "relu"
    positional: str = "sinusoidal"
    tie_embeddings: bool = False
    pad_id: int | None = 0
    scale_embeddings: bool = False
    layer_norm_eps: float = 1e-5
    bias: bool = True
    backend: str = "auto"
    norm: str = "layer"
    ffn: str = "mlp"
    rope_theta: float = 10000.0
    rotary_dim: int | None = None
    sliding_window: int | None = None
    attn_softcap: float | None = None
    attention_sinks: bool = False

    def __post_init__(self):
        self._check(("vocab_size", "d_model", "num_heads", "num_layers", "d_ff", "max_len",
                     "num_kv_heads", "head_dim", "rotary_dim", "sliding_window"),
                    ("vocab_size",))


@dataclass(frozen=True)
class TransformerConfig(_Config):
    """An encoder-decoder Transformer (Vaswani et al. 2017; d2l.ai chapter 11).

    Args:
        src_vocab_size / tgt_vocab_size: source and target vocabularies.
        num_layers: encoder blocks (and decoder blocks unless ``num_decoder_layers``).
        tie_embeddings: the output projection shares the target embedding matrix.
        pad_id: if set, source tokens equal to it are masked out of every attention to the
            source (in addition to ``src_valid_lens``); also ignored by the loss.
        scale_embeddings: multiply embeddings by ``sqrt(d_model)`` (default True, as the paper).
        The other fields are as in :class:`LMConfig` (RoPE, sliding windows, soft-capping and
        sinks apply to self-attention; cross-attention has no positions of its own).
    """

    kind: ClassVar[str] = "transformer"

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    num_heads: int = 8
    num_layers: int = 6
    d_ff: int = 2048
    max_len: int = 512
    dropout: float = 0.1
    num_decoder_layers: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    norm_first: bool = True
    activation: str = "relu"
    positional: str = "sinusoidal"
    tie_embeddings: bool = False
    pad_id: int | None = None
    scale_embeddings: bool = True
    layer_norm_eps: float = 1e-5
    bias: bool = True
    backend: str = "auto"
    norm: str = "layer"
    ffn: str = "mlp"
    rope_theta: float = 10000.0
    rotary_dim: int | None = None
    sliding_window: int | None = None
    attn_softcap: float | None = None
    attention_sinks: bool = False

    def __post_init__(self):
        self._check(("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "num_layers",
                     "d_ff", "max_len", "num_decoder_layers", "num_kv_heads", "head_dim",
                     "rotary_dim", "sliding_window"),
                    ("src_vocab_size", "tgt_vocab_size"))

    @property
    def decoder_layers(self) -> int:
        return self.num_decoder_layers or self.num_layers


CONFIGS: dict[str, type[_Config]] = {"lm": LMConfig, "transformer": TransformerConfig}


def config_from_dict(kind: str, d: dict[str, Any]):
    """``CONFIGS[kind].from_dict(d)``, with a clear error for an unknown kind."""
    if kind not in CONFIGS:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {sorted(CONFIGS)}")
    return CONFIGS[kind].from_dict(d)
