"""headwise.fast.native's bfloat16 kernels on each CPU path (AVX512-BF16 and AVX2, forced by
HEADWISE_NATIVE_ISA): the products of 1-4 rows and the attention of one query over a bfloat16
cache, against float64 on the same bfloat16 values; what they cannot take is declined, with
the reason kept."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from headwise.fast import native as _native
from tests.fast.conftest import torch_threads

BF16 = torch.bfloat16
ONE_PATH = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _bf16(*shape, gen, pad=0):
    """A bfloat16 ``shape`` whose last axis is a view of ``pad`` more (row strides padded)."""
    t = torch.randn(*shape[:-1], shape[-1] + pad, generator=gen).to(BF16)
    return t[..., :shape[-1]]


@settings(max_examples=60, **ONE_PATH)
@given(rows=st.integers(1, 4), n_in=st.integers(1, 150), n_out=st.integers(1, 90),
       bias=st.booleans(), res=st.booleans(), threads=st.sampled_from([1, 2]),
       pad=st.integers(0, 9), seed=st.integers(0, 2**31 - 1))
@example(rows=4, n_in=64, n_out=70, bias=True, res=True, threads=2, pad=3, seed=5)
@example(rows=1, n_in=97, n_out=65, bias=False, res=True, threads=2, pad=0, seed=6)
def test_bf16_rows_matmul_equals_float64(isa, rows, n_in, n_out, bias, res, threads, pad, seed):
    """Every row count, input widths with every tail of the 32- and 64-wide loops, odd output
    counts, padded row strides, bias and residual on or off, 1 or 2 threads. The products of
    two bfloat16 are exact in float32, so the error is the float32 sum (n * 2^-24 of the sum of
    |terms|) and the one rounding to bfloat16 (2^-8 of the result: half an ulp of 8 significant bits)."""
    gen = torch.Generator().manual_seed(seed)
    x, w = _bf16(rows, n_in, gen=gen, pad=pad), _bf16(n_out, n_in, gen=gen, pad=pad)
    b = _bf16(n_out, gen=gen) if bias else None
    r = _bf16(rows, n_out, gen=gen, pad=pad) if res else None
    extra = sum(t.double().abs() for t in (b, r) if t is not None)
    want = x.double() @ w.double().t() + sum(t.double() for t in (b, r) if t is not None)
    with torch_threads(threads):
        got = _native.rows_matmul(x, w, b, r)
    assert got is not None and got.shape == (rows, n_out) and got.dtype == BF16
    bound = 2**-8 * want.abs() + (n_in + 2) * 2**-24 * (x.double().abs() @ w.double().abs().t()
                                                         + extra)
    assert ((got.double() - want).abs() <= bound * (1 + 2**-8)).all()


@settings(max_examples=30, **ONE_PATH)
@given(rows=st.integers(1, 3), g=st.integers(1, 3), per=st.integers(1, 3),
       n=st.integers(1, 70), d=st.sampled_from([8, 17, 64, 80]),
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**31 - 1))
def test_bf16_attend_rows_equals_float64(isa, rows, g, per, n, d, threads, seed):
    """Over a bfloat16 cache (a view of a longer one): within float32 arithmetic of float64
    attention on the same bfloat16 values plus the output's one bfloat16 rounding; torch's
    bfloat16 attention is no closer."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, g * per, 1, d, generator=gen).to(BF16)
    k, v = (torch.randn(rows, g, n + 5, d, generator=gen).to(BF16)[:, :, :n] for _ in "kv")
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                          enable_gqa=True).reshape(rows, -1)
    with torch_threads(threads):
        got = _native.attend_rows(q, k, v)
    assert got is not None and got.dtype == BF16 and got.shape == (rows, g * per * d)
    err = (got.double() - want).abs()
    assert (err <= 2**-8 * want.abs() + 1e-5 * (d + n) * v.double().abs().amax()).all()
    torch_err = (F.scaled_dot_product_attention(q, k, v, enable_gqa=True).reshape(rows, -1)
                 .double() - want).abs()
    assert err.mean() <= torch_err.mean() * (1 + 1e-3)


@pytest.mark.parametrize("case, why", [
    ("mixed dtypes", "not all float32 or all bfloat16"),
    ("five rows", "with b <= 4"),
    ("bfloat16 W^T", "for float32 rows only"),
    ("strided W", "contiguous rows"),
])
def test_what_the_bf16_product_cannot_take_is_declined_with_the_reason(isa, monkeypatch, case,
                                                                        why):
    monkeypatch.setattr(_native, "_declined", {})
    x, w = torch.randn(2, 8).to(BF16), torch.randn(6, 8).to(BF16)
    args = dict(x=x, w=w)
    if case == "mixed dtypes":
        args.update(w=w.float())
    elif case == "five rows":
        args.update(x=torch.randn(5, 8).to(BF16))
    elif case == "bfloat16 W^T":
        args.update(x=x[:1], w=w.t().contiguous(), wt=True)
    else:
        args.update(w=torch.randn(6, 16).to(BF16)[:, ::2])
    assert _native.rows_matmul(**args) is None
    assert why in _native.declined()["rows_matmul"], _native.declined()


def test_an_unknown_isa_setting_keeps_the_torch_path_and_says_how_to_fix_it(monkeypatch):
    monkeypatch.setattr(_native, "_state", {})
    monkeypatch.setenv(_native.ISA_ENV, "sse2")
    assert "HEADWISE_NATIVE_ISA='sse2': expected one of auto, avx2" in _native.status()
    assert _native.isa() is None
    assert _native.rows_matmul(torch.randn(1, 8).to(BF16), torch.randn(4, 8).to(BF16)) is None


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 4), heads=st.integers(1, 5), half=st.integers(1, 40),
       extra=st.integers(0, 5), tail=st.integers(0, 9), pos=st.integers(0, 500),
       bad=st.sampled_from([None, float("nan"), float("inf")]), seed=st.integers(0, 2**31 - 1))
def test_bf16_rope_rows_is_rotate_bit_for_bit_and_reports_finiteness(rows, heads, half, extra,
                                                                     tail, pos, bad, seed):
    """As the float32 kernel's test: partial rotary, features after the q/k heads untouched,
    any position; bfloat16 rows and tables give RotaryEmbedding.rotate's bfloat16 result bit
    for bit (each product and the sum rounded as torch's kernels round them)."""
    from headwise.rope import RotaryEmbedding
    if _native.status() != "ready":
        pytest.skip(_native.status())
    gen = torch.Generator().manual_seed(seed)
    r, d = 2 * half, 2 * half + extra
    rope = RotaryEmbedding(d, theta=10000.0, rotary_dim=r)
    x = (torch.randn(rows, heads * d + tail, generator=gen) * 3).to(torch.bfloat16)
    cos, sin = rope.angles(pos, 1, x)
    if bad is not None:
        x.view(-1)[int(torch.randint(0, x.numel(), (1,), generator=gen))] = bad
    want = rope.rotate(x[:, :heads * d].reshape(rows, heads, 1, d), cos, sin).reshape(rows, -1)
    got = x.clone()
    finite = _native.rope_rows(got, cos, sin, heads, d, r)
    assert finite is bool(torch.isfinite(got).all()) and finite is (bad is None)
    torch.testing.assert_close(got[:, :heads * d], want, atol=0, rtol=0, equal_nan=True)
    assert torch.equal(got[:, heads * d:].view(torch.int16), x[:, heads * d:].view(torch.int16))


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 4), m=st.integers(1, 700), eps=st.sampled_from([1e-6, 1e-5, 0.1]),
       scale=st.sampled_from([1e-3, 1.0, 40.0]), seed=st.integers(0, 2**31 - 1))
def test_bf16_rms_rows_is_the_modules_bf16_norm(rows, m, eps, scale, seed):
    """bfloat16 rows and weight: the normalised row is the float64 one rounded to bfloat16 (up
    to one bfloat16 step where float32 statistics put it on the other side of a rounding
    boundary), times w rounded once: within two bfloat16 steps (2^-6 relative) of the module's
    own bfloat16 forward and of the float64 norm with those roundings, and equal to the
    module's on nearly every feature."""
    from headwise.models.norms import RMSNorm
    if _native.status() != "ready":
        pytest.skip(_native.status())
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, m, generator=gen) * scale).to(torch.bfloat16)
    norm = RMSNorm(m, eps=eps).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(m, generator=gen))
    w = norm.weight.detach()
    got = _native.rms_rows(x, w, eps)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, m)
    x64 = x.double()
    unit = (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)
    want = w.double() * unit.double()
    with torch.no_grad():
        module = norm(x)
    for ref in (want, module.double()):
        assert ((got.double() - ref).abs() <= 2**-6 * ref.abs()).all()
    assert (got == module).float().mean() >= 0.97  # the same rounding, nearly everywhere


@settings(deadline=None, max_examples=25,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 4), n_in=st.integers(1, 640), n_out=st.integers(1, 100),
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**31 - 1))
@example(rows=4, n_in=576, n_out=96, threads=1, seed=0)
@example(rows=2, n_in=200, n_out=67, threads=2, seed=1)
def test_bf16_rows_matmul_is_its_rows_of_w_one_at_a_time_bit_for_bit(isa, rows, n_in, n_out,
                                                                     threads, seed):
    """Reading several rows of W per pass (x's loads shared) keeps each output's order of sums:
    the product equals the products of W's rows taken one at a time, exactly, so the decoding
    step's tokens do not depend on how the kernel walks W."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n_in, generator=g).to(torch.bfloat16)
    w = torch.randn(n_out, n_in, generator=g).to(torch.bfloat16)
    if n_in > 32:  # +-2^20 products that cancel, in the first and second 32 of a 64-wide step:
        x[:, [0, 32]] = 1  # the float32 sums round at 2^-3 until they meet, so another order
        w[:, 0], w[:, 32] = 2.0**20, -2.0**20  # of sums shows in the bfloat16 result
    with torch_threads(threads):
        whole = _native.rows_matmul(x, w)
        one = [_native.rows_matmul(x, w[o:o + 1].contiguous()) for o in range(n_out)]
    assert whole is not None and all(y is not None for y in one)
    assert torch.equal(whole, torch.cat(one, 1))


def _vdpbf16_order(x, w, bias=None, res=None):
    """The AVX512-BF16 product's sums in float32, step by step (step_kernels_bf16.c): x (b, n)
    and w (out, n) in 32-wide steps of 16 lanes; a lane adds its odd-numbered product, then its
    even one (vdpbf16ps); for 2-4 rows of x, the first and second 32 of each 64 go to two sums
    (a tail step of 32 to the first) added at the end; 16 lanes summed in
    ``_mm512_reduce_add_ps``'s order (upper 8 + lower, 4 + 4, lanes 0 + 2 and 1 + 3, then
    those two); bias, then residual; one rounding to bfloat16. Products of two bfloat16 are
    exact in float32, and float32 tensor adds round as the instructions do, so this is the
    kernel's result bit for bit."""
    b, n = x.shape
    pad = (-n) % 64
    p = (F.pad(x.float(), (0, pad)).view(b, 1, -1, 16, 2)
         * F.pad(w.float(), (0, pad)).view(1, w.shape[0], -1, 16, 2))  # (b, out, step, lane, 2)
    acc = torch.zeros(2, b, w.shape[0], 16)
    for step in range(-(-n // 32)):
        h = step % 2 if b > 1 and step < n // 64 * 2 else 0
        acc[h] = (acc[h] + p[:, :, step, :, 1]) + p[:, :, step, :, 0]
    v = acc[0] + acc[1] if b > 1 else acc[0]
    v = v[..., 8:] + v[..., :8]
    v = v[..., 4:] + v[..., :4]
    v = v[..., :2] + v[..., 2:]
    s = v[..., 0] + v[..., 1]
    for t in (bias, res):
        if t is not None:
            s = s + t.float()
    return s.to(BF16)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 4), n_in=st.integers(1, 640), n_out=st.integers(1, 100),
       bias=st.booleans(), res=st.booleans(), threads=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**31 - 1))
@example(rows=4, n_in=576, n_out=97, bias=False, res=True, threads=1, seed=0)
@example(rows=3, n_in=200, n_out=67, bias=True, res=False, threads=2, seed=1)
def test_bf16_rows_matmul_avx512_sums_in_the_documented_order(rows, n_in, n_out, bias, res,
                                                              threads, seed):
    """The AVX512-BF16 path's every sum, in order, equals a float32 emulation of it
    (_vdpbf16_order): how the kernel walks W, reduces its lanes and rounds may change for
    speed, its results may not (the decoding step's tokens). Products of +-2^21 that cancel at
    random places make any other order of the sums show in the bfloat16 result."""
    if _native.isa() != "avx512-bf16":
        pytest.skip(f"the AVX512-BF16 path only (this CPU: {_native.isa()})")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n_in, generator=g).to(BF16)
    w = torch.randn(n_out, n_in, generator=g).to(BF16)
    if n_in > 1:
        for _ in range(3):
            i, j = torch.randperm(n_in, generator=g)[:2].tolist()
            x[:, [i, j]] = 1
            w[:, i], w[:, j] = 2.0**21, -2.0**21
    b = torch.randn(n_out, generator=g).to(BF16) if bias else None
    r = torch.randn(rows, n_out, generator=g).to(BF16) if res else None
    with torch_threads(threads):
        got = _native.rows_matmul(x, w, b, r)
    assert torch.equal(got.view(torch.int16), _vdpbf16_order(x, w, b, r).view(torch.int16))
