"""CPU flash attention in bf16/fp16 with a float32 backward.

Axis legend: ``b`` batch, ``h`` heads, ``i`` query position, ``j`` key position, ``d`` head dim.

Under bf16 autocast on the CPU, torch's flash kernel runs the forward faster than in float32,
but its bf16 *backward* is slower than the float32 one, and in a training step the attention
backward then takes a large share of the time. :class:`FlashUpcastBackward` keeps the bf16
forward and runs the float32 backward kernel on the upcast inputs with the forward's float32
log-sum-exp: faster than the bf16 forward + backward, and the gradients are more accurate (closer
to float64), since they are computed from exactly the values the forward used.

:func:`applies` says when it is used (CPU, bf16/fp16, autograd recording, no dropout, torch
choosing its flash kernel); everything else goes to ``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from headwise.fast import host

__all__ = ["FlashUpcastBackward", "applies", "takes", "with_lse"]

_ops = torch.ops.aten
_AVAILABLE = all(hasattr(_ops, name) for name in (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward"))


def applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float,
            kernel: Callable[[], str]) -> bool:
    """True when the attention of ``q, k, v`` is a reduced-precision CPU flash call that
    autograd will differentiate. ``kernel()`` names torch's kernel choice; it is asked last,
    only when every cheap condition holds."""
    return (_AVAILABLE and dropout_p == 0.0 and host(q)
            and q.dtype in (torch.bfloat16, torch.float16) and torch.is_grad_enabled()
            and (q.requires_grad or k.requires_grad or v.requires_grad)
            and kernel() == "FLASH_ATTENTION")


def takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float,
          kernel: Callable[[], str]) -> bool:
    """True when torch's CPU flash op would run this attention, so :func:`with_lse` gives the
    same output (and gradients) as ``F.scaled_dot_product_attention`` plus its log-sum-exp."""
    return (_AVAILABLE and dropout_p == 0.0 and host(q)
            and kernel() == "FLASH_ATTENTION")


def with_lse(q, k, v, mask, is_causal: bool, scale: float | None):
    """``(out (b, h, i, d), lse (b, h, i))`` of the CPU flash op on ``q, k, v (b, h, ., d)``
    (``mask`` additive; ``is_causal`` top-left). Differentiable in q, k, v, not in the LSE."""
    return _ops._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal,
                                                            attn_mask=mask, scale=scale)


class FlashUpcastBackward(torch.autograd.Function):
    """``(out (b, h, i, d), lse (b, h, i))`` of flash attention on ``q (b, h, i, d)``,
    ``k, v (b, h, j, d)``; the backward runs in float32 (the LSE is not differentiable). ``mask``: bool (True = may attend) or additive, broadcastable to
    ``(b, h, i, j)``; ``is_causal``: top-left (the caller passes it only when ``i == j``)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, is_causal: bool, scale: float | None):
        out, lse = _ops._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal, attn_mask=mask, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask, ctx.is_causal, ctx.scale = mask, is_causal, scale
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, _grad_lse=None):
        q, k, v, out, lse = ctx.saved_tensors
        mask = ctx.mask
        if mask is not None and mask.is_floating_point():
            mask = mask.float()
        dq, dk, dv = _ops._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out.float(), q.float(), k.float(), v.float(), out.float(), lse, 0.0,
            ctx.is_causal, attn_mask=mask, scale=ctx.scale)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None
