"""RMSNorm and LayerNorm against float64 references; RMSNorm's bf16 order is HF Llama's; the
one-row forms equal the forwards."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headwise.decode.forms import form_of
from headwise.models.norms import LayerNorm, RMSNorm, make_norm


@given(m=st.integers(1, 40), eps=st.sampled_from([1e-5, 1e-6, 0.3]), seed=st.integers(0, 2**16))
def test_rms_norm_matches_float64_reference(m, eps, seed):
    torch.manual_seed(seed)
    norm = RMSNorm(m, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(m))
    x = torch.randn(3, 4, m) * 3
    xd, wd = x.double(), norm.weight.double()
    want = xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + eps) * wd
    torch.testing.assert_close(norm(x).double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(norm.double()(xd), want, atol=1e-12, rtol=1e-12)
    norm.float()
    torch.testing.assert_close(form_of(norm)(x[:, 0]), norm(x[:, 0]), atol=1e-6, rtol=1e-6)


def test_rms_norm_bf16_rounds_like_hf_llama():
    torch.manual_seed(0)
    norm = RMSNorm(64, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    norm = norm.to(torch.bfloat16)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    # HF LlamaRMSNorm.forward, written out
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
    want = norm.weight * h.to(torch.bfloat16)
    assert torch.equal(norm(x), want)
    assert torch.equal(form_of(norm)(x), want)


@given(m=st.integers(2, 40), seed=st.integers(0, 2**16))
def test_layer_norm_matches_float64_reference_and_row(m, seed):
    torch.manual_seed(seed)
    norm = LayerNorm(m, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(m))
        norm.bias.copy_(torch.randn(m))
    x = torch.randn(6, m) * 2 + 1
    xd = x.double()
    mu, var = xd.mean(-1, keepdim=True), xd.var(-1, unbiased=False, keepdim=True)
    want = (xd - mu) / torch.sqrt(var + 1e-5) * norm.weight.double() + norm.bias.double()
    # float32 statistics over as few as 2 features round to ~1e-4 of the output (m=2,
    # seed=1604: 3.7e-5 on 1.4; at most 1.4e-4 over every other seed for m = 2, 3, 5, 40, all
    # within this tolerance); a wrong eps or an unbiased variance is off by 1e-2 and more
    torch.testing.assert_close(norm(x).double(), want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(form_of(norm)(x), norm(x), atol=0, rtol=0)


def test_make_norm():
    assert isinstance(make_norm("rms", 8, 1e-6), RMSNorm)
    assert isinstance(make_norm("layer", 8, 1e-6), torch.nn.LayerNorm)
    assert [n for n, _ in make_norm("rms", 8, 1e-6).named_parameters()] == ["weight"]
    with pytest.raises(ValueError, match="norm must be one of"):
        make_norm("batch", 8, 1e-5)
