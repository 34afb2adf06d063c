"""The decoding step's C kernels, built on first use: the product of 1 to 4 rows, the attention
of one new query per row over the cache, RoPE (bit for bit :meth:`headwise.rope.RotaryEmbedding.
rotate`) and RMSNorm on rows (one call each instead of four or five small torch kernels).

Why. A cached decoding step multiplies a few rows ``x (b, in)`` by every weight matrix, read once,
so the product should run at the speed memory delivers them (:mod:`headwise.fast.roof`); MKL's
float32 kernels are built for many rows and stream a few rows' matrices well below that, where
``step_kernels.c`` streams them faster (``benchmarks/RESULTS.md``, the ``generate`` sections).
The newest query's attention (SDPA's 1-query call pays a large fixed cost per layer) is a vector
exp over 4 keys' scores at a time; ``_plan.c`` runs a bound run of them as one (:mod:`.plan`).

How. The first call compiles :data:`SOURCES` (``-O3 -mavx2 -mfma -ffp-contract=off -fopenmp``:
each product and sum rounded on its own) with :func:`headwise.fast.build.target`'s compiler into
its path, in a thread the first call waits :data:`WAIT_S` for: past that the process keeps the
torch path, and the compiler is killed after :data:`BUILD_TIMEOUT_S` or at exit
(:mod:`headwise.fast.build`). A cached library is loaded only once its stamp verifies (else it
is rebuilt: :func:`headwise.fast.build.verify`). The kernels split output features over
``torch.get_num_threads()`` OpenMP threads (torch's ``libgomp``). bfloat16, 4-bit and 8-bit
weights (``step_kernels_bf16.c``, ``_q4.c``, ``_q8.c``) run AVX-512 (with AVX512-BF16's
``vdpbf16ps``) where CPU and OS have it, else AVX2 (:func:`isa`; ``HEADWISE_NATIVE_ISA=avx2``);
``_self.c`` runs RoPE, the cache write and the attention of a step's layer as one call.

When not (the torch path: the same result up to float32 rounding): no x86-64 CPU with AVX2 and
FMA, no compiler or a failed build (:func:`status`), ``HEADWISE_NATIVE=0``, tensors not float32
(or bfloat16 where a kernel has it) on the CPU, rows not contiguous, autograd, torch.compile;
a declined product's reason is kept (:func:`declined`).
"""

from __future__ import annotations

import os
import platform
import subprocess
import threading
from pathlib import Path

import torch

from headwise.fast import applies, build, host

__all__ = ["ISA_ENV", "ROWS", "Product", "attend_rows", "decline", "declined", "fits", "isa",
           "library", "q4_matmul", "q4_product", "q8_matmul", "rms_fits", "rms_rows",
           "rope_rows", "rows_matmul", "self_fits", "self_rows", "status", "takes", "use_isa"]

SOURCE = Path(__file__).with_name("step_kernels.c")
# the library's sources: SOURCE, the bfloat16, 4-bit and 8-bit kernels, their shared header
SOURCES = (SOURCE, *(SOURCE.with_name(f"step_kernels_{k}.c")
                     for k in ("bf16", "q4", "q8", "self", "plan")),
           SOURCE.with_suffix(".h"), SOURCE.with_name("step_kernels_attend.inc"))
ISA_ENV, ISAS = "HEADWISE_NATIVE_ISA", ("auto", "avx2")  # auto (default): the widest path
FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-lm")
ROWS = 4  # the kernel's most rows
# A build takes a few seconds of CPU, more on a loaded machine: the first call waits this long
# for it; past that the process keeps the torch path and the build finishes in the background.
WAIT_S = 8.0
BUILD_TIMEOUT_S = 120  # then the compiler and its children are killed

_F32, _BF16, _U8, _I8, _F16 = torch.float32, torch.bfloat16, torch.uint8, torch.int8, torch.float16
_lock = threading.Lock()
# "fn": the library (a ctypes.CDLL) or None; "why": the reason when None; "wide": 1 for the
# AVX512-BF16 path, 0 for AVX2; "f16c": float16 conversions (4-bit kernels); "stale": why the
# cached library was rebuilt; "thread", "proc", "failed": the build, its compiler, why it failed
_state: dict = {}
_declined: dict[str, str] = {}  # kernel -> why it first declined a product it was asked for


def status(wait: float = 0.0) -> str:
    """``"ready"``, or why the kernel is not used, in one line (building it first if not tried
    yet). A build still under way is waited for at most ``wait`` s: by default not at all, so
    a line that reports it (``headwise chat``'s roof) never waits for a hung compiler."""
    if _kernel() is None and (t := _state.get("thread")) is not None and wait > 0:
        t.join(wait)
        with _lock:
            _state.update(_settle(0.0))
    return "ready" if _kernel() is not None else _state["why"]


def isa() -> str | None:
    """The path the bfloat16, 4-bit and 8-bit products run: ``"avx512-bf16"`` or ``"avx2"``
    (None without the library: :func:`status` says why)."""
    return None if _kernel() is None else "avx512-bf16" if _state["wide"] else "avx2"


def use_isa(name: str) -> None:
    """From now on in this process, run the bfloat16 and 4-bit kernels on path ``name`` as
    :data:`ISA_ENV` would have from the start (a benchmark's rows on each path)."""
    if name not in ISAS:
        raise ValueError(f"use_isa: expected one of {ISAS}, got {name!r}")
    os.environ[ISA_ENV] = name
    with _lock:  # (settled again at the next call: the library is loaded once)
        _state.pop("fn", None)


def library():
    """``(the loaded library, "wide", "f16c")`` as the wrappers pass them, or None."""
    return None if _kernel() is None else (_state["fn"], _state["wide"], _state["f16c"])


def declined() -> dict[str, str]:
    """For each kernel that declined a product it was asked for, the first reason (the caller
    then ran torch's kernel), e.g. ``{"q4_matmul": "more than 4 rows"}``."""
    return dict(_declined)


def decline(kernel: str, why: str) -> None:
    """Keep ``why`` as ``kernel``'s reason to decline a product, if it is its first
    (:func:`declined`)."""
    _declined.setdefault(kernel, why)


def rows_matmul(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                res: torch.Tensor | None = None, *, wt: bool = False) -> torch.Tensor | None:
    """``x (b, in) @ w (out, in)^T + bias (out,) + res (b, out)`` -> a new ``(b, out)``, for
    ``b`` in 1 .. :data:`ROWS` with ``w``'s rows contiguous, all float32 or all bfloat16 (float32
    sums, rounded once); with ``wt=True``, one float32 row times ``w`` given as ``W^T (in,
    out)`` with contiguous rows (a :func:`headwise.fast.rows.lay_out` storage or a copy). None
    when the kernel does not apply (module docstring): the caller multiplies as usual."""
    why = takes(x, w, bias, res, wt)
    lib = None if why else _kernel()
    if lib is None:
        return decline("rows_matmul", why or _state["why"])
    (b, n), out = x.shape, w.shape[1] if wt else w.shape[0]
    y = torch.empty(b, out) if x.dtype is _F32 else torch.empty(b, out, dtype=_BF16)
    bias_ptr = None if bias is None else bias.data_ptr()
    res_ptr, ldr = (None, 0) if res is None else (res.data_ptr(), res.stride(0))
    if wt:
        lib.headwise_row_matmul_t(
            x.data_ptr(), w.data_ptr(), w.stride(0), y.data_ptr(), res_ptr, bias_ptr, out, n,
            torch.get_num_threads())
        return y
    args = (x.data_ptr(), x.stride(0), w.data_ptr(), w.stride(0), y.data_ptr(), out, res_ptr,
            ldr, bias_ptr, b, out, n, torch.get_num_threads())
    if x.dtype is _F32:
        lib.headwise_rows_matmul(*args)
    else:
        lib.headwise_rows_matmul_bf16(*args, _state["wide"])
    return y


def q4_matmul(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
              mins: torch.Tensor | None, bias: torch.Tensor | None = None,
              res: torch.Tensor | None = None) -> torch.Tensor | None:
    """``x (b, in) @ W^T + bias (out,) + res (b, out)`` -> a new float32 ``(b, out)`` for float32
    rows (any number: a prompt's in fours per block of W), ``W`` held as a
    :class:`headwise.fast.int4.Int4`'s ``codes (out, in / 2)``, ``scales, mins (out, in / 32)``
    (its layout). ``x`` is rounded to bfloat16 (as torch's int4 kernel does), the sums are
    float32. With ``mins`` None, :func:`q8_matmul`. None when the kernel does not apply. A
    matrix multiplied often binds its product once instead (:func:`q4_product`)."""
    product = q4_product(codes, scales, mins)
    return None if product is None else product(x, bias, res)


def q8_matmul(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
              bias: torch.Tensor | None = None, res: torch.Tensor | None = None):
    """:func:`q4_matmul` for 1 to :data:`ROWS` rows and ``W`` held as a :class:`headwise.fast.
    q8.Q8`'s ``codes (out, in)`` int8, ``scales (out, in / 32)`` float16: the products of the
    float32 matrix they dequantize to (exactly; ``x`` as it is), float32 sums."""
    return q4_matmul(x, codes, scales, None, bias, res)


def q4_product(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None):
    """:func:`q4_matmul` (``mins`` None: :func:`q8_matmul`) bound to one matrix: a
    :class:`Product`, its form checked and its addresses read once, here, not at every call
    (a fixed cost that shows on a small matrix). None, with the reason in :func:`declined`, when
    the tensors are not the 4-bit (8-bit) form of a matrix on the CPU. Their addresses are read
    at each call (a deep copy of the product multiplies by its own copies)."""
    name = "q4_matmul" if mins is not None else "q8_matmul"
    coded = (scales,) if mins is None else (scales, mins)
    out = codes.shape[0] if codes.dim() == 2 else 0
    n = codes.shape[-1] * (1 if mins is None else 2)
    if (codes.dim() != 2 or n % 32 or codes.dtype is not (_I8 if mins is None else _U8)
            or any(t.dtype is not _F16 or t.shape != (out, n // 32) for t in coded)
            or not all(t.is_contiguous() for t in (codes, *coded)) or not host(codes, *coded)):
        return decline(name, f"codes and scales are not the {8 if mins is None else 4}-bit "
                              "form of a matrix")
    return Product(name, (codes, *coded), out, n, ROWS if mins is None else None)


class Product:
    """A 4-bit or 8-bit matrix's product bound by :func:`q4_product`: ``(x (b, in), bias
    (out,) | None, res (b, out) | None) -> (b, out)`` float32, or None where the kernel
    declines (the reason in :func:`declined`)."""

    __slots__ = ("name", "fields", "out", "n", "most")

    def __init__(self, name: str, fields: tuple, out: int, n: int, most: int | None):
        self.name, self.fields, self.out, self.n, self.most = name, fields, out, n, most

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None,
                 res: torch.Tensor | None = None) -> torch.Tensor | None:
        out, n = self.out, self.n
        why = self.takes(x, bias, res)
        lib = None if why else _kernel()
        if lib is None or not _state["f16c"]:
            return decline(self.name, why or _state["why"] or "this CPU has no F16C")
        b = x.shape[0]
        y = torch.empty(b, out)
        failed = getattr(lib, "headwise_" + self.name)(
            x.data_ptr(), x.stride(0), *[t.data_ptr() for t in self.fields], y.data_ptr(), out,
            *((None, 0) if res is None else (res.data_ptr(), res.stride(0))),
            None if bias is None else bias.data_ptr(), b, out, n, torch.get_num_threads(),
            _state["wide"])
        return decline(self.name, "no scratch memory for the rows") if failed else y

    def takes(self, x: torch.Tensor, bias, res) -> str:
        """Why the kernel cannot take these rows (``""``: it can)."""
        why = fits(x, self.n, self.out, bias, res, self.most or (x.shape[0] if x.dim() else 1))
        if not why and not (applies(x) if bias is None and res is None else
                            applies(x, *[t for t in (bias, res) if t is not None])):
            why = "x, bias or the residual is not float32 on the CPU without autograd"
        return why


def rope_rows(rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, d: int,
              r: int) -> bool | None:
    """RoPE on the first ``heads`` heads of ``d`` features of each row of ``rows (b, width)``
    (a q|k or q|k|v projection: q and k heads first), in place, by ``cos, sin`` ``(1, 2, r/2)``
    (:meth:`~headwise.rope.RotaryEmbedding.angles`), all float32 or all bfloat16, bit for bit
    what :meth:`~headwise.rope.RotaryEmbedding.rotate` computes; returns whether every feature
    of every row is finite afterwards. None (nothing done) when the kernel does not apply."""
    tables = (cos, sin)
    if (rows.dim() != 2 or rows.stride(1) != 1 or heads * d > rows.shape[1]
            or not applies(rows, *tables, bf16=True)
            or any(t.numel() != r or not t.is_contiguous() for t in tables)):
        return None
    if (lib := _kernel()) is None:
        return None
    fn = lib.headwise_rope_rows if rows.dtype is _F32 else lib.headwise_rope_rows_bf16
    return bool(fn(rows.data_ptr(), rows.shape[0], rows.stride(0), heads, d, r, cos.data_ptr(),
                   sin.data_ptr(), rows.shape[1]))


def rms_rows(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor | None:
    """RMSNorm of rows ``x (b, m)`` with weight ``w (m,)`` -> a new ``(b, m)``, both float32 or
    both bfloat16 (then in :class:`headwise.models.norms.RMSNorm`'s order: the normalised row
    rounded to bfloat16 before ``w`` multiplies it); None when the kernel does not apply."""
    if not rms_fits(x, w) or (lib := _kernel()) is None:
        return None
    y = torch.empty(x.shape[0], x.shape[1], dtype=x.dtype)
    fn = lib.headwise_rms_rows if x.dtype is _F32 else lib.headwise_rms_rows_bf16
    fn(x.data_ptr(), x.shape[0], x.stride(0), w.data_ptr(), eps, x.shape[1], y.data_ptr())
    return y


def rms_fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether :func:`rms_rows` takes ``x`` and ``w``."""
    return (x.dim() == 2 and x.stride(1) == 1 and w.shape == (x.shape[1],) and w.is_contiguous()
            and applies(x, w, bf16=True))


def attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
    """Attention of one new query per row over every cached position, no mask, scale
    ``1/sqrt(d)``: ``q (b, h, 1, d)`` (heads ``d`` apart, e.g. a view of a fused q|k|v row),
    ``k, v (b, g, n, d)`` with ``g`` dividing ``h`` (grouped-query heads; views of a cache, the
    same strides), all float32 or all bfloat16 -> a new ``(b, h*d)`` in their dtype; what
    ``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)`` returns, to float32 rounding
    (its exp a ~1 ulp polynomial; bfloat16 read as float32, the output rounded once). Finite
    inputs only: the caller has checked them (the step's NaN policy), since a NaN is not spread
    as :func:`headwise.attend.fused.checked` says. None when the kernel does not apply."""
    b, h, i, d = q.shape
    g, n = k.shape[1], k.shape[2]
    if (i != 1 or k.dim() != 4 or k.shape != v.shape or k.shape[0] != b or k.shape[3] != d
            or n < 1 or h % g or q.stride(3) != 1 or q.stride(1) != d or k.stride() != v.stride()
            or k.stride(3) != 1 or not applies(q, k, v, bf16=True)):
        return None
    if (lib := _kernel()) is None:
        return None
    half = k.dtype is _BF16
    if half:
        q = q.float()  # (b, h, 1, d): a few hundred values; the cache is read as it is
    out = torch.empty(b, h * d)
    failed = (lib.headwise_attend_rows_bf16 if half else lib.headwise_attend_rows)(
        q.data_ptr(), q.stride(0), k.data_ptr(), v.data_ptr(), *k.stride()[:3], b, h, g, n, d,
        d ** -0.5, out.data_ptr(), h * d, torch.get_num_threads())
    return None if failed else out.to(_BF16) if half else out


def self_rows(rows: torch.Tensor, rot, k: torch.Tensor, v: torch.Tensor, pos: int, start: int,
              heads: int, r: int, attend: bool) -> tuple[int, torch.Tensor | None] | None:
    """:func:`rope_rows` (``r`` features of ``rot = (cos, sin)``; ``r = 0``, ``rot`` None: no
    RoPE), the write of each row's k and v into the cache ``k, v (b, g, L, d)`` at ``pos``, and,
    with ``attend``, :func:`attend_rows` of the rows' queries over positions ``start .. pos``,
    in one call (``step_kernels_self.c``), bit for bit those functions' values. ``rows (b,
    (heads + 2 g) d)``: a fused q|k|v projection, all float32 or all bfloat16. Returns ``(2,
    out (b, heads*d))`` when it attended, ``(1, None)`` when the rows are finite but it did not
    (``attend`` False, or no scratch memory), ``(0, None)`` when they are not finite (k and v
    are written either way); None, with nothing done, when the kernel does not apply."""
    b, g, n, d = k.shape
    if not self_fits(rows, rot, k, v, pos, start, heads, r) or (lib := _kernel()) is None:
        return None
    out = torch.empty(b, heads * d) if attend else None
    got = lib.headwise_self_rows(
        rows.data_ptr(), b, rows.stride(0), heads, g, d, r,
        *((None, None) if rot is None else (rot[0].data_ptr(), rot[1].data_ptr())),
        rows.element_size(), k.data_ptr(), v.data_ptr(), *k.stride()[:3], pos, start, attend,
        d ** -0.5, None if out is None else out.data_ptr(), heads * d, torch.get_num_threads())
    if got != 2:  # (-1: no scratch memory, after finding the rows finite)
        return (1 if got < 0 else got), None
    return 2, out if rows.dtype is _F32 else out.to(_BF16)


def self_fits(rows, rot, k, v, pos: int, start: int, heads: int, r: int) -> bool:
    """Whether :func:`self_rows` takes these arguments."""
    (b, g, n, d), tables = k.shape, () if rot is None else rot
    return not (rows.dim() != 2 or rows.stride(1) != 1 or rows.shape != (b, (heads + 2 * g) * d)
                or k.stride() != v.stride() or k.shape != v.shape or k.stride(3) != 1
                or heads % g or not 0 <= start <= pos < n or (r > 0) is not (rot is not None)
                or any(t.numel() != r or not t.is_contiguous() for t in tables)
                or not applies(rows, k, v, *tables, bf16=True))


def takes(x, w, bias, res, wt: bool) -> str:
    """Why :func:`rows_matmul` cannot take these tensors (``""``: it can): on the CPU (asked
    first: a device's step asks ~10 times a layer), ``w (out, in)`` with contiguous rows (``(in,
    out)`` for one float32 row when ``wt``), rows as :func:`fits` says, :func:`applies`."""
    if not host(x):
        return "not on the CPU"
    if w.dim() != 2 or w.stride(1) != 1:
        return "W is not 2-D with contiguous rows"
    out, n_in = w.shape
    if wt:
        out, n_in = n_in, out
    why = fits(x, n_in, out, bias, res, 1 if wt else ROWS)
    if not why and wt and x.dtype is not _F32:
        return "a W^T storage is multiplied for float32 rows only"
    if not why and not applies(x, w, *[t for t in (bias, res) if t is not None], bf16=True):
        return "not all float32 or all bfloat16 on the CPU without autograd"
    return why


def fits(x, n_in: int, out: int, bias, res, most: int = ROWS) -> str:
    """Why ``x``, ``bias``, ``res`` do not fit a product ``(b <= most, n_in) -> (b, out)``."""
    if x.dim() != 2 or x.stride(1) != 1:
        return f"x is not (b, {n_in}) with contiguous rows"
    b, n = x.shape
    if n != n_in or not 0 < b <= most:
        return f"x is not (b, {n_in}) with b <= {most}"
    if bias is not None and (bias.shape != (out,) or not bias.is_contiguous()):
        return "bias is not a contiguous (out,)"
    if res is not None and (res.shape != (b, out) or res.stride(1) != 1):
        return "the residual is not (b, out) with contiguous rows"
    return ""


def _kernel():
    """The loaded library, or None with ``_state["why"]`` set; settled once per process."""
    if "fn" not in _state:
        with _lock:
            if "fn" not in _state:
                _state.update(_settle(WAIT_S))
    return _state["fn"]


def _settle(wait: float) -> dict:
    """``{"fn": library or None, "why": reason}``, waiting at most ``wait`` s for a build: the
    cached library once verified, else rebuilt (:func:`headwise.fast.build.ensure`)."""
    try:
        found = _compiler()
        if not isinstance(found, tuple):
            return {"fn": None, "why": found}
        lib, why, stale = build.ensure(*found, SOURCES, FLAGS, SIGNATURES, _state, wait=wait,
                                       timeout=BUILD_TIMEOUT_S)
        if lib is None:
            return {"fn": None, "why": why}
        features = lib.headwise_features()  # bit 0: F16C, bit 1: the AVX512-BF16 path
        wide = features >> 1 & 1 and os.environ.get(ISA_ENV, "auto") != "avx2"
        return {"fn": lib, "why": "", "wide": int(wide), "f16c": features & 1, "stale": stale}
    except (OSError, AttributeError, subprocess.SubprocessError) as e:  # (a missing symbol)
        return {"fn": None, "why": f"could not build or load {SOURCE.name}: {e}"}


def _compiler():
    """``(cc, library path)``, or the reason the kernel cannot be used here."""
    if os.environ.get("HEADWISE_NATIVE", "1") == "0":
        return "HEADWISE_NATIVE=0"
    if os.environ.get(ISA_ENV, "auto") not in ISAS:
        return (f"{ISA_ENV}={os.environ[ISA_ENV]!r}: expected one of {', '.join(ISAS)}; unset it "
                "or set it to avx2 to force the AVX2 path")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"not an x86-64 CPU ({platform.machine()})"
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return f"no AVX2/FMA (torch reports {torch.backends.cpu.get_cpu_capability()})"
    return build.target(SOURCES, FLAGS)


# the library's functions and C signatures (build.TYPES; the letter after ":" the result)
SIGNATURES = {"headwise_rows_matmul": "plplplplpilli:i", "headwise_features": ":i",
              "headwise_rows_matmul_bf16": "plplplplpillii:i", "headwise_plan_run": "plllii:l",
              "headwise_q4_matmul": "plpppplplpillii:i", "headwise_q8_matmul": "plppplplpillii:i",
              "headwise_row_matmul_t": "pplppplli:", "headwise_rope_rows": "plllllppl:i",
              "headwise_rope_rows_bf16": "plllllppl:i", "headwise_rms_rows": "pllpflp:",
              "headwise_rms_rows_bf16": "pllpflp:", "headwise_attend_rows": "plppllllllllfpli:i",
              "headwise_attend_rows_bf16": "plppllllllllfpli:i",
              "headwise_self_rows": "pllllllppipplllllifpli:i"}
