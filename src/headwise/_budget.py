"""What this machine can hold: CPU count, available memory, and the parameter count a model
config implies, computed from the config alone (nothing allocated, nothing looped over per
layer). Used to refuse absurd sizes *before* building anything: a config that claims
``d_model: 1000000`` or ``num_layers: 1000000`` is answered in microseconds with the number of
bytes it would need, instead of after minutes of allocation or a crash.

Torch-free on purpose: ``headwise train --help`` estimates run times with it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["available_memory", "check_fits", "cpu_count", "format_bytes", "parameter_count"]


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_memory() -> int:
    """Bytes of memory available for new allocations (``MemAvailable`` on Linux; else the
    physical memory)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 34  # unknown: assume 16 GiB


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _block(d: int, heads: int, head_dim: int, kv_heads: int, d_ff: int, cross: bool) -> int:
    """Parameters of one block: attention (q, k, v, out with biases), optional
    cross-attention, feed-forward, two or three LayerNorms."""
    hd, kvd = heads * head_dim, kv_heads * head_dim
    attention = d * hd + hd + 2 * (d * kvd + kvd) + hd * d + d
    ff = d * d_ff + d_ff + d_ff * d + d
    norms = (3 if cross else 2) * 2 * d
    return attention * (2 if cross else 1) + ff + norms


def parameter_count(kind: str, c: Mapping[str, Any]) -> int:
    """Parameters of a headwise ``lm`` or ``transformer`` model with config fields ``c`` (a
    dict of :class:`~headwise.models.LMConfig` / ``TransformerConfig`` fields; missing fields
    take the usual defaults). Exact for the default layouts, an estimate within a few percent
    otherwise; pure arithmetic, whatever the sizes."""
    d, heads = int(c.get("d_model", 512)), int(c.get("num_heads", 8))
    head_dim = int(c.get("head_dim") or max(1, d // max(1, heads)))
    kv_heads = int(c.get("num_kv_heads") or heads)
    d_ff, layers = int(c.get("d_ff", 2048)), int(c.get("num_layers", 6))
    max_len = int(c.get("max_len", 512))
    learned = c.get("positional", "sinusoidal") == "learned"
    final_norm = 2 * d if c.get("norm_first", True) else 0  # pre-norm stacks end in a LayerNorm
    if kind == "lm":
        vocab = int(c.get("vocab_size", 1))
        embed = vocab * d + (max_len * d if learned else 0)
        head = 0 if c.get("tie_embeddings") else vocab * d  # the output head has no bias
        blocks = layers * _block(d, heads, head_dim, kv_heads, d_ff, cross=False)
        return embed + blocks + final_norm + head
    src, tgt = int(c.get("src_vocab_size", 1)), int(c.get("tgt_vocab_size", 1))
    dec_layers = int(c.get("num_decoder_layers") or layers)
    embed = (src + tgt) * d + (2 * max_len * d if learned else 0)
    head = 0 if c.get("tie_embeddings") else tgt * d
    blocks = (layers * _block(d, heads, head_dim, kv_heads, d_ff, cross=False)
              + dec_layers * _block(d, heads, head_dim, kv_heads, d_ff, cross=True))
    return embed + blocks + 2 * final_norm + head


def check_fits(what: str, nbytes: float, fix: str) -> None:
    """Raise ``ValueError`` when ``nbytes`` exceed the memory available now, naming both."""
    have = available_memory()
    if nbytes > have:
        raise ValueError(f"{what} needs about {format_bytes(nbytes)} of memory; this machine has "
                         f"{format_bytes(have)} available; {fix}")
