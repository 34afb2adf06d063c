"""TransformerLens' hook names, and the filter that picks some of them.

Axis legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads, ``i`` query position, ``j``
key position, ``d`` head dim, ``m`` model dim.

Each layer ``l`` has these hooks, in the order a forward reaches them (shapes as
TransformerLens gives them)::

    blocks.{l}.hook_resid_pre          (b, i, m)   the block's input
    blocks.{l}.attn.hook_q             (b, i, h, d) the query projection (before rotary)
    blocks.{l}.attn.hook_k / hook_v    (b, i, g, d) the key / value projections (keys before
                                                    rotary), g = key/value heads
    blocks.{l}.attn.hook_attn_scores   (b, h, i, j) q.k * scale, masked keys -inf
    blocks.{l}.attn.hook_pattern       (b, h, i, j) the attention weights
    blocks.{l}.attn.hook_z             (b, i, h, d) each head's output, before o_proj
    blocks.{l}.attn.hook_result        (b, i, h, m) each head's share of o_proj (no bias)
    blocks.{l}.hook_attn_out           (b, i, m)   the attention's output
    blocks.{l}.hook_resid_mid          (b, i, m)   the residual between attention and MLP
    blocks.{l}.hook_mlp_out            (b, i, m)   the MLP's output
    blocks.{l}.hook_resid_post         (b, i, m)   the block's output

A short name (``"pattern"``, ``"z"``, ``"resid_post"``) stands for that hook of every layer,
as ``cache["pattern", 5]`` stands for ``blocks.5.attn.hook_pattern``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable

__all__ = ["ATTN", "BLOCK", "EDITABLE", "WEIGHTS", "all_names", "choose", "full", "layer_of",
           "parse", "short_of"]

ATTN = ("q", "k", "v", "attn_scores", "pattern", "z", "result")  # blocks.{l}.attn.hook_*
BLOCK = ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post")  # blocks.{l}.hook_*
ORDER = ("resid_pre", "q", "k", "v", "attn_scores", "pattern", "z", "result", "attn_out",
         "resid_mid", "mlp_out", "resid_post")
WEIGHTS = ("attn_scores", "pattern")  # the hooks that need (b, h, i, j) tensors
# what run_with_hooks may edit on the fused path (the rest: read only, see run.py)
EDITABLE = ("z", "result", "resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post")

_NAME = re.compile(r"blocks\.(-?\d+)\.(attn\.)?hook_(\w+)")


def full(short: str, layer: int) -> str:
    """``("pattern", 5)`` -> ``"blocks.5.attn.hook_pattern"``."""
    return f"blocks.{layer}.attn.hook_{short}" if short in ATTN else f"blocks.{layer}.hook_{short}"


def all_names(n_layers: int) -> list[str]:
    """Every hook name of a model of ``n_layers`` layers, in forward order."""
    return [full(s, layer) for layer in range(n_layers) for s in ORDER]


def parse(name: str) -> tuple[int, str] | None:
    """``"blocks.5.attn.hook_pattern"`` -> ``(5, "pattern")``; None for anything else."""
    got = _NAME.fullmatch(name) if isinstance(name, str) else None
    if got is None:
        return None
    layer, attn, short = int(got[1]), bool(got[2]), got[3]
    return (layer, short) if (short in ATTN) == attn and short in ORDER else None


def layer_of(name: str) -> int:
    return parse(name)[0]


def short_of(name: str) -> str:
    return parse(name)[1]


def _unknown(name, n_layers: int, where: str) -> ValueError:
    words = list(ORDER) + all_names(n_layers)
    near = difflib.get_close_matches(str(name), words, n=1, cutoff=0.6)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return ValueError(f"{where}: unknown hook name {name!r}; {hint}hooks are "
                      f"blocks.{{l}}.hook_{{{','.join(BLOCK)}}} and "
                      f"blocks.{{l}}.attn.hook_{{{','.join(ATTN)}}}, or a short name (\"pattern\")")


def _one(name, n_layers: int, where: str) -> list[str]:
    """The full names one filter entry stands for (a short name: every layer's)."""
    if isinstance(name, str) and name in ORDER:
        return [full(name, layer) for layer in range(n_layers)]
    got = parse(name)
    if got is None:
        raise _unknown(name, n_layers, where)
    layer, short = got
    if not -n_layers <= layer < n_layers:
        raise ValueError(f"{where}: {name!r} names layer {layer}, out of range: the model has "
                         f"{n_layers} layers (0..{n_layers - 1})")
    return [full(short, layer % n_layers)]


def choose(names, n_layers: int, where: str = "run_with_cache") -> list[str]:
    """The hook names a filter picks, in forward order: ``None`` (every hook), a name (full or
    short), a list of them, or a callable ``name -> bool`` over the full names. A filter that
    picks nothing is a ValueError (a cache of nothing is a mistake, not a result)."""
    every = all_names(n_layers)
    if names is None:
        return every
    if callable(names):
        picked = {n for n in every if _call(names, n, where)}
    elif isinstance(names, str):
        picked = set(_one(names, n_layers, where))
    elif isinstance(names, Iterable):
        picked = {n for name in names for n in _one(name, n_layers, where)}
    else:
        raise TypeError(f"{where}: names must be None, a hook name, a list of hook names or a "
                        f"callable name -> bool, got {type(names).__name__}")
    if not picked:
        raise ValueError(f"{where}: the names filter selects no hook of this {n_layers}-layer "
                         f"model; hook names look like 'blocks.0.attn.hook_pattern'")
    return [n for n in every if n in picked]


def _call(names: Callable, name: str, where: str) -> bool:
    got = names(name)
    if not isinstance(got, bool):
        raise TypeError(f"{where}: the names filter must return True or False, got "
                        f"{type(got).__name__} for {name!r}")
    return got
