"""HeadwiseKVCache with transformers' generate on tiny random models (Llama GQA, Mistral,
Gemma 3, Qwen2, gpt-oss): a window over the whole text gives the full cache's tokens and
logits, with left padding too; a streaming plan matches a dense float64 sinks + window run;
other attention implementations and foreign plans are refused in one line."""

from __future__ import annotations

import pytest
import torch

from tests.hf.tiny import build, transformers  # noqa: F401  (skips without transformers)

pytest.importorskip("transformers")  # (before headwise.hf, which needs it)
from headwise.hf import HeadwiseKVCache  # noqa: E402
from headwise.hf.kvcache import model_shape  # noqa: E402
from headwise.kvplan import KVPlan  # noqa: E402

FAMILIES = ["llama", "mistral", "gemma3", "qwen2", "gpt_oss"]


def run(model, ids, mask, cache, new=8):
    out = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                         past_key_values=cache, output_logits=True, return_dict_in_generate=True,
                         pad_token_id=0)
    return out.sequences, torch.stack(out.logits, 1)


def inputs(padded: bool):
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(3, 64, (2, 9), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        ids[1, :3], mask[1, :3] = 0, 0
    return ids, mask


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_window_over_the_whole_text_gives_the_full_caches_tokens_and_logits(family, padded):
    model = build(family, "headwise")
    ids, mask = inputs(padded)
    layers, groups, d = model_shape(model.config)
    plan = KVPlan(layers, groups, d, 2, 40, ((0,),) + ((0, 1),) * (layers - 1))
    with torch.no_grad():
        want_ids, want = run(model, ids, mask, None)
        got_ids, got = run(model, ids, mask, HeadwiseKVCache(model, plan, 17))
    assert torch.equal(got_ids, want_ids)
    assert (got - want).abs().max() <= 1e-6 * max(1.0, want.abs().max().item())


def dense(model, ids, sinks, window):
    """Every position's logits from scratch in float64, each layer's attention under the sinks
    + window mask (the plan's every group streaming), on the eager implementation."""
    model = model.double()
    n = ids.shape[1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = (j <= i) & ((j < sinks) | (j > i - window))
    bias = torch.zeros(1, 1, n, n, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    model.set_attn_implementation("eager")  # (a 4D mask is taken as it is)
    return model(ids, attention_mask=bias).logits.float()


def test_every_group_streaming_is_the_dense_sinks_and_window_attention_over_the_wrap():
    model = build("llama", "headwise")
    ids, mask = inputs(False)
    layers, groups, d = model_shape(model.config)
    plan = KVPlan.uniform(layers, groups, d, sinks=2, window=3)
    with torch.no_grad():
        seq, logits = run(model, ids, mask, HeadwiseKVCache(model, plan, 30), new=12)
        want = dense(build("llama"), seq, 2, 3)
    torch.testing.assert_close(logits, want[:, 8:-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_left_padded_row_streams_as_it_does_alone_over_the_wrap(family):
    """Batch 2, row 1 left-padded by 3: its sinks are its first real tokens and its positions
    start at 0 there, so after the ring has wrapped its tokens and logits are those of the same
    row run alone without padding."""
    model = build(family, "headwise")
    model.generation_config.eos_token_id = None  # (both runs decode all 12 tokens)
    ids, mask = inputs(True)
    layers, groups, d = model_shape(model.config)
    plan = KVPlan(layers, groups, d, 2, 3, ((0, 1),) + ((1,),) * (layers - 1))
    with torch.no_grad():
        seq, logits = run(model, ids, mask, HeadwiseKVCache(model, plan, 21), new=12)
        alone, want = run(model, ids[1:, 3:], mask[1:, 3:], HeadwiseKVCache(model, plan, 18),
                          new=12)
    assert torch.equal(seq[1, 3:], alone[0])
    torch.testing.assert_close(logits[1], want[0], rtol=1e-5, atol=1e-5)


def test_other_implementations_and_other_shapes_are_refused():
    model = build("llama", "sdpa")
    layers, groups, d = model_shape(model.config)
    plan = KVPlan.uniform(layers, groups, d)
    with pytest.raises(ValueError, match="attn_implementation='headwise'"):
        HeadwiseKVCache(model, plan, 20)
    cache = HeadwiseKVCache(build("llama", "headwise"), plan, 20)
    with pytest.raises(ValueError, match="without headwise's attention function"):
        run(model, *inputs(False), cache)
    with pytest.raises(ValueError, match=r"the plan is for"):
        HeadwiseKVCache(build("llama", "headwise"), KVPlan.uniform(layers + 1, groups, d), 20)


def test_smollm2_with_a_window_over_the_whole_text_gives_the_full_caches_answer(smollm2_path):
    from headwise.hf import load

    model, tok = load("smollm2")
    ids = torch.tensor([[1, 504, 3458, 314, 260, 1789, 28, 27024, 7, 29, 2353]])
    layers, groups, d = model_shape(model.config)
    plan = KVPlan(layers, groups, d, 4, 64, tuple((1,) if i % 2 else () for i in range(layers)))
    with torch.no_grad():
        want_ids, want = run(model, ids, torch.ones_like(ids), None)
        got_ids, got = run(model, ids, torch.ones_like(ids), HeadwiseKVCache(model, plan, 19))
    assert torch.equal(got_ids, want_ids)
    assert (got - want).abs().max() <= 1e-6 * max(1.0, want.abs().max().item())
