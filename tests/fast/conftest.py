"""Fixtures of the speed layer's tests: each C-kernel path (step_kernels.h) in turn."""

import contextlib

import pytest
import torch

from headwise.fast import native as _native
from headwise.fast.roof import cpu_flags


@pytest.fixture(params=["auto", "avx2"])
def isa(request, monkeypatch):
    """The path the bfloat16 and 4-bit kernels run: ``auto`` (AVX512-BF16 where the CPU has
    it) or ``avx2`` forced by ``HEADWISE_NATIVE_ISA``; the library reloaded for it (the same
    cached build). Yields what :func:`headwise.fast.native.isa` reports, or skips where the
    kernels are not built."""
    monkeypatch.setenv(_native.ISA_ENV, request.param)
    monkeypatch.setattr(_native, "_state", {})
    if _native.status() != "ready":
        pytest.skip(f"no C kernels here: {_native.status()}")
    got = _native.isa()
    wide = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"} <= cpu_flags()
    assert got == ("avx512-bf16" if request.param == "auto" and wide else "avx2"), got
    return got


@contextlib.contextmanager
def torch_threads(n: int):
    """torch (and the kernels' OpenMP loops) on ``n`` threads inside the block, then as before."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
