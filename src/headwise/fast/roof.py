"""The memory roof of a decoding step: a step at batch 1 (and up to a few rows) reads every
weight once, so its floor is the bytes it reads over the machine's read bandwidth. The
benchmarks (``benchmarks/generate.py --model smollm2``) and ``headwise chat`` report each step's
speed as a fraction of it.

- :func:`read_bandwidth`: bytes per second one sum over a float32 buffer much larger than the
  caches reads, at the current torch thread count (torch's reduction splits it over them),
  best of a few: what the machine delivers to a reading loop, the step's kind of traffic (a
  copy's writes would count bytes the step never moves). The buffer is advised to huge pages,
  as the weights a step streams are (:func:`headwise.fast.rows.lay_out`, the 4-bit and 8-bit
  codes from loading): a sum over 4 KiB pages reads measurably slower than over 2 MiB pages
  (TLB misses), so a probe on 4 KiB pages would set the roof too low.
- :func:`step_bytes`: the bytes of weights one step reads: each matrix it multiplies by once
  (a tied matrix once) in the form the step reads it: a 4-bit matrix's codes, scales and minima
  (:class:`~headwise.fast.int4.Int4`), a float32 matrix with 8-bit codes beside it those codes
  and scales (:func:`headwise.fast.q8.of`, where headwise's kernel is built), else the
  parameter; every other parameter (norms, biases) once. An embedding table is looked up, one
  row per token: not counted (``b * m`` values a step) unless a product reads it too (a tied
  head).
- :func:`cache_bytes`: the bytes of keys and values one step reads from the KV cache: every
  layer's over the positions its new query attends (its window's at most), in the cache's
  dtype. A step reads them as it reads the weights, once, so they belong under the same roof:
  SmolLM2's float32 cache at 192 positions is 8.4 MiB a row, 34 MiB at four rows (the q4
  step's weights are 92 MiB).
- :func:`cpu`: the CPU's name and the features the kernels' paths depend on.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from headwise.fast import large as _large
from headwise.fast import native as _native
from headwise.fast import q8 as _q8
from headwise.limits import cpu_model

__all__ = ["BUFFER_BYTES", "cache_bytes", "cpu", "cpu_flags", "read_bandwidth", "step_bytes"]

BUFFER_BYTES = 512 * 2**20  # 16x this project's largest cache (a 32 MiB L3)
_FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "amx_bf16")


def read_bandwidth(repeats: int = 5, nbytes: int = BUFFER_BYTES) -> float:
    """Bytes per second of ``torch.sum`` over ``nbytes`` of float32 advised to huge pages, the
    best of ``repeats`` (after one untimed pass), at ``torch.get_num_threads()``."""
    if repeats < 1 or nbytes < 2**20:
        raise ValueError(f"read_bandwidth: expected repeats >= 1 and nbytes >= 1 MiB, got "
                         f"{repeats} and {nbytes}; the defaults measure 512 MiB 5 times")
    buf = _large.huge(nbytes // 4, torch.float32).fill_(1.0)
    buf.sum()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return buf.numel() * 4 / best


def step_bytes(model: nn.Module) -> int:
    """Bytes of weights one decoding step of ``model`` reads (module docstring)."""
    coded = _native.isa() is not None  # (the 8-bit kernel built: the step reads those codes)
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    read, total = set(), 0
    for m in model.modules():
        if getattr(m, "int4", None) is not None:
            total += m.int4.nbytes()
        elif isinstance(m, nn.Linear) and coded and (q8 := _q8.of(m)) is not None:
            total += q8.nbytes()
            tables.add(id(m.weight))
        elif isinstance(m, nn.Linear):
            read.add(id(m.weight))
    return total + sum(p.numel() * p.element_size() for p in model.parameters()
                       if id(p) in read or id(p) not in tables)


def cache_bytes(model: nn.Module, rows: int, keys: int) -> int:
    """Bytes of keys and values one decoding step of the decoder-only ``model``
    (:class:`~headwise.models.TransformerLM`) reads from its KV cache for ``rows`` rows whose new
    query attends ``keys`` positions (the cache's, its own included), each layer's at most its
    ``attention.window``, in the dtype :meth:`~headwise.models.TransformerLM.new_cache` gives the
    cache (module docstring)."""
    from headwise.models import TransformerLM

    if not isinstance(model, TransformerLM):
        raise TypeError(f"cache_bytes: expected a decoder-only TransformerLM (its self-attention "
                        f"caches), got {type(model).__name__}")
    for name, n in (("rows", rows), ("keys", keys)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"cache_bytes: {name} must be a positive int, got {n!r}")
    c = model.config
    window = c.attention.window
    seen = keys if window is None else min(keys, window)
    per_value = model.lm_head.weight.element_size() * c.head_size
    return 2 * rows * seen * per_value * sum(c.layer_kv_heads("decoder_self"))


def cpu_flags() -> set[str]:
    """The CPU's feature flags (``/proc/cpuinfo``'s ``flags``; empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.partition(":")[2].split()) for line in f
                         if line.startswith("flags")), set())
    except OSError:
        return set()


def cpu() -> str:
    """``"<model name>; avx2 fma ... avx512_bf16"``: the CPU (:func:`headwise.limits.cpu_model`)
    and which of the features the kernels' paths depend on it has (:func:`cpu_flags`)."""
    flags = cpu_flags()
    return f"{cpu_model()}; {' '.join(f for f in _FEATURES if f in flags) or 'features unknown'}"
