"""A decoding step's kernel calls bound once and run as one C call per stretch: a plan.

Axis legend: ``b`` rows, ``m`` model dim, ``in`` / ``out`` a product's features.

Why. A cached decoding step of a small model is a few hundred short kernel calls (SmolLM2-135M
in 4-bit: ~120 products, ~60 RMSNorms, 30 self-attentions), and each call's Python around it
(the wrapper's checks, an output ``torch.empty``, a 16-argument ctypes conversion, the row
forms' dispatch) costs about as long again: a large share of the step (measured:
``benchmarks/RESULTS.md``, ``generate``). What those
calls pass does not change from step to step except the position and the thread count: their
checks can be made once, their outputs written into buffers kept for the generation, and a
stretch of them run by one C call (``step_kernels_plan.c``).

How. :class:`Plan` holds a table of ops, one row of :data:`WIDTH` longs each: the kernel
(:data:`KINDS`) and the arguments its :mod:`headwise.fast.native` wrapper passes, found by that
wrapper's own checks (:func:`~headwise.fast.native.takes`, :func:`~headwise.fast.native.rms_fits`,
:meth:`~headwise.fast.native.Product.takes`, :func:`~headwise.fast.native.self_fits`); a binder
returns False where the wrapper would decline. The ops are the components' row forms bound to
buffers (:meth:`headwise.decode.block.BlockRow.bind`): the step strings them together as it
strings the row forms, so there is one description of the math. The C side calls the same
kernels with the same arguments: bit for bit the unbound step. A run stops at the first op that
does not succeed (a self-attention whose rows are not finite, no scratch memory) and says which:
the caller redoes that op's layer unbound (every op writes only buffers, or the cache at the
new position with the same values, so a layer can be run again).
"""

from __future__ import annotations

import ctypes
import functools
import struct
from pathlib import Path

import torch

from headwise.fast import host
from headwise.fast import native as _native

__all__ = ["KINDS", "WIDTH", "Plan"]

# the ops' kinds, numbered as step_kernels_plan.c numbers them
KINDS = {"rms": 1, "rms_bf16": 2, "rows": 3, "rows_bf16": 4, "row_t": 5, "q4_matmul": 6,
         "q8_matmul": 7, "self": 8, "to_bf16": 9, "silu_mul": 10}
WIDTH = 24  # longs per op


def _bits(v: float) -> int:
    """A float's double bits as a signed long (the C side reads them back and rounds once)."""
    return struct.unpack("<q", struct.pack("<d", v))[0]


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


class Plan:
    """Ops bound for ``rows`` rows, cut into stretches (:meth:`cut`), each run by one call
    (:meth:`run`). ``owner`` names, for each op, the layer that made it (:attr:`layer` when it
    was added): where a run stops, that layer is redone unbound."""

    def __init__(self, rows: int):
        self.rows, self.layer = rows, 0
        self.ops: list[list[int]] = []
        self.owner: list[int] = []
        self.cuts = [0]
        self.keep: list[torch.Tensor] = []  # what the ops point into
        self.table = None
        self._buffers: dict = {}

    def buffer(self, name: str, width: int, dtype: torch.dtype) -> torch.Tensor:
        """A ``(rows, width)`` buffer for ``name``, the same one each time it is asked for."""
        key = name, width, dtype
        if key not in self._buffers:
            self._buffers[key] = torch.empty(self.rows, width, dtype=dtype)
        return self._buffers[key]

    def _add(self, kind: str, args, keep) -> bool:
        assert len(args) < WIDTH
        self.ops.append([KINDS[kind], *(int(a) for a in args)])
        self.owner.append(self.layer)
        self.keep.extend(t for t in keep if t is not None)
        return True

    def cut(self) -> None:
        """End a stretch here."""
        self.cuts.append(len(self.ops))

    def rms(self, x: torch.Tensor, w: torch.Tensor, eps: float, y: torch.Tensor) -> bool:
        """``y = native.rms_rows(x, w, eps)``."""
        if not _native.rms_fits(x, w) or not _fresh(y, x.shape, x.dtype):
            return False
        kind = "rms" if x.dtype is torch.float32 else "rms_bf16"
        return self._add(kind, (_ptr(x), x.shape[0], x.stride(0), _ptr(w), _bits(eps),
                                x.shape[1], _ptr(y)), (x, w, y))

    def matmul(self, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, bias=None, res=None,
               *, wt: bool = False) -> bool:
        """``y = native.rows_matmul(x, w, bias, res, wt=wt)``."""
        if _native.takes(x, w, bias, res, wt):
            return False
        (b, n), out = x.shape, w.shape[1] if wt else w.shape[0]
        if not _fresh(y, (b, out), x.dtype):
            return False
        if wt:
            return self._add("row_t", (_ptr(x), _ptr(w), w.stride(0), _ptr(y), _ptr(res),
                                       _ptr(bias), out, n), (x, w, y, bias, res))
        kind = "rows" if x.dtype is torch.float32 else "rows_bf16"
        return self._add(kind, (_ptr(x), x.stride(0), _ptr(w), w.stride(0), _ptr(y), out,
                                _ptr(res), 0 if res is None else res.stride(0), _ptr(bias), b,
                                out, n), (x, w, y, bias, res))

    def coded(self, product: _native.Product, x: torch.Tensor, y: torch.Tensor, bias=None,
              res=None) -> bool:
        """``y = product(x, bias, res)`` (a 4-bit or 8-bit matrix's bound product)."""
        lib = _native.library()
        if lib is None or not lib[2] or product.takes(x, bias, res):
            return False
        b, out = x.shape[0], product.out
        if not _fresh(y, (b, out), torch.float32):
            return False
        return self._add(product.name, (_ptr(x), x.stride(0), *map(_ptr, product.fields),
                                         _ptr(y), out, _ptr(res),
                                         0 if res is None else res.stride(0), _ptr(bias), b,
                                         out, product.n), (x, y, bias, res, *product.fields))

    def self_attention(self, rows: torch.Tensor, angles, k: torch.Tensor, v: torch.Tensor,
                       heads: int, r: int, window: int | None, pos: int,
                       out: torch.Tensor) -> bool:
        """``native.self_rows(rows, rot, k, v, pos, start, heads, r, True)`` at every later
        position ``pos`` (as of this one: ``rot`` row ``pos`` of ``angles = (cos, sin)``, ``(L,
        2, r/2)`` each or None, ``start`` the window's first position) into ``out (b,
        heads*d)`` float32; the op succeeds when it attended."""
        rot = None if angles is None else tuple(t[pos:pos + 1] for t in angles)
        b, d = rows.shape[0], k.shape[3]
        if (not _native.self_fits(rows, rot, k, v, pos, pos, heads, r)
                or not _fresh(out, (b, heads * d), torch.float32)
                or (angles is not None and any(t.stride(0) != r or not t.is_contiguous()
                                               for t in angles))):
            return False
        cos, sin = (None, None) if angles is None else angles
        return self._add("self", (_ptr(rows), b, rows.stride(0), heads, k.shape[1], d, r,
                                  _ptr(cos), _ptr(sin), r, rows.element_size(), _ptr(k),
                                  _ptr(v), *k.stride()[:3], window or 0, _bits(d ** -0.5),
                                  _ptr(out), heads * d), (rows, cos, sin, k, v, out))

    def to_bf16(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """``y = x.to(torch.bfloat16)`` (the op stops at a NaN: its bits differ among torch's
        paths)."""
        if not (_fresh(x, x.shape, torch.float32) and _fresh(y, x.shape, torch.bfloat16)):
            return False
        return self._add("to_bf16", (_ptr(x), _ptr(y), x.numel()), (x, y))

    def silu_mul(self, g: torch.Tensor, u: torch.Tensor, out: torch.Tensor) -> bool:
        """``out = torch.mul(F.silu(g), u)`` for rows ``g, u (b, f)`` (columns of one buffer,
        or two), float32 or bfloat16, with the vector exp torch's own silu calls
        (:func:`_torch_exp`), where a check against torch found the same bits (:func:`_same`).
        Only where torch takes that exp for every value: rows of whole steps of its vector loop
        (two vectors: 32 float32 or 64 bfloat16 under AVX-512; the rest of a row goes through
        the scalar ``std::exp``) and at most one thread's share (``at::internal::GRAIN_SIZE``,
        32768: a split between threads could fall inside a row)."""
        found = _torch_exp()
        step = None if found is None else 2 * found[1] * (2 if g.dtype is torch.bfloat16 else 1)
        if (found is None or not _fresh(out, g.shape, g.dtype) or u.shape != g.shape
                or g.dtype not in (torch.float32, torch.bfloat16) or u.dtype is not g.dtype
                or g.stride() != u.stride() or g.stride(1) != 1 or g.shape[1] % step
                or g.numel() > 32768 or not _same(g.dtype)):
            return False
        return self._silu(g, u, out, found)

    def _silu(self, g, u, out, found) -> bool:
        return self._add("silu_mul", (_ptr(g), _ptr(u), g.stride(0), _ptr(out), g.shape[0],
                                      g.shape[1], g.dtype is torch.bfloat16, *found),
                         (g, u, out))

    def seal(self) -> None:
        """The ops as one table the C side reads; no more ops after this."""
        self.table = torch.tensor([op + [0] * (WIDTH - len(op)) for op in self.ops],
                                  dtype=torch.int64).reshape(-1)

    def run(self, stretch: int, pos: int, threads: int, lib) -> int:
        """Run stretch ``stretch`` at position ``pos`` with ``lib = native.library()``: -1 when
        every op ran, else the index of the op that did not (none after it ran)."""
        return lib[0].headwise_plan_run(self.table.data_ptr(), self.cuts[stretch],
                                        self.cuts[stretch + 1], pos, threads, lib[1])


@functools.cache
def _torch_exp() -> tuple[int, int] | None:
    """``(address, lanes)`` of the vector exp torch's CPU kernels call at the instruction set
    they run (Sleef's ``expf16_u10`` under AVX-512, ``expf8_u10avx2`` under AVX2: exported by
    torch's own library), or None (another build, another platform, no library)."""
    lanes = {"AVX512": 16, "AVX2": 8}.get(torch.backends.cpu.get_cpu_capability())
    if lanes is None or _native.library() is None:
        return None
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        fn = getattr(lib, "Sleef_expf16_u10" if lanes == 16 else "Sleef_expf8_u10avx2")
    except (OSError, AttributeError):
        return None
    return ctypes.cast(fn, ctypes.c_void_p).value, lanes


@functools.cache
def _same(dtype: torch.dtype) -> bool:
    """Whether the C op computes ``torch.mul(F.silu(g), u)`` bit for bit here, on 8192 values
    across silu's range (exp's underflow and overflow, the ties of bfloat16 rounding, signed
    zeros, subnormals), checked once per dtype and process."""
    gen = torch.Generator().manual_seed(0)
    g = torch.cat((torch.linspace(-110, 110, 4096), torch.randn(4064, generator=gen) * 8,
                   torch.tensor([0.0, -0.0, 1e-40, -1e-40, 88.7, -88.7, 103.9, -103.9] * 4)))
    g, u = g.to(dtype)[None], torch.randn(1, g.numel(), generator=gen).to(dtype)
    plan, out = Plan(1), torch.empty_like(g)
    plan._silu(g, u, out, _torch_exp())
    plan.cut()
    plan.seal()
    want = torch.mul(torch.nn.functional.silu(g), u)
    ok = plan.run(0, 0, 1, _native.library()) == -1 and torch.equal(  # (the bits)
        out.view(torch.int16), want.view(torch.int16))
    if not ok:
        _native.decline("silu_mul", f"the C silu * u differs from torch's in {dtype}")
    return ok


def _fresh(t: torch.Tensor, shape, dtype) -> bool:
    """Whether ``t`` is what the wrapper's ``torch.empty`` output would be: contiguous rows of
    ``shape`` and ``dtype`` on the CPU."""
    return (host(t) and t.dtype is dtype and tuple(t.shape) == tuple(shape)
            and t.is_contiguous())
