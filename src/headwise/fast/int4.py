"""4-bit weights a model holds instead of float32 matrices: :class:`Int4` (a matrix as 4-bit codes
in groups of 32 with float16 scales and minima: a GGUF's Q4_0 / Q4_1 blocks as they are) and
:class:`Int4Linear` (an ``nn.Linear`` whose weight exists only as those codes), which
:func:`headwise.pretrained.load_gguf` with ``q4=True`` builds; :mod:`headwise.fast.rows`
multiplies the decoding step's rows by them.
"""

from __future__ import annotations

import torch
from torch import nn

from headwise.fast import large as _large
from headwise.fast import native as _native

__all__ = ["BLOCK", "FIELDS", "GROUP", "Int4", "Int4Linear", "dtype_of", "joined", "pack", "place",
           "quantized", "share", "unpack"]

GROUP = 32  # input features per scale and minimum (a GGUF block)
FIELDS = ("codes", "scales", "mins")  # an Int4's tensors, one row of each per output


BLOCK = 16  # groups whose codes interleave (the kernel's one scale per lane; see :func:`pack`)


def pack(q: torch.Tensor) -> torch.Tensor:
    """``q (out, in)`` uint8 in [0, 15] -> ``codes (out, in / 2)`` uint8, each row on its own
    (rows concatenate): the order ``step_kernels_q4.c`` unpacks with shifts and masks alone.

    A row's groups of 32 go in blocks of :data:`BLOCK`, then the last ``groups % 16`` one by one:

    - a block is 256 bytes, four parts ``u`` of 64: little-endian 32-bit lane ``L`` of part
      ``u`` holds group ``L``'s weights ``8 u + 4 p + k`` in bits ``16 p + 4 k`` (``p`` in 0, 1,
      ``k`` in 0-3), so one shift and mask per ``k`` gives each lane two weights of its group;
    - a tail group is 16 bytes, eight 16-bit words: word ``j`` holds weights ``j, 8 + j,
      16 + j, 24 + j`` in bits ``0, 4, 8, 12``.
    """
    out, n = q.shape
    full = n // GROUP // BLOCK * BLOCK * GROUP
    nib = q[:, :full].reshape(out, -1, BLOCK, 4, 2, 4).permute(0, 1, 3, 2, 4, 5)  # [u L p k]
    tail = q[:, full:].reshape(out, -1, 4, 8).transpose(2, 3)  # [j k]: weight 8 k + j
    return torch.cat([(t[..., 0::2] | t[..., 1::2] << 4).reshape(out, -1) for t in (nib, tail)],
                     dim=1).contiguous()


def unpack(codes: torch.Tensor) -> torch.Tensor:
    """:func:`pack`'s inverse: ``codes (out, in / 2)`` -> ``q (out, in)`` uint8."""
    out, half = codes.shape
    full = half * 2 // GROUP // BLOCK * BLOCK * GROUP
    nibbles = torch.stack((codes & 0xF, codes >> 4), dim=-1).view(out, half * 2)
    block = nibbles[:, :full].reshape(out, -1, 4, BLOCK, 2, 4).permute(0, 1, 3, 2, 4, 5)
    tail = nibbles[:, full:].reshape(out, -1, 8, 4).transpose(2, 3)
    return torch.cat((block.reshape(out, full), tail.reshape(out, -1)), dim=1)


class Int4:
    """``W (out, in)`` as 4-bit codes ``q`` in groups of :data:`GROUP` input features,
    ``w = q * scale + min`` per (output row, group): a GGUF's Q4_1 blocks (Q4_0: ``min = -8
    scale``) without their interleaving.

    ``codes``: ``(out, in / 2)`` uint8 in :func:`pack`'s order (the kernel's: row ``o`` is
    ``codes[o]``, so rows of matrices concatenate). ``scales``, ``mins``: ``(out, in / 32)``
    float16 (the file's own values). Calling it on rows ``x (b, in)`` rounds them to bfloat16,
    multiplies with float32 sums and returns ``(b, out)`` in ``x``'s dtype, through headwise's
    kernel (:func:`headwise.fast.native.q4_matmul`, which unpacks the codes in registers), the
    same for the step's few rows and a prompt's many; where it declines (:func:`~headwise.fast.
    native.declined`), through torch's int4 kernel (``_weight_int4pack_mm_for_cpu``), whose
    packed copy is made on first use (it holds scale and zero in bfloat16: 3 fewer significant
    bits than the file's float16).
    """

    __slots__ = ("codes", "scales", "mins", "_torch", "_product", "_base")

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor):
        """``codes (out, in)`` integers in [0, 15]; ``scales, mins (out, in / 32)``."""
        out, n = codes.shape
        if n % GROUP or scales.shape != (out, n // GROUP) or mins.shape != scales.shape:
            raise ValueError(f"Int4: expected codes (out, in) with in a multiple of {GROUP} and "
                             f"scales, mins (out, in / {GROUP}), got {tuple(codes.shape)}, "
                             f"{tuple(scales.shape)}, {tuple(mins.shape)}; pad in to a "
                             f"multiple of {GROUP}")
        self.codes = pack(codes.to(torch.uint8))
        self.scales, self.mins = (t.to(torch.float16).contiguous() for t in (scales, mins))
        if not (self.scales.isfinite().all() and self.mins.isfinite().all()):
            raise ValueError("Int4: scales and mins must be finite in float16 (|x| < 65504), "
                             "got an inf or NaN; rescale the matrix")
        self._torch = None  # torch's packed form, made on first use
        self._product = None  # headwise's kernel bound to these fields, once it took them
        self._base = None  # the Int4 whose rows these are (rows())

    @classmethod
    def _of(cls, codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> Int4:
        """An :class:`Int4` over fields already in its layout (views kept as they are)."""
        self = cls.__new__(cls)
        self.codes, self.scales, self.mins = codes, scales, mins
        self._torch = self._product = self._base = None
        return self

    def rows(self, start: int, stop: int) -> Int4:
        """Output rows ``start .. stop - 1`` as an :class:`Int4` over views of these fields (no
        copy: the same codes, scales and minima)."""
        part = Int4._of(*(getattr(self, f)[start:stop] for f in FIELDS))
        part._base = self
        return part

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x)

    def product(self) -> _native.Product | None:
        """headwise's kernel bound to these codes (:func:`headwise.fast.native.q4_product`: the
        fields' form checked once, not at every product), or None where it declines (asked again
        next time, e.g. after torch.compile or fast.as_device)."""
        if self._product is None:
            self._product = _native.q4_product(self.codes, self.scales, self.mins)
        return self._product

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None,
               res: torch.Tensor | None = None) -> torch.Tensor:
        """``x (b, in) @ W^T + bias (out,) + res (b, out)`` -> ``(b, out)`` in ``x``'s dtype."""
        product = self.product()
        if product is None:
            pass
        elif x.dtype is torch.float32:
            y = product(x, bias, res)
            if y is not None:
                return y
        else:  # (bfloat16 rows: the kernel rounds them to bfloat16 again, exactly)
            y = product(x.float())
            if y is not None:
                return self._add(y.to(x.dtype), bias, res)
        if self.shape[0] % 16:  # (torch's packing takes rows in 16s: the product as a float one)
            y = x.to(torch.bfloat16).float() @ self.dequantize().t()
            return self._add(y.to(x.dtype), bias, res)
        if self._torch is None:
            zeros = self.mins.float() + 8 * self.scales.float()  # (q - 8) * scale + zero
            self._torch = (torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                self.unpacked().to(torch.int32), 1),
                torch.stack((self.scales.t().float(), zeros.t()), -1).to(torch.bfloat16))
        packed, scales_zeros = self._torch
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16), packed, GROUP, scales_zeros).to(x.dtype)
        return self._add(y, bias, res)

    @staticmethod
    def _add(y, bias, res):
        y = y if res is None else y.add_(res)
        return y if bias is None else y.add_(bias)

    @property
    def shape(self) -> tuple[int, int]:
        """``(out, in)``, as ``nn.Linear.weight``."""
        return self.codes.shape[0], self.codes.shape[1] * 2

    def unpacked(self) -> torch.Tensor:
        """The codes ``q (out, in)`` as uint8 in [0, 15]."""
        return unpack(self.codes)

    def dequantize(self) -> torch.Tensor:
        """The float32 ``W (out, in)``: ``q * scale + min``, one float32 rounding (``q * scale``
        is exact: 4 + 11 significant bits)."""
        scale, low = (t.float().repeat_interleave(GROUP, 1) for t in (self.scales, self.mins))
        return self.unpacked().float().mul_(scale).add_(low)

    def nbytes(self) -> int:
        """Bytes a product reads: the codes, scales and minima."""
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.mins))


class Int4Linear(nn.Module):
    """An ``nn.Linear`` whose weight exists only as :class:`Int4` codes: the module path
    multiplies by them as the decoding step does (bfloat16 activations into the products), so a
    model keeps one copy of each matrix, about 1/6 of its float32 bytes (20 per 32 weights).

    ``weight`` is not a parameter: reading it dequantizes the codes afresh (``(out, in)`` in
    :attr:`dtype`; for inspection, e.g. per-head views). ``dtype`` is the float dtype of the
    model it sits in: the outputs take their input's dtype, and ``model.to(dtype)`` moves it
    (the codes and their bfloat16 scales stay as they are). No gradients: inference only.

    ``forward(x (..., in)) -> (..., out)``.
    """

    def __init__(self, int4: Int4, bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__()
        self.int4, self.dtype = int4, dtype
        self.out_features, self.in_features = int4.shape
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @property
    def weight(self) -> torch.Tensor:
        return self.int4.dequantize().to(self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.int4.matmul(x.reshape(-1, self.in_features), self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def _apply(self, fn, recurse=True):
        self.dtype = fn(torch.empty(0, dtype=self.dtype)).dtype  # .to(dtype), .half(), ...
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, int4 group={GROUP}")


def share(layers) -> bool:
    """Give :class:`Int4Linear` layers that read one input (a component's ``joint_linears()``:
    self-attention's q, k, v; a gated feed-forward's gate, up) one set of codes: their
    :class:`Int4` become consecutive row blocks, as views, of one joined :class:`Int4` (copied
    once, the parts then freed), values unchanged, so the decoding step multiplies them in one
    product (:func:`joined`). Returns whether they share one now; layers of another kind or
    with different input widths are left as they are."""
    if len(layers) < 2 or not all(isinstance(layer, Int4Linear) for layer in layers) or len(
            {layer.in_features for layer in layers}) != 1:
        return False
    parts = [layer.int4 for layer in layers]
    if joined(parts) is None:
        whole = Int4._of(*(torch.cat([getattr(p, f) for p in parts]) for f in FIELDS))
        at = 0
        for layer in layers:
            layer.int4 = whole.rows(at, at + layer.out_features)
            at += layer.out_features
    return True


def joined(parts) -> Int4 | None:
    """The one :class:`Int4` whose consecutive row blocks ``parts`` are (views of one storage
    per field, as :func:`share` leaves them), as views with no copy; else None. Parts that
    tile the :class:`Int4` they were cut from give that object itself (its bound product and
    torch's packed form made once, not per generation)."""
    fields = []
    for f in FIELDS:
        ts = [getattr(p, f) for p in parts]
        first = ts[0]
        at, row = first.data_ptr(), first.shape[1] * first.element_size()
        for t in ts:
            if (t.data_ptr() != at or t.dtype is not first.dtype or not t.is_contiguous()
                    or t.shape[1] != first.shape[1]):
                return None
            at += t.shape[0] * row
        base = first.untyped_storage().data_ptr()
        if any(t.untyped_storage().data_ptr() != base for t in ts[1:]):
            return None
        fields.append(first.as_strided((sum(t.shape[0] for t in ts), first.shape[1]),
                                       first.stride(), first.storage_offset()))
    base = parts[0]._base
    if base is not None and all(p._base is base for p in parts) and all(
            getattr(base, f).data_ptr() == t.data_ptr() and getattr(base, f).shape == t.shape
            for f, t in zip(FIELDS, fields, strict=True)):
        return base
    return Int4._of(*fields)


def place(model: nn.Module) -> int:
    """Copy the codes the decoding step streams, every :class:`Int4Linear`'s fields and every
    :class:`~headwise.fast.q8.Q8` attached to a layer (the vocabulary head's), into one buffer
    advised to huge pages, in the modules' order (the step's), 64-byte aligned; returns the
    bytes placed. Views stay views: layers that share one set of codes (:func:`share`) share
    the copy. Why: the step reads these bytes once per token, and from 4 KiB pages (each its
    own TLB entry, where the prefetchers stop) memory delivered ~20% less here than from 2 MiB
    ones (:func:`headwise.fast.roof.read_bandwidth`). Call it before the first product (the
    kernels bind the fields' addresses on first use); :func:`headwise.pretrained.load_gguf`
    does."""
    roots, q8s, parts = {}, {}, []
    for m in model.modules():
        if isinstance(m, Int4Linear):
            part = m.int4
            root = part if part._base is None else part._base
            roots.setdefault(id(root), root)
            if root is not part:  # (its first row in the root's codes)
                start = (part.codes.data_ptr() - root.codes.data_ptr()) // part.codes.stride(0)
                parts.append((m, root, start, start + part.codes.shape[0]))
        if getattr(m, "q8", None) is not None:
            q8s.setdefault(id(m.q8), m.q8)
    held = [(r, f) for r in roots.values() for f in FIELDS] + [
        (q, f) for q in q8s.values() for f in ("codes", "scales")]
    if not held:
        return 0
    size = [-(-getattr(o, f).nbytes // 64) * 64 for o, f in held]
    arena, at = _large.huge(sum(size), torch.uint8), 0
    for (o, f), n in zip(held, size, strict=True):
        t = getattr(o, f)
        setattr(o, f, arena[at:at + t.nbytes].view(t.dtype).view(t.shape).copy_(t))
        at += n
    for o in (*roots.values(), *q8s.values()):
        o._product = None  # (bound to the old addresses, if ever bound)
        if isinstance(o, Int4):
            o._torch = None
    for m, root, start, stop in parts:
        m.int4 = root.rows(start, stop)
    return at


def dtype_of(layer: nn.Module) -> torch.dtype:
    """The float dtype a linear layer computes in (an :class:`Int4Linear` without reading its
    weight)."""
    return layer.dtype if isinstance(layer, Int4Linear) else layer.weight.dtype


def quantized(module: nn.Module) -> bool:
    """Whether some ``nn.Linear`` inside ``module`` carries :class:`Int4` codes."""
    return any(getattr(m, "int4", None) is not None for m in module.modules())
