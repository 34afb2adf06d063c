"""Remove, replace or read single heads' outputs on the fused path: zero and mean ablation, and
activation patching from a source run into a target run (TransformerLens's everyday tools), for
self- and cross-attention of every headwise model.

Axis legend: ``b`` batch, ``h`` heads, ``i`` query position, ``d`` head dim.

A head's output is its ``(b, i, d)`` slice of the attention's per-head output ``(b, h, i, d)``
before the merge, which is its ``d``-wide slice of the out-projection's input ``(b, i, h*d)``:
the fused kernel has already run, so nothing here leaves it. Each tool is an observer of
:func:`headwise.observe.heads` for the chosen layers, active only inside its ``with`` block;
generation takes the module path while an observer is active (:mod:`headwise.step`), so it sees
them too. Zeroing a head is exactly a ``head_mask`` of 0 for it (the mask multiplies first).
The tools' recorded outputs keep the layout ``(b, i, h, d)`` (one row of heads per position).

Heads are chosen as ``{kind: {layer: [heads]}}`` (``True`` for every head of a layer)::

    with hw.ablate(model, {"cross": {1: [0, 2]}}):                   # zero
        logits, _ = model(src, tgt)
    means = hw.head_means(model, batches)
    with hw.ablate(model, {"cross": {1: [0]}}, mode="mean", means=means):
        ...
    with hw.patch(model, {"decoder_self": {0: True}}, source=lambda: model(clean_tokens)):
        patched, _ = model(corrupted_tokens)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import contextmanager
from functools import partial

import torch
from einops import rearrange
from torch import nn

from headwise import observe
from headwise.analysis.run import as_batches, run_batch
from headwise.layers import MultiHeadAttention
from headwise.models.heads import attention_layers, check_heads, head_count
from headwise.train.evaluate import device_of

__all__ = ["ABLATIONS", "ablate", "head_means", "patch", "record_heads"]

ABLATIONS = ("zero", "mean")
BY_POSITION = "b h i d -> b i h d"  # the layout the tools hand out and take back
BY_HEAD = "b i h d -> b h i d"

Edit = Callable[[torch.Tensor], torch.Tensor]  # (b, h, i, d) -> (b, h, i, d)


@contextmanager
def edit_heads(edits: list[tuple[MultiHeadAttention, Edit]]):
    """Inside the block, each module's per-head outputs ``(b, h, i, d)`` pass through its edits
    (in list order) before the merge."""
    chosen: dict[int, list[Edit]] = {}
    for mha, edit in edits:
        chosen.setdefault(id(mha), []).append(edit)

    def heads(module, out):
        for edit in chosen.get(id(module), ()):
            out = edit(out)
        return out

    with observe.observing(observe.Observer(heads=heads)):
        yield


def _replace(x: torch.Tensor, *, heads: list[int], value: torch.Tensor | None) -> torch.Tensor:
    """``x (b, h, i, d)`` with the chosen heads' outputs set to ``value`` (broadcastable:
    ``(h, 1, d)``, ``(b, h, i, d)``) or 0."""
    picked = torch.zeros(x.shape[1], 1, 1, dtype=torch.bool, device=x.device)  # (h, 1, 1)
    picked[heads] = True
    fill = x.new_zeros(()) if value is None else value.to(x)
    return torch.where(picked, fill, x)


@contextmanager
def ablate(model: nn.Module, heads, *, mode: str = "zero", means=None):
    """Inside the block the chosen heads of ``model`` are removed: their outputs are zero
    (``mode="zero"``, the same as a ``head_mask`` of 0) or their mean output over reference data
    (``mode="mean"``, ``means`` from :func:`head_means`).

    Args:
        heads: ``{kind: {layer: [heads]}}``; ``True`` for every head of a layer.
        means: ``{kind: [(h, d) per layer]}`` (mean ablation only).
    """
    layers = attention_layers(model)
    chosen = check_heads(heads, layers, "ablate")
    if mode not in ABLATIONS:
        raise ValueError(f"ablate: mode must be one of {ABLATIONS}, got {mode!r}")
    if mode == "mean" and means is None:
        raise ValueError("ablate: mode='mean' needs means=headwise.head_means(model, batches) "
                         "(each head's mean output over reference data)")
    edits = []
    for kind, per_layer in chosen.items():
        for layer, picked in per_layer.items():
            value = None if mode == "zero" else _mean_of(means, kind, layer, layers)[:, None]
            edits.append((layers[kind][layer], partial(_replace, heads=picked, value=value)))
    with edit_heads(edits):
        yield


def _mean_of(means, kind: str, layer: int, layers) -> torch.Tensor:
    mha = layers[kind][layer]
    want = (head_count(mha), mha.head_dim)
    try:
        value = means[kind][layer]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"ablate: means has no entry for {kind} layer {layer}; compute it with "
                         "headwise.head_means(model, batches)") from None
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != want:
        raise ValueError(f"ablate: means[{kind!r}][{layer}] must be (h, d)={want}, got "
                         f"{tuple(getattr(value, 'shape', ()))}")
    return value


@torch.no_grad()
def head_means(model: nn.Module, batches, *, run: Callable | None = None,
               ) -> dict[str, list[torch.Tensor]]:
    """``{kind: [(h, d) per layer]}``: each head's output averaged over every query position of
    every batch (padded positions included), for ``ablate(..., mode="mean")``.

    ``run(model, batch)`` runs one batch (default: :func:`headwise.analysis.run.run_batch`)."""
    batches = as_batches(batches, "head_means", device_of(model))
    layers = attention_layers(model)
    sums = {kind: [None] * len(mods) for kind, mods in layers.items()}
    counts = {kind: [0] * len(mods) for kind, mods in layers.items()}

    def add(x, kind, layer):
        total = x.float().sum((0, 2))  # (h, d)
        sums[kind][layer] = total if sums[kind][layer] is None else sums[kind][layer] + total
        counts[kind][layer] += x.shape[0] * x.shape[2]
        return x

    edits = [(mha, partial(add, kind=kind, layer=layer))
             for kind, mods in layers.items() for layer, mha in enumerate(mods)]
    with edit_heads(edits):
        for batch in batches:
            (run or run_batch)(model, batch)
    return {kind: [None if s is None else s / max(counts[kind][l], 1)
                   for l, s in enumerate(per_layer)] for kind, per_layer in sums.items()}


def record_heads(model: nn.Module, source: Callable[[], object], heads=None,
                 ) -> dict[str, dict[int, torch.Tensor]]:
    """Call ``source()`` (a run of ``model``) and return ``{kind: {layer: (b, i, h, d)}}``, the
    per-head outputs of the layers in ``heads`` (default every layer), detached; a layer run
    twice keeps its last call."""
    layers = attention_layers(model)
    chosen = (check_heads(heads, layers, "record_heads") if heads is not None
              else {kind: dict.fromkeys(range(len(mods))) for kind, mods in layers.items()})
    found: dict[str, dict[int, torch.Tensor]] = {kind: {} for kind in chosen}

    def keep(x, kind, layer):
        found[kind][layer] = rearrange(x.detach(), BY_POSITION)
        return x

    edits = [(layers[kind][layer], partial(keep, kind=kind, layer=layer))
             for kind, per_layer in chosen.items() for layer in per_layer]
    with edit_heads(edits):
        source()
    return found


@contextmanager
def patch(model: nn.Module, heads, source):
    """Inside the block the chosen heads output what they output in the source run (activation
    patching); every other head computes as usual.

    Args:
        heads: ``{kind: {layer: [heads]}}``; ``True`` for every head of a layer.
        source: a callable running ``model`` on the source input (called once, on entry), or
            what :func:`record_heads` returned for it. The target run must have the source's
            batch size and query positions at every patched layer.
    """
    layers = attention_layers(model)
    chosen = check_heads(heads, layers, "patch")
    recorded = record_heads(model, source, chosen) if callable(source) else source
    if not isinstance(recorded, Mapping):
        raise TypeError(f"patch: source must be a callable running the model or the result of "
                        f"headwise.record_heads, got {type(source).__name__}")
    edits = []
    for kind, per_layer in chosen.items():
        for layer, picked in per_layer.items():
            value = recorded.get(kind, {}).get(layer)
            if value is None:
                raise ValueError(f"patch: the source run recorded nothing for {kind} layer "
                                 f"{layer}; does the source run call it?")
            edits.append((layers[kind][layer],
                          partial(_patched, heads=picked, value=value, where=(kind, layer))))
    with edit_heads(edits):
        yield


def _patched(x, *, heads, value, where):
    """``x (b, h, i, d)`` with the chosen heads taken from the recorded ``value (b, i, h, d)``."""
    ours = rearrange(x, BY_POSITION)
    if value.shape != ours.shape:
        kind, layer = where
        raise ValueError(f"patch: {kind} layer {layer} has outputs (b, i, h, d)="
                         f"{tuple(ours.shape)} in this run but {tuple(value.shape)} in the "
                         "source run; patch between inputs of the same batch size and length")
    return _replace(x, heads=heads, value=rearrange(value, BY_HEAD))
