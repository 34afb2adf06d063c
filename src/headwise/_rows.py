"""Weights in the form a one-row decoding step multiplies fastest (see :mod:`headwise.step`).

Axis legend: ``b`` rows, ``in`` / ``out`` a linear map's input and output features.

A cached decoding step feeds ``(b, in)`` rows with ``b`` small: every product is a matrix-vector
product bound by reading the weights once. Each component's ``row`` form (beside its
``forward``) holds its matrices as :data:`Weight` tuples and multiplies through
:func:`linear` / :func:`residual`, so the layout choice is made here, once:

- ``transpose=False``: the module's own ``(out, in)`` weight, no copy (the faster layout from
  two rows on, and the one that costs no memory);
- ``transpose=True``: a copy of ``W^T`` ``(in, out)``, which a single row streams 1.3-1.5x
  faster on this CPU, at the price of a second copy of the weights while a generation runs;
- :class:`Int4`: when a loader attached 4-bit codes to the ``nn.Linear`` (``layer.int4``, e.g.
  a GGUF's own Q4_1 blocks: :func:`headwise.pretrained.load_gguf` with ``q4=True``), the
  product reads those, about 1/7 of the float32 bytes, whatever ``transpose`` says.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["INT4", "Int4", "Weight", "linear", "of_linear", "quantized", "residual", "weight"]

Weight = tuple  # (matrix, bias | None, layout): layout False: W (out, in); True: a copy of
#                 W^T (in, out); INT4: an Int4
INT4 = "int4"


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

    def dequantize(self) -> torch.Tensor:
        """The float32 ``W (out, in)`` this form multiplies by (for tests and inspection)."""
        eye = torch.eye(self.packed.shape[1] * 2)  # float32 rows: no rounding of the result
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            eye, self.packed, self.group, self.scales_zeros.float()).t()

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales_zeros))


def weight(w: torch.Tensor, bias: torch.Tensor | None, transpose: bool) -> Weight:
    """A :data:`Weight` of ``w (out, in)`` and ``bias (out,)`` (detached: decoding has no
    gradients)."""
    w = w.detach()
    bias = None if bias is None else bias.detach()
    return (w.t().contiguous(), bias, True) if transpose else (w, bias, False)


def of_linear(layer: nn.Linear, transpose: bool) -> Weight:
    """The :data:`Weight` of an ``nn.Linear`` (its :class:`Int4` codes when it carries some)."""
    codes = getattr(layer, "int4", None)
    if codes is not None:
        return codes, None if layer.bias is None else layer.bias.detach(), INT4
    return weight(layer.weight, layer.bias, transpose)


def quantized(module: nn.Module) -> bool:
    """Whether some ``nn.Linear`` inside ``module`` carries :class:`Int4` codes."""
    return any(getattr(m, "int4", None) is not None for m in module.modules())


def linear(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """``x (b, in) @ W^T + bias -> (b, out)``."""
    m, bias, layout = w
    if not layout:
        return F.linear(x, m, bias)
    if layout is INT4:
        return m(x) if bias is None else m(x).add_(bias)
    return torch.mm(x, m) if bias is None else torch.addmm(bias, x, m)


def residual(x: torch.Tensor, y: torch.Tensor, w: Weight) -> torch.Tensor:
    """``x + (y @ W^T + bias)``: one product with the addition fused (as ``F.linear`` fuses
    its bias), plus one add when there is a bias."""
    m, bias, layout = w
    if layout is INT4:
        out = m(y).add_(x)
    else:
        out = torch.addmm(x, y, m if layout else m.t())
    return out if bias is None else out.add_(bias)
