"""The pruned structure of a model: which query and key/value heads each attention layer
keeps (``config.pruned_heads``, original indices) and the cut that gives a layer that structure.

Axis legend: ``h`` query heads, ``g`` key/value heads, ``d`` head dim, ``m`` model dim.

A model built from a config with pruned heads calls :func:`restructure` at the end of its
``__init__``, so a checkpoint of a pruned model rebuilds the same structure; :func:`cut` is what
:func:`headwise.prune_heads` (:mod:`headwise.analysis.prune`) applies to a live model. Head
``x`` owns rows ``x*d:(x+1)*d`` of ``q_proj`` and the same columns of ``out_proj`` (see
:func:`headwise.per_head.unfuse`); grouped-query attention (``g < h``): query head ``x`` reads
key/value head ``x // (h / g)``, and every surviving key/value head must still serve the same
number of query heads (:func:`layer_plan` says why a selection is refused).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from headwise.errors import CheckpointError
from headwise.heads import layer_plan
from headwise.kinds import per_kind
from headwise.models.heads import attention_layers

__all__ = ["Plan", "check_pruned", "check_structure", "config_plans", "cut", "layer_plan",
           "restructure"]

Plan = tuple[tuple[int, ...], tuple[int, ...]]  # (kept query heads, kept key/value heads)
# layer_plan (the grouped-query rule of what a layer keeps) lives in headwise.heads, where
# headwise.hf.prune reads it too


def check_pruned(pruned, kinds: Mapping[str, int], h: int, g: int, where: str):
    """Normalise a config's ``pruned_heads`` (``{kind: [pruned heads per layer]}``, original
    indices) to sorted lists, None when nothing is pruned; every layer checked by
    :func:`layer_plan`."""
    if pruned is None:
        return None
    out = {}
    for kind, layers in per_kind(pruned, kinds, "pruned_heads",
                                 "None or a dict {kind: [pruned heads per layer]}", where):
        if not isinstance(layers, (list, tuple)) or len(layers) != kinds[kind]:
            raise ValueError(f"{where}: pruned_heads[{kind!r}] must list the pruned heads of "
                             f"each of its {kinds[kind]} layers, got {layers!r}")
        rows = []
        for layer, heads in enumerate(layers):
            if not isinstance(heads, (list, tuple)) or not all(
                    isinstance(x, int) and not isinstance(x, bool) and 0 <= x < h for x in heads):
                raise ValueError(f"{where}: pruned_heads[{kind!r}][{layer}] must be a list of "
                                 f"head indices in 0..{h - 1}, got {heads!r}")
            layer_plan(h, g, heads, f"{where}: pruned_heads[{kind!r}][{layer}]")
            rows.append(sorted(set(heads)))
        if any(rows):
            out[kind] = rows
    return out or None


def config_plans(config) -> dict[str, list[Plan]]:
    """``{kind: [(kept query heads, kept key/value heads) per layer]}`` of a config, original
    indices (unpruned layers keep everything)."""
    h, g = config.num_heads, config.kv_heads
    pruned = config.pruned_heads or {}
    return {kind: [layer_plan(h, g, pruned.get(kind, [()] * n)[layer], type(config).__name__)
                   for layer in range(n)]
            for kind, n in config.attention_kinds().items()}


def restructure(model: nn.Module) -> None:
    """Give a freshly built model the pruned structure its config records (the models call it
    at the end of ``__init__``; a config with nothing pruned changes nothing)."""
    config = model.config
    if not config.pruned_heads:
        return
    full = (tuple(range(config.num_heads)), tuple(range(config.kv_heads)))
    plans = config_plans(config)
    for kind, mods in attention_layers(model).items():
        for module, plan in zip(mods, plans[kind], strict=True):
            if plan != full:
                cut(module, full, plan)


def cut(mha: nn.Module, before: Plan, after: Plan) -> None:
    """Keep the heads of ``after`` (original indices) in ``mha``, which holds those of
    ``before``: rows of q/k/v (and their biases), columns of the output projection, sinks."""
    d = mha.head_dim
    heads = [before[0].index(x) for x in after[0]]
    groups = [before[1].index(x) for x in after[1]]
    q_rows, kv_rows = _feature_rows(heads, d), _feature_rows(groups, d)
    mha.q_proj = _linear(mha.q_proj, rows=q_rows)
    mha.k_proj = _linear(mha.k_proj, rows=kv_rows)
    mha.v_proj = _linear(mha.v_proj, rows=kv_rows)
    mha.out_proj = _linear(mha.out_proj, cols=q_rows)
    if mha.sinks is not None:
        mha.sinks = nn.Parameter(mha.sinks.detach()[heads].clone(),
                                 requires_grad=mha.sinks.requires_grad)
    mha.num_heads, mha.num_kv_heads = len(heads), len(groups)
    mha._qkv_sizes = (len(heads) * d, len(groups) * d, len(groups) * d)


def _feature_rows(heads: list[int], d: int) -> torch.Tensor:
    """Feature indices ``x*d .. x*d + d - 1`` of every head ``x``, in order."""
    return (torch.tensor(heads)[:, None] * d + torch.arange(d)).reshape(-1)


def _linear(old: nn.Linear, *, rows=None, cols=None) -> nn.Linear:
    """A new ``nn.Linear`` holding the given output ``rows`` (or input ``cols``) of ``old``."""
    w = old.weight.detach()
    bias = None if old.bias is None else old.bias.detach()
    if rows is not None:
        w = w.index_select(0, rows.to(w.device))
        bias = None if bias is None else bias.index_select(0, rows.to(w.device))
    if cols is not None:
        w = w.index_select(1, cols.to(w.device))
    new = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None, device="meta")
    new.weight = nn.Parameter(w.contiguous(), requires_grad=old.weight.requires_grad)
    if bias is not None:
        new.bias = nn.Parameter(bias.clone(), requires_grad=old.bias.requires_grad)
    return new


def check_structure(model: nn.Module, weights: Path, config_json: Path) -> None:
    """Refuse a weights file whose attention layers have other head counts than ``model``
    (a pruned checkpoint into an unpruned model, or the reverse), naming both and the fix."""
    from safetensors import safe_open

    try:
        modules = attention_layers(model)
    except TypeError:
        return  # not a model with attention kinds: the strict load reports any mismatch
    try:
        with safe_open(str(weights), framework="pt") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except Exception:  # a damaged file: the strict load reports it in its own words
        return
    names = {id(mod): name for name, mod in model.named_modules()}
    for kind, mods in modules.items():
        for layer, mha in enumerate(mods):
            got = shapes.get(f"{names[id(mha)]}.q_proj.weight")
            if (got is None or got[1] != mha.embed_dim or got[0] % mha.head_dim
                    or got[0] == mha.num_heads * mha.head_dim):
                continue  # the same heads, or another model altogether (the strict load says)
            saved = _saved_pruned(config_json)
            raise CheckpointError(
                f"{weights.parent} holds {got[0] // mha.head_dim} heads in {kind} layer {layer} "
                f"but the model has {mha.num_heads} (checkpoint pruned_heads: {saved}; model "
                f"pruned_heads: {getattr(model.config, 'pruned_heads', None)}); load it with "
                f"headwise.checkpoint.load, which builds the structure the checkpoint records, "
                f"or prune the model the same way first (headwise.prune_heads)")


def _saved_pruned(config_json: Path):
    try:
        return json.loads(config_json.read_text(encoding="utf-8"))["config"].get("pruned_heads")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "unreadable"
