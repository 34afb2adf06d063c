"""Which weights: the :class:`Selection` of heads, query rows and keys, its resolution to
slices or index tensors, and the blocks of rows the chunked passes walk.

Axis legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads, ``i`` query position,
``j`` key position, ``d`` head dim.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

__all__ = ["Selection", "as_selection", "chunk_rows", "kv_heads", "positions", "row_chunks",
           "sub_rows", "take", "BLOCK_ELEMENTS", "CHUNK_ELEMENTS"]

# Elements of one chunk of scores in the chunked LSE pass and the statistics (b x heads x rows x
# keys): 4M floats = 16 MiB in float32.
CHUNK_ELEMENTS = 1 << 22
# Weights are recomputed from the LSE in blocks of at most this many (4M floats = 16 MiB,
# within this CPU's 32 MiB L3). Smaller blocks mean more, smaller ops: with 2 threads on a
# shared 2-core machine each op's thread barrier costs more than the cache saves (1 MiB blocks
# measured 8x slower at n=1024 under load; 16 MiB blocks 3x; 1 thread: 1.3x the fused core).
BLOCK_ELEMENTS = 1 << 22

Index = int | Sequence[int] | slice | torch.Tensor | None


@dataclass(frozen=True)
class Selection:
    """Which weights to return: ``heads`` (query heads), ``rows`` (query positions) and
    ``keys`` (key positions); each ``None`` (all), an int, a sequence of ints or a slice
    (negative values count from the end), or a 1-D integer tensor; anything else (a bool mask,
    floats, a string) is a TypeError. The result has shape
    ``(b, len(heads), len(rows), len(keys))``; an int keeps its axis, of length 1.

    ``hw.attention(q, k, v, return_weights=hw.Selection(heads=[3]))`` returns only head 3's
    weights, ``Selection(rows=slice(-16, None))`` the last 16 query rows of every head.
    """

    heads: Index = None
    rows: Index = None
    keys: Index = None

    def __post_init__(self):
        for name in ("heads", "rows", "keys"):
            _check_index(getattr(self, name), name)

    @property
    def everything(self) -> bool:
        """True when every head, row and key is selected by default (``return_weights=True``)."""
        return self.heads is None and self.rows is None and self.keys is None

    def resolve(self, h: int, i: int, j: int, device) -> tuple:
        """``(heads, rows, keys)`` as slices (when contiguous) or index tensors; ValueError for
        an index out of range or an empty selection."""
        return tuple(_axis(v, n, name, device) for v, n, name in
                     ((self.heads, h, "heads"), (self.rows, i, "rows"), (self.keys, j, "keys")))


def as_selection(return_weights) -> Selection | None:
    """``return_weights`` (False/None, True, a :class:`Selection` or a dict with keys ``heads``,
    ``rows``, ``keys``) to a Selection, or None when no weights are wanted."""
    if return_weights is None or return_weights is False:
        return None
    if return_weights is True:
        return Selection()
    if isinstance(return_weights, Selection):
        return return_weights
    if isinstance(return_weights, dict):
        unknown = set(return_weights) - {"heads", "rows", "keys"}
        if unknown:
            raise ValueError(f"return_weights: unknown selection keys {sorted(unknown)}; use "
                             "heads, rows and keys")
        return Selection(**return_weights)
    raise TypeError("return_weights must be a bool, a headwise.Selection or a dict with heads/"
                    f"rows/keys, got {type(return_weights).__name__}")


def _is_int(x) -> bool:  # numpy ints too; not bools
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_index(value, name: str) -> None:
    """TypeError unless ``value`` is None, an int, a sequence of ints, a slice of ints or a
    1-D integer tensor: a bool mask, a float or a string would otherwise be read as (other)
    indices without a word."""
    where = f"Selection: {name}={value!r}"
    if value is None or _is_int(value):
        return
    if isinstance(value, slice):
        parts = (value.start, value.stop, value.step)
        if all(p is None or _is_int(p) for p in parts):
            return
        raise TypeError(f"{where} has non-integer bounds; pass ints, e.g. slice(0, 4)")
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool:
            raise TypeError(f"Selection: {name} is a bool tensor, but indices are expected; "
                            f"pass its positions: {name}=mask.nonzero().flatten()")
        if value.device.type == "meta":
            raise ValueError(f"Selection: {name} is a meta tensor, which holds no indices to "
                             f"read; pass them on the CPU, e.g. {name}=torch.tensor([0, 2])")
        if value.is_floating_point() or value.is_complex() or value.dim() > 1:
            raise TypeError(f"Selection: {name} must be a 0-D or 1-D integer tensor, got "
                            f"{str(value.dtype).removeprefix('torch.')} of shape "
                            f"{tuple(value.shape)}; pass e.g. torch.tensor([0, 2])")
        return
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{where} is a string; pass ints, e.g. {name}=[1, 2]")
    if isinstance(value, Sequence):
        bad = [x for x in value if not _is_int(x)]
        if bad:
            raise TypeError(f"{where} holds {bad[0]!r} ({type(bad[0]).__name__}); indices must "
                            f"be ints, e.g. {name}=[0, 2]")
        return
    raise TypeError(f"Selection: {name} must be an int, a sequence of ints, a slice or an "
                    f"integer tensor, got {type(value).__name__}; pass e.g. {name}=[0, 2]")


def _axis(value: Index, n: int, name: str, device):
    if value is None:
        return slice(0, n)
    if isinstance(value, slice):
        picked = range(n)[value]
        if len(picked) == 0:
            raise ValueError(f"return_weights: empty selection of {name} ({value} of {n}); "
                             "select at least one")
        if picked.step == 1:
            return slice(picked.start, picked.stop)
        return torch.tensor(list(picked), device=device)
    values = ([int(value)] if _is_int(value) else value.reshape(-1).tolist()  # types: checked
              if isinstance(value, torch.Tensor) else [int(x) for x in value])  # at __init__
    if not values:
        raise ValueError(f"return_weights: empty selection of {name}; select at least one")
    bad = [x for x in values if not -n <= x < n]
    if bad:
        raise ValueError(f"return_weights: {name} index {bad[0]} out of range for {n} {name} "
                         f"(use 0..{n - 1} or negative from the end)")
    values = [x % n for x in values]
    if values == list(range(values[0], values[0] + len(values))):
        return slice(values[0], values[0] + len(values))
    return torch.tensor(values, device=device)


def take(x: torch.Tensor, dim: int, index, broadcast: bool = False) -> torch.Tensor:
    """``x`` indexed along ``dim`` (a view for a slice); with ``broadcast`` (masks) an axis of
    size 1 stays as it is."""
    if broadcast and x.shape[dim] == 1:
        return x
    if isinstance(index, slice):
        return x.narrow(dim, index.start, index.stop - index.start)
    return x.index_select(dim, index.to(x.device))


def positions(index, device) -> torch.Tensor:
    """The positions a resolved index (a slice or an index tensor) names, as a tensor."""
    return (torch.arange(index.start, index.stop, device=device) if isinstance(index, slice)
            else index.to(device))


def row_chunks(rows: int, per_row: int, budget: int) -> Iterator[tuple[int, int]]:
    """``(r0, r1)`` blocks of ``rows`` query rows, each at most ``budget`` elements when one
    row costs ``per_row`` (at least one row per block)."""
    step = max(1, budget // max(1, per_row))
    for r0 in range(0, rows, step):
        yield r0, min(rows, r0 + step)


def chunk_rows(per_row: int, budget: int = CHUNK_ELEMENTS) -> int:
    """Query rows per chunk when one row costs ``per_row`` elements."""
    return max(1, budget // max(1, per_row))


def kv_heads(heads, h: int, g: int, device):
    """The key/value head each selected query head reads (grouped-query: ``x // (h // g)``)."""
    if g == h:
        return heads
    return positions(heads, device) // (h // g)


def sub_rows(index, r0: int, r1: int):
    """Rows ``r0:r1`` of a selection of rows (slice or index tensor)."""
    if isinstance(index, slice):
        return slice(index.start + r0, index.start + r1)
    return index[r0:r1]
