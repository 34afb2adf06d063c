"""The head-wise KV cache against dense float64 references: the sinks + window rule per group,
over the ring's wrap, with left padding; whole models: W >= length gives the full cache's
tokens and logits, and every group streaming with no sinks is the sliding-window model."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise.decode.generation import generate_with_logits
from headwise.decode.ragged import HeadwiseCache, RaggedLayer, headwise_cache
from headwise.kvplan import KVPlan
from headwise.models import LMConfig, TransformerLM


def reference(q, k, v, stream, r, sinks, window, starts):
    """Dense float64 attention, every allowed pair written out: query ``i`` of head ``hh``
    (group ``hh // r``) sees key ``j <= i`` of its row's real positions; a streaming group only
    the first ``sinks`` real ones and the ``window`` latest."""
    b, h, n, d = q.shape
    out = torch.zeros(b, h, n, d, dtype=torch.float64)
    for row in range(b):
        s0 = int(starts[row])
        for hh in range(h):
            c = hh // r
            for i in range(s0, n):
                keys = [j for j in range(s0, i + 1)
                        if c not in stream or j - s0 < sinks or j > i - window]
                scores = q[row, hh, i] @ k[row, c, keys].T / d ** 0.5
                out[row, hh, i] = torch.softmax(scores, -1) @ v[row, c, keys]
    return out


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), prompt=st.integers(1, 9), steps=st.integers(1, 14),
       sinks=st.integers(0, 3), window=st.integers(1, 5), padded=st.booleans(),
       stream=st.sets(st.integers(0, 2), max_size=3))
def test_a_layer_attends_each_group_under_its_rule_over_the_wrap(seed, prompt, steps, sinks,
                                                                  window, padded, stream):
    g = torch.Generator().manual_seed(seed)
    b, h, groups, d = 2, 6, 3, 8
    n = prompt + steps
    q, k, v = (torch.randn(b, c, n, d, generator=g, dtype=torch.float64) for c in (h, groups,
                                                                                 groups))
    plan = KVPlan(1, groups, d, sinks, window, (tuple(stream),))
    layer = RaggedLayer(plan, 0, b, n, dtype=torch.float64, device="cpu")
    starts = torch.tensor([0, min(2, prompt - 1)]) if padded else torch.zeros(b, dtype=torch.long)
    j = torch.arange(n)
    real = j[None, :] >= starts[:, None]  # (b, j): left padding
    mask = (real[:, None, None, :] & (j[None, :] <= j[:, None])[None, None])  # (b, 1, i, j)
    outs = [layer.attend(q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt],
                         mask=mask[:, :, :prompt, :prompt] if padded else None)]
    for t in range(prompt, n):
        outs.append(layer.attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1],
                                 mask=mask[:, :, t:t + 1, :t + 1] if padded else None))
    got = torch.cat(outs, 2)
    want = reference(q, k, v, stream, h // groups, sinks, window, starts)
    for row in range(b):
        s0 = int(starts[row])
        torch.testing.assert_close(got[row, :, s0:], want[row, :, s0:], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_memory_is_allocated_per_group(dtype):
    """The bytes are the tensors' own storage: a streaming group owns S + W slots, a full one
    max_len, and no buffer of the full cache's size is held anywhere."""
    plan = KVPlan(2, 4, 16, 4, 12, ((0, 1, 2), ()))
    cache = HeadwiseCache(plan, 3, 1000, dtype=dtype)
    size = torch.empty((), dtype=dtype).element_size()
    full = 2 * 2 * 3 * 4 * 1000 * 16 * size
    kept = 2 * 3 * 16 * size * (3 * 16 + 1 * 1000 + 4 * 1000)
    layers = [layer.self_attn for layer in cache.layers]
    assert [tuple(x.kr.shape) for x in layers] == [(3, 3, 16, 16), (3, 0, 16, 16)]
    assert [tuple(x.kf.shape) for x in layers] == [(3, 1, 1000, 16), (3, 4, 1000, 16)]
    storage = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
               for x in layers for t in (x.kf, x.vf, x.kr, x.vr)}
    assert sum(storage.values()) == cache.nbytes() == kept == plan.kv_bytes(3, 1000, size)
    assert kept < full / 1.5


def lm(**kw):
    args = dict(d_model=32, num_heads=4, num_kv_heads=2, num_layers=3, d_ff=64, max_len=64,
                dropout=0.0, positional="rope", norm="rms", ffn="glu", activation="silu")
    args.update(kw)
    torch.manual_seed(7)
    return TransformerLM(LMConfig(41, **args)).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_window_over_the_whole_text_gives_the_full_caches_tokens_and_logits(dtype, batch):
    model = lm().to(dtype)
    x = torch.randint(1, 41, (batch, 11), generator=torch.Generator().manual_seed(batch))
    plan = KVPlan(3, 2, 8, 2, 64 - 2, ((0,), (0, 1), ()))
    tokens, logits = generate_with_logits(model, x, max_new_tokens=20)
    tokens2, logits2 = generate_with_logits(model, x, max_new_tokens=20, kv_plan=plan)
    assert torch.equal(tokens, tokens2)
    bound = 1e-6 if dtype is torch.float32 else 1e-2
    assert (logits2 - logits).abs().max() <= bound * max(1.0, logits.abs().max().item())


def test_every_group_streaming_without_sinks_is_the_sliding_window_model():
    """Keys are stored turned at their true positions, queries at theirs: after the ring has
    wrapped several times the logits are the sliding-window model's (computed from scratch
    on the whole text, no cache)."""
    model, windowed = lm(), lm(sliding_window=5)
    windowed.load_state_dict(model.state_dict())
    x = torch.randint(1, 41, (2, 7), generator=torch.Generator().manual_seed(3))
    plan = KVPlan.uniform(3, 2, 8, sinks=0, window=5)
    tokens, logits = generate_with_logits(model, x, max_new_tokens=25, kv_plan=plan)
    with torch.no_grad():
        full = windowed(tokens)[0]
    torch.testing.assert_close(logits, full[:, 6:-1].float(), rtol=1e-5, atol=1e-5)


def test_after_the_ring_wraps_each_step_is_the_masked_prefill_of_the_whole_text():
    """In float64, with sinks and a window the ring wraps many times over: the logits of every
    decoded position are those of a fresh prefill of the whole text so far, which attends under
    the sinks + window mask over every position at its true RoPE angle (no ring)."""
    model = lm().double()
    x = torch.randint(1, 41, (2, 5), generator=torch.Generator().manual_seed(8))
    plan = KVPlan(3, 2, 8, 2, 3, ((0, 1), (1,), (0, 1)))
    tokens, logits = generate_with_logits(model, x, max_new_tokens=16, kv_plan=plan)
    for t in (5, 9, 13, 20):
        with torch.no_grad():
            want = model(tokens[:, :t], cache=headwise_cache(model, plan, 2, t))[0][:, -1]
        torch.testing.assert_close(logits[:, t - 5].double(), want, rtol=1e-10, atol=1e-10)


def test_the_module_path_and_the_step_agree_on_a_streaming_plan():
    model = lm()
    x = torch.randint(1, 41, (2, 9), generator=torch.Generator().manual_seed(5))
    plan = KVPlan(3, 2, 8, 2, 3, ((1,), (0, 1), (0,)))
    cache = headwise_cache(model, plan, 2, 30)
    with torch.no_grad():
        out = model(x, cache=cache)
        first = out[0][:, -1]
    tokens, logits = generate_with_logits(model, x, max_new_tokens=6, kv_plan=plan)
    torch.testing.assert_close(logits[:, 0], first, rtol=1e-5, atol=1e-5)
    cache = headwise_cache(model, plan, 2, 30)
    with torch.no_grad():  # the module path over every position, one at a time after the prompt
        step = model(tokens[:, :9], cache=cache)
        for t in range(9, 14):
            step = model(tokens[:, t:t + 1], cache=cache)
            got = step[0][:, -1]
            torch.testing.assert_close(got, logits[:, t - 8], rtol=1e-5, atol=1e-5)


def test_a_plan_for_another_model_is_refused():
    with pytest.raises(ValueError, match=r"the plan is for .*\(4, 2, 8\).*\(3, 2, 8\)"):
        headwise_cache(lm(), KVPlan.uniform(4, 2, 8), 1)
    with pytest.raises(ValueError, match="in one call"):
        cache = headwise_cache(lm(), KVPlan.uniform(3, 2, 8), 1, 20)
        lm()(torch.ones(1, 3, dtype=torch.long), cache=cache)
        lm()(torch.ones(1, 3, dtype=torch.long), cache=cache)


def test_smollm2_with_a_window_over_the_whole_text_gives_the_full_caches_answer(smollm2_path):
    from headwise.pretrained.gguf import load_gguf

    model = load_gguf(smollm2_path).model
    c = model.config
    x = torch.tensor([[1, 504, 3458, 314, 260, 1789, 28, 27024, 7, 29, 2353]])
    half = tuple(range(0, c.kv_heads, 2))
    plan = KVPlan(c.num_layers, c.kv_heads, c.head_size, 4, 64,
                  tuple(half if i % 2 else () for i in range(c.num_layers)))
    tokens, logits = generate_with_logits(model, x, max_new_tokens=10)
    tokens2, logits2 = generate_with_logits(model, x, max_new_tokens=10, kv_plan=plan)
    assert torch.equal(tokens, tokens2)
    assert (logits2 - logits).abs().max() <= 1e-6 * max(1.0, logits.abs().max().item())


def test_the_fixed_shape_step_reads_the_same_ragged_cache_and_graphs_are_refused():
    from headwise.decode.step import DecodeStep

    model = lm()
    x = torch.randint(1, 41, (2, 6), generator=torch.Generator().manual_seed(9))
    plan = KVPlan(3, 2, 8, 1, 3, ((0,), (1,), (0, 1)))
    outs = []
    for static in (False, True):
        cache = headwise_cache(model, plan, 2, 20)
        with torch.inference_mode():
            model(x, cache=cache)
            step = DecodeStep(model, cache, static=static)
            outs.append(torch.stack([step(x[:, t % 6]) for t in range(8)]))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="head-wise KV cache"):
        DecodeStep(model, headwise_cache(model, plan, 2, 20), graph=True)
