"""Making a head-wise KV plan for a model: which key/value groups stream (sinks + window) by a
budget, with the loss it costs measured on held-out text.

Axis legend: ``b`` rows, ``n`` positions, ``l`` layers, ``g`` key/value groups.

How groups are ranked. Given per-group streaming scores (higher = more streaming-like): a
:class:`headwise.long.LongProfile` of a calibration text (its ``group_scores["streaming"]``, the
mass on sinks + window, a group as streaming as its least streaming query head) or an
``(l, g)`` table, the highest stream first. Without them each
group's *cost* is measured: the next-token loss on the calibration text when that group alone
streams, minus the full cache's (one prefill per group; the cheapest stream first). A budget
is either the share of groups that stream or a loss tolerance: the most groups, in that order,
whose measured held-out loss stays within ``(1 + tolerance)`` of the full cache's.

The loss of a plan is one prefill through the head-wise cache (its streaming groups under the
sinks + window mask: what decoding with the plan would see at every position), for headwise's
own decoders (:mod:`headwise.decode.ragged`) and transformers models
(:class:`headwise.hf.HeadwiseKVCache`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from headwise.decode.ragged import headwise_cache
from headwise.kvplan import KVPlan, check_window

__all__ = ["group_costs", "kv_plan", "model_shape", "plan_loss", "streaming_scores"]


def _hf(model) -> bool:
    return hasattr(getattr(model, "config", None), "_attn_implementation")


def model_shape(model) -> tuple[int, int, int]:
    """``(layers, key/value groups, head dim)`` of a headwise or transformers decoder."""
    if _hf(model):
        from headwise.hf.kvcache import model_shape as hf_shape

        return hf_shape(model.config)
    c = model.config
    heads = set(c.layer_kv_heads("decoder_self"))
    if len(heads) != 1:
        raise ValueError(f"kv_plan: the layers have {sorted(heads)} key/value heads; a plan "
                         f"takes one count for all layers")
    return c.num_layers, heads.pop(), c.head_size


@torch.no_grad()
def plan_loss(model, ids: torch.Tensor, plan: KVPlan | None) -> float:
    """Mean next-token loss of ``ids (b, n)`` with ``plan``'s cache (None: no cache, every
    position seen)."""
    if _hf(model):
        from headwise.hf.kvcache import HeadwiseKVCache

        cache = None if plan is None else HeadwiseKVCache(model, plan, ids.shape[1])
        logits = model(ids, past_key_values=cache, use_cache=cache is not None).logits
    else:
        cache = None if plan is None else headwise_cache(model, plan, ids.shape[0], ids.shape[1])
        logits = model(ids, cache=cache)[0]
    return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten()).item()


def _only(shape, layer: int, group: int, sinks: int, window: int) -> KVPlan:
    rows = tuple((group,) if i == layer else () for i in range(shape[0]))
    return KVPlan(*shape, sinks, window, rows)


def group_costs(model, ids: torch.Tensor, *, sinks: int = 4, window: int = 256,
                full: float | None = None) -> list[list[float]]:
    """``(l, g)``: the loss each group adds when it alone streams (measured on ``ids``)."""
    shape = model_shape(model)
    full = plan_loss(model, ids, None) if full is None else full
    return [[plan_loss(model, ids, _only(shape, i, c, sinks, window)) - full
             for c in range(shape[1])] for i in range(shape[0])]


def streaming_scores(scores, shape: tuple[int, int, int]) -> list[list[float]]:
    """``(l, g)`` streaming scores for a model of ``shape`` from a LongProfile (read by its
    ``group_scores["streaming"]``; it must cover every layer and group) or an ``(l, g)`` table;
    ValueError (one line) for another shape or a group without a finite score."""
    where = "scores"
    if hasattr(scores, "group_scores"):  # a LongProfile (not imported: duck-typed)
        where = "the LongProfile"
        layers, groups = list(scores.layers), scores.groups_per_layer
        if layers != list(range(shape[0])) or groups != shape[1]:
            raise ValueError(f"kv_plan: the LongProfile covers layers {layers} x {groups} "
                             f"groups, the model has {shape[0]} x {shape[1]}; profile every "
                             f"layer of this model")
        if "streaming" not in scores.group_scores:
            raise ValueError(f"kv_plan: the LongProfile has no 'streaming' group score (it "
                             f"has {sorted(scores.group_scores)}); profile with the default "
                             f"scores")
        scores = scores.group_scores["streaming"]
    t = torch.as_tensor(scores, dtype=torch.float64)
    if tuple(t.shape) != shape[:2]:
        raise ValueError(f"kv_plan: {where} gives {tuple(t.shape)} streaming scores, expected "
                         f"(layers, groups) = {shape[:2]}")
    bad = (~torch.isfinite(t)).nonzero().tolist()
    if bad:
        raise ValueError(f"kv_plan: {where} has no finite streaming score for (layer, group) "
                         f"{[tuple(x) for x in bad[:4]]}; profile every query head")
    return t.tolist()


def _plan(shape, order, count, sinks, window, **kw) -> KVPlan:
    rows = [[] for _ in range(shape[0])]
    for layer, group in order[:count]:
        rows[layer].append(group)
    return KVPlan(*shape, sinks, window, tuple(map(tuple, rows)), **kw)


def kv_plan(model, ids: torch.Tensor, *, budget: float | None = 0.5,
            tolerance: float | None = None, heldout: torch.Tensor | None = None,
            sinks: int = 4, window: int = 256, scores=None, name: str | None = None) -> KVPlan:
    """A :class:`KVPlan` for ``model`` from the calibration ids ``ids (b, n)``.

    ``budget``: the share of groups that stream; or ``tolerance`` (then ``budget`` is ignored):
    stream the most groups whose held-out loss is within ``(1 + tolerance)`` x the full
    cache's. ``scores``: a :class:`headwise.long.LongProfile` or per-group streaming scores
    ``(l, g)`` (higher streams first, :func:`streaming_scores`); default: each group's measured
    cost (:func:`group_costs`). ``heldout``: ids the loss is measured on
    (default: ``ids``). The plan carries the scores (costs negated) and the measured losses."""
    check_window(sinks, window)
    KVPlan(1, 1, 1, sinks, window, ((),), budget=budget)  # (the budget's one check)
    if tolerance is not None and not (isinstance(tolerance, (int, float)) and tolerance >= 0):
        raise ValueError(f"kv_plan: tolerance must be a number >= 0 (a relative loss rise, "
                         f"e.g. 0.01), got {tolerance!r}")
    shape = model_shape(model)
    heldout = ids if heldout is None else heldout
    if scores is None:
        scores = [[-c for c in row] for row in group_costs(model, ids, sinks=sinks,
                                                            window=window)]
    else:
        scores = streaming_scores(scores, shape)
    order = sorted(((i, c) for i in range(shape[0]) for c in range(shape[1])),
                   key=lambda ic: -scores[ic[0]][ic[1]])
    full = plan_loss(model, heldout, None)
    total = len(order)
    if tolerance is None:
        count = round(budget * total)
    else:  # the largest prefix of the order within the tolerance (losses rise with it)
        low, high = 0, total
        while low < high:
            mid = (low + high + 1) // 2
            ok = plan_loss(model, heldout, _plan(shape, order, mid, sinks, window)) \
                <= full * (1 + tolerance)
            low, high = (mid, high) if ok else (low, mid - 1)
        count = low
    plan = _plan(shape, order, count, sinks, window, scores=scores, model=name,
                 budget=count / total if tolerance is not None else budget)
    loss = plan_loss(model, heldout, plan)
    return KVPlan(**{**_fields(plan), "loss": {"full": full, "plan": loss}})


def _fields(plan: KVPlan) -> dict:
    return {k: getattr(plan, k) for k in ("layers", "groups", "head_dim", "sinks", "window",
                                          "streaming", "budget", "scores", "loss", "model")}
