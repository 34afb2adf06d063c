"""Feed-forward networks: SwiGLU / GeGLU and the plain MLP against float64 references, and
their one-row forms: tests/reference/decode/test_feedforward.py."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from headwise.models.feedforward import FeedForward, GatedFeedForward, make_feedforward


def _randomise(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return module


@given(m=st.integers(1, 12), f=st.integers(1, 20), bias=st.booleans(),
       act=st.sampled_from(["silu", "gelu_tanh", "gelu", "relu"]), seed=st.integers(0, 2**16))
def test_gated_matches_float64_reference(m, f, bias, act, seed):
    torch.manual_seed(seed)
    ff = _randomise(GatedFeedForward(m, f, activation=act, bias=bias)).eval()
    x = torch.randn(2, 3, m)
    xd = x.double()

    def lin(layer, y):
        out = y @ layer.weight.double().T
        return out + layer.bias.double() if layer.bias is not None else out
    a = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu,
         "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[act]
    want = lin(ff.down, a(lin(ff.gate, xd)) * lin(ff.up, xd))
    torch.testing.assert_close(ff(x).double(), want, atol=1e-5, rtol=1e-4)
    if act == "silu":  # SwiGLU spelled out: silu(z) = z * sigmoid(z)
        z = lin(ff.gate, xd)
        torch.testing.assert_close(want, lin(ff.down, z * torch.sigmoid(z) * lin(ff.up, xd)))


def test_parameter_names_and_bad_kind():
    names = [n for n, _ in make_feedforward("glu", 4, 6, bias=False).named_parameters()]
    assert sorted(names) == ["down.weight", "gate.weight", "up.weight"]
    assert type(make_feedforward("mlp", 4, 6)) is FeedForward
    with pytest.raises(ValueError, match="ffn must be one of"):
        make_feedforward("moe", 4, 6)
