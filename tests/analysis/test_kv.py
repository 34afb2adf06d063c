"""kv_plan on a tiny model: a budget streams that share of groups, the cheapest first; a
tolerance keeps the measured held-out loss within it; the loss a plan reports is measured."""

from __future__ import annotations

import pytest
import torch

from headwise.analysis.kv import group_costs, kv_plan, plan_loss
from headwise.kvplan import KVPlan
from headwise.models import LMConfig, TransformerLM


def lm():
    torch.manual_seed(11)
    return TransformerLM(LMConfig(41, d_model=32, num_heads=4, num_kv_heads=2, num_layers=3,
                                  d_ff=64, max_len=64, dropout=0.0, positional="rope",
                                  norm="rms", ffn="glu", activation="silu")).eval()


def ids(seed):
    return torch.randint(1, 41, (2, 40), generator=torch.Generator().manual_seed(seed))


def test_a_budget_streams_its_share_of_groups_cheapest_first():
    model, x = lm(), ids(0)
    costs = group_costs(model, x, sinks=1, window=4)
    plan = kv_plan(model, x, budget=0.5, sinks=1, window=4)
    chosen = sorted(costs[i][c] for i in range(3) for c in plan.streaming[i])
    rest = sorted(costs[i][c] for i in range(3) for c in plan.full(i))
    assert len(chosen) == 3 and max(chosen) <= min(rest)
    assert plan.loss["plan"] == pytest.approx(plan_loss(model, x, plan))
    assert plan.loss["full"] == pytest.approx(plan_loss(model, x, None))
    assert KVPlan.uniform(3, 2, 8, sinks=1, window=40) and plan_loss(
        model, x, KVPlan.uniform(3, 2, 8, sinks=1, window=40)) == pytest.approx(
        plan.loss["full"], rel=1e-5)


def test_a_tolerance_keeps_the_heldout_loss_within_it():
    model = lm()
    plan = kv_plan(model, ids(1), tolerance=0.01, heldout=ids(2), sinks=1, window=4)
    assert plan.loss["plan"] <= plan.loss["full"] * 1.01
    with pytest.raises(ValueError, match="budget must be a fraction"):
        kv_plan(model, ids(1), budget=2.0, scores=[[0, 0]] * 3)
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        kv_plan(model, ids(1), window=0, scores=[[0, 0]] * 3)
