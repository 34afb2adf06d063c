"""Weights only for what was asked: which layers' attention calls return weights, and which.

Outside :func:`weights`, a call returns every head's weights when the forward was given
``output_attentions=True`` and none otherwise. Inside ``with weights(model, spec) as got:``
only the selected layers compute weights (only the selected heads, query rows and keys), and
``got[layer]`` holds the last forward's ``(b, hs, is, js)``; every other layer runs the fused
kernel with no weights at all, ``output_attentions`` or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import torch
from torch import nn

from headwise.hf.model import head_count, running
from headwise.weights import Selection

__all__ = ["asked", "deliver", "weights"]

_SPEC_KEYS = {"layers", "heads", "rows", "keys"}


@dataclass(frozen=True)
class Request:
    """What one attention layer returns inside :func:`weights`: ``selection`` (None: no
    weights), stored under ``layer`` in ``found``."""

    layer: int
    selection: Selection | None
    found: dict


_REQUESTS: WeakKeyDictionary[nn.Module, Request] = WeakKeyDictionary()


def asked(module: nn.Module, output_attentions: bool) -> Selection | bool:
    """The ``return_weights`` of one call: the active selection of ``module``, else
    ``output_attentions``."""
    request = _REQUESTS.get(module)
    if request is None:
        return bool(output_attentions)
    return False if request.selection is None else request.selection


def deliver(module: nn.Module, weights: torch.Tensor | None) -> None:
    """Keep the weights a selected layer returned, for the caller of :func:`weights`."""
    request = _REQUESTS.get(module)
    if request is not None and request.selection is not None:
        request.found[request.layer] = weights


@contextmanager
def weights(model, spec=True):
    """Per-head weights of only the layers, heads, query rows and keys asked for.

    Args:
        model: a transformers model running ``attn_implementation="headwise"``.
        spec: ``True`` (every layer, everything), a :class:`~headwise.Selection` (its heads /
            rows / keys in every layer) or a dict with ``layers``, ``heads``, ``rows``, ``keys``
            (each an int, a sequence of ints or a slice; negative counts from the end; missing
            means all), e.g. ``{"layers": [5], "heads": [3], "rows": slice(-16, None)}``.

    Yields:
        a dict ``{layer: (b, hs, is, js)}``, filled by each forward inside the block (the last
        forward's weights; during ``generate`` the last step's).
    """
    layers = running(model, "headwise.hf.weights")
    picked, selection = _parse(spec, len(layers))
    found: dict[int, torch.Tensor] = {}
    for n in picked:
        _check_heads(selection, layers[n], n)
    saved = {m: _REQUESTS.get(m) for m in layers}
    for n, m in enumerate(layers):
        _REQUESTS[m] = Request(n, selection if n in picked else None, found)
    try:
        yield found
    finally:
        for m, old in saved.items():
            if old is None:
                _REQUESTS.pop(m, None)
            else:
                _REQUESTS[m] = old


def _parse(spec, n_layers: int) -> tuple[list[int], Selection]:
    if spec is True:
        return list(range(n_layers)), Selection()
    if isinstance(spec, Selection):
        return list(range(n_layers)), spec
    if not isinstance(spec, dict):
        raise TypeError("headwise.hf.weights: spec must be True, a headwise.Selection or a dict "
                        f"with layers/heads/rows/keys, got {type(spec).__name__}")
    unknown = set(spec) - _SPEC_KEYS
    if unknown:
        raise ValueError(f"headwise.hf.weights: unknown keys {sorted(unknown)}; use "
                         f"{sorted(_SPEC_KEYS)}")
    layers = _layer_indices(spec.get("layers"), n_layers)
    return layers, Selection(spec.get("heads"), spec.get("rows"), spec.get("keys"))


def _layer_indices(value, n: int) -> list[int]:
    if value is None:
        return list(range(n))
    if isinstance(value, slice):
        picked = list(range(n)[value])
    elif isinstance(value, int) and not isinstance(value, bool):
        picked = [value]
    elif isinstance(value, Sequence) and all(isinstance(x, int) for x in value):
        picked = list(value)
    else:
        raise TypeError("headwise.hf.weights: layers must be an int, a sequence of ints or a "
                        f"slice, got {value!r}")
    bad = [x for x in picked if not -n <= x < n]
    if bad or not picked:
        raise ValueError(f"headwise.hf.weights: layer {bad[0] if bad else value!r} is out of "
                         f"range: the model has {n} attention layers (use 0..{n - 1} or "
                         "negative from the end)")
    return sorted({x % n for x in picked})


def _check_heads(selection: Selection, module: nn.Module, layer: int) -> None:
    h = head_count(module)
    try:
        Selection(heads=selection.heads).resolve(h, 1, 1, "cpu")
    except (ValueError, TypeError) as e:
        raise type(e)(f"headwise.hf.weights: layer {layer} ({type(module).__name__}, {h} "
                      f"heads): {e}") from None
