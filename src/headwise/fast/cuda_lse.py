"""The output and the row log-sum-exp from one CUDA kernel call.

Axis legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads, ``i`` query position, ``j``
key position, ``d`` head dim.

Public ``F.scaled_dot_product_attention`` returns no LSE, but the three fused CUDA kernels it
dispatches to compute one for their backward and hand it out through their private aten ops
(signatures and layouts as measured on an H100 and as their meta kernels in
``torch/_meta_registrations.py`` give them; shared/research/gpu-facts.md):

=======================  ==========================  ===============================
kernel                   dtypes, masks               lse as returned
=======================  ==========================  ===============================
``FLASH_ATTENTION``      bf16/fp16, no mask          ``(b, h, i)``
``EFFICIENT_ATTENTION``  bf16/fp16/fp32, any bias    ``(b, h, ceil(i / 32) * 32)``
``CUDNN_ATTENTION``      bf16/fp16 (fp32 gives NaN)  ``(b, h, i, 1)``
=======================  ==========================  ===============================

All three are float32 and natural-log; :func:`as_bhi` turns each into ``(b, h, i)``, the one
layout :mod:`headwise.weights` and :mod:`headwise.fast.triton_weights` read. Each op is the one
``F.scaled_dot_product_attention`` itself calls for that kernel, with its autograd formula, so
the output and its gradients are the ones SDPA gives (the LSE is not differentiable).

:func:`choose` picks the kernel SDPA would pick when that one returns an LSE (cuDNN when
torch prefers it, flash for half precision without a mask), else the efficient kernel (the one
that takes float32 and masks); :func:`with_lse` returns None where none fits (float64,
dropout, a kernel refusing its arguments: a host-side check, no device work was started) and
the caller takes the plain path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from headwise import masks as _masks
from headwise.heads import expand_kv

__all__ = ["LSE_KERNELS", "as_bhi", "choose", "with_lse"]

_ops = torch.ops.aten
LSE_KERNELS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
_HALF = (torch.float16, torch.bfloat16)
# The efficient kernel reads its bias in 16-element rows: SDPA pads the last axis of a bias
# whose length is not a multiple of 16 and slices the padding off (a view with aligned rows).
_BIAS_ALIGN = 16


def choose(dtype: torch.dtype, mask: torch.Tensor | None, dropout_p: float,
           sdpa_choice: str, *, same_head_dims: bool = True) -> str | None:
    """Which private op gives the output and the LSE: ``sdpa_choice`` (the name of the kernel
    SDPA would run, :func:`headwise.attend.sdpa_kernel_name`) when it is one of
    :data:`LSE_KERNELS` and takes ``dtype``/``mask``; otherwise flash for half precision
    without a mask and with values of the queries' head dim, the efficient kernel for float32,
    a mask or another value head dim; None for other dtypes or dropout (the plain path keeps
    SDPA's dropout)."""
    if dropout_p != 0.0 or dtype not in (*_HALF, torch.float32):
        return None
    if sdpa_choice == "CUDNN_ATTENTION" and dtype in _HALF:
        return sdpa_choice
    if sdpa_choice == "EFFICIENT_ATTENTION" or mask is not None or dtype == torch.float32 \
            or not same_head_dims:
        return "EFFICIENT_ATTENTION"
    return "FLASH_ATTENTION"


def as_bhi(lse: torch.Tensor, nq: int) -> torch.Tensor:
    """Any of the three kernels' LSE layouts as ``(b, h, i)`` float32 (a view when it already
    is float32): cuDNN's trailing axis of 1 dropped, the efficient kernel's padding to a
    multiple of 32 rows sliced off."""
    if lse.dim() == 4:  # cuDNN: (b, h, i, 1)
        lse = lse.squeeze(-1)
    assert lse.dim() == 3 and lse.shape[-1] >= nq, f"unexpected LSE shape {tuple(lse.shape)}"
    return lse.narrow(-1, 0, nq).float()  # (narrow: Python indexing of a fake CUDA tensor fails)


def _bias(mask: torch.Tensor | None, q: torch.Tensor, nk: int) -> torch.Tensor | None:
    """``mask`` (4-D, bool or additive) as the ``(b, h, i, j)`` additive bias the efficient and
    cuDNN kernels take, with rows aligned as SDPA aligns them."""
    if mask is None:
        return None
    bias = _masks.as_bias(mask, q.dtype)
    if nk % _BIAS_ALIGN:
        bias = F.pad(bias, (0, _BIAS_ALIGN - nk % _BIAS_ALIGN)).narrow(-1, 0, nk)
    b, h, nq = q.shape[:3]
    return bias.expand(b, h, nq, nk)


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
             is_causal: bool, scale: float | None, kernel: str | None,
             ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(out (b, h, i, e), lse (b, h, i) float32)`` of ``kernel`` (:func:`choose`) on ``q (b,
    h, i, d)``, ``k (b, g, j, d)``, ``v (b, g, j, e)``; ``mask`` 4-D bool (True = may attend)
    or additive, ``is_causal`` top-left (the caller passes it only when ``i == j``). None when
    ``kernel`` is None or the kernel refuses these arguments (shape, alignment, head dim)."""
    if kernel is None:
        return None
    h, nq, nk = q.shape[1], q.shape[2], k.shape[2]
    q, k, v = (_last_dim_contiguous(t) for t in (q, expand_kv(k, h), expand_kv(v, h)))
    try:
        if kernel == "FLASH_ATTENTION":
            out, lse = _ops._scaled_dot_product_flash_attention(
                q, k, v, 0.0, is_causal, False, scale=scale)[:2]
        elif kernel == "CUDNN_ATTENTION":
            out, lse = _ops._scaled_dot_product_cudnn_attention(
                q, k, v, _bias(mask, q, nk), True, 0.0, is_causal, False, scale=scale)[:2]
        else:
            out, lse = _ops._scaled_dot_product_efficient_attention(
                q, k, v, _bias(mask, q, nk), True, 0.0, is_causal, scale=scale)[:2]
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, NotImplementedError):  # the op's own argument checks, on the host
        return None
    return out, as_bhi(lse, nq)
