"""Large CPU tensors for the weights we return: the last one's memory is recycled once its
caller has let go of it, and fresh memory is advised to transparent huge pages.

A fresh ``(b, h, i, j)`` weights tensor is a new ``mmap`` of glibc's malloc (anything over
32 MiB is), and its first write takes one page fault per 4 KiB page: for the 128 MiB of
``(4, 8, 1024, 1024)`` float32 weights that is 32768 faults, several times the cost of writing
the same bytes once they are resident (``benchmarks/weights.py --tables floor``), and a large
share of the fused forward the weights are measured against. Two remedies, in order:

- **Recycling.** :func:`empty` keeps the storages of the last large tensors it handed out (at
  most :data:`KEEP_COUNT` of them, :data:`KEEP_MAX` bytes in all). When a request has the size
  of one of them and nothing outside this module still uses that storage (no tensor, view,
  NumPy array, autograd graph or storage object), the request gets that memory back: resident,
  no faults. This is what CUDA's caching allocator does for every tensor; here it is done for one
  tensor kind only, so a loop that asks for weights batch after batch (and drops them) pays
  the faults once. The memory is held until newer sizes push it out or :func:`release` is
  called (public as ``headwise.release_memory()``). The cap, 1/8 of physical memory, is set so
  that the largest weights the benchmarks ask for (``(4, 8, 4096, 4096)``: 2 GiB) can be kept
  on a 24 GiB machine: under 1/16 they were not, and every call faulted 2 GiB of fresh pages.
- **Huge pages.** Otherwise the untouched range is advised to 2 MiB pages
  (``madvise(MADV_HUGEPAGE)``, what Linux's default ``transparent_hugepage=madvise`` waits for):
  64 faults instead of 32768.

Both are invisible to the caller: the tensor is ``torch.empty``'s, with contents undefined.
Where neither applies (another OS, another device, ``transparent_hugepage=never``, a torch
without the storage use count, a small tensor) :func:`empty` is ``torch.empty``.
"""

from __future__ import annotations

import ctypes
import math
import sys
import threading

import torch

from headwise import limits

__all__ = ["empty", "huge", "release", "KEEP_MAX", "KEEP_COUNT"]

_HUGE = 2 << 20  # bytes of one x86-64/arm64 transparent huge page
_MADV_HUGEPAGE = 14
_MIN_BYTES = 8 * _HUGE  # below this the faults cost little and the region may be heap memory
#: Most bytes kept for recycling: 1/8 of physical memory (2.9 GiB on a 24 GiB machine)...
KEEP_MAX = limits.machine_memory() // 8
#: ...in at most this many storages (sizes a loop alternates between: all weights, one head).
KEEP_COUNT = 4


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
_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)  # absent: no recycling
_lock = threading.Lock()


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str, *,
          huge_pages: bool = True) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, device=device)``; on a CPU and for at least 16 MiB,
    a kept storage of this size that nobody uses any more, else fresh memory, advised to huge
    pages (on Linux) unless ``huge_pages=False``, and kept for later requests."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if torch.device(device).type != "cpu" or nbytes < _MIN_BYTES:
        return torch.empty(shape, dtype=dtype, device=device)
    with _lock:
        for i in range(len(_kept) if _USE_COUNT is not None else 0):
            if _kept[i].nbytes() == nbytes and _unused(i):
                _kept.append(_kept.pop(i))  # most recently used last
                return torch.empty(0, dtype=dtype).set_(_kept[-1], 0, shape)
        t = _fresh(shape, dtype, nbytes) if huge_pages else torch.empty(shape, dtype=dtype)
        if _USE_COUNT is not None and nbytes <= KEEP_MAX:
            _kept.append(t.untyped_storage())
            while len(_kept) > KEEP_COUNT or sum(s.nbytes() for s in _kept) > KEEP_MAX:
                del _kept[0]  # the least recently used
        return t


def _python_refs(i: int) -> int:
    return sys.getrefcount(_kept[i])


def _unused(i: int) -> bool:
    """Nothing but this module uses kept storage ``i``: no tensor, view or NumPy array (each
    holds the storage: torch's use count is 1), and nobody holds the storage object itself
    (torch hands every caller of ``.untyped_storage()`` this same object: its Python reference
    count is what it is when only this module holds it, measured once at import)."""
    return _USE_COUNT(_kept[i]._cdata) == 1 and _python_refs(i) == _ALONE


_kept: list[torch.UntypedStorage] = [torch.empty(1).untyped_storage()]
_ALONE = _python_refs(0)
_kept.clear()


def release() -> None:
    """Let go of the kept storages (their memory returns to the system once no tensor uses
    it)."""
    with _lock:
        _kept.clear()


def huge(n: int, dtype: torch.dtype) -> torch.Tensor:
    """A new 1-D CPU tensor of ``n`` elements whose 2 MiB-aligned interior is advised to huge
    pages (on Linux), never recycled: for memory that is read over and over, such as weights a
    decoding step streams once per token (:func:`headwise.fast.rows.lay_out`: ~5% faster products
    over SmolLM2-135M's matrices here, fewer TLB misses)."""
    return _fresh((n,), dtype, n * torch.empty((), dtype=dtype).element_size())


def _fresh(shape: tuple[int, ...], dtype: torch.dtype, nbytes: int) -> torch.Tensor:
    """New CPU memory, its whole 2 MiB-aligned interior advised to huge pages before anything
    touches it."""
    t = torch.empty(shape, dtype=dtype)
    if _MADVISE is not None:
        start = -(-t.data_ptr() // _HUGE) * _HUGE
        stop = (t.data_ptr() + nbytes) // _HUGE * _HUGE
        if stop > start:
            _MADVISE(start, stop - start, _MADV_HUGEPAGE)  # advice: a failure changes nothing
    return t
