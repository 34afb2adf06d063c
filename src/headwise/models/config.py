"""Model configs: one frozen, keyword-only base with the fields every family shares, their
checks and their (de)serialisation, written once; one subclass per family.

``LMConfig`` builds a decoder-only :class:`~headwise.models.TransformerLM`; ``TransformerConfig``
an encoder-decoder :class:`~headwise.models.Transformer`; ``BertConfig``
(:mod:`headwise.models.bert`) a BERT encoder. Each round-trips through JSON with ``to_dict()`` /
``from_dict(d)`` and carries a ``kind`` class attribute (``"lm"`` / ``"transformer"`` /
``"bert"``) that checkpoints store next to the dict. The dict keys are the field names.

The attention options (key/value heads, head size, sliding window, soft-cap, sinks, RoPE's base
and width, backend) are one field, ``attention``: a :class:`~headwise.layers.AttentionConfig`.
Before it they were flat fields under other names; :data:`FLAT_ATTENTION_KEYS` maps each old
name to its field, and is applied at the edges only: ``from_dict`` of a saved config, the
constructors' and ``replace``'s keywords (``LMConfig(10, sliding_window=8)``), and reading an
old attribute (``config.num_kv_heads``, with a ``DeprecationWarning``).

Names: ``d_model`` is the model dim ``m``; ``head_dim`` is the *requested* per-head size (None:
``d_model // num_heads``) and :attr:`ModelConfig.head_size` the size ``d`` in use; ``dropout``
is always a probability (the ``nn.Dropout`` modules that apply it are attributes of the blocks).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, ClassVar

from headwise import limits
from headwise.layers.config import AttentionConfig
from headwise.models.feedforward import check_activation

__all__ = ["CONFIGS", "FLAT_ATTENTION_KEYS", "LMConfig", "ModelConfig", "TransformerConfig",
           "config_from_dict", "fold_attention"]

# Which maximum of headwise.limits.MAX bounds each size field (others: "dim").
_SIZE_KINDS = {"vocab_size": "vocab", "src_vocab_size": "vocab", "tgt_vocab_size": "vocab",
               "type_vocab_size": "vocab", "num_heads": "heads", "num_layers": "layers",
               "num_decoder_layers": "layers", "max_len": "length"}

#: The flat keys model configs had before the field ``attention`` (in saved configs, in user
#: code), each with the :class:`~headwise.layers.AttentionConfig` field it now is.
FLAT_ATTENTION_KEYS = {"num_kv_heads": "num_kv_heads", "head_dim": "head_dim",
                       "sliding_window": "window", "attn_softcap": "softcap",
                       "attention_sinks": "sinks", "rope_theta": "rope_theta",
                       "rotary_dim": "rotary_dim", "backend": "backend"}


def fold_attention(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` with its flat attention keys (:data:`FLAT_ATTENTION_KEYS`) moved into
    ``attention``, set over the ``attention`` given (an AttentionConfig or a dict of its
    fields) or the defaults. Other keys pass as they are."""
    out = {k: v for k, v in kwargs.items() if k not in FLAT_ATTENTION_KEYS}
    flat = {FLAT_ATTENTION_KEYS[k]: v for k, v in kwargs.items() if k in FLAT_ATTENTION_KEYS}
    if flat:
        out["attention"] = AttentionConfig.build(out.get("attention"), **flat)
    return out


class _FoldsFlatAttention(type):
    """Every model config's constructor (and so ``dataclasses.replace``) takes the flat
    attention keywords too: :func:`fold_attention` before the dataclass ``__init__``."""

    def __call__(cls, *args, **kwargs):
        return super().__call__(*args, **fold_attention(kwargs))
_POSITIONALS = ("sinusoidal", "learned", "rope")
_NORMS = ("layer", "rms")
_FFNS = ("mlp", "glu")


@dataclass(frozen=True, kw_only=True)
class ModelConfig(metaclass=_FoldsFlatAttention):
    """The fields every model family has; every value is checked once, in ``__post_init__``.

    Args:
        d_model: model dim ``m``. num_heads: query heads ``h``. num_layers: blocks.
        d_ff: feed-forward width. max_len: longest sequence.
        dropout: probability, on embeddings, sublayer outputs and after the activation.
        activation: ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"silu"``.
        layer_norm_eps: every LayerNorm's epsilon.
        pad_id: the padding id, or None where the family allows it.
        attention: the options of every attention layer
            (:class:`~headwise.layers.AttentionConfig`: key/value heads, head size, sliding
            window, soft-cap, sinks, RoPE's base and width, backend); a dict of its fields is
            taken too. Cross-attention takes them without the window.
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
    attention: AttentionConfig = dataclasses.field(default_factory=AttentionConfig)
    pruned_heads: dict[str, list[list[int]]] | None = None

    def __post_init__(self):
        object.__setattr__(self, "attention",
                           AttentionConfig.build(self.attention, type(self).__name__))
        self._check()

    def __getattr__(self, name: str):
        # Only reached for a name the config lacks: an old flat attention field reads on.
        if name in FLAT_ATTENTION_KEYS and "attention" in vars(self):
            new = FLAT_ATTENTION_KEYS[name]
            warnings.warn(f"{type(self).__name__}.{name} is now .attention.{new}",
                          DeprecationWarning, stacklevel=2)
            return getattr(self.attention, new)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -------------------------------------------------------------------------- serialisation
    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict of every field (``from_dict`` inverts it)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]):
        """Build from ``to_dict()`` output, or from a config saved before ``attention`` (its
        flat keys, :data:`FLAT_ATTENTION_KEYS`, are moved into it); unknown or missing keys
        raise ``ValueError``."""
        if not isinstance(d, Mapping):
            raise TypeError(f"{cls.__name__}.from_dict expects a dict, got {type(d).__name__}")
        if isinstance(d.get("attention"), Mapping):
            d = {**d, "attention": AttentionConfig.from_dict(d["attention"], cls.__name__)}
        d = fold_attention(d)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown keys {unknown}; known keys are "
                             f"{sorted(names)}{cls._from_dict_hint()}")
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING and f.name not in d]
        if required:
            raise ValueError(f"{cls.__name__}: missing required keys {required}")
        return cls(**d)

    @classmethod
    def _from_dict_hint(cls) -> str:
        return ""

    def replace(self, **changes):
        """A copy with some fields changed (checked again); a flat attention keyword
        (``sliding_window=8``) changes that option of ``attention``."""
        return dataclasses.replace(self, **changes)

    # ---------------------------------------------------------------------------- derived
    @property
    def head_size(self) -> int:
        """Per-head size ``d`` in use: ``attention.head_dim`` or ``d_model // num_heads``."""
        return self.attention.head_size(self.d_model, self.num_heads)

    @property
    def kv_heads(self) -> int:
        """Key/value heads ``g`` of an unpruned layer (``num_heads`` unless grouped-query
        attention)."""
        return self.attention.kv_heads(self.num_heads)

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
        from headwise.models.pruned import check_pruned
        object.__setattr__(self, "pruned_heads", check_pruned(
            self.pruned_heads, self.attention_kinds(), self.num_heads, self.kv_heads, name))

    def _check_heads(self, name: str) -> None:
        self.attention.check_heads(self.d_model, self.num_heads, name, "d_model")
        if self.attention.rotary_dim is not None and not self._rotary():
            raise ValueError(f"{name}: rotary_dim={self.attention.rotary_dim} needs "
                             f"positional='rope', got positional="
                             f"{getattr(self, 'positional', None)!r}")

    def _rotary(self) -> bool:
        """Are this model's positions rotary (RoPE, in the attention)? Not in this family."""
        return False

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
    """The fields the LM and the encoder-decoder share beyond the base (norm placement,
    positions, embedding options, biases, and the Llama-era choices: norm, ffn, RoPE; the
    attention's own are in ``attention``)."""

    _BOOLS: ClassVar[tuple[str, ...]] = ("norm_first", "tie_embeddings", "scale_embeddings",
                                         "bias")

    norm_first: bool = True
    positional: str = "sinusoidal"
    tie_embeddings: bool = False
    scale_embeddings: bool = False
    bias: bool = True
    norm: str = "layer"
    ffn: str = "mlp"

    @property
    def rotary_size(self) -> int:
        """How many features of each head RoPE rotates (``rotary_dim`` or the whole head)."""
        return self.attention.rotary_dim or self.head_size

    def _rotary(self) -> bool:
        return self.positional == "rope"

    def _check(self) -> None:
        super()._check()
        name = type(self).__name__
        for field, choices in (("positional", _POSITIONALS), ("norm", _NORMS), ("ffn", _FFNS)):
            if getattr(self, field) not in choices:
                raise ValueError(f"{name}: {field} must be one of {choices}, got "
                                 f"{getattr(self, field)!r}")


@dataclass(frozen=True)
class LMConfig(_StackConfig):
    """A decoder-only language model (the Trax ``TransformerLM``, GPT).

    Args:
        vocab_size: number of token ids (the one positional argument; the rest are keywords).
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
            with ``attention.rope_theta`` and ``attention.rotary_dim``.
        The other fields (``attention`` among them: grouped-query heads, head size, sliding
        window, soft-cap, sinks, RoPE's base and width) are those of :class:`ModelConfig`.
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
        The other fields are as in :class:`LMConfig` (``attention`` applies to
        self-attention; cross-attention takes it without the window and without RoPE: its keys
        have no positions of their own).
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
