"""No silent degradation: why a call leaves the fused kernel, and strict mode.

:func:`fallback_reason` is the one place that says why ``F.scaled_dot_product_attention``
would run its O(n^2) math kernel instead of a fused one; the trace reports it and, under
strict mode (``strict=True`` or ``HEADWISE_STRICT=1``), :func:`check` raises a ValueError
naming it. Strict mode also refuses the eager backend and all-heads weights above
:func:`weights_budget` bytes (``HEADWISE_WEIGHTS_BUDGET_MB``, default 256).
"""

from __future__ import annotations

import os

import torch

__all__ = ["StrictError", "enabled", "fallback_reason", "check", "weights_budget"]

FUSED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


class StrictError(ValueError):
    """A call would leave the fused kernel or build O(n^2) memory under strict mode."""


def enabled(strict: bool | None) -> bool:
    """``strict`` if given, else the environment's ``HEADWISE_STRICT`` (1/true/yes/on).

    Every attention call asks, so the environment is read once per call (one dict lookup, small
    against the smallest attention call) and the parsing is cached per value: a change of the
    variable while the process runs still takes effect."""
    if strict is not None:
        return bool(strict)
    return _truthy(os.environ.get("HEADWISE_STRICT", ""))


def _truthy(raw: str) -> bool:
    seen = _PARSED.get(raw)
    if seen is None:
        seen = _PARSED[raw] = raw.strip().lower() in ("1", "true", "yes", "on")
    return seen


_PARSED: dict[str, bool] = {}  # HEADWISE_STRICT values parsed so far


def weights_budget() -> int:
    """Bytes of all-heads weights strict mode allows (``HEADWISE_WEIGHTS_BUDGET_MB``)."""
    return int(float(os.environ.get("HEADWISE_WEIGHTS_BUDGET_MB", "256")) * 2**20)


def fallback_reason(q, k, v, mask, dropout_p: float, kernel: str) -> str | None:
    """Why the attention of ``q (b, h, i, d)``, ``k``, ``v (b, g, j, e)`` leaves the fused
    kernel (``kernel`` is torch's choice, see :func:`headwise.attend.fused.sdpa_kernel_name`),
    or None when it does not."""
    if kernel != "MATH":
        return None
    dtypes = {q.dtype, k.dtype, v.dtype} | ({mask.dtype} - {torch.bool} if mask is not None
                                            else set())
    if len({q.dtype, k.dtype, v.dtype}) > 1 or q.dtype not in FUSED_DTYPES:
        return (f"unsupported dtype ({', '.join(sorted(str(x) for x in dtypes))}); the fused "
                f"kernels take one of {', '.join(str(x) for x in FUSED_DTYPES)} for q, k and v")
    if dropout_p > 0 and q.device.type == "cpu":
        return (f"dropout > 0 (dropout_p={dropout_p}) on the CPU: the CPU flash kernel has no "
                "dropout; pass dropout_p=0 (eval) or run on a GPU")
    if q.shape[-1] != v.shape[-1]:
        return (f"value head dim {v.shape[-1]} != query head dim {q.shape[-1]} (the flash "
                "kernel needs them equal); project values to the same head size")
    if mask is not None:
        return (f"the fused kernel refuses this mask ({_describe(mask)}); pass a bool or float "
                "mask broadcastable to (b, h, i, j) that does not require grad")
    return f"kernel constraints (dtype {q.dtype}, device {q.device.type}, strides or shape)"


def check(strict: bool | None, reason: str | None, where: str = "attention") -> None:
    """Raise :class:`StrictError` naming ``reason`` when strict mode is on."""
    if reason is not None and enabled(strict):
        raise StrictError(f"{where}: strict mode: this call would leave the fused kernel or "
                          f"build O(n^2) memory: {reason}. Fix the cause, or pass strict=False "
                          "/ unset HEADWISE_STRICT")


def _describe(mask: torch.Tensor) -> str:
    form = "bool" if mask.dtype == torch.bool else str(mask.dtype)
    grad = ", requires grad" if mask.requires_grad else ""
    return f"{form} {tuple(mask.shape)}{grad}"
