"""Model configs: one frozen, keyword-only base with the fields every family shares, their
checks and their (de)serialisation, written once; one subclass per family.

``LMConfig`` builds a decoder-only :class:`~headwise.models.TransformerLM`; ``TransformerConfig``
an encoder-decoder :class:`~headwise.models.Transformer`; ``BertConfig``
(:mod:`headwise.models.bert`) a BERT encoder. Each round-trips through JSON with ``to_dict()`` /
``from_dict(d)`` and carries a ``kind`` class attribute (``"lm"`` / ``"transformer"`` /
``"bert"``) that checkpoints store next to the dict. The dict keys are the field names, so
saved configs keep loading as long as no field is renamed.

Names: ``d_model`` is the model dim ``m``; ``head_dim`` is the *requested* per-head size (None:
``d_model // num_heads``) and :attr:`ModelConfig.head_size` the size ``d`` in use; ``dropout``
is always a probability (the ``nn.Dropout`` modules that apply it are attributes of the blocks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, ClassVar

from headwise import limits
from headwise.attend import check_backend
from headwise.models.feedforward import check_activation

__all__ = ["CONFIGS", "LMConfig", "ModelConfig", "TransformerConfig", "config_from_dict"]

# Which maximum of headwise.limits.MAX bounds each size field (others: "dim").
_SIZE_KINDS = {"vocab_size": "vocab", "src_vocab_size": "vocab", "tgt_vocab_size": "vocab",
               "type_vocab_size": "vocab", "num_heads": "heads", "num_kv_heads": "heads",
               "num_layers": "layers", "num_decoder_layers": "layers", "max_len": "length",
               "sliding_window": "length"}
_POSITIONALS = ("sinusoidal", "learned", "rope")
_NORMS = ("layer", "rms")
_FFNS = ("mlp", "glu")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The fields every model family has; every value is checked once, in ``__post_init__``.

    Args:
        d_model: model dim ``m``. num_heads: query heads ``h``. num_layers: blocks.
        d_ff: feed-forward width. max_len: longest sequence.
        dropout: probability, on embeddings, sublayer outputs and after the activation.
        activation: ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"silu"``.
        layer_norm_eps: every LayerNorm's epsilon.
        pad_id: the padding id, or None where the family allows it.
        backend: attention backend of every block (``"auto"``: always the fused kernel; weights,
            when asked for, are recomputed beside it).
        pruned_heads: ``{kind: [pruned query heads per layer]}`` (original indices), written by
            :func:`headwise.prune_heads`; None for an unpruned model.

    Subclasses list their extra checks in the class attributes below.
    """

    kind: ClassVar[str]
    #: int fields checked to be >= 1; those in ``_OPTIONAL`` may also be None.
    _INTS: ClassVar[tuple[str, ...]] = ("d_model", "num_heads", "num_layers", "d_ff", "max_len")
    _OPTIONAL: ClassVar[tuple[str, ...]] = ()
    _BOOLS: ClassVar[tuple[str, ...]] = ()
    _PROBABILITIES: ClassVar[tuple[str, ...]] = ("dropout",)
    #: vocabulary fields ``pad_id`` must be valid in; may ``pad_id`` be None?
    _VOCABS: ClassVar[tuple[str, ...]] = ()
    _PAD_OPTIONAL: ClassVar[bool] = True

    d_model: int = 512
    num_heads: int = 8
    num_layers: int = 6
    d_ff: int = 2048
    max_len: int = 512
    dropout: float = 0.1
    activation: str = "relu"
    layer_norm_eps: float = 1e-5
    pad_id: int | None = None
    backend: str = "auto"
    pruned_heads: dict[str, list[list[int]]] | None = None

    def __post_init__(self):
        self._check()

    # -------------------------------------------------------------------------- serialisation
    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict of every field (``from_dict`` inverts it)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]):
        """Build from ``to_dict()`` output; unknown or missing keys raise ``ValueError``."""
        if not isinstance(d, Mapping):
            raise TypeError(f"{cls.__name__}.from_dict expects a dict, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown keys {unknown}; known keys are "
                             f"{sorted(names)}{cls._from_dict_hint()}")
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.name not in d]
        if required:
            raise ValueError(f"{cls.__name__}: missing required keys {required}")
        return cls(**d)

    @classmethod
    def _from_dict_hint(cls) -> str:
        return ""

    def replace(self, **changes):
        """A copy with some fields changed (checked again)."""
        return dataclasses.replace(self, **changes)

    # ---------------------------------------------------------------------------- derived
    @property
    def head_size(self) -> int:
        """Per-head size ``d`` in use: ``d_model // num_heads``."""
        return self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads ``g`` of an unpruned layer (``num_heads`` here)."""
        return self.num_heads

    def attention_kinds(self) -> dict[str, int]:
        """``{kind: layers}`` of the attentions this family has (an encoder here)."""
        return {"encoder_self": self.num_layers}

    def layer_kv_heads(self, kind: str) -> list[int]:
        """Key/value heads of each layer of ``kind`` (fewer where heads were pruned)."""
        from headwise.models.pruned import config_plans
        return [len(groups) for _, groups in config_plans(self)[kind]]

    # ------------------------------------------------------------------------------ checks
    def _check(self) -> None:
        name = type(self).__name__
        for field in (*self._INTS, *self._VOCABS):
            value = getattr(self, field)
            if value is None and field in self._OPTIONAL:
                continue
            limits.size(value, field, _SIZE_KINDS.get(field, "dim"), name)
        for field in self._BOOLS:
            if not isinstance(getattr(self, field), bool):
                raise TypeError(f"{name}: {field} must be True or False, got "
                                f"{getattr(self, field)!r}")
        self._check_heads(name)
        for field in self._PROBABILITIES:
            value = getattr(self, field)
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not 0.0 <= value < 1.0):
                raise ValueError(f"{name}: {field} must be in [0, 1), got {value!r}")
        check_activation(self.activation, name)
        if not isinstance(self.layer_norm_eps, (int, float)) \
                or not 0 < self.layer_norm_eps < float("inf"):
            raise ValueError(f"{name}: layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
        self._check_pad_id(name)
        check_backend(self.backend, name)
        from headwise.models.pruned import check_pruned
        object.__setattr__(self, "pruned_heads", check_pruned(
            self.pruned_heads, self.attention_kinds(), self.num_heads, self.kv_heads, name))

    def _check_heads(self, name: str) -> None:
        if self.d_model % self.num_heads:
            raise ValueError(f"{name}: d_model={self.d_model} is not divisible by num_heads="
                             f"{self.num_heads}; the head size is d_model // num_heads, so pick "
                             "a divisor of d_model")

    def _check_pad_id(self, name: str) -> None:
        if self.pad_id is None and self._PAD_OPTIONAL:
            return
        smallest = min(getattr(self, v) for v in self._VOCABS)
        if (not isinstance(self.pad_id, int) or isinstance(self.pad_id, bool)
                or not 0 <= self.pad_id < smallest):
            allowed = "None or an id" if self._PAD_OPTIONAL else "an id"
            raise ValueError(f"{name}: pad_id must be {allowed} in [0, {smallest}), got "
                             f"{self.pad_id!r}")


@dataclass(frozen=True, kw_only=True)
class _StackConfig(ModelConfig):
    """The fields the LM and the encoder-decoder share beyond the base (grouped-query
    attention, a free head size, norm placement, positions, embedding options, biases, and the
    Llama-era choices: norm, ffn, RoPE, sliding window, soft-capping, sinks)."""

    _INTS: ClassVar[tuple[str, ...]] = (*ModelConfig._INTS, "num_kv_heads", "head_dim",
                                        "rotary_dim", "sliding_window")
    _OPTIONAL: ClassVar[tuple[str, ...]] = ("num_kv_heads", "head_dim", "rotary_dim",
                                            "sliding_window")
    _BOOLS: ClassVar[tuple[str, ...]] = ("norm_first", "tie_embeddings", "scale_embeddings",
                                         "bias", "attention_sinks")

    num_kv_heads: int | None = None
    head_dim: int | None = None
    norm_first: bool = True
    positional: str = "sinusoidal"
    tie_embeddings: bool = False
    scale_embeddings: bool = False
    bias: bool = True
    norm: str = "layer"
    ffn: str = "mlp"
    rope_theta: float = 10000.0
    rotary_dim: int | None = None
    sliding_window: int | None = None
    attn_softcap: float | None = None
    attention_sinks: bool = False

    @property
    def head_size(self) -> int:
        """Per-head size ``d`` in use: ``head_dim`` or ``d_model // num_heads``."""
        return self.head_dim or self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads ``g`` (``num_heads`` unless grouped-query attention)."""
        return self.num_kv_heads or self.num_heads

    @property
    def rotary_size(self) -> int:
        """How many features of each head RoPE rotates (``rotary_dim`` or the whole head)."""
        return self.rotary_dim or self.head_size

    def _check(self) -> None:
        super()._check()
        name = type(self).__name__
        for field, choices in (("positional", _POSITIONALS), ("norm", _NORMS), ("ffn", _FFNS)):
            if getattr(self, field) not in choices:
                raise ValueError(f"{name}: {field} must be one of {choices}, got "
                                 f"{getattr(self, field)!r}")
        self._check_modern(name)

    def _check_modern(self, name: str) -> None:
        """The Llama-era fields: RoPE, soft-capping."""
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

    def _check_heads(self, name: str) -> None:
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(f"{name}: d_model={self.d_model} is not divisible by num_heads="
                             f"{self.num_heads}; pass head_dim={max(1, self.d_model // self.num_heads)}"
                             " or change num_heads")
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"{name}: num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}; pick a divisor of num_heads")


@dataclass(frozen=True)
class LMConfig(_StackConfig):
    """A decoder-only language model (the Trax ``TransformerLM``, GPT).

    Args:
        vocab_size: number of token ids (the one positional argument; the rest are keywords).
        num_kv_heads: ``g`` < ``h`` for grouped-query attention (1 = multi-query).
        head_dim: per-head size ``d`` (default ``d_model // num_heads``).
        norm_first: pre-norm (with a final LayerNorm) or post-norm.
        tie_embeddings: the output projection shares the token embedding matrix.
        pad_id: the padding id (ignored by the loss, written after ``eos`` in generation),
            or None.
        scale_embeddings: multiply token embeddings by ``sqrt(d_model)`` (Vaswani et al.).
        bias: biases in every projection.
        norm: ``"layer"`` (LayerNorm) or ``"rms"`` (RMSNorm, Zhang & Sennrich 2019; Llama);
            ``layer_norm_eps`` is the epsilon of either.
        ffn: ``"mlp"`` (``down(act(up(x)))``) or ``"glu"`` (``down(act(gate(x)) * up(x))``,
            Shazeer 2020; with ``activation="silu"`` this is Llama's SwiGLU).
        positional: ``"sinusoidal"``, ``"learned"`` or ``"rope"``: rotary positions on q and k
            after the head split (Su et al. 2021, the rotate-half form of GPT-NeoX / HF Llama),
            base ``rope_theta``, on the first ``rotary_dim`` features of each head (default all).
        sliding_window: each query sees itself and the ``sliding_window - 1`` keys before it
            (Mistral), or None.
        attn_softcap: scores become ``c * tanh(scores / c)`` before masking (Gemma 2), or None.
        attention_sinks: a learned logit per head joins every softmax (gpt-oss; rows of
            weights then sum to at most 1).
        The other fields are those of :class:`ModelConfig`.
    """

    kind: ClassVar[str] = "lm"
    _VOCABS: ClassVar[tuple[str, ...]] = ("vocab_size",)

    vocab_size: int
    _: KW_ONLY
    max_len: int = 2048
    pad_id: int | None = 0

    def attention_kinds(self) -> dict[str, int]:
        return {"decoder_self": self.num_layers}


@dataclass(frozen=True)
class TransformerConfig(_StackConfig):
    """An encoder-decoder Transformer (Vaswani et al. 2017; d2l.ai chapter 11).

    Args:
        src_vocab_size / tgt_vocab_size: source and target vocabularies (positional).
        num_layers: encoder blocks (and decoder blocks unless ``num_decoder_layers``).
        tie_embeddings: the output projection shares the target embedding matrix.
        pad_id: if set, source tokens equal to it are masked out of every attention to the
            source (in addition to ``src_valid_lens``); also ignored by the loss.
        scale_embeddings: multiply embeddings by ``sqrt(d_model)`` (default True, as the paper).
        The other fields are as in :class:`LMConfig` (RoPE, sliding windows, soft-capping and
        sinks apply to self-attention; cross-attention has no positions of its own).
    """

    kind: ClassVar[str] = "transformer"
    _OPTIONAL: ClassVar[tuple[str, ...]] = (*_StackConfig._OPTIONAL, "num_decoder_layers")
    _INTS: ClassVar[tuple[str, ...]] = (*_StackConfig._INTS, "num_decoder_layers")
    _VOCABS: ClassVar[tuple[str, ...]] = ("src_vocab_size", "tgt_vocab_size")

    src_vocab_size: int
    tgt_vocab_size: int
    _: KW_ONLY
    num_decoder_layers: int | None = None
    scale_embeddings: bool = True

    @property
    def decoder_layers(self) -> int:
        return self.num_decoder_layers or self.num_layers

    def attention_kinds(self) -> dict[str, int]:
        return {"encoder_self": self.num_layers, "decoder_self": self.decoder_layers,
                "cross": self.decoder_layers}


CONFIGS: dict[str, type[ModelConfig]] = {"lm": LMConfig, "transformer": TransformerConfig}


def config_from_dict(kind: str, d: dict[str, Any]):
    """``CONFIGS[kind].from_dict(d)``, with a clear error for an unknown kind."""
    if kind not in CONFIGS:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {sorted(CONFIGS)}")
    return CONFIGS[kind].from_dict(d)
