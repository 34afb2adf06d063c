"""``hw.head_view(model, inputs)``: the interactive head view of one run of a headwise language
model or a transformers decoder, taken the same way from either (every layer's pattern through
:func:`headwise.run_with_cache`, from the fused kernel's log-sum-exp).

Axis legend: ``b`` batch, ``h`` query heads, ``i`` query position, ``j`` key position.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from headwise.lens.run import run_with_cache
from headwise.lens.sites import layers_of

__all__ = ["head_view"]


def head_view(model, inputs, path=None, *, tokens=None, **options):
    """The head view (:func:`headwise.viz.head_view`) of ``model`` on ``inputs``; written to
    ``path`` when given.

    Args:
        model: a headwise ``TransformerLM`` or a transformers decoder on headwise attention.
        inputs: token ids ``(b, i)`` or a batch dict (``attention_mask``: each example's
            tokens end at its last real one; pad on the right).
        tokens: a tokenizer (each id decoded alone), a list of token strings per example (or
            one list), or None (the ids themselves).
        options: :func:`headwise.viz.head_view`'s (``title``, ``importance``, ``layer``, ...);
            grouped-query heads are shown under their key/value heads.
    """
    from headwise.viz import head_view as view

    layers = layers_of(model, "head_view")
    _, cache = run_with_cache(model, inputs, names="pattern", stop_at_layer=len(layers))
    ids = inputs["input_ids"] if isinstance(inputs, Mapping) else inputs
    lengths = (inputs["attention_mask"].sum(-1).tolist() if isinstance(inputs, Mapping)
               and "attention_mask" in inputs else [ids.shape[1]] * ids.shape[0])
    names = _tokens(tokens, ids, lengths)
    g, h = layers[0].kv_heads, layers[0].heads
    options.setdefault("title", type(model).__name__)
    return view({"decoder_self": [cache["pattern", l] for l in range(len(layers))]}, names,
                path, kv_heads=g if g < h else None, **options)


def _tokens(tokens, ids: torch.Tensor, lengths: Sequence[int]) -> list[list[str]]:
    rows = [row[:n] for row, n in zip(ids.tolist(), lengths, strict=True)]
    if tokens is None:
        return [[str(i) for i in row] for row in rows]
    if hasattr(tokens, "decode"):
        return [[tokens.decode([i]) for i in row] for row in rows]
    if tokens and all(isinstance(t, str) for t in tokens):
        return [list(tokens)]
    return [list(t) for t in tokens]
