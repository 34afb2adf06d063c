"""The function transformers calls for ``attn_implementation="headwise"``, and its mask rule.

transformers 5.x looks each attention layer's function up by name in its attention interface
(``ALL_ATTENTION_FUNCTIONS``) and builds the mask with the function registered under the same
name in ``AttentionMaskInterface``. A function registered alone gets ``attention_mask=None``
and silently loses causality and padding, so :func:`register` registers both: the mask is
transformers' own ``sdpa_mask`` (bool ``(b, 1, i, j)``, True = may attend: headwise's polarity;
sliding windows and padding in it; ``None`` where plain causality or nothing is left, which
``is_causal`` then carries), and the function reads it exactly as HF's ``sdpa`` integration does.

Axis legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads, ``i`` query position,
``j`` key position, ``d`` head dim, ``e`` value head dim.
"""

from __future__ import annotations

import torch

from headwise import observe
from headwise.attend import check_selection, dispatch
from headwise.attend.fused import checked
from headwise.hf import kvcache, select
from headwise.hf.model import NAME
from headwise.weights import Selection, logsumexp, take

__all__ = ["attention_forward", "register"]


def attention_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0,
                      scaling: float | None = None, softcap: float | None = None,
                      s_aux: torch.Tensor | None = None, is_causal: bool | None = None,
                      **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One attention layer's call from transformers, on headwise's fused path.

    Args:
        module: the HF attention module (``module.is_causal`` is the default causality).
        query: ``(b, h, i, d)``; key: ``(b, g, j, d)``; value: ``(b, g, j, e)``: grouped-query
            heads are attended without repeating k/v.
        attention_mask: None, bool ``(b, 1, i, j)`` (True = may attend) or additive float.
        dropout: dropout on the probabilities (HF passes 0 in eval).
        scaling: the score scale (None: ``1 / sqrt(d)``).
        softcap: Gemma 2's ``softcap * tanh(scores / softcap)`` before the mask.
        s_aux: gpt-oss's ``(h,)`` sink logits: an extra softmax column with no value.
        is_causal: overrides ``module.is_causal`` when the mask is None.
        kwargs: ``output_attentions`` asks for every head's weights; the rest (``sliding_window``,
            already in the mask; ``position_ids``, ...) is not needed here.

    Returns:
        ``(out (b, i, h, e), weights (b, hs, is, js) or None)``.

    Observers of :mod:`headwise.observe` see each call (``attention``: q, k, mask, causality,
    scale, for head statistics, except under soft-capping or sinks, which they do not model)
    and each per-head output ``(b, h, i, e)`` (``heads``), whose edits reach ``o_proj``.
    """
    layer = kvcache.claimed(key)  # a head-wise cache's new keys: each group over its own part
    if layer is not None:
        causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
        out = kvcache.attend(layer, query, key, value, attention_mask, scaling, softcap, s_aux,
                             causal and attention_mask is None)
        return out.transpose(1, 2).contiguous(), None
    # 1) causality: HF's sdpa rule (a mask carries it; None means module.is_causal)
    key, value, causal = _causality(module, query, key, value, attention_mask, is_causal)
    # 2) which weights: the layer's selection (headwise.hf.weights) or output_attentions
    wanted = select.asked(module, kwargs.get("output_attentions") or _collecting_attentions())
    if isinstance(wanted, Selection):
        check_selection(wanted, "auto", query.shape[1], query.shape[2], key.shape[2])
    observe.attention(module, query, key, attention_mask, causal, scaling,  # statistics see
                      not getattr(module, "is_cross_attention", False),  # plain softmax only
                      softcap=softcap, sinks=s_aux)
    # 3) attend: the fused kernel; soft-capping alone needs the eager reference (no kernel
    #    takes a function of the scores); sinks are the fused output rescaled by its LSE
    if s_aux is not None and softcap is None:
        out, weights = _with_sinks(query, key, value, attention_mask, causal, dropout, scaling,
                                   wanted, s_aux)
    else:
        out, weights = dispatch(query, key, value, mask=attention_mask, causal=causal,
                                dropout_p=dropout, scale=scaling, return_weights=wanted,
                                softcap=softcap, sinks=s_aux)
    select.deliver(module, weights)
    # 4) the observer channel: per-head outputs at the input of o_proj (ablation, patching)
    out = observe.heads(module, out)
    return out.transpose(1, 2).contiguous(), weights


def _collecting_attentions() -> bool:
    """Whether the running forward collects attention weights. ``output_attentions`` does not
    reach every attention call (GPT-2's model pops it); transformers decides what to record in
    its output collector, so that is asked too. The collector is transformers' private state
    (5.x): without it, another version falls back to ``output_attentions`` alone."""
    from transformers.utils import output_capturing

    collector = getattr(output_capturing, "_active_collector", None)
    collected = None if collector is None else collector.get()
    return bool(collected) and any(key.endswith("attentions") for key in collected)


def _causality(module, query, key, value, mask, is_causal):
    """``(key, value, causal)`` as HF's sdpa integration reads them: a mask carries causality
    itself; without one, ``is_causal`` (else ``module.is_causal``) for more than one query.
    HF's mask rule leaves out the mask of an empty static cache's prefill (``j > i``, the
    unwritten slots after the prompt, top-left causal): those slots are cut, as HF cuts them,
    because headwise's causality is bottom-right."""
    if mask is not None:
        return key, value, False
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    nq, nk = query.shape[2], key.shape[2]
    if not causal or nq == 1:
        return key, value, False
    if nk > nq:
        key, value = key[:, :, :nq], value[:, :, :nq]
    return key, value, True


def _with_sinks(q, k, v, mask, causal, dropout, scale, wanted, sinks):
    """gpt-oss attention sinks on the fused kernel. A sink adds ``e^sink_h`` to each row's
    softmax denominator ``Z = e^lse`` and carries no value, so every probability and the output
    shrink by one factor per row: ``Z / (Z + e^sink) = sigmoid(lse - sink)`` (exact)."""
    out, weights = dispatch(q, k, v, mask=mask, causal=causal, dropout_p=dropout, scale=scale,
                            return_weights=wanted)
    clean = checked(q, k, None, mask, causal)[0]  # masked bad keys as 0 (the NaN policy)
    lse = logsumexp(q, clean, mask=mask, causal=causal, scale=scale)  # (b, h, i); 0: all masked
    keep = torch.sigmoid(lse - sinks.to(lse.dtype)[None, :, None])
    out = out * keep.unsqueeze(-1).to(out.dtype)
    if weights is not None:
        selection = wanted if isinstance(wanted, Selection) else Selection()
        heads, rows, _ = selection.resolve(q.shape[1], q.shape[2], k.shape[2], q.device)
        keep = take(take(keep, 1, heads), 2, rows)
        weights = weights * keep.unsqueeze(-1).to(weights.dtype)
    return out, weights


def register() -> None:
    """Register :func:`attention_forward` and transformers' ``sdpa_mask`` under ``"headwise"``
    (what importing :mod:`headwise.hf` does)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
