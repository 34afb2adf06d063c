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


def _lanes() -> int:
    from headwise.fast import plan as _plan
    found = _plan._torch_exp()
    if found is None:
        pytest.skip("torch's vector exp is not found in this build")
    return found[1]


@settings(deadline=None, max_examples=40)
@given(b=st.integers(1, 4), k=st.integers(1, 6), scale=st.sampled_from([1.0, 30.0, 120.0]),
       dtype=DTYPES, seed=st.integers(0, 2**31 - 1))
def test_a_bound_silu_mul_is_torchs_bit_for_bit(b, k, scale, dtype, seed):
    """The plan's silu * u is ``torch.mul(F.silu(g), u)`` bit for bit, g and u the two halves
    of one gate|up buffer as the step binds them, over silu's range (exp underflowing and
    overflowing at +-scale 120); a NaN stops the run there (torch then redoes the layer)."""
    gen = torch.Generator().manual_seed(seed)
    f = 2 * _lanes() * (2 if dtype is torch.bfloat16 else 1) * k  # (torch's vector steps)
    gu = _randn(gen, b, 2 * f, dtype=dtype) * scale
    g, u = gu.split_with_sizes((f, f), -1)
    out, plan = torch.empty(b, f, dtype=dtype), Plan(b)
    assert plan.silu_mul(g, u, out)
    assert _run(plan) == -1
    want = torch.mul(torch.nn.functional.silu(g), u)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    gu[b - 1, f - 1] = float("nan")
    assert plan.run(0, 0, 1, _native.library()) == 0


def test_silu_mul_declines_what_it_would_not_compute_as_torch(monkeypatch):
    """Rows whose width is not a multiple of torch's vector step (two vectors: its remainder
    goes through the scalar exp), more values than torch runs on one thread (its split could
    fall inside a row), mixed dtypes, strided rows;
    and, where the check against torch finds other bits (here: Sleef's 2^x handed in as the
    exp), the op declines and says why."""
    import ctypes
    from pathlib import Path

    from headwise.fast import plan as _plan
    lanes = _lanes()
    g, u = torch.randn(2, 2 * lanes), torch.randn(2, 2 * lanes)
    plan = Plan(2)
    assert not plan.silu_mul(g[:, :lanes], u[:, :lanes], torch.empty(2, lanes))
    assert not plan.silu_mul(g.bfloat16(), u.bfloat16(), torch.empty(2, 2 * lanes,
                                                                      dtype=torch.bfloat16))
    assert not plan.silu_mul(g, u.bfloat16(), torch.empty(2, 2 * lanes))
    assert not plan.silu_mul(g.t(), u.t(), torch.empty(2 * lanes, 2))
    big = torch.randn(2, 16384 + 2 * lanes)
    assert not plan.silu_mul(big, big, torch.empty_like(big))
    assert plan.ops == []
    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    rough = getattr(lib, "Sleef_exp2f16_u10" if lanes == 16 else "Sleef_exp2f8_u10avx2")
    monkeypatch.setattr(_plan, "_torch_exp", lambda: (ctypes.cast(rough, ctypes.c_void_p).value,
                                                      lanes))
    _plan._same.cache_clear()
    try:
        assert not plan.silu_mul(g, u, torch.empty(2, 2 * lanes)) and plan.ops == []
        assert "silu_mul" in _native.declined()
    finally:
        _plan._same.cache_clear()
        _native._declined.pop("silu_mul", None)


def test_silu_mul_on_torchs_avx2_path_is_torchs_bit_for_bit():
    """Under torch's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2, a CPU without AVX-512) the op
    takes Sleef's 8-lane exp and still matches torch, in a fresh process (the capability is
    fixed when torch loads)."""
    import os
    import subprocess
    import sys
    code = ("import torch; from headwise.fast import plan as p; "
            "assert torch.backends.cpu.get_cpu_capability() == 'AVX2'; "
            "assert p._torch_exp()[1] == 8; "
            "assert p._same(torch.float32) and p._same(torch.bfloat16); print('ok')")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert got.returncode == 0 and got.stdout.strip() == "ok", got.stderr[-2000:]
