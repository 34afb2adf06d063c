"""The attention core on split heads: ``softmax(q k^T * scale + mask) v``.

Axis legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads (``h % g == 0``), ``i`` query
position, ``j`` key position, ``d`` head dim (``e`` the value head dim).

:func:`attention` is the one entry point. It checks its inputs once, then calls a *backend* by
name from :data:`BACKENDS`; every backend has the same signature and the same semantics:

- masks are **True = may attend** (bool) or additive (float), broadcastable to ``(b, h, i, j)``;
- ``causal=True`` is *bottom-right* aligned (see :func:`headwise.masks.causal`);
- a query row whose keys are all masked gets **zero output and zero weights**, with finite
  gradients (never NaN, never a uniform average over padding) — the only place zeros are
  promised;
- NaN policy (docs/design.md): NaN or inf in a query row makes that output row NaN; in a key or
  value, every row that may attend its position (without a mask, the head's whole output); a
  position a row may not attend leaves that row as if it held 0, whatever it holds
  (:func:`headwise.masks.neutral`), on every backend alike (fused kernels would otherwise
  differ block by block). ``scale`` must be finite. One difference, off the CPU (a GPU,
  compiled or not), for the fused output without weights: there headwise adds nothing to what
  CUDA's fused kernels do by themselves (measured: flash, efficient and cuDNN,
  bf16/fp16/fp32): a NaN or inf key or value reaches every row of its head, masked positions
  included, except under causal masking, where it reaches the rows that can see it; enforcing
  the rule there would cost a third of the forward or a device sync
  (:func:`headwise.fast.kernel_nan`);
- ``weights`` are per head, ``(b, h, i, j)``, the softmax probabilities before dropout.

``"eager"`` is the readable reference, here beside the dispatch. ``"sdpa"``
(:mod:`headwise.attend.fused`) feeds ``F.scaled_dot_product_attention`` what its fused kernels are fast
on: 4-D tensors, masks in their smallest broadcast form, causality as ``is_causal`` where the
kernel accepts it; weights, when asked for, are recomputed exactly from the kernel's
log-sum-exp (:mod:`headwise.weights`). ``"auto"`` is ``"sdpa"``, weights or not.

The module is ``attend`` (as in x-transformers' ``Attend``: the core math apart from the
projections) so that ``headwise.attention`` names one thing, the function.

May import: :mod:`headwise.masks`, :mod:`headwise.heads`, :mod:`headwise.weights`,
:mod:`headwise.strict`, :mod:`headwise.observe`, :mod:`headwise.fast`; never a layer or a model.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from headwise import masks as _masks
from headwise import strict as _strict
from headwise import weights as _weights
from headwise._device import check_tensor_device
from headwise.attend.fused import checked, sdpa, sdpa_kernel_name
from headwise.heads import expand_kv
from headwise.observe import Memory, StepKind, WeightsSource, record

__all__ = ["attention", "attention_weights", "BACKENDS", "check_backend", "check_selection",
           "register_backend", "resolve_backend", "sdpa_kernel_name"]

Backend = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
BACKENDS: dict[str, Backend] = {}
_SELECTS: set[str] = set()  # backends that return a Selection of the weights


def register_backend(name: str, fn: Backend | None = None, *, selections: bool = False):
    """Register ``fn(q, k, v, *, mask, causal, dropout_p, scale, return_weights, strict)`` under
    ``name`` (usable as a decorator). Inputs arrive already checked; ``return_weights`` is a
    bool unless ``selections=True`` says ``fn`` also honours a
    :class:`~headwise.weights.Selection`."""
    def add(f: Backend) -> Backend:
        BACKENDS[name] = f
        if selections:
            _SELECTS.add(name)
        return f
    return add(fn) if fn is not None else add


def check_backend(backend: str, where: str) -> None:
    """The one check of a backend name, for every place that accepts one: ``"auto"`` or a name
    in :data:`BACKENDS`. ``where`` names the caller in the message."""
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"{where}: unknown backend {backend!r}; choose 'auto' or one of "
                         f"{sorted(BACKENDS)}")


def resolve_backend(backend: str) -> str:
    """The ``"auto"`` rule: always the fused ``"sdpa"`` kernel, weights or not (they are
    recomputed from its log-sum-exp); ``"eager"`` runs only when named. Other names pass."""
    return "sdpa" if backend == "auto" else backend


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
              mask: torch.Tensor | None = None, causal: bool = False, dropout_p: float = 0.0,
              scale: float | None = None, return_weights=False, backend: str = "auto",
              softcap: float | None = None, sinks: torch.Tensor | None = None,
              strict: bool | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scaled dot-product attention over heads.

    Args:
        q: ``(b, h, i, d)`` queries.
        k: ``(b, g, j, d)`` keys; ``g`` divides ``h`` (grouped-query attention: query head ``x``
            reads key/value head ``x // (h // g)``).
        v: ``(b, g, j, e)`` values.
        mask: bool (True = may attend) or float (additive), broadcastable to ``(b, h, i, j)``.
        causal: query ``i`` attends only keys ``j <= i + (j_len - i_len)`` (bottom-right).
        dropout_p: dropout on the attention probabilities (pass 0 in eval).
        scale: score scale, default ``1 / sqrt(d)``.
        return_weights: ``True`` for the per-head probabilities ``(b, h, i, j)``, or a
            :class:`~headwise.weights.Selection` (``heads``, ``rows``, ``keys``) for only those
            (``(b, hs, is, js)``); recomputed from the fused kernel's log-sum-exp.
        backend: ``"auto"`` (= ``"sdpa"``), ``"eager"`` (the readable reference, O(n^2)),
            ``"sdpa"`` or any name in :data:`BACKENDS`.
        softcap: attention-logit soft-capping ``softcap * tanh(scores / softcap)`` (Gemma 2).
        sinks: ``(h,)`` learned sink logits (gpt-oss). Either one runs the eager path.
        strict: raise a ValueError naming the reason when the call would leave the fused kernel
            or build O(n^2) memory (default: the ``HEADWISE_STRICT`` environment variable).

    Returns:
        ``(output (b, h, i, e), weights or None)``.
    """
    _check(q, k, v, mask, dropout_p, scale, backend)
    if softcap is not None and not (isinstance(softcap, (int, float)) and softcap > 0):
        raise ValueError(f"attention: softcap must be None or > 0, got {softcap!r}")
    if sinks is not None and (not isinstance(sinks, torch.Tensor)
                              or tuple(sinks.shape) != (q.shape[1],)):
        raise ValueError(f"attention: sinks must be a tensor of shape (h,)=({q.shape[1]},), got "
                         f"{getattr(sinks, 'shape', type(sinks).__name__)}")
    check_selection(return_weights, backend, q.shape[1], q.shape[2], k.shape[2])
    return dispatch(q, k, v, mask=mask, causal=causal, dropout_p=dropout_p, scale=scale,
                    return_weights=return_weights, backend=backend, softcap=softcap,
                    sinks=sinks, strict=strict)


def dispatch(q, k, v, *, mask=None, causal=False, dropout_p=0.0, scale=None,
             return_weights=False, backend="auto", softcap=None, sinks=None, strict=None):
    """:func:`attention` without the input checks, for callers that validated their inputs at
    their own boundary (MultiHeadAttention): a decoding step pays for no check twice.

    ``softcap`` (a float) and ``sinks`` (``(h,)`` logits) change the softmax itself: no fused
    kernel takes a function of the scores or an extra softmax column, so either one runs the
    eager reference (:func:`attention_weights` says how), whatever ``backend`` asks."""
    if softcap is not None or sinks is not None:
        _strict.check(strict, _eager_reason(return_weights, softcap, sinks))
        return eager(q, k, v, mask=mask, causal=causal, dropout_p=dropout_p, scale=scale,
                     return_weights=return_weights, softcap=softcap, sinks=sinks, strict=False)
    core = BACKENDS[resolve_backend(backend)]
    return core(q, k, v, mask=mask, causal=causal, dropout_p=dropout_p, scale=scale,
                return_weights=return_weights, strict=strict)


def fused_path(backend: str, softcap, sinks) -> bool:
    """Whether :func:`dispatch` with these settings runs the fused ``"sdpa"`` kernel (not the
    eager reference, which soft-capping and sinks need): a caller that knows every input is
    finite may then call the kernel itself, with no NaN policy to apply (the decoding row)."""
    return softcap is None and sinks is None and BACKENDS[resolve_backend(backend)] is sdpa


def check_selection(return_weights, backend: str, h: int, nq: int, nk: int) -> None:
    """A bad ``return_weights`` (index out of range, empty, or a selection the backend cannot
    honour) fails here, at the caller's boundary, with a ValueError."""
    selection = _weights.as_selection(return_weights)
    if selection is None or selection.everything:
        return
    selection.resolve(h, nq, nk, "cpu")
    name = resolve_backend(backend)
    if name not in _SELECTS:
        raise ValueError(f"backend {name!r} cannot return a selection of the weights; use "
                         f"one of {sorted(_SELECTS)} or return_weights=True")


def attention_weights(q: torch.Tensor, k: torch.Tensor, *, mask: torch.Tensor | None = None,
                      causal: bool = False, scale: float | None = None,
                      softcap: float | None = None, sinks: torch.Tensor | None = None,
                      ) -> torch.Tensor:
    """The per-head probabilities ``(b, h, i, j)`` alone (``k`` already has ``h`` heads).

    Fully masked rows are all zero; every other row sums to 1 with exactly 0 on masked keys
    (to less than 1 with ``sinks``).

    Args:
        softcap: scores become ``softcap * tanh(scores / softcap)`` before masking (Gemma 2).
        sinks: ``(h,)`` learned logits, one extra softmax column per head that takes
            probability but carries no value (gpt-oss): ``p_ij = e^s_ij / (sum_j e^s_ij +
            e^sink_h)``.
    """
    scale = _scale(scale, q.shape[-1])
    k, _, bad, _ = checked(q, k, None, mask, causal)  # (None: finite) the NaN policy's rows
    # fp16 overflows at 65504 and rounds to 11 bits: widen q and k to float32 and keep scores
    # and softmax in float32, as the fused kernels accumulate; the weights come back in q's
    # dtype. Product first, then scale: the order checkpoints were written with before issue 11
    # (scaling q first rounds differently whenever scale is not a power of two, and moved the
    # old-checkpoint test's eager logits by 1e-6).
    acc = torch.float32 if q.dtype == torch.float16 else q.dtype
    scores = torch.einsum("bhid,bhjd->bhij", q.to(acc), k.to(acc)) * scale
    record(StepKind.SCORES, scores, scale=scale)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
        record(StepKind.SOFT_CAP, scores, softcap=softcap)
    scores = _apply_masks(scores, mask, causal)
    # A row with no allowed key would be softmax(-inf, ..., -inf) = NaN. Give it finite scores,
    # then zero its probabilities: zero output and zero (not NaN) gradients.
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
    scores = scores.masked_fill(dead, 0.0)
    if sinks is None:
        weights = torch.softmax(scores, dim=-1).masked_fill(dead, 0.0)
        kind = StepKind.SOFTMAX
    else:
        sink = sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
        weights = weights.masked_fill(dead, 0.0)
        kind = StepKind.SOFTMAX_WITH_SINKS
    # NaN or inf in a query row or a key its row may attend: NaN, never "fully masked" zeros
    weights = weights.to(q.dtype)
    if bad is not None:
        weights = weights.masked_fill(bad, float("nan"))
    record(kind, weights)
    return weights


def _apply_masks(scores: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    if mask is not None:
        scores = _masks.fill(scores, mask)
        record(StepKind.MASK, scores, form=_masks.form(mask), shape=tuple(mask.shape))
    if causal:
        nq, nk = scores.shape[-2:]
        scores = _masks.fill(scores, _masks.causal(nq, nk, device=scores.device))
        record(StepKind.MASK, scores, form="causal", alignment="bottom-right")
    return scores


@register_backend("eager", selections=True)
def eager(q, k, v, *, mask=None, causal=False, dropout_p=0.0, scale=None, return_weights=False,
          softcap=None, sinks=None, strict=None):
    """The reference math, step by step. Materialises ``(b, h, i, j)``: O(n^2) memory.
    Chosen only by name (or for ``softcap``/``sinks``, as in :func:`attention_weights`);
    ``return_weights`` may be a :class:`~headwise.weights.Selection` (sliced from the full
    weights, which keep their gradient)."""
    _strict.check(strict, "the eager backend was chosen by name (it builds (b, h, i, j)); "
                  "use backend='sdpa'")
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    k, v, bad_w, bad = checked(q, k, v, mask, causal)  # (None: finite) masked positions: 0
    weights = attention_weights(q, k, mask=mask, causal=causal, scale=scale, softcap=softcap,
                                sinks=sinks)
    if bad_w is not None:
        weights = weights.masked_fill(bad_w, float("nan"))
    probs = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    if dropout_p > 0:
        record(StepKind.DROPOUT, probs, p=dropout_p)
    out = torch.einsum("bhij,bhje->bhie", probs, v)
    if bad is not None:
        out = out.masked_fill(bad, float("nan"))
    record(StepKind.WEIGHTED_SUM, out, backend="eager", kernel=None, fused=False,
           memory=Memory.QUADRATIC, reason=_eager_reason(return_weights, softcap, sinks),
           weights_source=WeightsSource("softmax") if return_weights else None)
    selection = _weights.as_selection(return_weights)
    return out, (None if selection is None else _select(weights, selection))


register_backend("sdpa", sdpa, selections=True)  # the fused kernel: headwise.attend.fused


def _select(weights: torch.Tensor, selection) -> torch.Tensor:
    b, h, nq, nk = weights.shape
    for dim, index in zip((1, 2, 3), selection.resolve(h, nq, nk, weights.device), strict=True):
        weights = _weights.take(weights, dim, index)
    return weights


def _scale(scale, d: int) -> float:
    """The score scale: ``1 / sqrt(d)`` by default; a given one must be a finite number."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale):
        raise ValueError(f"attention: scale must be a finite number or None (1/sqrt(d)), got "
                         f"{scale!r}")
    return scale


def _eager_reason(return_weights: bool, softcap=None, sinks=None) -> str:
    if softcap is not None or sinks is not None:
        return " and ".join(x for x, on in (("soft-capping", softcap is not None),
                                            ("attention sinks", sinks is not None)) if on) \
            + " (no fused kernel takes them)"
    return "weights requested" if return_weights else "eager backend chosen"


def _check(q, k, v, mask, dropout_p, scale, backend) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"attention: {name} must be 4-D (b, heads, n, d), got shape "
                             f"{tuple(t.shape)}; use headwise.split_heads to go from (b, n, h*d)")
        if not t.is_floating_point():
            raise TypeError(f"attention: {name} must be floating point, got {t.dtype}")
        check_tensor_device(t, name, "attention")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"attention: q, k and v must share one dtype, got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}; convert them with .to(q.dtype)")
    (b, h, nq, d), (bk, g, nk, dk), (bv, gv, nv, _) = q.shape, k.shape, v.shape
    if not b == bk == bv:
        raise ValueError(f"attention: batch sizes differ: q {b}, k {bk}, v {bv}")
    if d != dk:
        raise ValueError(f"attention: q head dim {d} != k head dim {dk}; queries and keys must "
                         "be projected to the same head size")
    if nk != nv or g != gv:
        raise ValueError(f"attention: k (b, g, j, d)={tuple(k.shape)} and v={tuple(v.shape)} "
                         "must have the same number of heads and positions")
    if h % g:
        raise ValueError(f"attention: {h} query heads cannot share {g} key/value heads; "
                         "h must be a multiple of g")
    if mask is not None:
        _masks.check(mask, "attention", (b, h, nq, nk))
    _scale(scale, d)
    if not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"attention: dropout_p must be in [0, 1), got {dropout_p}")
    check_backend(backend, "attention")
