"""The boundary policy for sizes: every size a user passes is bounded *before* anything is
allocated or looped over, and every error hint costs no more than the check.

Two rules, one place:

- a stated maximum per kind of size (:data:`MAX`), far above any real model (Llama-3 405B has
  ``d_model`` 16384, ``d_ff`` 53248, 126 layers, 128 heads, a 128k vocabulary) and far below
  what would make a loop or an allocation run for minutes;
- a memory estimate of what is about to be allocated, refused when it exceeds this machine's
  physical memory, with the number (:func:`check_memory`).
"""

from __future__ import annotations

import os

__all__ = ["MAX", "size", "check_memory", "machine_memory"]

#: Largest accepted value per kind of size.
MAX: dict[str, int] = {
    "dim": 1 << 17,      # feature sizes: embed_dim, d_model, d_ff, head_dim, kdim, vdim
    "heads": 1 << 12,    # attention heads
    "layers": 1 << 10,   # blocks in a stack
    "vocab": 1 << 21,    # token ids
    "length": 1 << 20,   # positions (max_len, sequence lengths)
    "batch": 1 << 20,    # rows of a batch
    "panels": 256,       # heatmaps in one figure (layers x heads); BERT-base has 144
}


def size(value, name: str, kind: str, where: str, *, low: int = 1) -> int:
    """``value`` as a checked int in ``[low, MAX[kind]]``; TypeError/ValueError otherwise."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{where}: {name} must be >= {low}, got {value}")
    top = MAX[kind]
    if value > top:
        raise ValueError(f"{where}: {name}={value} is over the maximum {top:,} for a {kind} "
                         f"size; use a value <= {top:,}")
    return value


def machine_memory() -> int:
    """Bytes of physical memory on this machine (a generous 1 TiB if the OS will not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def check_memory(nbytes: int, what: str, where: str) -> None:
    """Refuse to allocate ``nbytes`` (an estimate) when it exceeds physical memory."""
    have = machine_memory()
    if nbytes > have:
        raise ValueError(f"{where}: {what} would need about {_gb(nbytes)} of memory, more than "
                         f"this machine's {_gb(have)}; choose smaller sizes")


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB"
