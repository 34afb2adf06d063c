"""Where the heads are created: splitting the model dim into ``h`` heads and merging back.

``split_heads``: ``(b, n, h*d) -> (b, h, n, d)`` — pure reshaping, no parameters. One projection
of width ``h*d`` followed by this split *is* ``h`` independent projections of width ``d``:
column block ``k`` of the big weight is head ``k``'s projection (:mod:`headwise.per_head` makes
that literal). This module holds only the patterns: it imports no model code, so every layer
may import it.
"""

from __future__ import annotations

import torch
from einops import repeat

__all__ = ["split_heads", "merge_heads", "expand_kv", "split", "merge", "SPLIT", "MERGE",
           "EXPAND_KV"]

SPLIT = "b n (h d) -> b h n d"
MERGE = "b h n d -> b n (h d)"
EXPAND_KV = "b g j d -> b (g r) j d"


def split(x: torch.Tensor, h: int) -> torch.Tensor:
    """:data:`SPLIT` unchecked, as two views (what ``rearrange(x, SPLIT, h=h)`` returns, without
    its ~10 us of pattern handling per call: the module path splits three times per forward,
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
