"""Strict mode: each fallback from the fused kernel raises, naming its reason; the fused path
never raises."""

import pytest
import torch
from hypothesis import given

import headwise as hw
from tests.attend.test_init import configs, draw_inputs


def qkv(d=8, e=8, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(2, 4, 16, d, generator=gen, dtype=dtype),
            torch.randn(2, 4, 16, d, generator=gen, dtype=dtype),
            torch.randn(2, 4, 16, e, generator=gen, dtype=dtype))


def test_a_mask_the_kernel_refuses_raises():
    q, k, v = qkv()
    mask = torch.zeros(1, 1, 16, 16, requires_grad=True)  # a learned bias: the math kernel
    with pytest.raises(ValueError, match="refuses this mask .*requires grad"):
        hw.attention(q, k, v, mask=mask, strict=True)
    hw.attention(q, k, v, mask=mask)  # without strict it runs


def test_dropout_on_the_cpu_raises():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"dropout > 0 \(dropout_p=0.1\) on the CPU"):
        hw.attention(q, k, v, dropout_p=0.1, strict=True)


def test_value_head_dim_different_from_query_head_dim_raises():
    q, k, v = qkv(d=8, e=4)
    with pytest.raises(ValueError, match="value head dim 4 != query head dim 8"):
        hw.attention(q, k, v, strict=True)


def test_an_unsupported_dtype_raises():
    """Mixed q/k/v dtypes are refused at attention()'s boundary before any kernel is chosen;
    the strict rule itself names the dtype when torch's choice is the math kernel."""
    from headwise import strict
    q, k, v = qkv()
    with pytest.raises(TypeError, match="must share one dtype"):
        hw.attention(q, k.double(), v, strict=True)
    reason = strict.fallback_reason(q, k.double(), v, None, 0.0, "MATH")
    assert reason is not None and "unsupported dtype" in reason
    with pytest.raises(ValueError, match="unsupported dtype"):
        strict.check(True, reason)


def test_all_weights_above_the_budget_raise_and_a_selection_does_not(monkeypatch):
    q, k, v = qkv()
    monkeypatch.setenv("HEADWISE_WEIGHTS_BUDGET_MB", "0.001")  # 1 KiB < 2*4*16*16*4 bytes
    with pytest.raises(ValueError, match="exceed the budget of 0 MiB"):
        hw.attention(q, k, v, return_weights=True, strict=True)
    _, w = hw.attention(q, k, v, return_weights=hw.Selection(heads=1, rows=[3]), strict=True)
    assert w.shape == (2, 1, 1, 16)
    hw.attention(q, k, v, return_weights=True)  # without strict it runs


def test_the_eager_backend_raises_under_strict_and_the_environment_turns_it_on(monkeypatch):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="eager backend was chosen by name"):
        hw.attention(q, k, v, backend="eager", strict=True)
    monkeypatch.setenv("HEADWISE_STRICT", "1")
    with pytest.raises(ValueError, match=r"dropout > 0 \(dropout_p=0.1\) on the CPU"):
        hw.attention(q, k, v, dropout_p=0.1)
    mha = hw.MultiHeadAttention(16, 2, dropout=0.1)  # training mode: dropout on the CPU
    with pytest.raises(ValueError, match="strict mode"):
        mha(torch.randn(1, 5, 16))
    hw.attention(q, k, v, dropout_p=0.1, strict=False)  # the argument wins


@given(cfg=configs.filter(lambda c: c["d"] == c["e"]))
def test_strict_never_raises_on_the_fused_path(cfg):
    """Every mask kind, causal with nq != nk, grouped heads, fully masked rows; with and without
    weights (all of them, or a selection)."""
    q, k, v, mask = draw_inputs(cfg)
    for want in (False, True, hw.Selection(heads=0, rows=[-1])):
        hw.attention(q, k, v, mask=mask, causal=cfg["causal"], return_weights=want, strict=True)


def test_strict_module_runs_fused_with_padding_causal_and_grouped_heads():
    self_attn = hw.MultiHeadAttention(24, 4, num_kv_heads=2, strict=True).eval()
    cross = hw.MultiHeadAttention(24, 4, num_kv_heads=2, kdim=10, strict=True).eval()
    x, mem = torch.randn(3, 7, 24), torch.randn(3, 9, 10)
    self_attn(x, valid_lens=torch.tensor([7, 3, 1]), causal=True, return_weights=True)
    cross(x, mem, valid_lens=torch.tensor([9, 2, 5]), return_weights={"rows": [0]})
