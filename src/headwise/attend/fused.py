"""The ``"sdpa"`` backend: the output from ``F.scaled_dot_product_attention``'s fused kernels,
fed what they are fast on (4-D tensors, masks in their smallest broadcast form, causality as
``is_causal`` where the kernel accepts it), and per-head weights recomputed exactly, in chunks
(:mod:`headwise.weights`; :func:`_weights_plan` says how). Registered under its name by
:mod:`headwise.attend`, whose ``"auto"`` rule picks it; also the NaN policy's check every backend
calls (:func:`checked`), kept here because the fused kernel is where it has to be enforced.

Axis legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads, ``i`` query position, ``j``
key position, ``d`` head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from headwise import masks as _masks
from headwise import strict as _strict
from headwise import weights as _weights
from headwise.fast import cuda_lse as _cuda_lse
from headwise.fast import finite, gpu, kernel_nan, triton
from headwise.fast import flash_cpu as _flash_cpu
from headwise.heads import expand_kv
from headwise.observe import (
    FUSED_KERNEL,
    WEIGHTS_AT_V,
    Memory,
    StepKind,
    WeightsSource,
    active,
    record,
)

__all__ = ["sdpa", "sdpa_kernel_name", "checked"]


def sdpa(q, k, v, *, mask=None, causal=False, dropout_p=0.0, scale=None, return_weights=False,
         strict=None):
    """The output from ``F.scaled_dot_product_attention``'s fused kernel; weights, when asked
    for, recomputed exactly in chunks for only the heads/rows/keys asked for
    (:mod:`headwise.weights`): whole rows as their softmax, a key range from the kernel's row
    log-sum-exp. All weights without autograd take the output from the same chunks instead
    (``weights @ v``, see :func:`_weights_plan`)."""
    h, g = q.shape[1], k.shape[1]
    mask, is_causal, causal_in_mask = _sdpa_inputs(q, k, v, mask, causal, dropout_p)
    selection = _weights.as_selection(return_weights)
    strict_on = _strict.enabled(strict)
    if active() or strict_on:
        kernel = sdpa_kernel_name(q, k, v, mask, dropout_p, is_causal, h != g)
        reason = _strict.fallback_reason(q, k, v, mask, dropout_p, kernel)
        _strict.check(strict, reason)
        if selection is not None and selection.everything:
            _check_budget(strict, q, k)
    plan = _weights_plan(selection, q, k, v, dropout_p, strict_on)
    # NaN policy: the fused CPU kernel turns a query row holding NaN into zeros (its running
    # max treats the row as fully masked), a NaN key reaches the rows of its block only, and a
    # NaN at a masked position reaches the rows it is masked for. Off the CPU the kernels
    # propagate NaN themselves (headwise.fast.kernel_nan): there the output is theirs (with or
    # without weights from their LSE), with no mask built and no value read back.
    bad_w = bad = None
    if plan not in (None, "lse") or not kernel_nan(q):
        k, v, bad_w, bad = checked(q, k, v, mask, is_causal)
    weights = lse = lse_kernel = None
    if plan == WEIGHTS_AT_V:
        weights, out = _weights.softmax_rows(q, k, v, mask=mask, causal=is_causal, scale=scale)
    elif plan == "lse":
        out, lse, lse_kernel = _fused_with_lse(q, k, v, mask, is_causal, dropout_p, scale)
    else:
        out = _fused(q, k, v, mask, is_causal, dropout_p, scale)
    if bad is not None:
        out = out.masked_fill(bad, float("nan"))
    if active():
        _record_sdpa(out, q, k, selection, plan, lse_kernel, kernel, reason, mask,
                     is_causal, causal_in_mask)
    if plan == "rows":
        heads, rows, _ = selection.resolve(h, q.shape[2], k.shape[2], q.device)
        weights, _ = _weights.softmax_rows(q, k, mask=mask, causal=is_causal, scale=scale,
                                           heads=heads, rows=rows)
    elif plan == "lse":
        if lse is None:
            lse = _weights.logsumexp(q, k, mask=mask, causal=is_causal, scale=scale)
        weights = _from_lse(q, k, lse, mask, is_causal, scale, selection)
    if bad_w is not None and weights is not None:
        weights = _rows_of(weights, bad_w, selection, k.shape[2])
    return out, weights


def checked(q, k, v, mask, causal):
    """``(k, v, weights_bad, out_bad)``: the keys and values every backend computes with, and
    the ``(b, h, i, 1)`` rows whose weights and whose output the NaN policy makes NaN (None,
    with ``k`` and ``v`` untouched, when one float32 total finds q, k and v finite: every call
    but a broken one). Otherwise the masked-NaN rule, :func:`headwise.masks.neutral`: a
    position a row may not attend leaves that row as if it held 0. ``v`` may be None (weights
    alone); ``mask`` as the kernel takes it (4-D or fewer dims), ``causal`` bottom-right."""
    if finite(q, k) if v is None else finite(q, k, v):
        return k, v, None, None
    return _masks.neutral(q, k, v, mask, causal)


def _rows_of(weights, bad, selection, nk: int):
    """``weights (b, hs, is, js)`` of ``selection`` with NaN in the rows ``bad (b, h, i, 1)``
    names."""
    heads, rows, _ = (selection or _weights.Selection()).resolve(
        bad.shape[1], bad.shape[2], nk, bad.device)
    return weights.masked_fill(_weights.take(_weights.take(bad, 1, heads), 2, rows),
                               float("nan"))


# Weights recomputed at a time on a GPU when triton is missing (torch ops, float32 blocks):
# 64M elements = 256 MiB, enough for the whole of most selections in one block.
GPU_BLOCK_ELEMENTS = 1 << 26


def _from_lse(q, k, lse, mask, is_causal, scale, selection):
    """The selected weights from the row ``lse (b, h, i)``: on a GPU with triton one kernel
    writes them (:mod:`headwise.fast.triton_weights`), elsewhere
    :func:`headwise.weights.from_lse` computes them in blocks sized for the device."""
    if not gpu(q):
        return _weights.from_lse(q, k, lse, mask=mask, causal=is_causal, scale=scale,
                                 selection=selection)
    if not _triton_writes(q):
        w = _weights.from_lse(q, k, lse, mask=mask, causal=is_causal, scale=scale,
                              selection=selection, budget=GPU_BLOCK_ELEMENTS)
        return _nan_heads(w, q, k, selection)
    from headwise.fast import triton_weights  # imports triton: only here, on a GPU

    heads, rows, keys = (selection or _weights.Selection()).resolve(
        q.shape[1], q.shape[2], k.shape[2], q.device)
    with torch.no_grad():
        return triton_weights.select_and_launch(
            q, k, lse, mask=mask, causal=is_causal,
            scale=q.shape[-1] ** -0.5 if scale is None else scale,
            heads=heads, rows=rows, keys=keys)


def _nan_heads(w, q, k, selection):
    """The weights' NaN policy for a head (as the Triton kernel applies it): NaN or inf
    anywhere in a key/value head's keys makes every weight of the query heads reading it NaN,
    under causal masking too (where the kernel's LSE is NaN only for rows that see the key).
    One float32 sum per key head and one fill; no host read. (Query rows holding NaN are NaN
    already: their scores are.)"""
    h = q.shape[1]
    heads, _, _ = (selection or _weights.Selection()).resolve(h, q.shape[2], k.shape[2],
                                                              w.device)
    return w.masked_fill(_weights.take(_bad_heads(k, h), 1, heads), float("nan"))


def _bad_heads(t: torch.Tensor, h: int) -> torch.Tensor:
    """``(b, h, 1, 1)``: True for the query heads whose key/value head ``t (b, g, j, .)``
    holds NaN or inf anywhere (one float32 sum per head: NaN or inf in, non-finite out)."""
    bad = ~torch.isfinite(t.sum(dim=(-2, -1), dtype=torch.float32))           # (b, g)
    return expand_kv(bad[:, :, None, None], h)


def _triton_writes(q) -> bool:
    """Whether the Triton kernel writes the weights: bfloat16 and float16 on a GPU with triton.
    Not float32: its exact (IEEE) products run without tensor cores, and on an H100 all weights
    took 11-18x torch's need_weights (b=4, n=1024 / b=2, n=4096); cuBLAS's float32 products in
    device-sized blocks (:func:`headwise.weights.from_lse`) are the faster exact path there."""
    return triton(q) and q.dtype in (torch.bfloat16, torch.float16)


def _weights_plan(selection, q, k, v, dropout_p, strict_on: bool) -> str | None:
    """How :func:`sdpa` produces its output and weights:

    - ``None``: no weights; the fused kernel.
    - ``"weights @ v"``: all weights, nothing for autograd to record, no dropout, not strict:
      every score is computed for the returned weights anyway, so the output is those weights
      times v, block by block while the block is in cache — one ``q k^T`` instead of two (the
      fused kernel's and the recompute's). Strict mode keeps the fused kernel for the output.
    - ``"rows"``: the fused kernel's output; the selected whole rows recomputed as a softmax.
    - ``"lse"``: a key range (a part of a row needs the row's log-sum-exp), or any selection
      on a GPU: the fused kernel's output and its log-sum-exp from one call, then the weights
      from the LSE (one Triton kernel, :func:`_from_lse`); no scores are computed twice.
    """
    if selection is None:
        return None
    if selection.keys is not None or gpu(q):  # a GPU kernel hands its LSE out with the output
        return "lse"
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if selection.everything and not grad and dropout_p == 0.0 and not strict_on:
        return WEIGHTS_AT_V
    return "rows"


def _record_sdpa(out, q, k, selection, plan, lse_kernel, kernel, reason, mask, is_causal,
                 causal_in_mask) -> None:
    source = None
    if selection is not None:
        rows = min(q.shape[2], _weights.chunk_rows(_selected(selection.keys, k.shape[2]),
                                                   _weights.BLOCK_ELEMENTS) if plan == "lse"
                   else _weights.chunk_rows(_selected(selection.heads, q.shape[1]) * k.shape[2],
                                            _weights.ROW_BLOCK_ELEMENTS))  # every head at once
        if gpu(q) and lse_kernel is not None:  # the CUDA kernel that made output and LSE;
            kernel = f"{lse_kernel.upper()}_ATTENTION"  # Triton writes every row at once
            rows = None if _triton_writes(q) else rows
        source = (WeightsSource("lse", lse_kernel or "chunked pass", rows) if plan == "lse"
                  else WeightsSource("rows", "", rows))
    quadratic = kernel == "MATH" or plan == WEIGHTS_AT_V
    if plan == WEIGHTS_AT_V:
        kernel, reason = WEIGHTS_AT_V, ("all weights asked for, no autograd: one q k^T serves "
                                         "the weights and the output")
    record(StepKind.FUSED_ATTENTION, out, backend="sdpa", kernel=kernel,
           fused=not quadratic, memory=Memory.QUADRATIC if quadratic else Memory.LINEAR,
           reason=reason or FUSED_KERNEL, weights_source=source,
           mask=_mask_kind(mask) if mask is not None else "none",
           causal="is_causal" if is_causal else ("in mask" if causal_in_mask else "no"))


def _selected(index, n: int) -> int:
    """How many of ``n`` keys a Selection picks (for the trace's chunk size)."""
    return len(range(n)[index]) if isinstance(index, slice) else (
        n if index is None else 1 if isinstance(index, int) else len(index))


def _sdpa_inputs(q, k, v, mask, causal, dropout_p):
    """What the fused kernel is fast on: ``(mask 4-D or None, is_causal, causal folded into
    the mask)``. ``is_causal`` (top-left in torch) only when ``i == j``."""
    h, g = q.shape[1], k.shape[1]
    nq, nk = q.shape[-2], k.shape[-2]
    mask = _masks.as_4d(mask)  # (j,), (i, j), (h, i, j): the kernel wants 4-D
    if causal and nq == 1:  # bottom-right: the single newest query sees every key
        causal = False
    is_causal = False
    if causal:
        if nq == nk and _takes_mask_and_causal(q, k, v, mask, dropout_p, h != g):
            is_causal = True  # keep the mask (b, 1, 1, j)-small; the kernel skips blocks
        else:  # top-left is_causal would be wrong for nq != nk, or the kernel rejects the pair
            mask = _masks.combine(_masks.causal(nq, nk, device=q.device), mask)
    if mask is not None and mask.dtype != torch.bool and mask.dtype != q.dtype:
        mask = mask.to(q.dtype)
    return mask, is_causal, causal and not is_causal


def _fused(q, k, v, mask, is_causal, dropout_p, scale):
    h, g = q.shape[1], k.shape[1]
    if _flash_cpu.applies(q, k, v, dropout_p,
                          lambda: sdpa_kernel_name(q, k, v, mask, dropout_p, is_causal, h != g)):
        # bf16 training on the CPU: torch's flash forward, its float32 backward (faster and
        # more accurate than the bf16 one; see headwise.fast.flash_cpu). The flash kernel takes
        # the mask in additive form, as F.sdpa passes it.
        return _flash_cpu.FlashUpcastBackward.apply(
            q, expand_kv(k, h), expand_kv(v, h),
            None if mask is None else _masks.as_bias(mask, q.dtype), is_causal, scale)[0]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale, enable_gqa=h != g)


def _fused_with_lse(q, k, v, mask, is_causal, dropout_p, scale):
    """``(out, lse (b, h, i) or None, which kernel gave the LSE)``: the CPU flash op and the
    CUDA flash / efficient / cuDNN ops return their log-sum-exp with the output (the same ops
    ``F.sdpa`` runs, so output and gradients are unchanged); other kernels give None."""
    h, g = q.shape[1], k.shape[1]
    choice = lambda: sdpa_kernel_name(q, k, v, mask, dropout_p, is_causal, h != g)  # noqa: E731
    if gpu(q):
        kernel = _cuda_lse.choose(q.dtype, mask, dropout_p, choice(),
                                  same_head_dims=v.shape[-1] == q.shape[-1])
        got = _cuda_lse.with_lse(q, k, v, mask, is_causal, scale, kernel)
        if got is not None:
            return (*got, kernel.removesuffix("_ATTENTION").lower())
        return _fused(q, k, v, mask, is_causal, dropout_p, scale), None, None
    if not _flash_cpu.takes(q, k, v, dropout_p, choice):
        return _fused(q, k, v, mask, is_causal, dropout_p, scale), None, None
    bias = None if mask is None else _masks.as_bias(mask, q.dtype)
    if _flash_cpu.applies(q, k, v, dropout_p, lambda: "FLASH_ATTENTION"):
        return (*_flash_cpu.FlashUpcastBackward.apply(q, expand_kv(k, h), expand_kv(v, h),
                                                      bias, is_causal, scale), "flash")
    return (*_flash_cpu.with_lse(q, expand_kv(k, h), expand_kv(v, h), bias, is_causal, scale),
            "flash")


def _check_budget(strict, q, k) -> None:
    b, h, nq, _ = q.shape
    size = b * h * nq * k.shape[-2] * q.element_size()
    if size > _strict.weights_budget():
        _strict.check(strict, f"weights for every head and row, (b, h, i, j)=({b}, {h}, {nq}, "
                      f"{k.shape[-2]}) = {size / 2**20:.0f} MiB, exceed the budget of "
                      f"{_strict.weights_budget() / 2**20:.0f} MiB (HEADWISE_WEIGHTS_BUDGET_MB); "
                      "ask for a selection (headwise.Selection(heads=..., rows=...))")


def sdpa_kernel_name(q, k, v, mask=None, dropout_p=0.0, is_causal=False, gqa=False) -> str:
    """Which kernel ``F.scaled_dot_product_attention`` would run for these inputs."""
    try:
        from torch.nn.attention import SDPBackend
        choice = torch._fused_sdp_choice(q, k, v, mask, dropout_p, is_causal, enable_gqa=gqa)
        return SDPBackend(choice).name
    except Exception:  # private API: older or newer torch may differ
        return "unknown"


def _takes_mask_and_causal(q, k, v, mask, dropout_p, gqa) -> bool:
    """True when the chosen kernel accepts ``attn_mask`` together with ``is_causal``: every
    fused kernel SDPA would choose for that pair (the CPU flash kernel; on CUDA the efficient
    or cuDNN kernel, the flash one taking no mask), not the math kernel, which raises."""
    if mask is None:
        return True
    return sdpa_kernel_name(q, k, v, mask, dropout_p, True, gqa) in _TAKE_MASK_AND_CAUSAL


_TAKE_MASK_AND_CAUSAL = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")


def _mask_kind(mask: torch.Tensor) -> str:
    return f"{_masks.form(mask)} {tuple(mask.shape)}"
