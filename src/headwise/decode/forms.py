"""The one table of one-row forms: each module class a decoder holds -> the form the cached
decoding step runs in its place.

Axis legend: ``b`` rows, ``m`` model dim.

Why a table. The module tree is written for inspection (named steps, shape checks, trace hooks,
``(b, n, m)`` tensors); a step after the prompt feeds one token per row, where that bookkeeping
costs more than the arithmetic. Each component therefore has a second form over rows ``(b, m)``
with the same parameters and the same arithmetic, and this table says which, as Hugging Face's
``ALL_ATTENTION_FUNCTIONS`` maps a name to its attention function. The lookup is by exact class:
a subclass may change its forward, so it gets no form until one is registered for it, and a
decoder holding a module without one is refused, naming the class (:func:`form_of`,
:func:`missing`; :func:`headwise.decode.step.usable` then sends ``generate`` through the
modules).

A form constructor takes the module and the step's choices, keyword-only: ``transpose`` (copy
the weights as ``W^T``), ``fuse`` (join the products that read one input), ``cache`` (a block's
:class:`~headwise.cache.LayerCache`) and ``cross`` (the attention is cross-attention); each uses
those it needs. ``tests/decode/test_forms.py`` checks every form against its module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from torch import nn

from headwise.decode.attention import AttentionRow
from headwise.decode.block import BlockRow
from headwise.decode.embedding import embedding_row
from headwise.decode.feedforward import feedforward_row, gated_row
from headwise.decode.norms import RMSRow, layer_norm_row
from headwise.fast import rows as _rows
from headwise.fast.int4 import Int4Linear
from headwise.layers import MultiHeadAttention
from headwise.models.blocks import DecoderBlock
from headwise.models.embedding import Embeddings
from headwise.models.feedforward import FeedForward, GatedFeedForward
from headwise.models.norms import LayerNorm, RMSNorm

__all__ = ["FORMS", "SUBLAYERS", "form_of", "missing", "parts", "refuse"]

#: A block's sublayers, in the order its form is built (cross-attention's are None in an LM).
SUBLAYERS = ("self_attn", "attn_norm", "cross_attn", "cross_norm", "ff", "ff_norm")


def _block(block, *, transpose: bool, fuse: bool, cache, cross: bool = False) -> BlockRow:
    """A :class:`BlockRow`: the block's sublayers' forms, in its residual order."""
    sub = {name: (None if getattr(block, name, None) is None else
                  form_of(getattr(block, name), transpose=transpose, fuse=fuse,
                          cross=name == "cross_attn"))
           for name in SUBLAYERS}
    return BlockRow(pre=block.norm_first, cache=cache, **sub)


def _attention(attn, *, transpose: bool, fuse: bool, cache=None,
               cross: bool = False) -> AttentionRow:
    return AttentionRow(attn, transpose=transpose, fuse=fuse, cross=cross)


def _plain(form):
    """A form built from the module alone (embeddings, norms)."""
    def build(norm, *, transpose: bool = False, fuse: bool = False, cache=None,
              cross: bool = False):
        return form(norm)
    return build


def _ff(form):
    """A feed-forward's form, which takes the layout choices."""
    def build(ff, *, transpose: bool, fuse: bool, cache=None, cross: bool = False):
        return form(ff, transpose=transpose, fuse=fuse)
    return build


def _linear(layer, *, transpose: bool = False, fuse: bool = False, cache=None,
            cross: bool = False) -> _rows.Weight:
    """The :data:`~headwise.fast.rows.Weight` the step multiplies (the vocabulary head)."""
    return _rows.of_linear(layer, transpose)


#: module class -> its one-row form's constructor (exact class; see the module docstring)
FORMS: dict[type[nn.Module], Callable] = {
    Embeddings: _plain(embedding_row),
    DecoderBlock: _block,
    MultiHeadAttention: _attention,
    LayerNorm: _plain(layer_norm_row),
    RMSNorm: _plain(RMSRow),
    FeedForward: _ff(feedforward_row),
    GatedFeedForward: _ff(gated_row),
    nn.Linear: _linear,
    Int4Linear: _linear,
}


def form_of(module: nn.Module, *, transpose: bool = False, fuse: bool = False, cache=None,
            cross: bool = False):
    """``module``'s one-row form (:data:`FORMS`); TypeError naming its class where it has
    none."""
    build = FORMS.get(type(module))
    if build is None:
        raise TypeError(_refusal([("", type(module))]))
    return build(module, transpose=transpose, fuse=fuse, cache=cache, cross=cross)


def parts(decoder: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``(name, module)`` of every module the step replaces by its form: the embeddings, each
    block and its sublayers, the final norm (an ``nn.Identity`` after post-norm blocks: none)
    and the vocabulary head."""
    yield "embed", decoder.embed
    for i, block in enumerate(decoder.blocks):
        yield f"blocks.{i}", block
        for name in SUBLAYERS:
            if (sub := getattr(block, name, None)) is not None:
                yield f"blocks.{i}.{name}", sub
    if not isinstance(decoder.final_norm, nn.Identity):
        yield "final_norm", decoder.final_norm
    yield "lm_head", decoder.lm_head


def missing(decoder: nn.Module) -> list[tuple[str, type]]:
    """``(name, class)`` of each module of ``decoder`` the step would replace but has no form
    for (empty: the step can run it)."""
    return [(name, type(m)) for name, m in parts(decoder) if type(m) not in FORMS]


def refuse(decoder: nn.Module) -> None:
    """TypeError naming every module class of ``decoder`` without a one-row form, if any."""
    if gaps := missing(decoder):
        raise TypeError(_refusal(gaps))


def _refusal(gaps) -> str:
    named = ", ".join(f"{name} ({cls.__module__}.{cls.__qualname__})" if name else
                      f"{cls.__module__}.{cls.__qualname__}" for name, cls in gaps)
    known = ", ".join(sorted(cls.__name__ for cls in FORMS))
    return (f"DecodeStep: no one-row form for {named}; the step decodes the module classes of "
            f"headwise.decode.forms.FORMS ({known}). Register a form for it there, or decode "
            "through the modules (headwise.generate does so for such a model)")
