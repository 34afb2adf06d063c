"""headwise.step.DecodeStep's bound form (headwise.fast.plan: one C call a step, or one per
layer where torch computes the activation between): where every layer's row form binds, the step's logits and cache are the
unbound step's bit for bit, in float32, bfloat16 and 4-bit; where a form does not bind
(LayerNorm, a plain MLP, post-norm, cross-attention, soft-capping, sinks), or the kernels are
off, the step is unbound; a row that is not finite, or an op that fails, has its layer redone
unbound, with the NaN policy's result."""

import pytest
import torch

from headwise.fast import native
from headwise.step import DecodeStep
from tests.test_step import COMBINATIONS, _lm

pytestmark = pytest.mark.skipif(native.status() != "ready",
                                reason="headwise's kernel is not built here")


def _bound_and_unbound(model, rows, prompt_len=5, steps=6, seed=0, before_steps=None):
    """Prompt through the modules, then ``steps`` tokens through a step bound as it binds and
    one with no plan, on two caches: their logits and caches are equal (NaN where NaN).
    Returns the bound step, with ``unbound_from``: where each of its unbound runs started."""
    gen = torch.Generator().manual_seed(seed)
    v = model.config.vocab_size
    prompt = torch.randint(0, v, (rows, prompt_len), generator=gen)
    nxt = torch.randint(0, v, (rows, steps), generator=gen)
    with torch.inference_mode():
        caches = [model.new_cache(rows, prompt_len + steps) for _ in range(2)]
        for cache in caches:
            model(prompt, cache=cache)
        if before_steps is not None:
            before_steps()
        bound, unbound = (DecodeStep(model, cache) for cache in caches)
        unbound.plan = None
        bound.unbound_from = []  # the layers the bound step handed to the unbound one

        def finish(x, first, pos):
            bound.unbound_from.append(first)
            return DecodeStep._finish(bound, x, first, pos)
        if bound.plan is not None:
            bound._finish = finish
        for t in range(steps):
            got, want = bound(nxt[:, t]), unbound(nxt[:, t])
            torch.testing.assert_close(got, want, atol=0, rtol=0, equal_nan=True)
        for a, b in ((caches[0].k, caches[1].k), (caches[0].v, caches[1].v)):
            torch.testing.assert_close(a, b, atol=0, rtol=0, equal_nan=True)
        assert caches[0].length == caches[1].length == prompt_len + steps
    return bound


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("axes", COMBINATIONS, ids=lambda a: "-".join(map(str, a.values())))
def test_the_bound_step_is_the_unbound_step_bit_for_bit_on_every_combination_of_the_axes(
        axes, dtype):
    torch.manual_seed(len(str(axes)))
    model = _lm(d_model=16, num_heads=4, num_layers=2, d_ff=24, vocab_size=23, max_len=16,
                activation="silu", **axes).to(dtype)
    for rows in (1, 3):
        step = _bound_and_unbound(model, rows, seed=rows)
        # the forms that bind: RMSNorm, a gated feed-forward (with q|k|v joined, pre-norm);
        # a small model's one-row step in bfloat16 multiplies transposed copies, which only
        # torch's kernel reads: unbound
        binds = axes["norm"] == "rms" and axes["ffn"] == "glu"
        assert (step.plan is not None) is (binds and not (dtype is torch.bfloat16 and rows == 1))
        assert step.unbound_from == []  # (every step ran the plan)


@pytest.mark.parametrize("extra", [dict(attn_softcap=2.0), dict(attention_sinks=True),
                                   dict(norm_first=False), dict(rotary_dim=2, rope_theta=50.0),
                                   dict(activation="gelu_tanh"), dict(backend="eager")])
def test_forms_outside_the_plan_leave_the_step_unbound_and_others_bind(extra):
    kw = dict(d_model=16, num_heads=4, num_layers=2, d_ff=24, vocab_size=23, max_len=16,
              positional="rope", norm="rms", ffn="glu", activation="silu", num_kv_heads=2,
              sliding_window=4)
    model = _lm(**{**kw, **extra})
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.copy_(torch.randn_like(p))
    step = _bound_and_unbound(model, rows=2)
    # partial rotary and another activation bind; the eager backend, soft-capping, sinks and
    # post-norm run the module-faithful path
    assert (step.plan is not None) is (set(extra) <= {"rotary_dim", "rope_theta", "activation"})


def test_without_the_kernels_the_step_is_unbound(monkeypatch):
    model = _lm(norm="rms", ffn="glu", activation="silu", positional="rope")
    monkeypatch.setenv("HEADWISE_NATIVE", "0")
    monkeypatch.setattr(native, "_state", {})
    assert _bound_and_unbound(model, rows=1).plan is None


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_row_that_is_not_finite_redoes_its_layer_with_the_nan_policy(bad):
    """Layer 1's first key feature is non-finite from the first step on: its one-call
    attention stops the plan, the layer is redone unbound (the NaN policy: NaN in the logits,
    as the module path gives, tests/test_step.py); later steps see a cache not known finite
    and run unbound from layer 0."""
    model = _lm(num_kv_heads=2, positional="rope", norm="rms", ffn="glu", activation="silu",
                num_layers=3)

    def plant():
        with torch.no_grad():
            model.blocks[1].self_attn.k_proj.weight[0] = bad

    step = _bound_and_unbound(model, rows=2, steps=3, before_steps=plant)
    assert step.plan is not None and step.unbound_from == [1, 0, 0]


def test_a_failed_op_redoes_its_layer_and_the_rest_unbound(monkeypatch):
    """An op that fails (here: made to, in layer 1's second stretch) hands its layer and every
    later one to the unbound step; the earlier layers' work stands."""
    from headwise.fast import plan as _plan

    model = _lm(num_kv_heads=2, positional="rope", norm="rms", ffn="glu", activation="silu",
                num_layers=3)
    real = _plan.Plan.run
    stopped = []

    def run(self, stretch, pos, threads, lib):
        if stretch == 2:  # (layer 1's down product, then layer 2's first ops)
            stopped.append(self.owner[self.cuts[2]])
            return self.cuts[2]
        return real(self, stretch, pos, threads, lib)

    monkeypatch.setattr(_plan.Plan, "run", run)
    step = _bound_and_unbound(model, rows=3, steps=4)
    assert step.plan is not None and stopped == step.unbound_from == [1] * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_runs_in_the_plan_where_it_is_torchs_bit_for_bit(dtype):
    """A SwiGLU feed-forward whose width is whole steps of torch's vector loop (here 128) has its
    activation in the plan (Plan.silu_mul: torch's bits): no call between stretches, one C call
    a step, still the unbound step bit for bit; one whose width is not (72) keeps torch's call."""
    from headwise.fast import plan as _plan
    if _plan._torch_exp() is None:
        pytest.skip("torch's vector exp is not found in this build")
    for d_ff, inside in ((128, True), (72, False)):
        torch.manual_seed(d_ff)
        model = _lm(d_model=32, num_heads=4, num_kv_heads=2, num_layers=3, d_ff=d_ff,
                    vocab_size=29, max_len=16, positional="rope", norm="rms", ffn="glu",
                    activation="silu").to(dtype)
        # (in bfloat16 a small model's one-row step is unbound: the first test above)
        for rows in (1, 3) if dtype is torch.float32 else (3,):
            step = _bound_and_unbound(model, rows, seed=rows)
            kinds = [op[0] for op in step.plan.ops]
            assert kinds.count(_plan.KINDS["silu_mul"]) == (3 if inside else 0)
            assert len(step.rests) == (0 if inside else 3)
            assert len(step.plan.cuts) == (2 if inside else 5) and step.unbound_from == []
