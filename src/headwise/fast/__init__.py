"""The speed layer: what makes headwise's paths fast on a given device, changing no value.

Holds the CPU decoding step's weight layouts and products (``rows``), headwise's C kernels and
their loader (``native`` + ``step_kernels*.c``; ``build`` runs the compiler; ``plan`` binds a step's
calls once and runs them as one C call), the 4-bit GGUF
weight form (``int4``), 8-bit codes the step reads beside a float32 weight (``q8``), the
memory roof a step is measured against (``roof``), huge-page and recycled buffers (``large``),
inference that reuses its own buffers (``reuse``), the CPU flash kernel that returns its
log-sum-exp (``flash_cpu``), the CUDA kernels' log-sum-exp (``cuda_lse``), the Triton kernels
that write per-head weights from it (``triton_weights``) and stream head statistics
(``stats_triton``), imported only on a GPU: they need the ``gpu`` extra's triton. Everything here is an optimisation of a computation the plain torch
path (:mod:`headwise.layers`, :mod:`headwise.attend`, :mod:`headwise.step`) also does:
switching it off (``HEADWISE_NATIVE=0``, another device, autograd) gives the same numbers.

This file is the one place that decides where the layer applies (as Hugging Face's
``ALL_ATTENTION_FUNCTIONS`` or llm.c's single fallback test): :func:`host` is the device rule
(:func:`gpu` its CUDA side, :func:`triton` the Triton kernels' rule), :func:`applies` the rule for the float32
(and, where a kernel has that form, bfloat16) CPU kernels and layouts, :func:`finite` the one
NaN check, with its device rule, that the NaN policy's shortcut reads, :func:`kernel_nan`
whether the device's fused attention kernels propagate NaN by themselves (so the policy costs
nothing there), :func:`joint_qkv` whether self-attention projects q, k, v with one GEMM over
their concatenated weights, :func:`upload` how a host batch reaches the device,
:func:`block_elements` how large a block of recomputed weights is (the CPU's cache or
the device's memory), :func:`compiling` the one question about torch.compile. No other module tests a tensor's
device for speed. :func:`as_device` (for tests) runs every rule as off the CPU on CPU tensors:
the GPU's code path, with real values to check and ops to count.

May import: torch, :mod:`headwise.errors`, :mod:`headwise.limits`, :mod:`headwise.masks`,
:mod:`headwise.heads`, :mod:`headwise.observe`; never a model, a layer or a tool.

:func:`upload` is the one rule for copying host data (a training batch) to a device.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from contextlib import contextmanager

import torch

__all__ = ["applies", "as_device", "block_elements", "compiling", "finite", "fixed_shapes",
           "gpu", "graphs", "has_triton", "host", "joint_qkv", "kernel_nan", "triton", "upload",
           "DEVICE_BLOCK_ELEMENTS"]

# Off the CPU a block of recomputed weights is sized for memory, not cache: 2**25 float32
# elements (128 MiB; the chunked passes hold two), so a 16k-token, 16-head causal pass is ~40
# blocks of whole rows instead of thousands (each block is ~20 kernels; launches, not
# arithmetic, were the cost).
DEVICE_BLOCK_ELEMENTS = 1 << 25

_F32, _BF16 = torch.float32, torch.bfloat16
_compiling = torch.compiler.is_compiling
_as_device = False  # set by as_device(): CPU tensors take the rules of a non-CPU device


@contextmanager
def as_device():
    """Within the block every rule here answers for CPU tensors as it would off the CPU (a
    GPU): no C kernel, no layout, no value read back, three projection GEMMs, the kernels' own
    NaN propagation. A test switch: it runs the GPU's code path on a CPU-only machine, where
    its values can be checked against float64 and its ops and host reads counted (with
    autograd, which fake CUDA tensors lack). Not thread-safe; never for production."""
    global _as_device
    before, _as_device = _as_device, True
    try:
        yield
    finally:
        _as_device = before


def _cpu(tensors) -> bool:
    if _as_device:
        return False
    for t in tensors:
        if not t.is_cpu:
            return False
    return True


def compiling() -> bool:
    """Whether torch.compile is tracing: it cannot branch on a value, read a storage or call
    C, so the layer steps aside and the plain torch path (which it fuses) runs."""
    return _compiling()


def upload(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` (on the CPU) copied to ``device`` without a host sync: to a CUDA device from
    page-locked memory with ``non_blocking=True`` (a plain ``.to`` from pageable memory waits
    for the copy: one sync per training batch); elsewhere a plain ``.to``."""
    if device.type == "cuda" and tensor.is_cpu:
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def host(*tensors: torch.Tensor) -> bool:
    """The device rule: every tensor on the CPU, outside torch.compile. On a GPU a value read
    back to Python (``.item()``) is a device sync, and the C kernels and huge pages are the
    CPU's; there the plain path runs."""
    if _as_device:
        return False
    for t in tensors:
        if not t.is_cpu:
            return False
    return not _compiling()


def gpu(*tensors: torch.Tensor) -> bool:
    """The GPU rule: every tensor on a CUDA device, outside torch.compile. There weights come
    from the row log-sum-exp the fused CUDA kernel returns with the output
    (:mod:`headwise.fast.cuda_lse`), written by one Triton kernel where triton is installed
    (:func:`has_triton`; :mod:`headwise.fast.triton_weights`), with no host read in between.
    Attribute reads only."""
    for t in tensors:
        if t.device.type != "cuda":
            return False
    return bool(tensors) and not _compiling()


@functools.cache
def has_triton() -> bool:
    """Whether the ``triton`` package is installed (the ``gpu`` extra); asked once."""
    return importlib.util.find_spec("triton") is not None


def applies(*tensors: torch.Tensor, autograd: bool = False, bf16: bool = False) -> bool:
    """The rule for the CPU speed layer's kernels and layouts (:mod:`headwise.fast.native`,
    :mod:`headwise.fast.rows`): float32 tensors on the :func:`host` (``bf16=True``, for the
    kernels that also have a bfloat16 form: all float32 or all bfloat16), with nothing for
    autograd to record, since the C kernels have no backward (``autograd=True``: the caller
    only moves where values are stored, keeping the same parameters, as
    :func:`~headwise.fast.rows.lay_out` does). Attribute reads only, no tensor op: a decoding
    step asks a few hundred times."""
    dtype = tensors[0].dtype if tensors else _F32
    if dtype is not _F32 and not (bf16 and dtype is _BF16):
        return False
    if _as_device:
        return False
    for t in tensors:
        if t.dtype is not dtype or not t.is_cpu:
            return False
    if not autograd and torch.is_grad_enabled():
        for t in tensors:
            if t.requires_grad:
                return False
    return not _compiling()


def fixed_shapes(*tensors: torch.Tensor) -> bool:
    """The decoding step's rule (:class:`headwise.step.DecodeStep`): off the :func:`host` a
    step takes fixed shapes and tensor positions (the cache written at a position tensor,
    attention over its full length under a mask built from that tensor), so it launches the
    same kernels every token, reads nothing back, and can be replayed as a CUDA graph. On the
    CPU the Python-int positions and growing cache views cost nothing and the C kernels read
    only the filled positions: the CPU keeps that step."""
    return not host(*tensors)


def graphs(*tensors: torch.Tensor) -> bool:
    """Whether a fixed-shape step over these tensors can be captured and replayed as a CUDA
    graph (``generate(..., compile=True)``): every tensor on a CUDA device."""
    return bool(tensors) and all(t.is_cuda for t in tensors)


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
    return math.isfinite(total.item())  # (not torch.isfinite on a scalar: a dispatched op)


def kernel_nan(*tensors: torch.Tensor) -> bool:
    """Whether the fused attention kernels of the tensors' device propagate NaN by themselves,
    so the NaN policy adds nothing (:func:`headwise.attend.fused.sdpa`): off the CPU, compiled
    or not. Measured on an H100 (flash, efficient and cuDNN kernels, bf16/fp16/fp32): NaN or
    inf in a query row gives that row; in a key or value, every row of the head that can see it
    (masked keys included) -- the policy, except under causal masking. The CPU's flash kernel
    does not (a NaN query row comes out as zeros; a NaN key reaches its block's rows only), so
    there the policy's masks are built."""
    return not _cpu(tensors)


def joint_qkv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether self-attention projects its input ``x`` to q, k and v as one GEMM over
    ``cat(W_q, W_k, W_v)`` (``weight``: W_q) rather than three GEMMs.

    On the CPU, compiled or not: one GEMM over the three is faster there than three, and the
    concatenation is cheap next to it. Off the CPU only while autograd records (training):
    there one GEMM forward and two backward replace three and six (plus the casts autocast
    makes of each weight, and the sums of three input gradients), for two concatenation
    kernels; without autograd three GEMMs are what the hand-written path runs, with no
    per-call copy of the weights."""
    return _cpu((x,)) or (torch.is_grad_enabled() and weight.requires_grad)


def block_elements(*tensors: torch.Tensor, cpu: int) -> int:
    """Elements of one block of recomputed weights: ``cpu`` (a size tuned for this CPU's
    cache) on the :func:`host`, :data:`DEVICE_BLOCK_ELEMENTS` elsewhere."""
    return cpu if host(*tensors) else DEVICE_BLOCK_ELEMENTS


def triton(*tensors: torch.Tensor) -> bool:
    """The rule for the Triton kernels (:mod:`headwise.fast.triton_weights`,
    :mod:`headwise.fast.stats_triton`): the :func:`gpu` rule, ``triton`` installed
    (:func:`has_triton`) and ``HEADWISE_TRITON`` not ``0``. Elsewhere the torch path runs
    (same values)."""
    return gpu(*tensors) and has_triton() and os.environ.get("HEADWISE_TRITON", "1") != "0"
