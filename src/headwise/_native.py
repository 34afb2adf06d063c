"""The decoding step's C kernels, built on first use: the product for 2 to 4 rows, and RoPE and
RMSNorm on rows (one call each instead of four or five small torch kernels, ~2.5% of a
SmolLM2 step at batch 1; RoPE bit for bit :meth:`headwise.rope.RotaryEmbedding.rotate`).

Why. A cached decoding step at batch 2-4 multiplies a few rows ``x (b, in)`` by every weight
matrix: the weights are read once, so the product should run at the speed memory delivers
them. MKL's float32 kernels for so few rows do not: on this project's CPUs (AMD EPYC, AVX2)
``x @ W^T`` runs at ~25 GFLOP/s and ``W @ x^T`` (:mod:`headwise._rows`' column form) at
~10 GB/s of weights read, compute-bound; a single core reads ~19 GB/s. ``step_kernels.c`` (beside
this file) reads two rows of ``W`` at a time, multiplies them with every row of ``x``, and
prefetches ahead along ``W``: SmolLM2-135M's matrices at batch 4, one thread, 14-15 GB/s
(``benchmarks/RESULTS.md``, session 10).

How. The first call compiles the source with the C compiler (``$CC``, else ``cc`` / ``gcc``;
``-O3 -mavx2 -mfma -ffp-contract=off -fopenmp``: each product and sum rounded on its own) into ``$HEADWISE_CACHE`` (default ``~/.cache/headwise``), under
a name that hashes the source and flags, written to a temporary file and renamed into place, so
concurrent first calls never load a half-written library; later processes load it at once. It
splits output features over ``torch.get_num_threads()`` OpenMP threads, in the OpenMP runtime
torch has already loaded (``libgomp.so.1``).

When not. Anything else takes the torch path (MKL; the same result up to float32 rounding): no
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

__all__ = ["ROWS", "rms_rows", "rope_rows", "rows_matmul", "status"]

SOURCE = Path(__file__).with_name("step_kernels.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-lm")
ROWS = 4  # the kernel's most rows

_lock = threading.Lock()
_state: dict = {}  # "fn": the loaded library (ctypes.CDLL) or None; "why": the reason when None


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
    lib = _kernel()
    if lib is None:
        return None
    (b, n), out = x.shape, w.shape[0]
    y = torch.empty(b, out)
    lib.headwise_rows_matmul(
        x.data_ptr(), x.stride(0), w.data_ptr(), w.stride(0), y.data_ptr(), out,
        None if res is None else res.data_ptr(), 0 if res is None else res.stride(0),
        None if bias is None else bias.data_ptr(), b, out, n, torch.get_num_threads())
    return y


def rope_rows(rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, d: int,
              r: int) -> bool | None:
    """RoPE on the first ``heads`` heads of ``d`` features of each row of ``rows (b, width)``
    (a fused q|k|v projection: q and k heads first), in place, by ``cos, sin`` ``(1, 2, r/2)``
    (:meth:`~headwise.rope.RotaryEmbedding.angles`), bit for bit what
    :meth:`~headwise.rope.RotaryEmbedding.rotate` computes; returns whether every feature of
    every row is finite afterwards. None (nothing done) when the kernel does not apply."""
    tables = (cos, sin)
    if (rows.dim() != 2 or rows.stride(1) != 1 or heads * d > rows.shape[1]
            or not _takes_rows(rows, *tables)
            or any(t.numel() != r or not t.is_contiguous() for t in tables)):
        return None
    lib = _kernel()
    if lib is None:
        return None
    return bool(lib.headwise_rope_rows(rows.data_ptr(), rows.shape[0], rows.stride(0), heads, d,
                                       r, cos.data_ptr(), sin.data_ptr(), rows.shape[1]))


def rms_rows(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor | None:
    """RMSNorm of rows ``x (b, m)`` with weight ``w (m,)`` -> a new ``(b, m)``; None when the
    kernel does not apply."""
    if (x.dim() != 2 or x.stride(1) != 1 or w.shape != (x.shape[1],) or not w.is_contiguous()
            or not _takes_rows(x, w)):
        return None
    lib = _kernel()
    if lib is None:
        return None
    y = torch.empty(x.shape)
    lib.headwise_rms_rows(x.data_ptr(), x.shape[0], x.stride(0), w.data_ptr(), eps, x.shape[1],
                          y.data_ptr())
    return y


def _takes_rows(*ts) -> bool:
    """Float32 CPU tensors with nothing to differentiate, outside torch.compile."""
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in ts):
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in ts)
                or torch.compiler.is_compiling())


def _takes(x, w, bias, res) -> bool:
    """:func:`_takes_rows` tensors of the product's shapes, read as they are (rows contiguous)."""
    if not _takes_rows(*(t for t in (x, w, bias, res) if t is not None)):
        return False
    if x.dim() != 2 or w.dim() != 2:
        return False
    b, n = x.shape
    return (w.shape[1] == n and x.stride(1) == 1 and w.stride(1) == 1
            and (bias is None or (bias.shape == (w.shape[0],) and bias.is_contiguous()))
            and (res is None or (res.shape == (b, w.shape[0]) and res.stride(1) == 1)))


def _kernel():
    """The loaded library, or None with ``_state["why"]`` set; built once per process."""
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
    path = root / f"step_kernels-{key}.so"
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            built = Path(tmp) / path.name
            run = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(built)],
                                 capture_output=True, text=True, timeout=300)
            if run.returncode != 0:
                return _off(f"{cc} failed: {run.stderr.strip()[-300:]}")
            os.replace(built, path)  # atomic: another process sees all of it or nothing
    lib = ctypes.CDLL(str(path))
    ptr, long, i32 = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    for name, args, result in (
            ("headwise_rows_matmul",
             [ptr, long, ptr, long, ptr, long, ptr, long, ptr, i32, long, long, i32], i32),
            ("headwise_rope_rows", [ptr, long, long, long, long, long, ptr, ptr, long], i32),
            ("headwise_rms_rows", [ptr, long, long, ptr, ctypes.c_float, long, ptr], None)):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return lib


def _off(why: str):
    _state["why"] = why
    return None
