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


def profile(streaming: torch.Tensor, layers=(0, 1, 2), groups=2):
    """A LongProfile of the tiny model's 4 query heads per layer carrying ``streaming (l, h)``
    (its other statistics random: kv_plan reads only the group scores)."""
    from headwise.long import LongProfile

    g = torch.Generator().manual_seed(5)
    l, h, n = len(layers), 4, 40
    rand = lambda *s: torch.rand(*s, generator=g)  # noqa: E731
    return LongProfile(n=n, block=8, layers=list(layers), heads=list(range(h)),
                       heads_per_layer=h, groups_per_layer=groups, sinks=4, window=16,
                       maps=rand(l, h, 5, 5), distance=rand(l, h, 7),
                       distance_edges=torch.tensor([0, 1, 2, 4, 8, 16, 32, n]),
                       sink=rand(l, h), local=rand(l, h), received=rand(l, h, n),
                       topk_keys=torch.randint(0, n, (l, h, 5, 2), generator=g),
                       topk_mass=rand(l, h, 5, 2), scores={"streaming": streaming})


def test_a_long_profile_ranks_the_groups_by_their_least_streaming_head():
    model, x = lm(), ids(3)
    streaming = torch.rand(3, 4, generator=torch.Generator().manual_seed(6))
    p = profile(streaming)
    plan = kv_plan(model, x, budget=0.5, sinks=1, window=4, scores=p)
    group = streaming.view(3, 2, 2).amin(-1)  # (l, g): heads 2c, 2c+1 share group c
    chosen = sorted(group[i, c].item() for i in range(3) for c in plan.streaming[i])
    rest = sorted(group[i, c].item() for i in range(3) for c in plan.full(i))
    assert len(chosen) == 3 and min(chosen) >= max(rest)
    torch.testing.assert_close(torch.tensor(plan.scores, dtype=torch.float64), group.double())
    assert plan.loss["plan"] == pytest.approx(plan_loss(model, x, plan))


def test_a_profile_or_table_of_another_shape_is_one_line():
    model, x = lm(), ids(3)
    streaming = torch.rand(2, 4, generator=torch.Generator().manual_seed(7))
    for scores, match in ((profile(streaming, layers=(0, 2)), r"covers layers \[0, 2\]"),
                          (profile(torch.rand(3, 4), groups=4), r"\[0, 1, 2\] x 4 groups, the model has 3 x 2"),
                          ([[0.5, 0.1]] * 2, r"gives \(2, 2\) streaming scores"),
                          ([[0.5, float("nan")]] * 3, r"no finite streaming score")):
        with pytest.raises(ValueError, match=match) as info:
            kv_plan(model, x, budget=0.5, scores=scores)
        assert "\n" not in str(info.value)


def test_kv_plan_takes_the_profile_headwise_long_measures():
    """The whole path: headwise.long.profile's streaming mass (sinks + window) per group on a
    calibration text ranks the groups; the plan streams the most streaming-like half."""
    from headwise.long import profile

    model, x = lm(), ids(4)
    prof = profile(model, x, sinks=1, window=4, progress=False)
    group = prof.group_scores["streaming"]
    assert group.shape == (3, 2) and bool(torch.isfinite(group).all())
    plan = kv_plan(model, x, budget=0.5, sinks=1, window=4, scores=prof)
    chosen = [group[i, c].item() for i in range(3) for c in plan.streaming[i]]
    rest = [group[i, c].item() for i in range(3) for c in plan.full(i)]
    assert len(chosen) == 3 and min(chosen) >= max(rest)
    torch.testing.assert_close(torch.tensor(plan.scores, dtype=torch.float64), group.double())
