"""Weights in the form a one-row decoding step multiplies fastest (see :mod:`headwise.step`).

Axis legend: ``b`` rows, ``in`` / ``out`` a linear map's input and output features.

A cached decoding step feeds ``(b, in)`` rows with ``b`` small: every product is a matrix-vector
product bound by reading the weights once. Each component's ``row`` form (beside its
``forward``) holds its matrices as :data:`Weight` tuples and multiplies through
:func:`linear` / :func:`residual`, so the layout choice is made here, once:

- ``transpose=False``: the module's own ``(out, in)`` weight, no copy (the faster layout from
  two rows on, and the one that costs no memory);
- ``transpose=True``: a copy of ``W^T`` ``(in, out)``, which a single row streams 1.3-1.5x
  faster on this CPU, at the price of a second copy of the weights while a generation runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Weight", "linear", "residual", "weight", "of_linear"]

Weight = tuple  # (matrix, bias | None, transposed): W (out, in), or a copy of W^T (in, out)


def weight(w: torch.Tensor, bias: torch.Tensor | None, transpose: bool) -> Weight:
    """A :data:`Weight` of ``w (out, in)`` and ``bias (out,)`` (detached: decoding has no
    gradients)."""
    w = w.detach()
    bias = None if bias is None else bias.detach()
    return (w.t().contiguous(), bias, True) if transpose else (w, bias, False)


def of_linear(layer: nn.Linear, transpose: bool) -> Weight:
    """The :data:`Weight` of an ``nn.Linear``."""
    return weight(layer.weight, layer.bias, transpose)


def linear(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """``x (b, in) @ W^T + bias -> (b, out)``."""
    m, bias, transposed = w
    if not transposed:
        return F.linear(x, m, bias)
    return torch.mm(x, m) if bias is None else torch.addmm(bias, x, m)


def residual(x: torch.Tensor, y: torch.Tensor, w: Weight) -> torch.Tensor:
    """``x + (y @ W^T + bias)``: one product with the addition fused (as ``F.linear`` fuses
    its bias), plus one add when there is a bias."""
    m, bias, transposed = w
    out = torch.addmm(x, y, m if transposed else m.t())
    return out if bias is None else out.add_(bias)
