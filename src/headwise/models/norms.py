"""The two normalisations a block can use, chosen by ``config.norm``.

Axis legend: ``m`` model dim (the normalised axis); any leading axes.

- ``"layer"``: LayerNorm (Ba et al. 2016): ``(x - mean) / sqrt(var + eps) * weight + bias``.
- ``"rms"``: RMSNorm (Zhang & Sennrich 2019; Llama, Mistral, Gemma):
  ``x / sqrt(mean(x^2) + eps) * weight``: no centring, no bias.

Both keep the parameter names ``weight`` (and ``bias``) of ``nn.LayerNorm``, so checkpoints of
either kind map by name, and both supply :meth:`row`, the plain function a decoding step calls
on ``(b, m)`` rows without a module call.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from headwise.fast import native as _native

__all__ = ["LayerNorm", "NORMS", "RMSNorm", "RMSRow", "make_norm"]

_HALF = (torch.float16, torch.bfloat16)


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` plus its one-row form (same parameters, same arithmetic)."""

    def row(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """``f(x (b, m)) -> (b, m)``: ``torch.layer_norm`` with this module's parameters."""
        return partial(torch.layer_norm, normalized_shape=self.normalized_shape,
                       weight=self.weight, bias=self.bias, eps=self.eps)


class RMSNorm(nn.Module):
    """``forward(x (..., m)) -> (..., m)``: ``x * rsqrt(mean(x^2, -1) + eps) * weight``.

    In float16/bfloat16 the statistics are taken in float32 and the normalised value is cast back
    before the weight multiplies it: the order of Hugging Face's ``LlamaRMSNorm``, so a bf16
    model rounds where HF's does.
    """

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.normalized_shape, self.eps = (d_model,), eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: (..., m) -> (..., m)``."""
        if x.dtype in _HALF:
            y = x.float()
            y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * y.to(x.dtype)
        return torch.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def row(self) -> RMSRow:
        """``f(x (b, m)) -> (b, m)``: the same formula without a module call (:class:`RMSRow`)."""
        return RMSRow(self)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape[0]}, eps={self.eps:g}"


class RMSRow:
    """:class:`RMSNorm` for rows ``x (b, m)``: one C call where it applies
    (:func:`headwise.fast.native.rms_rows`); else, in float32, the formula as four small
    kernels with tensor constants (``torch.rms_norm`` and python-scalar arithmetic cost several
    times more per call on one row here), in bfloat16 the module's own forward."""

    __slots__ = ("norm", "w", "eps", "inv_m", "eps_t")

    def __init__(self, norm: RMSNorm):
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


NORMS = {"layer": LayerNorm, "rms": RMSNorm}


def make_norm(kind: str, d_model: int, eps: float) -> nn.Module:
    """The norm ``kind`` (``"layer"`` or ``"rms"``) over ``d_model`` features."""
    if kind not in NORMS:
        raise ValueError(f"norm must be one of {sorted(NORMS)}, got {kind!r}")
    return NORMS[kind](d_model, eps=eps)
