"""The function transformers calls: shapes, scaling, dropout, causality without a mask,
grouped-query heads, and no eager pass (strict mode) wherever a fused kernel can serve."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.hf.tiny import batch, build

hh = pytest.importorskip("headwise.hf", reason="the hf wing needs transformers")
import headwise as hw  # noqa: E402


def _qkv(b=2, h=4, g=2, i=5, j=5, d=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, i, d, generator=gen), torch.randn(b, g, j, d, generator=gen),
            torch.randn(b, g, j, d, generator=gen))


def _module(causal=True):
    module = nn.Module()
    module.is_causal = causal
    return module


@pytest.mark.parametrize("causal", [True, False])
def test_output_is_b_i_h_e_and_equals_headwise_attention_with_the_scaling(causal):
    q, k, v = _qkv()
    out, weights = hh.attention_forward(_module(causal), q, k, v, None, scaling=0.3,
                                        output_attentions=True)
    want, want_w = hw.attention(q, k, v, causal=causal, scale=0.3, return_weights=True,
                                backend="eager")
    torch.testing.assert_close(out, want.transpose(1, 2), atol=1e-6, rtol=0)
    torch.testing.assert_close(weights, want_w, atol=1e-6, rtol=0)
    assert out.shape == (2, 5, 4, 8) and out.is_contiguous()


def test_no_weights_unless_asked():
    q, k, v = _qkv()
    assert hh.attention_forward(_module(), q, k, v, None)[1] is None


def test_without_a_mask_the_unwritten_static_cache_slots_are_cut():
    """HF leaves out the mask of an empty static cache's prefill (keys j > i: the unwritten
    slots); the prompt attends only itself, causally."""
    q, k, v = _qkv(j=8)
    out, _ = hh.attention_forward(_module(), q, k, v, None)
    want, _ = hw.attention(q, k[:, :, :5], v[:, :, :5], causal=True)
    torch.testing.assert_close(out, want.transpose(1, 2), atol=1e-6, rtol=0)


def test_a_bool_mask_carries_causality_and_is_causal_false_turns_it_off():
    q, k, v = _qkv()
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    mask[0, :, :, 0] = False
    out, _ = hh.attention_forward(_module(False), q, k, v, mask)
    want, _ = hw.attention(q, k, v, mask=mask)
    torch.testing.assert_close(out, want.transpose(1, 2), atol=1e-6, rtol=0)
    plain, _ = hh.attention_forward(_module(), q, k, v, None, is_causal=False)
    torch.testing.assert_close(plain, hw.attention(q, k, v)[0].transpose(1, 2), atol=1e-6,
                               rtol=0)


def test_dropout_is_honoured():
    q, k, v = _qkv()
    torch.manual_seed(0)
    dropped, _ = hh.attention_forward(_module(), q, k, v, None, dropout=0.5)
    assert not torch.allclose(dropped, hh.attention_forward(_module(), q, k, v, None)[0])


def test_sinks_on_the_fused_kernel_equal_the_eager_reference():
    q, k, v = _qkv()
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    mask[0, :, :2] = False  # two fully masked rows: zero output, zero weights
    out, weights = hh.attention_forward(_module(), q, k, v, mask, s_aux=sinks,
                                        output_attentions=True)
    want, want_w = hw.attention(q, k, v, mask=mask, sinks=sinks, return_weights=True)
    torch.testing.assert_close(out, want.transpose(1, 2), atol=1e-6, rtol=0)
    torch.testing.assert_close(weights, want_w, atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", ["llama", "gpt_oss", "bert", "mistral"])
@pytest.mark.parametrize("padding", ["none", "left"])
def test_strict_mode_passes_no_eager_pass_with_weights(family, padding, monkeypatch):
    """HEADWISE_STRICT raises whenever a call would leave the fused kernel: every layer's
    weights and a selection run with none of that."""
    model = build(family, "headwise")
    ids, mask = batch(padding)
    monkeypatch.setenv("HEADWISE_STRICT", "1")
    with torch.no_grad():
        assert len(model(input_ids=ids, attention_mask=mask, output_attentions=True)
                   .attentions) == 2
        with hh.weights(model, {"layers": [0], "heads": [1], "rows": slice(-2, None)}) as got:
            model(input_ids=ids, attention_mask=mask)
    assert got[0].shape == (2, 1, 2, 9)


def test_strict_mode_names_soft_capping_as_the_reason_for_the_eager_path(monkeypatch):
    model = build("gemma2", "headwise")
    ids, mask = batch("none")
    monkeypatch.setenv("HEADWISE_STRICT", "1")
    with pytest.raises(ValueError, match="soft-capping"), torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
