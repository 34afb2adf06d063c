"""headwise.fast.plan: each bound op, run by the plan's one C call, writes what its
headwise.fast.native wrapper returns for the same tensors, bit for bit (products of every form,
norms, the one-call self-attention at later positions, the bfloat16 rounding); a run stops at
the first op that fails and runs nothing after it; the binders decline what the wrappers
decline."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise.fast import int4 as _int4
from headwise.fast import native as _native
from headwise.fast import q8 as _q8
from headwise.fast.plan import Plan
from headwise.rope import RotaryEmbedding
from tests.fast.conftest import torch_threads

pytestmark = pytest.mark.skipif(_native.status() != "ready",
                                reason="headwise's kernel is not built here")

DTYPES = st.sampled_from([torch.float32, torch.bfloat16])


def _run(plan: Plan, pos: int = 0, threads: int = 1) -> int:
    plan.cut()
    plan.seal()
    with torch_threads(threads):
        return plan.run(len(plan.cuts) - 2, pos, threads, _native.library())


def _randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


@settings(deadline=None, max_examples=40)
@given(b=st.integers(1, 4), m=st.integers(1, 100), pad=st.integers(0, 5), dtype=DTYPES,
       seed=st.integers(0, 2**31 - 1))
def test_a_bound_rms_is_rms_rows_bit_for_bit(b, m, pad, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = _randn(gen, b, m + pad, dtype=dtype)[:, :m]  # (rows pad apart)
    w = _randn(gen, m, dtype=dtype)
    plan, y = Plan(b), torch.full((b, m), float("nan"), dtype=dtype)
    assert plan.rms(x, w, 1e-5, y)
    assert _run(plan) == -1
    assert torch.equal(y, _native.rms_rows(x, w, 1e-5))


@settings(deadline=None, max_examples=60)
@given(b=st.integers(1, 4), n=st.integers(1, 70), out=st.integers(1, 150), bias=st.booleans(),
       res=st.booleans(), wt=st.booleans(), dtype=DTYPES, threads=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**31 - 1))
def test_a_bound_product_is_rows_matmul_bit_for_bit(b, n, out, bias, res, wt, dtype, threads,
                                                    seed):
    wt = wt and b == 1 and dtype is torch.float32  # (W^T storage: one float32 row)
    gen = torch.Generator().manual_seed(seed)
    x, w = _randn(gen, b, n, dtype=dtype), _randn(gen, *((n, out) if wt else (out, n)),
                                                  dtype=dtype)
    bias = _randn(gen, out, dtype=dtype) if bias else None
    res = _randn(gen, b, out, dtype=dtype) if res else None
    plan, y = Plan(b), torch.empty(b, out, dtype=dtype)
    assert plan.matmul(x, w, y, bias, res, wt=wt)
    assert _run(plan, threads=threads) == -1
    with torch_threads(threads):
        assert torch.equal(y, _native.rows_matmul(x, w, bias, res, wt=wt))


@settings(deadline=None, max_examples=40)
@given(b=st.integers(1, 4), groups=st.integers(1, 5), out=st.integers(1, 100),
       eight=st.booleans(), bias=st.booleans(), res=st.booleans(),
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**31 - 1))
def test_a_bound_coded_product_is_the_bound_product_bit_for_bit(b, groups, out, eight, bias,
                                                                res, threads, seed):
    gen = torch.Generator().manual_seed(seed)
    n = 32 * groups
    if eight:
        codes = torch.randint(-128, 128, (out, n), generator=gen, dtype=torch.int8)
        scales = (torch.rand(out, groups, generator=gen) * 0.02 + 1e-4).half()
        product = _native.q4_product(codes, scales, None)
    else:
        w = _int4.Int4(torch.randint(0, 16, (out, n), generator=gen),
                       torch.rand(out, groups, generator=gen) * 0.1,
                       torch.rand(out, groups, generator=gen) - 0.5)
        product = _native.q4_product(w.codes, w.scales, w.mins)
    x = _randn(gen, b, n)
    bias = _randn(gen, out) if bias else None
    res = _randn(gen, b, out) if res else None
    plan, y = Plan(b), torch.empty(b, out)
    assert plan.coded(product, x, y, bias, res)
    assert _run(plan, threads=threads) == -1
    with torch_threads(threads):
        assert torch.equal(y, product(x, bias, res))


def _self_case(b, g, per, d, length, dtype, gen):
    h = g * per
    rows = _randn(gen, b, (h + 2 * g) * d, dtype=dtype)
    k, v = (_randn(gen, b, g, length, d, dtype=dtype) for _ in range(2))
    return h, rows, k, v


@settings(deadline=None, max_examples=40)
@given(b=st.integers(1, 4), g=st.integers(1, 3), per=st.integers(1, 3),
       d=st.sampled_from([8, 16, 64]), pos=st.integers(0, 20), later=st.integers(0, 10),
       window=st.sampled_from([None, 1, 4]), rope=st.booleans(), dtype=DTYPES,
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**31 - 1))
def test_a_bound_self_attention_is_self_rows_at_every_later_position(b, g, per, d, pos, later,
                                                                     window, rope, dtype,
                                                                     threads, seed):
    """Bound at ``pos``, run at ``pos + later``: the position, the angles' row and the
    window's start are the run's."""
    gen = torch.Generator().manual_seed(seed)
    at, length = pos + later, pos + later + 3
    h, rows, k, v = _self_case(b, g, per, d, length, dtype, gen)
    r = d // 2 if rope else 0
    angles = RotaryEmbedding(d, rotary_dim=r).angles(0, length, rows) if rope else None
    rows2, k2, v2 = rows.clone(), k.clone(), v.clone()
    plan, out = Plan(b), torch.empty(b, h * d)
    assert plan.self_attention(rows, angles, k, v, h, r, window, pos, out)
    assert _run(plan, at, threads) == -1
    start = 0 if window is None else max(0, at + 1 - window)
    rot = None if angles is None else tuple(t[at:at + 1] for t in angles)
    with torch_threads(threads):
        status, want = _native.self_rows(rows2, rot, k2, v2, at, start, h, r, True)
    assert status == 2
    assert torch.equal(out.to(dtype), want) and torch.equal(rows, rows2)  # (bf16: to_bf16 op)
    assert torch.equal(k, k2) and torch.equal(v, v2)


def test_bfloat16_rounding_is_torchs_and_a_nan_stops_the_run():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 500, generator=gen) * 10.0 ** torch.randint(-30, 30, (3, 500),
                                                                  generator=gen)
    ties = (x[:, :40].view(torch.int32) & ~0xFFFF) | 0x8000  # exact ties: to even
    x[:, :40] = ties.view(torch.float32)
    x[0, 41], x[1, 42], x[2, 43] = float("inf"), float("-inf"), 3.4e38  # (rounds up to inf)
    plan, y = Plan(3), torch.empty(3, 500, dtype=torch.bfloat16)
    assert plan.to_bf16(x, y)
    assert _run(plan) == -1
    assert torch.equal(y.view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
    x[1, 7] = float("nan")
    assert plan.run(0, 0, 1, _native.library()) == 0  # (the caller redoes it)


def test_a_run_stops_at_the_op_that_fails_and_runs_nothing_after_it():
    gen = torch.Generator().manual_seed(1)
    h, rows, k, v = _self_case(1, 2, 2, 16, 6, torch.float32, gen)
    rows[0, -1] = float("nan")  # a value: the attention's NaN policy is the caller's
    w, out = torch.ones(rows.shape[1]), torch.empty(1, h * 16)
    first, after = torch.zeros_like(rows), torch.zeros_like(rows)
    plan = Plan(1)
    plan.layer = 3
    assert plan.rms(rows, w, 1e-6, first)
    plan.layer = 4
    assert plan.self_attention(rows, None, k, v, h, 0, None, 2, out)
    assert plan.rms(rows, w, 1e-6, after)
    plan.cut()
    plan.seal()
    assert plan.run(0, 2, 1, _native.library()) == 1 and plan.owner[1] == 4
    assert torch.isnan(v[0, 1, 2, -1])  # (written, as self_rows writes it)
    assert torch.isnan(first).all()  # (ran: the norm of a row holding a NaN)
    assert torch.equal(after, torch.zeros_like(rows))  # (did not run)


def test_the_binders_decline_what_the_wrappers_decline():
    x, w = torch.randn(5, 8), torch.randn(6, 8)
    plan = Plan(5)
    assert not plan.matmul(x, w, torch.empty(5, 6))  # five rows
    assert not plan.matmul(x[:2].double(), w.double(), torch.empty(2, 6).double())
    assert not plan.matmul(x[:2], w, torch.empty(6, 2).t())  # the output not contiguous rows
    assert not plan.matmul(x[:2], w, torch.empty(2, 6, dtype=torch.bfloat16))  # its dtype
    assert not plan.rms(x, torch.ones(7), 1e-6, torch.empty(5, 8))  # the weight's size
    assert not plan.rms(x.t(), torch.ones(5), 1e-6, torch.empty(8, 5))  # strided rows
    codes = torch.randint(-128, 128, (6, 32), dtype=torch.int8)
    product = _native.q4_product(codes, torch.ones(6, 1).half(), None)
    assert not plan.coded(product, torch.randn(5, 32), torch.empty(5, 6))  # q8: 1-4 rows
    assert not plan.coded(product, torch.randn(2, 32).bfloat16(), torch.empty(2, 6))
    h, rows, k, v = _self_case(1, 2, 2, 16, 6, torch.float32, torch.Generator())
    assert not plan.self_attention(rows, None, k, v, h, 0, None, 6, torch.empty(1, h * 16))
    assert not plan.self_attention(rows[:, :-1], None, k, v, h, 0, None, 2,
                                   torch.empty(1, h * 16))
    assert not plan.to_bf16(x, torch.empty(5, 8))
    assert plan.ops == []  # (nothing added by a decline)


def test_q8_codes_bind_through_their_product():
    codes = torch.randint(-128, 128, (40, 64), dtype=torch.int8)
    scales = (torch.rand(40, 2) * 0.02 + 1e-4).half()
    q8 = _q8.Q8(codes, scales, codes.float() * scales.float().repeat_interleave(32, 1))
    x, plan, y = torch.randn(2, 64), Plan(2), torch.empty(2, 40)
    assert plan.coded(_native.q4_product(q8.codes, q8.scales, None), x, y)
    assert _run(plan) == -1
    assert torch.equal(y, q8.matmul(x))
