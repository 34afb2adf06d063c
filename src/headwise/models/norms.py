"""The two normalisations a block can use, chosen by ``config.norm``.

Axis legend: ``m`` model dim (the normalised axis); any leading axes.

- ``"layer"``: LayerNorm (Ba et al. 2016): ``(x - mean) / sqrt(var + eps) * weight + bias``.
- ``"rms"``: RMSNorm (Zhang & Sennrich 2019; Llama, Mistral, Gemma):
  ``x / sqrt(mean(x^2) + eps) * weight``: no centring, no bias.

Both keep the parameter names ``weight`` (and ``bias``) of ``nn.LayerNorm``, so checkpoints of
either kind map by name. Their one-row forms for the cached decoding step live in
:mod:`headwise.decode.norms`.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LayerNorm", "NORMS", "RMSNorm", "make_norm"]

_HALF = (torch.float16, torch.bfloat16)


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` as the ``"layer"`` norm: its own class, so the decoding step's forms table
    (:data:`headwise.decode.forms.FORMS`) knows it by name, apart from other subclasses."""


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

    def extra_repr(self) -> str:
        return f"{self.normalized_shape[0]}, eps={self.eps:g}"


NORMS = {"layer": LayerNorm, "rms": RMSNorm}


def make_norm(kind: str, d_model: int, eps: float) -> nn.Module:
    """The norm ``kind`` (``"layer"`` or ``"rms"``) over ``d_model`` features."""
    if kind not in NORMS:
        raise ValueError(f"norm must be one of {sorted(NORMS)}, got {kind!r}")
    return NORMS[kind](d_model, eps=eps)
