"""The boundary of :func:`headwise.long.profile`: every input checked before any work, each
mistake one line naming what was expected, what was got and the fix.

Axis legend: ``b`` batch, ``n`` tokens, ``h`` query heads, ``g`` key/value heads.
"""

from __future__ import annotations

import math
import numbers

import torch

from headwise import finders
from headwise.layers import MultiHeadAttention
from headwise.long import reductions as _red
from headwise.long.tiles import Call

__all__ = ["attention_layers", "context", "counts", "default_block", "plan"]

WHERE = "headwise.long.profile"


def attention_layers(model) -> list:
    """``model``'s attention layers in order: a transformers model's (on headwise attention,
    else the finder's ValueError saying how), or every headwise MultiHeadAttention."""
    found = finders.layers(model, WHERE)
    if found is None:
        found = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if not found:
        raise ValueError(f"{WHERE}: {type(model).__name__} has no attention layer headwise "
                         "can observe; pass a headwise model or a transformers model")
    return found


def context(model) -> int | None:
    """The most tokens ``model`` reads (None where it names no limit)."""
    config = getattr(model, "config", None)
    for name in ("max_len", "max_position_embeddings"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def counts(module) -> tuple[int, int]:
    """``(h, g)``: query heads and key/value heads of one attention layer."""
    if isinstance(module, MultiHeadAttention):
        return module.num_heads, module.num_kv_heads
    from headwise.hf.model import head_count, kv_head_count

    return head_count(module), kv_head_count(module)


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _selection(value, n: int, what: str) -> list[int]:
    """A selection of layers or heads (None: all) as a sorted list of indices."""
    if value is None:
        return list(range(n))
    picked = [value] if _is_int(value) else list(value)
    if not picked:
        raise ValueError(f"{WHERE}: empty selection of {what}; select at least one of 0..{n - 1}"
                         f" (or None for all {n})")
    bad = [x for x in picked if not _is_int(x) or not -n <= x < n]
    if bad:
        raise ValueError(f"{WHERE}: {what} {bad[0]!r} out of range for {n} {what} (use 0.."
                         f"{n - 1} or negative from the end)")
    return sorted({int(x) % n for x in picked})


def _check_ids(ids, model) -> int:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point() \
            or ids.dtype == torch.bool:
        got = (f"{str(ids.dtype).removeprefix('torch.')} of shape {tuple(ids.shape)}"
               if isinstance(ids, torch.Tensor) else type(ids).__name__)
        raise ValueError(f"{WHERE}: ids must be a (b, n) integer tensor of token ids, got {got};"
                         " pass tokenizer ids, e.g. torch.tensor([ids])")
    n, limit = ids.shape[1], context(model)
    if n == 0:
        raise ValueError(f"{WHERE}: the document has no tokens; pass at least one")
    if limit is not None and n > limit:
        raise ValueError(f"{WHERE}: the document has {n:,} tokens but "
                         f"{type(model).__name__}'s context is {limit:,}; cut it to at most "
                         f"{limit:,} tokens (e.g. --tokens {limit})")
    return n


def _check_ints(n: int, block, sinks, window, far, top_k) -> None:
    for name, value, low in (("sinks", sinks, 0), ("window", window, 1), ("far", far, 0),
                             ("top_k", top_k, 1)):
        if not _is_int(value) or value < low:
            raise ValueError(f"{WHERE}: {name} must be an int >= {low}, got {value!r}")
    if not _is_int(block) or not 1 <= block <= n:
        raise ValueError(f"{WHERE}: block size {block!r} does not fit a {n:,}-token document; "
                         f"use an int from 1 to {n:,} (or None for {default_block(n)})")


def default_block(n: int) -> int:
    """Tokens per block for ``n`` tokens: ``max(64, ceil(n / 128))`` (at most 128 blocks a
    side), never more than ``n``."""
    return max(1, min(n, max(64, math.ceil(n / 128))))


def plan(model, ids, block, sinks, window, far, top_k, layers, heads, reductions) -> dict:
    """What the pass will do, every input checked (no forward has run yet)."""
    n = _check_ids(ids, model)
    block = default_block(n) if block is None else block
    _check_ints(n, block, sinks, window, far, top_k)
    modules = attention_layers(model)
    h, g = counts(modules[0])
    picked_layers = _selection(layers, len(modules), "layers")
    picked_heads = _selection(heads, h, "heads")
    reductions = list(reductions)
    names = [getattr(r, "name", None) for r in reductions]
    taken = {"maps", "received", "topk", "distance", "row_masses"}
    clash = next((x for x in names if x in taken or names.count(x) > 1), None)
    if clash is not None:
        raise ValueError(f"{WHERE}: reduction name {clash!r} is taken (built-ins: "
                         f"{sorted(taken)}, or twice among yours); give it another name")
    small = Call(1, len(picked_heads), 3 * 4 + 1, 3 * 4 + 1, 4, min(sinks, 2), min(window, 3),
                 torch.float64, torch.device("cpu"), min(far, 5))
    for r in reductions:
        _red.check_reduction(r, small)
    return {"index": {id(m): x for x, m in enumerate(modules)}, "layers": picked_layers,
            "heads": picked_heads, "h": h, "g": g, "block": block, "sinks": sinks,
            "window": window, "far": far, "top_k": top_k, "reductions": reductions}
