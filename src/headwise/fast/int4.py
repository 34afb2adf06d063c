"""4-bit weights a model holds instead of float32 matrices: :class:`Int4` (a matrix as torch's
CPU int4 codes, multiplied by ``torch.ops.aten._weight_int4pack_mm_for_cpu``) and
:class:`Int4Linear` (an ``nn.Linear`` whose weight exists only as those codes), which
:func:`headwise.pretrained.load_gguf` with ``q4=True`` builds from a GGUF's own Q4_1 blocks;
:mod:`headwise.fast.rows` multiplies the decoding step's rows by them.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Int4", "Int4Linear", "dtype_of", "quantized"]


class Int4:
    """``W (out, in)`` as 4-bit codes ``q`` in groups of ``group`` input features,
    ``w = (q - 8) * scale + zero`` per (output row, group): torch's CPU int4 layout
    (``torch.ops.aten._convert_weight_to_int4pack_for_cpu``).

    ``packed``: ``(out, in / 2)`` uint8. ``scales_zeros``: ``(in / group, out, 2)`` bfloat16 (the
    kernel's dtype: it takes bfloat16 rows; float32 rows run a scalar path ~20x slower here).
    Calling it on rows ``x (b, in)`` rounds them to bfloat16, multiplies with float32
    accumulation and returns ``(b, out)`` in ``x``'s dtype.
    """

    __slots__ = ("packed", "scales_zeros", "group")

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 group: int):
        """``codes (out, in)`` integers in [0, 15]; ``scales, zeros (out, in / group)``."""
        self.group = group
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            codes.to(torch.int32).contiguous(), 1)
        self.scales_zeros = torch.stack((scales.t(), zeros.t()), -1).to(torch.bfloat16)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16), self.packed, self.group, self.scales_zeros)
        return y.to(x.dtype)

    @property
    def shape(self) -> tuple[int, int]:
        """``(out, in)``, as ``nn.Linear.weight``."""
        return self.packed.shape[0], self.packed.shape[1] * 2

    def dequantize(self) -> torch.Tensor:
        """The float32 ``W (out, in)`` this form multiplies by (for inspection and tests).

        The codes come back through the kernel itself (whose packed layout depends on the CPU's
        vector width): identity rows with unit scales and zero offsets give ``q - 8``, small
        integers that bfloat16 holds exactly; then ``(q - 8) * scale + zero`` in float32, where
        the product is exact (8 + 4 significant bits), so the one rounding is the kernel's."""
        k = self.shape[1]
        unit = torch.zeros_like(self.scales_zeros)
        unit[..., 0] = 1
        q = torch.ops.aten._weight_int4pack_mm_for_cpu(
            torch.eye(k, dtype=torch.bfloat16), self.packed, self.group, unit).t().float()
        scale, zero = (self.scales_zeros[..., i].t().float().repeat_interleave(self.group, 1)
                       for i in (0, 1))
        return q.mul_(scale).add_(zero)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales_zeros))


class Int4Linear(nn.Module):
    """An ``nn.Linear`` whose weight exists only as :class:`Int4` codes: the module path
    multiplies by them as the decoding step does (bfloat16 activations into the products), so a
    model keeps one copy of each matrix, 1/7 of its float32 bytes.

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
        y = self.int4(x.reshape(-1, self.in_features)).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def _apply(self, fn, recurse=True):
        self.dtype = fn(torch.empty(0, dtype=self.dtype)).dtype  # .to(dtype), .half(), ...
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, int4 group={self.int4.group}")


def dtype_of(layer: nn.Module) -> torch.dtype:
    """The float dtype a linear layer computes in (an :class:`Int4Linear` without reading its
    weight)."""
    return layer.dtype if isinstance(layer, Int4Linear) else layer.weight.dtype


def quantized(module: nn.Module) -> bool:
    """Whether some ``nn.Linear`` inside ``module`` carries :class:`Int4` codes."""
    return any(getattr(m, "int4", None) is not None for m in module.modules())
