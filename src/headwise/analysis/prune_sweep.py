"""Prune step by step without retraining: score the heads once, cut the least important ones at
growing fractions, and measure a metric and the inference latency of each pruned copy against
the unpruned model, interleaved in one process (rotating order; ratios are medians of per-round
ratios, so the machine's drift hits every candidate alike).

Axis legend: ``b`` batch, ``i`` position, ``h`` heads, ``d`` head dim, ``m`` model dim.

The order comes from ``scores`` (``{kind: (layers, heads)}``, larger = more important; e.g.
:func:`headwise.importance`). Without one, :func:`output_norms` is the criterion: the mean L2
norm of each head's contribution ``o_h W_out,h^T`` to the residual stream over calibration
inputs (a head that writes little can go first; cheaper than Michel et al.'s gradient
importance, one forward pass, and blind to what the writes mean).

Grouped heads are cut by whole key/value groups (the group's score is its heads' mean), the
unit that keeps every surviving group equal; with ``g == h`` a group is one head. No layer is
left without a group.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from einops import rearrange
from torch import nn

from headwise.analysis.ablation import edit_heads
from headwise.analysis.prune import prune_heads
from headwise.models import attention_layers

__all__ = ["Step", "output_norms", "plan_fraction", "plan_groups", "sweep"]


@torch.no_grad()
def output_norms(model: nn.Module, forward: Callable[[nn.Module], object]) -> dict[str, torch.Tensor]:
    """``{kind: (layers, heads)}``: each head's mean ``||o_h W_out,h^T||`` over every position
    that ``forward(model)`` runs through the model (padding included)."""
    modules = attention_layers(model)
    sums = {kind: torch.zeros(len(mods), max(m.num_heads for m in mods), dtype=torch.float64)
            for kind, mods in modules.items()}
    counts = {kind: [0] * len(mods) for kind, mods in modules.items()}

    def add(heads, kind, layer, mha):  # heads (b, h, i, d)
        w = rearrange(mha.out_proj.weight, "m (h d) -> h d m", h=mha.num_heads)
        norms = torch.einsum("bhid,hdm->bhim", heads, w.to(heads.dtype)).norm(dim=-1)
        sums[kind][layer, :mha.num_heads] += norms.sum((0, 2)).double().cpu()
        counts[kind][layer] += norms.shape[0] * norms.shape[2]
        return heads

    with edit_heads([(mha, partial(add, kind=kind, layer=layer, mha=mha))
                     for kind, mods in modules.items() for layer, mha in enumerate(mods)]):
        forward(model)
    return {kind: t / torch.tensor(counts[kind], dtype=torch.float64).clamp(min=1)[:, None]
            for kind, t in sums.items()}


def plan_fraction(model: nn.Module, scores: Mapping[str, torch.Tensor],
                  fraction: float) -> dict[str, dict[int, list[int]]]:
    """The least important key/value groups (by mean score) covering ``fraction`` of the
    model's query heads, as a :func:`~headwise.prune_heads` selection; never a whole layer."""
    counts = {kind: [(mha.num_heads, mha.num_kv_heads) for mha in mods]
              for kind, mods in attention_layers(model).items()}
    return plan_groups(counts, scores, fraction)


def plan_groups(counts: Mapping[str, Sequence[tuple[int, int]]],
                scores: Mapping[str, torch.Tensor],
                fraction: float) -> dict[str, dict[int, list[int]]]:
    """:func:`plan_fraction` for layers given by their head counts: ``counts`` is ``{kind:
    [(h, g) per layer]}`` (query heads, key/value heads), so any model's layers can be planned
    (a transformers model's, for :func:`headwise.hf.prune_heads`)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"plan_fraction: fraction must be in [0, 1), got {fraction!r}")
    units, left = [], {}
    for kind, layers in counts.items():
        if kind not in scores:
            raise ValueError(f"plan_fraction: no scores for kind {kind!r}; scores have "
                             f"{sorted(scores)}")
        for layer, (h, g) in enumerate(layers):
            r = h // g
            left[kind, layer] = h
            for group in range(g):
                heads = list(range(group * r, group * r + r))
                units.append((float(scores[kind][layer, heads].mean()), kind, layer, heads))
    target = round(fraction * sum(left.values()))
    chosen: dict[str, dict[int, list[int]]] = {}
    removed = 0
    for _, kind, layer, heads in sorted(units, key=lambda u: u[0]):
        if removed >= target:
            break
        if left[kind, layer] - len(heads) < 1:
            continue  # keep every layer alive
        left[kind, layer] -= len(heads)
        chosen.setdefault(kind, {}).setdefault(layer, []).extend(heads)
        removed += len(heads)
    return chosen


@dataclass
class Step:
    """One row of a sweep: the fraction asked for, heads actually pruned (of all), the metric,
    and per workload the median latency (ms) and its ratio to the unpruned model (median of
    per-round ratios)."""

    fraction: float
    pruned: int
    heads: int
    metric: float
    latency_ms: dict[str, float]
    ratio: dict[str, float]


def sweep(model: nn.Module, scores: Mapping[str, torch.Tensor], fractions: Sequence[float],
          metric: Callable[[nn.Module], float], runs: Mapping[str, Callable[[nn.Module], object]],
          *, rounds: int = 5, budget_s: float = 30.0) -> list[Step]:
    """Prune copies of ``model`` at each fraction (the first must be 0: the anchor), compute
    ``metric(copy)``, and time each workload of ``runs`` on every copy, the copies interleaved;
    one :class:`Step` per fraction."""
    if not fractions or fractions[0] != 0:
        raise ValueError(f"sweep: fractions must start with 0 (the unpruned anchor), got "
                         f"{list(fractions)}")
    total = sum(m.num_heads for mods in attention_layers(model).values() for m in mods)
    copies, pruned = {}, {}
    for f in fractions:
        plan = plan_fraction(model, scores, f)
        pruned[f] = sum(len(h) for layers in plan.values() for h in layers.values())
        copies[f] = prune_heads(copy.deepcopy(model), plan) if plan else model
    values = {f: float(metric(m)) for f, m in copies.items()}
    ms, ratios = {f: {} for f in fractions}, {f: {} for f in fractions}
    for name, run in runs.items():
        times = interleave({f: (lambda m=m, run=run: run(m)) for f, m in copies.items()},
                           rounds=rounds, budget_s=budget_s)
        for f in fractions:
            ms[f][name] = 1000 * statistics.median(times[f])
            ratios[f][name] = statistics.median(
                a / b for a, b in zip(times[f], times[fractions[0]], strict=True))
    return [Step(f, pruned[f], total, values[f], ms[f], ratios[f]) for f in fractions]


def interleave(fns: Mapping[object, Callable[[], object]], *, rounds: int = 5,
               budget_s: float = 30.0, warmup: int = 1) -> dict[object, list[float]]:
    """Run every candidate once per round in a rotating order, at least ``rounds`` rounds and
    on until ``budget_s`` is spent (at most ``4 * rounds``); candidate -> seconds per round."""
    names = list(fns)
    with torch.inference_mode():
        for _ in range(warmup):
            for name in names:
                fns[name]()
        times: dict[object, list[float]] = {name: [] for name in names}
        start = time.perf_counter()
        for r in range(4 * rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                t0 = time.perf_counter()
                fns[name]()
                times[name].append(time.perf_counter() - t0)
            if r + 1 >= rounds and time.perf_counter() - start > budget_s:
                break
    return times
