"""A model's attention modules per kind, and the two head-addressing forms every head tool
shares: a head selection ``{kind: {layer: [heads]}}`` and a model-level ``head_mask``.

Kinds: :data:`headwise.kinds.KINDS` (the names of ``return_weights``). Heads are query heads; a
layer's head count is read from its module, so layers may differ. A transformers model's layers
come from the finder :mod:`headwise.hf` registers (:mod:`headwise.finders`): this module never
imports the hf wing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from headwise import finders
from headwise import heads as heads_rule
from headwise.layers import MultiHeadAttention

__all__ = ["attention_layers", "check_heads", "head_count", "head_counts", "layer_head_masks"]

Heads = dict[str, dict[int, list[int]]]  # kind -> layer -> sorted query heads


def attention_layers(model: nn.Module) -> dict[str, list[MultiHeadAttention]]:
    """``{kind: [MultiHeadAttention per layer]}`` of a headwise model (:class:`TransformerLM`,
    :class:`Transformer`, :class:`Encoder`, :class:`Decoder`, :class:`BertModel`: each says
    where its attentions are in its own ``attention_layers`` method), or ``{"layers": [...]}``:
    the attention layers of a transformers model, numbered as :mod:`headwise.hf` numbers them
    (they report to headwise only while it runs ``attn_implementation="headwise"``: a model on
    another implementation is a ValueError, as its heads would be silently out of sight)."""
    layers = getattr(model, "attention_layers", None)
    found = finders.layers(model, "headwise's head tools")  # another library's model
    if found is not None:
        return {"layers": found}
    if not isinstance(model, nn.Module) or not callable(layers):
        raise TypeError(f"expected a headwise model (TransformerLM, Transformer, Encoder, "
                        f"Decoder or BertModel), got {type(model).__name__}; load a checkpoint "
                        "with headwise.checkpoint.load or build one with headwise.models.build")
    return layers()


def head_count(module: nn.Module) -> int:
    """The query heads of one attention module (a headwise one, or one a registered finder
    owns: a transformers one)."""
    if isinstance(module, MultiHeadAttention):
        return module.num_heads
    return finders.head_count(module)


def check_heads(heads, layers: Mapping[str, Sequence[nn.Module]], where: str,
                once: bool = False) -> Heads:
    """:func:`headwise.heads.check_heads` of a selection for the attention modules ``layers``
    (:func:`attention_layers`): ``{kind: {layer: sorted heads}}``."""
    counts = {kind: [head_count(m) for m in mods] for kind, mods in layers.items()}
    return heads_rule.check_heads(heads, counts, where, once)


def layer_head_masks(head_mask, layers: Mapping[str, Sequence[int]], batch: int,
                     where: str) -> dict[str, list[torch.Tensor | None]]:
    """A model-level ``head_mask`` as one mask (or None) per kind and layer.

    ``head_mask``: None; ``{kind: mask}`` with ``mask`` a ``(layers, h)`` or
    ``(layers, b, h)`` tensor, or a list of per-layer ``(h,)`` / ``(b, h)`` tensors or None
    (layers with different head counts); a bare mask for a model with one kind. Kinds left out
    are not masked. ``layers``: kind -> query heads per layer (:func:`head_counts`)."""
    counts = {kind: list(n) for kind, n in layers.items()}
    out = {kind: [None] * len(n) for kind, n in counts.items()}
    if head_mask is None:
        return out
    if not isinstance(head_mask, Mapping):
        if len(counts) != 1:
            raise TypeError(f"{where}: head_mask must be a dict {{kind: (layers, h) tensor}} "
                            f"for a model with several attention kinds ({sorted(counts)}), got "
                            f"{type(head_mask).__name__}")
        head_mask = {next(iter(counts)): head_mask}
    for kind, mask in head_mask.items():
        if kind not in counts:
            raise ValueError(f"{where}: head_mask has unknown kind {kind!r}; this model has "
                             f"{sorted(counts)}")
        heads = counts[kind]
        rows = list(mask) if isinstance(mask, (torch.Tensor, Sequence)) else None
        if rows is None or len(rows) != len(heads):
            h = heads[0] if len(set(heads)) == 1 else "h"
            raise ValueError(f"{where}: head_mask[{kind!r}] must be (layers, h)=({len(heads)}, "
                             f"{h}) or (layers, b, h)=({len(heads)}, {batch}, {h}), or a list of "
                             f"{len(heads)} per-layer masks, got {_describe(mask)}")
        for layer, (row, h) in enumerate(zip(rows, heads, strict=True)):
            if row is not None and (not isinstance(row, torch.Tensor)
                                    or tuple(row.shape) not in ((h,), (batch, h))):
                raise ValueError(f"{where}: head_mask[{kind!r}][{layer}] must be (h,)=({h},) "
                                 f"or (b, h)=({batch}, {h}), got {_describe(row)}")
            out[kind][layer] = row
    return out


def _describe(x) -> str:
    return f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def head_counts(model: nn.Module) -> dict[str, list[int]]:
    """``{kind: [query heads per layer]}``."""
    return {kind: [head_count(m) for m in mods] for kind, mods in attention_layers(model).items()}
