"""The norms' one-row forms: :class:`~headwise.models.norms.LayerNorm` and
:class:`~headwise.models.norms.RMSNorm` for decoding rows ``x (b, m)`` without a module call.

Axis legend: ``b`` rows, ``m`` model dim (the normalised axis).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from headwise.fast import native as _native

__all__ = ["RMSRow", "layer_norm_row"]

_HALF = (torch.float16, torch.bfloat16)


def layer_norm_row(norm) -> Callable[[torch.Tensor], torch.Tensor]:
    """``f(x (b, m)) -> (b, m)``: ``torch.layer_norm`` with the module's parameters (the same
    arithmetic as its forward)."""
    return partial(torch.layer_norm, normalized_shape=norm.normalized_shape,
                   weight=norm.weight, bias=norm.bias, eps=norm.eps)


class RMSRow:
    """:class:`~headwise.models.norms.RMSNorm` for rows ``x (b, m)``: one C call where it
    applies (:func:`headwise.fast.native.rms_rows`); else, in float32, the formula as four small
    kernels with tensor constants (``torch.rms_norm`` and python-scalar arithmetic cost several
    times more per call on one row), in bfloat16 the module's own forward."""

    __slots__ = ("norm", "w", "eps", "inv_m", "eps_t")

    def __init__(self, norm):
        self.norm, self.w, self.eps = norm, norm.weight.detach(), norm.eps
        w = self.w
        self.inv_m = torch.tensor(1.0 / norm.normalized_shape[0], dtype=w.dtype, device=w.device)
        self.eps_t = torch.tensor(norm.eps, dtype=w.dtype, device=w.device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if (y := _native.rms_rows(x, self.w, self.eps)) is not None:  # one call, not five
            return y
        if self.w.dtype in _HALF:
            return self.norm.forward(x)
        ms = torch.addcmul(self.eps_t, torch.linalg.vecdot(x, x).unsqueeze(-1), self.inv_m)
        return x * torch.rsqrt(ms) * self.w

    def bind(self, plan, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Add this norm of ``x`` into ``y`` to ``plan`` (:class:`headwise.fast.plan.Plan`)."""
        return plan.rms(x, self.w, self.eps, y)
