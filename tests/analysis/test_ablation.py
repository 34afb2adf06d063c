"""Ablation and activation patching on every model: zero ablation equals head_mask 0; mean
ablation equals moving the head's mean output into the out-projection's bias (a reference
built from the weights); patching every head of a layer from a source run gives that layer the
source run's output; patching no head is the target run; the tools are observers of
headwise.observe's per-head outputs (no torch hook), gone after the block; nested tools compose,
outermost first; generation sees them; bad selections and mismatched runs are clear errors."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import headwise as hw
from headwise import observe
from headwise.models import attention_layers, head_counts
from tests.models.test_heads import bert, lm, seq2seq

MODELS = {"lm": lambda s: lm(s), "llama": lambda s: lm(s, llama=True), "seq2seq": seq2seq,
          "bert": bert}


def inputs(name: str, gen, b: int = 2, n: int = 6):
    if name == "seq2seq":
        return (torch.randint(1, 23, (b, n + 1), generator=gen),
                torch.randint(1, 19, (b, n), generator=gen))
    return (torch.randint(0, 29, (b, n), generator=gen),)


def pick(model, gen) -> dict:
    """A random non-empty selection ``{kind: {layer: [heads]}}``."""
    heads = {}
    for kind, counts in head_counts(model).items():
        for layer, h in enumerate(counts):
            chosen = [x for x in range(h) if torch.rand((), generator=gen) < 0.4]
            if chosen:
                heads.setdefault(kind, {})[layer] = chosen
    return heads or {next(iter(head_counts(model))): {0: [0]}}


def as_mask(model, heads) -> dict:
    out = {}
    for kind, counts in head_counts(model).items():
        m = torch.ones(len(counts), counts[0])
        for layer, hs in heads.get(kind, {}).items():
            m[layer, hs] = 0
        out[kind] = m
    return out


@settings(max_examples=8)
@given(name=st.sampled_from(sorted(MODELS)), seed=st.integers(0, 2**16))
def test_zero_ablation_equals_head_mask_zero(name, seed):
    model, gen = MODELS[name](seed), torch.Generator().manual_seed(seed)
    x = inputs(name, gen)
    heads = pick(model, gen)
    plain, _ = model(*x)
    with hw.ablate(model, heads):
        assert observe.observed()  # an observer of the channel, not a torch hook
        assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())
        got, _ = model(*x)
    want, _ = model(*x, head_mask=as_mask(model, heads))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    again, _ = model(*x)  # the observer is gone
    torch.testing.assert_close(again, plain, atol=0, rtol=0)
    assert not observe.observed()
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


@settings(max_examples=8)
@given(name=st.sampled_from(sorted(MODELS)), seed=st.integers(0, 2**16))
def test_mean_ablation_equals_mean_in_the_bias(name, seed):
    """Replacing head x's output by a constant mu is ``out_proj`` with head x's columns W_x
    zeroed and ``W_x mu`` added to the bias."""
    model, gen = MODELS[name](seed), torch.Generator().manual_seed(seed)
    reference = [inputs(name, gen, b=3) for _ in range(2)]
    means = hw.head_means(model, reference)
    x = inputs(name, gen)
    heads = pick(model, gen)
    with hw.ablate(model, heads, mode="mean", means=means):
        got, _ = model(*x)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for kind, per_layer in heads.items():
            for layer, hs in per_layer.items():
                proj = attention_layers(other)[kind][layer].out_proj
                if proj.bias is None:
                    proj.bias = torch.nn.Parameter(torch.zeros(proj.out_features))
                d = proj.in_features // head_counts(other)[kind][layer]
                for h in hs:
                    cols = slice(h * d, (h + 1) * d)
                    proj.bias += proj.weight[:, cols] @ means[kind][layer][h]
                    proj.weight[:, cols] = 0
    want, _ = other(*x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_nested_tools_compose_outermost_first():
    """Nested blocks stack as torch pre-hooks registered in order did: an ablation inside an
    ablation removes both selections; record_heads inside ablate records the ablated outputs,
    and around it (ablate inside the recorded run) the outputs before the ablation."""
    model, gen = lm(4), torch.Generator().manual_seed(4)
    x = inputs("lm", gen)
    outer, inner = {"decoder_self": {0: [0]}}, {"decoder_self": {0: [1], 1: [2]}}
    with hw.ablate(model, outer), hw.ablate(model, inner):
        got, _ = model(*x)
    want, _ = model(*x, head_mask=as_mask(model, {"decoder_self": {0: [0, 1], 1: [2]}}))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    with hw.ablate(model, outer):
        ablated = hw.record_heads(model, lambda: model(*x))["decoder_self"][0]  # (b, i, h, d)
    assert (ablated[:, :, 0] == 0).all() and (ablated[:, :, 1] != 0).any()

    def ablated_run():
        with hw.ablate(model, outer):
            return model(*x)
    before = hw.record_heads(model, ablated_run)["decoder_self"][0]
    plain = hw.record_heads(model, lambda: model(*x))["decoder_self"][0]
    assert torch.equal(before, plain) and (plain[:, :, 0] != 0).any()
    assert not observe.observed()


def test_head_means_is_the_average_head_output():
    model, gen = lm(3), torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 29, (2, 5), generator=gen), torch.randint(0, 29, (3, 5),
                                                                          generator=gen)]
    means = hw.head_means(model, batches)
    found = [hw.record_heads(model, lambda b=b: model(b)) for b in batches]
    layer1 = torch.cat([f["decoder_self"][1].flatten(0, 1) for f in found])  # (positions, h, d)
    torch.testing.assert_close(means["decoder_self"][1], layer1.mean(0), atol=1e-6, rtol=1e-6)


def _layer_outputs(model, kind, layer, run):
    found = []
    mha = attention_layers(model)[kind][layer]
    handle = mha.register_forward_hook(lambda m, a, out: found.append(out[0].detach()))
    try:
        result = run()
    finally:
        handle.remove()
    return result, found[-1]


@settings(max_examples=8)
@given(name=st.sampled_from(sorted(MODELS)), seed=st.integers(0, 2**16), data=st.data())
def test_patching_every_head_gives_the_source_layer_output(name, seed, data):
    model, gen = MODELS[name](seed), torch.Generator().manual_seed(seed)
    source, target = inputs(name, gen), inputs(name, gen)
    kind = data.draw(st.sampled_from(sorted(head_counts(model))))
    layer = data.draw(st.integers(0, len(head_counts(model)[kind]) - 1))
    source_out, source_layer = _layer_outputs(model, kind, layer, lambda: model(*source))
    target_out, _ = model(*target)
    with hw.patch(model, {kind: {layer: True}}, source=lambda: model(*source)):
        _, patched_layer = _layer_outputs(model, kind, layer, lambda: model(*target))
    torch.testing.assert_close(patched_layer, source_layer, atol=1e-6, rtol=1e-6)
    with hw.patch(model, {}, source=lambda: model(*source)):
        unpatched, _ = model(*target)
    torch.testing.assert_close(unpatched, target_out, atol=0, rtol=0)


def test_patching_from_the_run_itself_is_the_identity():
    model, gen = seq2seq(5), torch.Generator().manual_seed(5)
    x = inputs("seq2seq", gen)
    plain, _ = model(*x)
    recorded = hw.record_heads(model, lambda: model(*x))
    with hw.patch(model, {"cross": {1: [2]}, "decoder_self": {0: [0, 1]}}, recorded):
        same, _ = model(*x)
    torch.testing.assert_close(same, plain, atol=0, rtol=0)


def test_generation_sees_the_ablation():
    model, gen = seq2seq(7), torch.Generator().manual_seed(7)
    src = torch.randint(1, 23, (2, 6), generator=gen)
    start = torch.ones(2, 1, dtype=torch.long)
    every = {"cross": {0: True, 1: True}}
    with hw.ablate(model, every):
        ablated = hw.generate(model, start, src=src, max_new_tokens=5)
    masked = hw.generate(model, start, src=src, max_new_tokens=5)
    # without cross-attention the output cannot depend on the source
    other_src = torch.randint(1, 23, (2, 6), generator=gen)
    with hw.ablate(model, every):
        assert torch.equal(ablated, hw.generate(model, start, src=other_src, max_new_tokens=5))
    assert masked.shape == ablated.shape


def test_errors():
    model, gen = lm(0), torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 29, (2, 6), generator=gen)
    with pytest.raises(ValueError, match="mode must be one of"):
        with hw.ablate(model, {"decoder_self": {0: [0]}}, mode="resample"):
            pass
    with pytest.raises(ValueError, match="needs means="):
        with hw.ablate(model, {"decoder_self": {0: [0]}}, mode="mean"):
            pass
    with pytest.raises(ValueError, match="head 9 of decoder_self layer 0 does not exist"):
        with hw.ablate(model, {"decoder_self": {0: [9]}}):
            pass
    with pytest.raises(ValueError, match="unknown attention kind 'cross'"):
        with hw.patch(model, {"cross": {0: [0]}}, source=lambda: model(tokens)):
            pass
    with pytest.raises(ValueError, match="same batch size and length"):
        with hw.patch(model, {"decoder_self": {1: [0]}}, source=lambda: model(tokens)):
            model(tokens[:, :4])
    with pytest.raises(ValueError, match="no data"):
        hw.head_means(model, [])
    with pytest.raises(TypeError, match="expected a headwise model"):
        with hw.ablate(torch.nn.Linear(3, 3), {}):
            pass


@pytest.mark.parametrize("name", ["llama", "seq2seq"])
def test_every_tool_stays_on_the_fused_kernel(name, monkeypatch):
    """Under strict mode any attention call that left the fused kernel would raise: the
    model-level head_mask, zero and mean ablation and patching never do."""
    monkeypatch.setenv("HEADWISE_STRICT", "1")
    model, gen = MODELS[name](11), torch.Generator().manual_seed(11)
    x, other = inputs(name, gen), inputs(name, gen)
    every = {k: {l: True for l in range(len(c))} for k, c in head_counts(model).items()}
    model(*x, head_mask={k: torch.rand(len(c), c[0], generator=gen)
                         for k, c in head_counts(model).items()})
    with hw.ablate(model, every):
        model(*x)
    with hw.ablate(model, every, mode="mean", means=hw.head_means(model, [x])):
        model(*x)
    with hw.patch(model, every, source=lambda: model(*other)):
        model(*x)
