"""CPU flash attention in bf16 with a float32 backward, against the float64 reference."""

import torch
from hypothesis import given

import headwise as hw
from headwise.fast import flash_cpu as _flash_cpu
from tests.attend.test_init import configs, draw_inputs
from tests.reference import reference_attention


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-12)).item()


@given(cfg=configs.filter(lambda c: c["mask"] != "full_bool"))
def test_bf16_training_on_cpu_runs_a_float32_backward_close_to_float64(cfg):
    """bf16 with autograd on the CPU: flash forward, float32 backward (headwise.fast.flash_cpu). The
    gradients match the float64 reference of the same bf16 values, at least as well as torch's
    own bf16 backward does."""
    cfg = {**cfg, "e": cfg["d"], "nq": cfg["nq"] + 8, "nk": cfg["nk"] + 8}  # flash-eligible
    q, k, v, mask = draw_inputs(cfg)
    q, k, v = (t.bfloat16().requires_grad_() for t in (q, k, v))
    causal = cfg["causal"]
    calls = []
    original = _flash_cpu.FlashUpcastBackward.apply

    def spy(*args):
        calls.append(1)
        return original(*args)
    _flash_cpu.FlashUpcastBackward.apply = spy
    try:
        out, _ = hw.attention(q, k, v, mask=mask, causal=causal, backend="sdpa")
    finally:
        _flash_cpu.FlashUpcastBackward.apply = original
    assert calls, "the float32-backward path was not taken"
    grad_out = torch.randn_like(out)
    ours = torch.autograd.grad(out, (q, k, v), grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out, _ = reference_attention(q64, k64, v64, mask, causal)
    refs = torch.autograd.grad(ref_out, (q64, k64, v64), grad_out.double())
    assert _rel(out, ref_out) < 1e-2
    # torch's bf16 path on the same inputs (its flash backward runs in bf16)
    h, g = q.shape[1], k.shape[1]
    sdpa_mask = None if mask is None else (mask if mask.dtype == torch.bool
                                           else mask.bfloat16())
    if causal:
        allowed = hw.masks.causal(q.shape[2], k.shape[2])
        sdpa_mask = allowed if sdpa_mask is None else (
            sdpa_mask & allowed if sdpa_mask.dtype == torch.bool
            else sdpa_mask.masked_fill(~allowed, float("-inf")))
    theirs_out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=sdpa_mask, enable_gqa=h != g)
    theirs = torch.autograd.grad(theirs_out, (q, k, v), grad_out)
    for mine, torchs, ref in zip(ours, theirs, refs, strict=True):
        assert torch.isfinite(mine).all()
        if ref.norm() > 0 and torch.isfinite(torchs).all():
            assert _rel(mine, ref) <= _rel(torchs, ref) + 5e-3
            assert _rel(mine, ref) < 3e-2


def test_applies_only_to_reduced_precision_cpu_calls_autograd_records():
    q, k, v = (torch.randn(1, 2, 16, 8, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    flash = lambda: "FLASH_ATTENTION"  # noqa: E731
    assert _flash_cpu.applies(q, k, v, 0.0, flash)
    assert not _flash_cpu.applies(q, k, v, 0.1, flash)  # dropout
    assert not _flash_cpu.applies(q.float(), k.float(), v.float(), 0.0, flash)  # float32
    assert not _flash_cpu.applies(q, k, v, 0.0, lambda: "MATH")
    with torch.no_grad():
        assert not _flash_cpu.applies(q, k, v, 0.0, flash)
    assert _flash_cpu.takes(q.float(), k.float(), v.float(), 0.0, flash)


def test_with_lse_gives_sdpa_output_and_the_row_logsumexp():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 9, 8, generator=gen) for _ in range(3))
    out, lse = _flash_cpu.with_lse(q, k, v, None, False, None)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v))
    scores = torch.einsum("bhid,bhjd->bhij", q.double(), k.double()) / 8 ** 0.5
    torch.testing.assert_close(lse.double(), scores.logsumexp(-1), rtol=1e-5, atol=1e-5)
