"""Where the heads are created: splitting the model dim into ``h`` heads and merging back.

``split_heads``: ``(b, n, h*d) -> (b, h, n, d)`` — pure reshaping, no parameters. One projection
of width ``h*d`` followed by this split *is* ``h`` independent projections of width ``d``:
column block ``k`` of the big weight is head ``k``'s projection (:mod:`headwise.per_head` makes
that literal). This module holds only the patterns: it imports no model code, so every layer
may import it.

Grouped-query attention (``g < h``): query head ``x`` reads key/value head ``x // (h / g)``
(:func:`expand_kv`); :func:`layer_plan` is the one rule of which heads a layer keeps when some
are pruned (headwise's models, :mod:`headwise.models.pruned`, and transformers models,
:mod:`headwise.hf.prune`), and :func:`check_heads` the one reading of a head selection
``{kind: {layer: [heads]}}`` that every head tool takes (ablate, patch, record, prune; kind
``"layers"`` on transformers models).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from einops import repeat

__all__ = ["split_heads", "merge_heads", "expand_kv", "layer_plan", "check_heads", "split", "merge",
           "SPLIT", "MERGE", "EXPAND_KV"]

SPLIT = "b n (h d) -> b h n d"
MERGE = "b h n d -> b n (h d)"
EXPAND_KV = "b g j d -> b (g r) j d"


def split(x: torch.Tensor, h: int) -> torch.Tensor:
    """:data:`SPLIT` unchecked, as two views (what ``rearrange(x, SPLIT, h=h)`` returns, without
    its pattern handling per call: the module path splits three times per forward,
    and a GPU forward is launch-bound below a few thousand tokens)."""
    return x.view(*x.shape[:-1], h, x.shape[-1] // h).transpose(1, 2)


def merge(x: torch.Tensor) -> torch.Tensor:
    """:data:`MERGE` unchecked: ``(b, h, n, d) -> (b, n, h*d)``, as :func:`split`."""
    return x.transpose(1, 2).flatten(2)


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``x: (b, n, h*d) -> (b, h, n, d)``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"split_heads expects a torch.Tensor (b, n, h*d), got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"split_heads expects (b, n, h*d), got shape {tuple(x.shape)}")
    if not isinstance(num_heads, int) or isinstance(num_heads, bool):
        raise TypeError(f"split_heads: num_heads must be an int, got {num_heads!r}")
    if num_heads < 1:
        raise ValueError(f"split_heads: num_heads must be >= 1, got {num_heads}")
    if x.shape[-1] % num_heads:
        raise ValueError(f"split_heads: last dim {x.shape[-1]} is not divisible by "
                         f"num_heads={num_heads}")
    return split(x, num_heads)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``x: (b, h, n, d) -> (b, n, h*d)``, the inverse of :func:`split_heads`."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"merge_heads expects a torch.Tensor (b, h, n, d), got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"merge_heads expects (b, h, n, d), got shape {tuple(x.shape)}")
    return merge(x)


def expand_kv(x: torch.Tensor, h: int) -> torch.Tensor:
    """``x: (b, g, j, d) -> (b, h, j, d)``: grouped-query attention's sharing made explicit, each
    key/value head serving ``h // g`` query heads. Unchecked: the attention backends call it
    after :func:`headwise.attend.attention` checked ``h % g == 0`` at its boundary."""
    g = x.shape[1]
    return x if g == h else repeat(x, EXPAND_KV, r=h // g)


def layer_plan(h: int, g: int, removed: Iterable[int],
               where: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(kept query heads, kept key/value heads)`` of an attention with ``h`` query heads in
    ``g`` groups once the query heads ``removed`` are gone; refuses an empty layer and unequal
    groups with what remains and how to fix it."""
    removed = set(removed)
    kept = tuple(x for x in range(h) if x not in removed)
    if not kept:
        raise ValueError(f"{where}: pruning heads {sorted(removed)} would remove all {h} heads "
                         f"of the layer (none would remain); keep at least one head, or drop "
                         f"the layer itself instead of pruning its heads")
    r = h // g  # query heads per key/value head
    members = {group: [x for x in kept if x // r == group] for group in range(g)}
    groups = tuple(group for group in range(g) if members[group])
    sizes = {len(members[group]) for group in groups}
    if len(sizes) > 1:
        left = ", ".join(f"group {group} (heads {group * r}-{group * r + r - 1}): "
                         f"{members[group]}" for group in range(g))
        raise ValueError(
            f"{where}: {h} query heads share {g} key/value heads in groups of {r}; removing "
            f"heads {sorted(removed)} leaves {left}, but every key/value head must serve the "
            f"same number of query heads; remove whole groups (all heads of a group) or the same "
            f"number of heads from every surviving group")
    return kept, groups


def check_heads(heads, counts: Mapping[str, Sequence[int]], where: str,
                once: bool = False) -> dict[str, dict[int, list[int]]]:
    """A head selection ``{kind: {layer: heads}}`` as ``{kind: {layer: sorted heads}}``.

    ``heads``: per layer a head index, a list of them, or True (every head); negative layer and
    head indices count from the end. ``counts``: kind -> query heads per layer of the model.
    A kind, layer or head that does not exist is a ValueError, another form a TypeError.
    ``once``: a layer or head named twice (``[1, -3]`` of 4 heads) is a ValueError (pruning,
    where it is likely a mistake); else the names are merged (ablation, patching).

    ``"layers"`` names the one kind of a model that has one (a language model's
    ``decoder_self``), so ``{"layers": {1: [0]}}`` addresses the same heads of headwise's models
    and of a transformers model."""
    if isinstance(heads, Mapping) and "layers" in heads and len(counts) == 1 \
            and not set(heads) & set(counts):
        heads = {next(iter(counts)) if k == "layers" else k: v for k, v in heads.items()}
    if not isinstance(heads, Mapping):
        example = "{'layers': {1: [0, 2]}}" if set(counts) == {"layers"} else "{'cross': {1: [0, 2]}}"
        raise TypeError(f"{where}: heads must be a dict {{kind: {{layer: [heads]}}}} such as "
                        f"{example}, got {type(heads).__name__}")
    out: dict[str, dict[int, list[int]]] = {}
    for kind, per_layer in heads.items():
        if kind not in counts:
            raise ValueError(f"{where}: unknown attention kind {kind!r}; this model has "
                             f"{sorted(counts)}")
        if not isinstance(per_layer, Mapping):
            raise TypeError(f"{where}: heads[{kind!r}] must be a dict {{layer: [heads]}}, got "
                            f"{type(per_layer).__name__}")
        name = "layer" if kind == "layers" else f"{kind} layer"
        for layer, chosen in per_layer.items():
            index = _index(layer, len(counts[kind]), name, where)
            if once and index in out.get(kind, {}):
                raise ValueError(f"{where}: {name} {layer!r} names {name} {index} twice; name "
                                 f"each layer once")
            h = counts[kind][index]
            if chosen is True:
                chosen = range(h)
            elif isinstance(chosen, int) and not isinstance(chosen, bool):
                chosen = [chosen]
            elif not isinstance(chosen, Iterable) or isinstance(chosen, (str, bytes)):
                raise TypeError(f"{where}: heads[{kind!r}][{layer!r}] must be a head index, a "
                                f"list of them or True (all), got {chosen!r}")
            picked = [_index(x, h, "head", where, f" of {name} {index}") for x in chosen]
            if once and len(set(picked)) < len(picked):
                raise ValueError(f"{where}: {name} {index} names a head twice ({list(chosen)!r} "
                                 f"is heads {picked} of {h}); name each head once")
            out.setdefault(kind, {})[index] = sorted(set(picked) | set(out.get(kind, {})
                                                                   .get(index, [])))
    return out


def _index(value, size: int, what: str, where: str, of: str = "") -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not -size <= value < size:
        raise ValueError(f"{where}: {what} {value!r}{of} does not exist (there are {size}: "
                         f"0..{size - 1}, or negative from the end)")
    return value % size
