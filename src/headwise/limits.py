"""The boundary policy for sizes: every size a user passes is bounded *before* anything is
allocated or looped over, and every error hint costs no more than the check. Also what this
machine can hold (CPU count, memory), how torch's threads wait (:func:`wait_policy`), and the
parameter count a model config implies, computed from the config alone, so that ``d_model:
1000000`` is answered in microseconds with the number of bytes it would need. Torch-free on
purpose: ``headwise train --help`` estimates run times with it, and ``import headwise`` sets
the wait policy with it before torch loads.

Two rules, one place:

- a stated maximum per kind of size (:data:`MAX`), far above any real model (Llama-3 405B has
  ``d_model`` 16384, ``d_ff`` 53248, 126 layers, 128 heads, a 128k vocabulary) and far below
  what would make a loop or an allocation run for minutes;
- a memory estimate of what is about to be allocated, refused when it exceeds this machine's
  physical memory, with the number (:func:`check_memory`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

__all__ = ["MAX", "size", "check_memory", "machine_memory", "cpu_count", "cpu_model", "threads",
           "WAIT_SETTINGS", "wait_policy", "format_bytes", "parameter_count"]

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


def check_memory(nbytes: float, what: str, where: str, fix: str = "choose smaller sizes") -> None:
    """Refuse to allocate ``nbytes`` (an estimate) when it exceeds physical memory: the one
    memory rule, for modules, models, training runs and checkpoints alike."""
    have = machine_memory()
    if nbytes > have:
        raise ValueError(f"{where}: {what} would need about {_gb(nbytes)} of memory, more than "
                         f"this machine's {_gb(have)}; {fix}")


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB"


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_model() -> str:
    """This CPU's model name (``/proc/cpuinfo``'s first ``model name``), else the platform's."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.partition(":")[2].split())
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine() or "unknown CPU"


def threads(value, name: str = "threads") -> int:
    """``value`` as a thread count in ``[1, cpu_count()]``, or one ValueError: more threads than
    CPUs only wait on one another, and 100,000 OpenMP threads exhaust memory mid-load (once
    misreported as a truncated model file)."""
    cpus = cpu_count()
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= cpus:
        raise ValueError(f"{name} must be an int in [1, {cpus}] (this machine's CPUs); got "
                         f"{value!r}")
    return value


#: What a user may set to choose how torch's OpenMP runtime (libgomp) waits; any of them set,
#: and :func:`wait_policy` leaves the choice to them.
WAIT_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def others_running() -> int | None:
    """Threads of other processes runnable right now (``/proc/loadavg``'s running count, less
    this one), or None where it cannot be read: an instant count, unlike the load averages,
    which lag a busy loop started a second ago by most of a minute."""
    try:
        with open("/proc/loadavg") as f:
            return max(0, int(f.read().split()[3].split("/")[0]) - 1)
    except (OSError, ValueError, IndexError):
        return None


def free_threads() -> int | None:
    """Threads for a decoding loop when other processes are running (the CPUs they leave, at
    least 1), or None on a quiet machine (torch's default). A step is hundreds of short parallel
    regions; a thread that shares its core with a busy process makes every region wait for it:
    beside a busy loop on each of 2 cores, ``chat`` at 2 threads ran 16-33 tokens/s from run to
    run, at 1 thread 24-26 (``benchmarks/busy.py``)."""
    others = others_running()
    return None if not others else max(1, cpu_count() - others)


def wait_policy(environ: MutableMapping[str, str] | None = None, *,
                torch_loaded: bool | None = None, others: int | None = -1) -> str:
    """Ask torch's OpenMP runtime to put a waiting thread to sleep at once
    (``OMP_WAIT_POLICY=PASSIVE``): the thread policy for a busy machine, in one place.

    libgomp lets a thread that reaches the end of a parallel region first spin ~300,000 times
    (milliseconds) before it sleeps. When other processes load every core, the thread it waits
    for is often descheduled and the spinners burn the time slices it needs: beside a busy loop
    on each core, ``chat`` and ``train`` ran 15-40x slower at torch's default threads than with
    this policy (``benchmarks/busy.py``; its table is in ``benchmarks/RESULTS.md``). libgomp
    reads the variable once, when torch loads it, so this runs on ``import headwise``: it takes
    effect when headwise is imported before torch (as the CLI does) and does nothing once torch
    is loaded. A user's own ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` stands. On a quiet
    machine the spin is what makes 2 threads fast (a decoding step at 2 threads is slower with
    passive threads: ``benchmarks/busy.py``), so the policy is asked only when another
    process is running at import (``others``: :func:`others_running`; unknown counts as busy).

    Returns ``"set"``, ``"user"`` (their setting stands), ``"late"`` (torch already loaded) or
    ``"quiet"`` (no other process running: libgomp's spin stands).
    """
    env = os.environ if environ is None else environ
    if torch_loaded is None:
        torch_loaded = "torch" in sys.modules
    if any(name in env for name in WAIT_SETTINGS):
        return "user"
    if torch_loaded:
        return "late"
    if others == -1:
        others = others_running()
    if others == 0:
        return "quiet"
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    return "set"


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
    dict of :class:`~headwise.models.LMConfig` / ``TransformerConfig`` fields, ``to_dict()``'s
    or the constructors' keywords, flat attention keys included; missing fields
    take the usual defaults). Exact for the default layouts, an estimate within a few percent
    otherwise; pure arithmetic, whatever the sizes."""
    d, heads = int(c.get("d_model", 512)), int(c.get("num_heads", 8))
    # the attention's sizes: in ``attention`` (its dict), or flat in a config saved before it
    attention = c.get("attention") or {}
    if not isinstance(attention, Mapping):  # an AttentionConfig
        attention = vars(attention)
    head_dim = int(attention.get("head_dim", c.get("head_dim")) or max(1, d // max(1, heads)))
    kv_heads = int(attention.get("num_kv_heads", c.get("num_kv_heads")) or heads)
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
