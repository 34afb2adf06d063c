"""Large CPU tensors backed by transparent huge pages, for the weights tensors we return.

A fresh ``(b, h, i, j)`` weights tensor is a new ``mmap`` of glibc's malloc, and its first
write takes one page fault per 4 KiB page: for the 128 MiB of ``(4, 8, 1024, 1024)`` float32
weights that is 32768 faults, measured 67-195 ms here against 30 ms for filling the same bytes
once they are resident (``benchmarks/weights.py --tables alloc``). Asking the kernel for huge
pages on the untouched range (``madvise(MADV_HUGEPAGE)``, what Linux's default
``transparent_hugepage=madvise`` waits for) makes it 64 faults of 2 MiB: ~47 ms.

The advice is only a hint about memory the tensor already owns: where it is not available
(another OS, another device, ``transparent_hugepage=never``, a small tensor) :func:`empty` is
``torch.empty``.
"""

from __future__ import annotations

import ctypes
import sys

import torch

__all__ = ["empty"]

_HUGE = 2 << 20  # bytes of one x86-64/arm64 transparent huge page
_MADV_HUGEPAGE = 14
_MIN_BYTES = 8 * _HUGE  # below this the faults cost little and the region may be heap memory


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise()


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, device=device)``; on a Linux CPU and for at least
    16 MiB, its whole 2 MiB-aligned interior advised to huge pages before anything touches it."""
    t = torch.empty(shape, dtype=dtype, device=device)
    nbytes = t.numel() * t.element_size()
    if _MADVISE is None or t.device.type != "cpu" or nbytes < _MIN_BYTES:
        return t
    start = -(-t.data_ptr() // _HUGE) * _HUGE
    stop = (t.data_ptr() + nbytes) // _HUGE * _HUGE
    if stop > start:
        _MADVISE(start, stop - start, _MADV_HUGEPAGE)  # advice: a failure changes nothing
    return t
