"""Inference that reuses its buffers (headwise.fast.reuse): decided once at a model's forward,
bit for bit the plain expressions, never while autograd or a hook could see the old values."""

import pytest
import torch
from torch import nn

from headwise.fast import large as _large
from headwise.fast import reuse
from headwise.models import LMConfig, TransformerLM


def tiny(**kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=40, d_model=16, num_heads=4, num_layers=2, d_ff=32, max_len=32)
    return TransformerLM(LMConfig(**(cfg | kw))).eval()


def test_reusable_only_without_autograd_and_hooks():
    model = tiny()
    assert not reuse.reusable(model)  # grad is on
    with torch.no_grad():
        assert reuse.reusable(model)
        handle = model.blocks[1].ff.down.register_forward_hook(lambda m, a, o: None)
        assert not reuse.reusable(model)
        handle.remove()
        handle = nn.modules.module.register_module_forward_hook(lambda m, a, o: None)
        assert not reuse.reusable(model)
        handle.remove()
        assert reuse.reusable(model)


@pytest.mark.parametrize("grad", [True, False])
def test_the_forms_are_the_plain_expressions_in_place_only_inside_a_reusing_scope(grad):
    model = tiny()
    x, out, h, g, u = (torch.randn(4, 6) for _ in range(5))
    with torch.set_grad_enabled(grad), reuse.scope(model) as on:
        assert on is not grad
        a, b, c = out.clone(), h.clone(), g.clone()
        s = reuse.add(x, a)
        y = reuse.activate("silu", b, torch.nn.functional.silu)
        z = reuse.gate(c, u)
    assert torch.equal(s, x + out) and (s is a) is on
    assert torch.equal(y, torch.nn.functional.silu(h)) and (y is b) is on
    assert torch.equal(z, g * u) and (z is c) is on


def test_scope_restores_the_previous_setting_after_an_error():
    model = tiny()
    with torch.no_grad():
        with pytest.raises(RuntimeError), reuse.scope(model) as on:
            assert on
            raise RuntimeError("boom")
        a, x = torch.randn(2), torch.randn(2)
        assert reuse.add(x, a) is not a


@pytest.mark.parametrize("ffn, activation", [("mlp", "gelu"), ("glu", "silu"), ("mlp", "relu")])
def test_a_models_forward_reuses_with_the_same_bits_as_autograd(ffn, activation):
    model = tiny(ffn=ffn, activation=activation)
    tokens = torch.randint(0, 40, (2, 9))
    want, _ = model(tokens)
    calls = []
    real = reuse.add

    def spy(x, out):
        calls.append(reuse._reusing())
        return real(x, out)

    reuse.add = spy
    try:
        with torch.no_grad():
            got, _ = model(tokens)
    finally:
        reuse.add = real
    assert calls and all(calls)  # the model's forward was the edge that turned reuse on
    assert torch.equal(got, want.detach())
    assert not reuse._reusing()  # and it is off again after


def test_large_logits_go_to_recyclable_memory_only_when_reusing():
    model = tiny(vocab_size=70000, d_model=8, num_heads=2, d_ff=16)
    x = torch.randn(1, 40, 8)
    with torch.no_grad():
        plain = reuse.linear(model.lm_head, x)
        with reuse.scope(model):
            got = reuse.linear(model.lm_head, x)
    assert torch.equal(got, plain) and torch.equal(plain, model.lm_head(x))
    del got
    _large.release()
