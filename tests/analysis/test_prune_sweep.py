"""The pruning sweep: the output-norm criterion is each head's write to the residual stream,
the plan cuts whole key/value groups and never a whole layer, and a sweep returns one row per
fraction with the anchor at ratio 1."""

from __future__ import annotations

import pytest
import torch
from einops import rearrange
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise.analysis.prune import prune_heads
from headwise.analysis.prune_sweep import output_norms, plan_fraction, sweep
from headwise.models import LMConfig, TransformerLM, attention_layers


def lm(seed=0, **kw):
    torch.manual_seed(seed)
    args = dict(vocab_size=31, d_model=24, num_heads=6, num_layers=3, d_ff=32, max_len=32,
                dropout=0.0)
    return TransformerLM(LMConfig(**{**args, **kw})).eval()


def test_output_norms_are_each_heads_write_to_the_residual_stream():
    model = lm(1)
    tokens = torch.randint(0, 31, (3, 7))
    with torch.no_grad():  # zero head 4's output columns in layer 1: it writes nothing
        model.blocks[1].self_attn.out_proj.weight[:, 16:20] = 0
    scores = output_norms(model, lambda m: m(tokens))["decoder_self"]
    assert scores.shape == (3, 6) and scores[1, 4] == 0 and (scores[0] > 0).all()
    # by hand for layer 0: the merged heads entering out_proj, head by head through W_out
    seen = {}
    mha = model.blocks[0].self_attn
    handle = mha.out_proj.register_forward_pre_hook(lambda _m, a: seen.update(x=a[0]))
    model(tokens)
    handle.remove()
    heads = rearrange(seen["x"], "b i (h d) -> b i h d", h=6)
    w = rearrange(mha.out_proj.weight, "m (h d) -> h d m", h=6)
    want = torch.stack([(heads[:, :, h] @ w[h]).norm(dim=-1).mean() for h in range(6)])
    torch.testing.assert_close(scores[0].float(), want.detach(), rtol=1e-5, atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(fraction=st.floats(0, 0.95), g=st.sampled_from([1, 2, 3, 6]), seed=st.integers(0, 99))
def test_the_plan_cuts_whole_groups_and_never_a_whole_layer(fraction, g, seed):
    model = lm(num_kv_heads=g)
    scores = {"decoder_self": torch.rand(3, 6, generator=torch.Generator().manual_seed(seed))}
    plan = plan_fraction(model, scores, fraction)
    r = 6 // g
    removed = 0
    for heads in plan.get("decoder_self", {}).values():
        assert len(heads) < 6
        groups = {x // r for x in heads}
        assert sorted(heads) == [x for grp in sorted(groups) for x in range(grp * r, grp * r + r)]
        removed += len(heads)
    # as many heads as asked, rounded up to a whole group, unless every layer is down to its
    # last group
    target = round(fraction * 18)
    assert removed >= target or removed == 18 - 3 * r
    assert removed < target + r
    prune_heads(model, plan)  # a plan is always a valid selection


def test_the_plan_takes_the_lowest_scores_first():
    model = lm()
    scores = {"decoder_self": torch.arange(18.0).view(3, 6).flip(0)}  # layer 2 scores lowest
    assert plan_fraction(model, scores, 4 / 18) == {"decoder_self": {2: [0, 1, 2, 3]}}
    with pytest.raises(ValueError, match=r"fraction must be in \[0, 1\)"):
        plan_fraction(model, scores, 1.0)
    with pytest.raises(ValueError, match=r"no scores for kind 'decoder_self'"):
        plan_fraction(model, {"cross": scores["decoder_self"]}, 0.5)


def test_a_sweep_has_the_anchor_first_and_smaller_models_after():
    model = lm(2)
    tokens = torch.randint(0, 31, (2, 9))
    scores = output_norms(model, lambda m: m(tokens))
    params = []
    steps = sweep(model, scores, [0, 0.5], lambda m: params.append(
        sum(p.numel() for p in m.parameters())) or len(params), {"forward": lambda m: m(tokens)},
        rounds=2, budget_s=0.0)
    assert [(s.fraction, s.pruned, s.heads) for s in steps] == [(0, 0, 18), (0.5, 9, 18)]
    assert steps[0].ratio == {"forward": 1.0} and steps[1].latency_ms["forward"] > 0
    assert params[1] < params[0]
    assert [m.num_heads for m in attention_layers(model)["decoder_self"]] == [6, 6, 6]
    with pytest.raises(ValueError, match="must start with 0"):
        sweep(model, scores, [0.5], len, {})
