"""A hand-written product for 2 to 4 rows of a decoding step, built from C on first use.

Why. A cached decoding step at batch 2-4 multiplies a few rows ``x (b, in)`` by every weight
matrix: the weights are read once, so the product should run at the speed memory delivers
them. MKL's float32 kernels for so few rows do not: on this project's CPUs (AMD EPYC, AVX2)
``x @ W^T`` runs at ~25 GFLOP/s and ``W @ x^T`` (:mod:`headwise._rows`' column form) at
~10 GB/s of weights read, compute-bound; a single core reads ~19 GB/s. ``rows_matmul.c`` (beside
this file) reads two rows of ``W`` at a time, multiplies them with every row of ``x``, and
prefetches ahead along ``W``: SmolLM2-135M's matrices at batch 4, one thread, 14-15 GB/s
(``benchmarks/RESULTS.md``, session 10).

How. The first call compiles the source with the C compiler (``$CC``, else ``cc`` / ``gcc``;
``-O3 -mavx2 -mfma -fopenmp``) into ``$HEADWISE_CACHE`` (default ``~/.cache/headwise``), under
a name that hashes the source and flags, written to a temporary file and renamed into place, so
concurrent first calls never load a half-written library; later processes load it at once. It
splits output features over ``torch.get_num_threads()`` OpenMP threads, in the OpenMP runtime
torch has already loaded (``libgomp.so.1``).

When not. Anything else takes the MKL path, with the same result up to float32 rounding: no
x86-64 CPU with AVX2 and FMA, no compiler or a failed build (:func:`status` says why), the
environment variable ``HEADWISE_NATIVE=0``, tensors that are not float32 on the CPU, rows that
are not contiguous, autograd (no backward exists), torch.compile.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

__all__ = ["ROWS", "rows_matmul", "status"]

SOURCE = Path(__file__).with_name("rows_matmul.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
ROWS = 4  # the kernel's most rows

_lock = threading.Lock()
_state: dict = {}  # "fn": the loaded entry point or None; "why": the reason when None


def status() -> str:
    """``"ready"``, or why the kernel is not used (building it first if not tried yet)."""
    return "ready" if _kernel() is not None else _state["why"]


def rows_matmul(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                res: torch.Tensor | None = None) -> torch.Tensor | None:
    """``x (b, in) @ w (out, in)^T + bias (out,) + res (b, out)`` -> a new ``(b, out)``, for
    ``b`` in 1 .. :data:`ROWS`; None when the kernel does not apply (module docstring): the
    caller then multiplies as usual."""
    if not 1 <= x.shape[0] <= ROWS or not _takes(x, w, bias, res):
        return None
    fn = _kernel()
    if fn is None:
        return None
    (b, n), out = x.shape, w.shape[0]
    y = torch.empty(b, out)
    fn(x.data_ptr(), x.stride(0), w.data_ptr(), w.stride(0), y.data_ptr(), out,
       None if res is None else res.data_ptr(), 0 if res is None else res.stride(0),
       None if bias is None else bias.data_ptr(), b, out, n, torch.get_num_threads())
    return y


def _takes(x, w, bias, res) -> bool:
    """Float32 CPU tensors the kernel can read as they are, with nothing to differentiate."""
    ts = [t for t in (x, w, bias, res) if t is not None]
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in ts):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in ts):
        return False
    if torch.compiler.is_compiling() or x.dim() != 2 or w.dim() != 2:
        return False
    b, n = x.shape
    return (w.shape[1] == n and x.stride(1) == 1 and w.stride(1) == 1
            and (bias is None or (bias.shape == (w.shape[0],) and bias.is_contiguous()))
            and (res is None or (res.shape == (b, w.shape[0]) and res.stride(1) == 1)))


def _kernel():
    """The loaded entry point, or None with ``_state["why"]`` set; built once per process."""
    if "fn" not in _state:
        with _lock:
            if "fn" not in _state:
                try:
                    _state["fn"] = _load()
                except (OSError, subprocess.SubprocessError) as e:
                    _state.update(fn=None, why=f"could not build or load {SOURCE.name}: {e}")
    return _state["fn"]


def _load():
    if os.environ.get("HEADWISE_NATIVE", "1") == "0":
        return _off("HEADWISE_NATIVE=0")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return _off(f"not an x86-64 CPU ({platform.machine()})")
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return _off(f"no AVX2/FMA (torch reports {torch.backends.cpu.get_cpu_capability()})")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return _off("no C compiler (cc or gcc) on PATH")
    src = SOURCE.read_bytes()
    key = hashlib.sha256(src + " ".join(FLAGS).encode()).hexdigest()[:16]
    root = Path(os.environ.get("HEADWISE_CACHE") or Path.home() / ".cache" / "headwise")
    path = root / f"rows_matmul-{key}.so"
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            built = Path(tmp) / path.name
            run = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(built)],
                                 capture_output=True, text=True, timeout=300)
            if run.returncode != 0:
                return _off(f"{cc} failed: {run.stderr.strip()[-300:]}")
            os.replace(built, path)  # atomic: another process sees all of it or nothing
    fn = ctypes.CDLL(str(path)).headwise_rows_matmul
    fn.restype = ctypes.c_int
    ptr, long = ctypes.c_void_p, ctypes.c_long
    fn.argtypes = [ptr, long, ptr, long, ptr, long, ptr, long, ptr, ctypes.c_int, long, long,
                   ctypes.c_int]
    return fn


def _off(why: str):
    _state["why"] = why
    return None
