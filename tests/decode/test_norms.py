"""headwise.decode.norms: the norms' one-row forms equal the modules' forwards, through the C
kernel and through torch alike (the RMSNorm form's fallback, four small kernels, is the formula)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise.decode.norms import RMSRow, layer_norm_row
from headwise.fast import native as _native
from headwise.models.norms import LayerNorm, RMSNorm


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 5), m=st.integers(1, 70), eps=st.sampled_from([1e-6, 1e-5, 0.5]),
       kernel=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_the_rms_form_is_the_forward_with_and_without_the_kernel(b, m, eps, kernel, seed):
    torch.manual_seed(seed)
    norm = RMSNorm(m, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(m))
    x = torch.randn(b, m) * 3
    form = RMSRow(norm)
    with pytest.MonkeyPatch.context() as mp:
        if not kernel:
            mp.setattr(_native, "rms_rows", lambda *args: None)
        got = form(x)
    torch.testing.assert_close(got, norm(x), atol=1e-6, rtol=1e-5)


@settings(max_examples=20, deadline=None)
@given(b=st.integers(1, 5), m=st.integers(2, 40), seed=st.integers(0, 2**31 - 1))
def test_the_layer_norm_form_is_the_forward_bit_for_bit(b, m, seed):
    torch.manual_seed(seed)
    norm = LayerNorm(m, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(m))
        norm.bias.copy_(torch.randn(m))
    x = torch.randn(b, m)
    assert torch.equal(layer_norm_row(norm)(x), norm(x))


def test_the_bf16_rms_form_takes_the_modules_rounding_without_the_kernel(monkeypatch):
    torch.manual_seed(0)
    norm = RMSNorm(64, eps=1e-5).to(torch.bfloat16)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(_native, "rms_rows", lambda *args: None)
    assert torch.equal(RMSRow(norm)(x), norm(x))
