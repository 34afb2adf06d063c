"""The speed layer: what makes headwise's paths fast on a given device, changing no value.

Holds the CPU decoding step's weight layouts and products (``rows``), headwise's C kernels and
their loader (``native`` + ``step_kernels*.c``), the 4-bit GGUF weight form (``int4``), the
memory roof a step is measured against (``roof``), huge-page
and recycled buffers (``large``), inference that reuses its own buffers (``reuse``), the
CPU flash kernel that returns its log-sum-exp (``flash_cpu``), and the GPU's Triton kernel for
streaming head statistics (``stats_triton``). Everything here is an
optimisation of a computation the plain torch path (:mod:`headwise.layers`,
:mod:`headwise.attend`, :mod:`headwise.step`) also does: switching it off
(``HEADWISE_NATIVE=0``, another device, autograd) gives the same numbers.

This file is the one place that decides where the layer applies (as Hugging Face's
``ALL_ATTENTION_FUNCTIONS`` or llm.c's single fallback test): :func:`host` is the device rule,
:func:`applies` the rule for the float32 (and, where a kernel has that form, bfloat16) CPU
kernels and layouts, :func:`finite` the one NaN
check, with its device rule, that the NaN policy's shortcut reads, :func:`compiling` the one
question about torch.compile, :func:`block_elements` how large a block of recomputed weights
is (the CPU's cache or the device's memory), :func:`triton` whether the GPU's Triton kernels
run (``HEADWISE_TRITON=0`` switches them off). No other module tests a tensor's device for
speed.

May import: torch, :mod:`headwise.errors`, :mod:`headwise.limits`, :mod:`headwise.masks`,
:mod:`headwise.heads`, :mod:`headwise.observe`; never a model, a layer or a tool.
"""

from __future__ import annotations

import importlib.util
import math
import os

import torch

__all__ = ["applies", "block_elements", "compiling", "finite", "host", "triton",
           "DEVICE_BLOCK_ELEMENTS"]

# Off the CPU a block of recomputed weights is sized for memory, not cache: 2**25 float32
# elements (128 MiB; the chunked passes hold two), so a 16k-token, 16-head causal pass is ~40
# blocks of whole rows instead of thousands (each block is ~20 kernels; launches, not
# arithmetic, were the cost).
DEVICE_BLOCK_ELEMENTS = 1 << 25
_TRITON: list[bool] = []  # found once: importing triton costs ~0.3 s

_F32, _BF16 = torch.float32, torch.bfloat16
_compiling = torch.compiler.is_compiling


def compiling() -> bool:
    """Whether torch.compile is tracing: it cannot branch on a value, read a storage or call
    C, so the layer steps aside and the plain torch path (which it fuses) runs."""
    return _compiling()


def host(*tensors: torch.Tensor) -> bool:
    """The device rule: every tensor on the CPU, outside torch.compile. On a GPU a value read
    back to Python (``.item()``) is a device sync, and the C kernels and huge pages are the
    CPU's; there the plain path runs."""
    for t in tensors:
        if not t.is_cpu:
            return False
    return not _compiling()


def applies(*tensors: torch.Tensor, autograd: bool = False, bf16: bool = False) -> bool:
    """The rule for the CPU speed layer's kernels and layouts (:mod:`headwise.fast.native`,
    :mod:`headwise.fast.rows`): float32 tensors on the :func:`host` (``bf16=True``, for the
    kernels that also have a bfloat16 form: all float32 or all bfloat16), with nothing for
    autograd to record, since the C kernels have no backward (``autograd=True``: the caller
    only moves where values are stored, keeping the same parameters, as
    :func:`~headwise.fast.rows.lay_out` does). Attribute reads only, ~1 us: a decoding step
    asks a few hundred times."""
    dtype = tensors[0].dtype if tensors else _F32
    if dtype is not _F32 and not (bf16 and dtype is _BF16):
        return False
    for t in tensors:
        if t.dtype is not dtype or not t.is_cpu:
            return False
    if not autograd and torch.is_grad_enabled():
        for t in tensors:
            if t.requires_grad:
                return False
    return not _compiling()


def finite(*tensors: torch.Tensor) -> bool | None:
    """Whether the tensors hold no NaN or inf, from one float32 total (NaN or inf in,
    non-finite sum out: 1 reduction per tensor and one scalar read, instead of per-row and
    per-head masks and a copy); None off the :func:`host`, where the read would be a device
    sync (and torch.compile cannot branch on it): the caller then builds its masks, which are
    correct either way."""
    if not host(*tensors):
        return None
    total = tensors[0].detach().sum(dtype=_F32)
    for t in tensors[1:]:
        total = total + t.detach().sum(dtype=_F32)
    return math.isfinite(total.item())  # (torch.isfinite on a scalar: ~50 us)


def block_elements(*tensors: torch.Tensor, cpu: int) -> int:
    """Elements of one block of recomputed weights: ``cpu`` (a size tuned for this CPU's
    cache) on the :func:`host`, :data:`DEVICE_BLOCK_ELEMENTS` elsewhere."""
    return cpu if host(*tensors) else DEVICE_BLOCK_ELEMENTS


def triton(*tensors: torch.Tensor) -> bool:
    """The rule for the Triton kernels (:mod:`headwise.fast.stats_triton`): every tensor on a
    CUDA device, outside torch.compile, ``triton`` installed and ``HEADWISE_TRITON`` not
    ``0``. Elsewhere the plain torch path runs (same values)."""
    for t in tensors:
        if t.device.type != "cuda":
            return False
    if _compiling() or os.environ.get("HEADWISE_TRITON", "1") == "0":
        return False
    if not _TRITON:
        _TRITON.append(importlib.util.find_spec("triton") is not None)
    return _TRITON[0]
