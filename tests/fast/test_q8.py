"""headwise.fast.q8: 8-bit codes multiply as the float32 matrix they dequantize to (float32
sums, on either CPU path, 1-2 threads), stand in for a weight only while they still are it, and
a declined product falls back to the weight with its reason kept."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from headwise.fast import native as _native
from headwise.fast import q8 as _q8
from headwise.fast import rows as _rows
from tests.fast.conftest import torch_threads


def random_q8(out, groups, seed):
    """``(codes, scales, the float32 weight they dequantize to)``."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-128, 128, (out, groups * 32), generator=g, dtype=torch.int8)
    scales = (torch.rand(out, groups, generator=g) * 0.02 + 1e-4).half()
    return codes, scales, codes.float() * scales.float().repeat_interleave(32, 1)


@settings(deadline=None, max_examples=30,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # (isa: one path each)
@given(out=st.integers(1, 150), groups=st.integers(1, 7), rows=st.integers(1, 4),
       pad=st.integers(0, 5), bias=st.booleans(), res=st.booleans(),
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**31 - 1))
def test_the_kernel_multiplies_by_the_dequantized_matrix_on_each_path(
        isa, out, groups, rows, pad, bias, res, threads, seed):
    """Output counts that leave every remainder of the four streams and of the threads' blocks,
    1-7 groups, padded rows of x and of the residual, bias and residual on or off, 1 or 2
    threads; against float64 on the exact dequantized weights. The bound is float32 summation
    (each product and sum rounded once): (n + 2) * 2^-24 of the sum of |terms|."""
    codes, scales, w = random_q8(out, groups, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    n = groups * 32
    x = torch.randn(rows, n + pad, generator=gen)[:, :n]
    b = torch.randn(out, generator=gen) if bias else None
    r = torch.randn(rows, out + pad, generator=gen)[:, :out] if res else None
    extra = [t.double() for t in ((b,) if bias else ()) + ((r,) if res else ())]
    want = x.double() @ w.double().t() + sum(extra, torch.zeros(()))
    terms = x.double().abs() @ w.double().abs().t() + sum((t.abs() for t in extra),
                                                          torch.zeros(()))
    with torch_threads(threads):
        got = _native.q8_matmul(x, codes, scales, b, r)
    assert got is not None and got.shape == (rows, out) and got.dtype == torch.float32
    assert ((got.double() - want).abs() <= (n + 2) * 2**-24 * terms).all()


@pytest.mark.skipif(_native.status() != "ready", reason="headwise's kernel is not built here")
def test_what_the_kernel_cannot_take_is_declined_with_a_reason():
    codes, scales, _ = random_q8(8, 2, 0)
    assert _native.q8_matmul(torch.randn(5, 64), codes, scales) is None  # more than 4 rows
    assert "b <= 4" in _native.declined()["q8_matmul"]
    assert _native.q8_matmul(torch.randn(2, 64), codes.to(torch.uint8), scales) is None
    assert _native.q8_matmul(torch.randn(2, 64).double(), codes, scales) is None


def test_codes_that_are_not_the_weight_are_refused():
    codes, scales, w = random_q8(4, 2, 1)
    q8 = _q8.Q8(codes, scales, w)
    assert torch.equal(q8.dequantize(), w) and q8.nbytes() == 4 * 64 + 4 * 2 * 2
    with pytest.raises(ValueError, match="do not dequantize to the weight"):
        _q8.Q8(codes, scales, w + 1)
    with pytest.raises(ValueError, match="multiple of 32"):
        _q8.Q8(codes[:, :40], scales[:, :1], w[:, :40])


def test_the_step_reads_the_codes_while_they_are_the_weight_and_falls_back_after():
    """A linear with Q8 codes: 1-4 rows multiply through them (as close to F.linear as float32
    summation allows), 5 rows and a weight changed in place through the weight itself."""
    codes, scales, w = random_q8(40, 3, 2)
    layer = nn.Linear(96, 40)
    with torch.no_grad():
        layer.weight.copy_(w)
    layer.q8 = _q8.Q8(codes, scales, layer.weight)
    assert _q8.of(layer) is layer.q8
    weight = _rows.of_linear(layer, False)
    assert weight[2] is _rows.Q8
    for rows in (1, 4, 5):
        x = torch.randn(rows, 96)
        want = torch.nn.functional.linear(x, layer.weight, layer.bias)
        torch.testing.assert_close(_rows.linear(x, weight), want, rtol=1e-5, atol=1e-5)
        res = torch.randn(rows, 40)
        torch.testing.assert_close(_rows.residual(res, x, weight), res + want, rtol=1e-5,
                                   atol=1e-5)
    with torch.no_grad():
        layer.weight.mul_(2)  # the codes are stale now
    assert _q8.of(layer) is None and _rows.of_linear(layer, False)[2] is not _rows.Q8
    layer.weight = nn.Parameter(w.clone())  # another parameter: not the codes' weight either
    assert _q8.of(layer) is None


@pytest.mark.parametrize("change", ["fused adamw", "foreach adamw", "sgd", "new storage"])
def test_codes_go_stale_when_training_or_a_new_storage_changes_the_weight(change):
    """A fused optimizer writes the weight without counting a version: the optimizer step is
    what marks the codes stale; ``weight.data = ...`` keeps the parameter but not its storage.
    Either way the step multiplies by the weight as it now is."""
    codes, scales, w = random_q8(40, 3, 4)
    layer = nn.Linear(96, 40, bias=False)
    with torch.no_grad():
        layer.weight.copy_(w)
    layer.q8 = _q8.Q8(codes, scales, layer.weight)
    other = nn.Linear(96, 40)  # an optimizer over other parameters leaves the codes valid
    torch.optim.SGD(other.parameters(), lr=0.1).step()
    assert _q8.of(layer) is layer.q8
    x = torch.randn(1, 96)
    if change == "new storage":
        layer.weight.data = torch.randn(40, 96)
    else:
        opt = {"fused adamw": lambda p: torch.optim.AdamW(p, lr=0.1, fused=True),
               "foreach adamw": lambda p: torch.optim.AdamW(p, lr=0.1, foreach=True),
               "sgd": lambda p: torch.optim.SGD(p, lr=0.1)}[change](layer.parameters())
        layer(x).square().sum().backward()
        opt.step()
    assert not torch.equal(layer.weight.detach(), w)
    assert _q8.of(layer) is None
    weight = _rows.of_linear(layer, False)
    assert weight[2] is not _rows.Q8
    torch.testing.assert_close(_rows.linear(x, weight), layer(x).detach(), rtol=1e-5, atol=1e-5)
