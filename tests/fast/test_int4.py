"""headwise.fast.int4: a matrix as 4-bit codes multiplies as its dequantized form does (to the
kernel's bfloat16 rounding of the rows), and Int4Linear is an nn.Linear on those codes."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise.fast import int4 as _int4


def random_int4(out, groups, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (out, groups * 32), generator=g)
    scales = torch.rand(out, groups, generator=g) * 0.1 + 0.01
    zeros = torch.randn(out, groups, generator=g) * 0.3
    return codes, scales, zeros


def _reference(codes, scales, zeros):
    """``(q - 8) * scale + zero`` in float64, with scale and zero rounded to bfloat16 as the
    kernel holds them."""
    s, z = (t.to(torch.bfloat16).double().repeat_interleave(32, 1) for t in (scales, zeros))
    return (codes.double() - 8) * s + z


@settings(deadline=None, max_examples=20)
@given(out=st.sampled_from([16, 64, 96]), groups=st.integers(1, 4), rows=st.integers(1, 4),
       seed=st.integers(0, 2**31 - 1))
def test_int4_multiplies_by_its_codes(out, groups, rows, seed):
    codes, scales, zeros = random_int4(out, groups, seed)
    w = _int4.Int4(codes, scales, zeros, 32)
    want_w = _reference(codes, scales, zeros)
    assert (w.dequantize().double() - want_w).abs().max() < 1e-6 * want_w.abs().max()
    x = torch.randn(rows, groups * 32, generator=torch.Generator().manual_seed(seed + 1))
    # the kernel rounds x to bfloat16, accumulates in float32, returns bfloat16 -> x's dtype
    want = x.to(torch.bfloat16).double() @ want_w.t()
    got = w(x)
    assert got.dtype == x.dtype and got.shape == (rows, out)
    assert ((got.double() - want).abs() <= 2**-8 * want.abs() + 1e-4 * want.abs().max()).all()
    assert not torch.equal(got, torch.zeros_like(got))


@settings(deadline=None, max_examples=10)
@given(seed=st.integers(0, 2**31 - 1), bias=st.booleans(), lead=st.sampled_from([(2,), (2, 3)]))
def test_int4_linear_is_a_linear_layer_on_its_codes(seed, bias, lead):
    torch.manual_seed(seed)
    codes, scales, zeros = random_int4(32, 2, seed)
    b = torch.randn(32) if bias else None
    layer = _int4.Int4Linear(_int4.Int4(codes, scales, zeros, 32), b, torch.float32)
    assert (layer.in_features, layer.out_features) == (64, 32)
    assert [n for n, _ in layer.named_parameters()] == (["bias"] if bias else [])  # no weight
    w = layer.weight  # dequantized on demand, the matrix the kernel multiplies by
    assert w.shape == (32, 64) and torch.equal(w, layer.int4.dequantize())
    x = torch.randn(*lead, 64)
    want = layer.int4(x.reshape(-1, 64)).view(*lead, 32) + (b if bias else 0)
    torch.testing.assert_close(layer(x), want, rtol=0, atol=0)
    # near F.linear with the dequantized weight: x rounded to bfloat16 inside the kernel moves
    # each product by at most 2^-9 |x_k w_k| (a bound per element; a relative tolerance fails
    # where the sum cancels), plus float32 accumulation
    bound = 2**-8 * (x.abs() @ w.abs().t()) + 1e-5
    assert ((layer(x) - torch.nn.functional.linear(x, w, b)).abs() <= bound).all()
    assert _int4.dtype_of(layer) == torch.float32
    layer.to(torch.bfloat16)  # the model's dtype moves; the codes stay
    assert _int4.dtype_of(layer) == layer.weight.dtype == torch.bfloat16
    assert layer.int4.packed.dtype == torch.uint8
    assert layer(x.to(torch.bfloat16)).dtype == torch.bfloat16
    plain = torch.nn.Linear(3, 2).double()
    assert _int4.dtype_of(plain) == torch.float64
