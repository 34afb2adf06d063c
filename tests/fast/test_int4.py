"""headwise.fast.int4: a matrix as 4-bit codes multiplies as ``q * scale + min`` does (to the
bfloat16 rounding of the rows and float32 sums), through headwise's kernel on either CPU path
and through torch's int4 kernel where that one declines; Int4Linear is an nn.Linear on those
codes."""

import copy

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from headwise.fast import int4 as _int4
from headwise.fast import native as _native
from tests.fast.conftest import torch_threads
from tests.fast.test_q8 import random_q8


def random_int4(out, groups, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (out, groups * 32), generator=g)
    scales = torch.rand(out, groups, generator=g) * 0.1 + 0.01
    mins = torch.randn(out, groups, generator=g) * 0.3
    return codes, scales, mins


def _reference(w: _int4.Int4, codes):
    """``q * scale + min`` in float64, from the float16 scale and min the form holds."""
    s, m = (t.double().repeat_interleave(32, 1) for t in (w.scales, w.mins))
    return codes.double() * s + m


@settings(deadline=None, max_examples=30,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # (isa: one path each)
@example(out=37, groups=18, rows=1, pad=0, bias=True, res=False, threads=1, seed=1)  # 576 inputs
@example(out=7, groups=49, rows=4, pad=3, bias=False, res=True, threads=2, seed=2)  # 3 x 16 + 1
@given(out=st.integers(1, 70), groups=st.one_of(st.integers(1, 9), st.integers(14, 52)),
       rows=st.integers(1, 4), pad=st.integers(0, 5), bias=st.booleans(), res=st.booleans(),
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**31 - 1))
def test_the_kernel_multiplies_by_the_codes_on_each_path(isa, out, groups, rows, pad, bias, res,
                                                          threads, seed):
    """Odd output counts, 1-9 groups (no block of 16: the tail alone, four at a time on the
    AVX-512 path, a last 1 or 2 for two rows of W at once or for one) or 14-52 (up to three
    blocks of 16 with every tail),
    padded rows of x and of the residual, bias and residual on or off, 1 or 2 threads; against
    float64 on x rounded to bfloat16. The bound is float32 summation over the terms the path
    adds, |q + 128| |scale| |x| at most (the AVX-512 path carries 128 in each code and takes it
    back with the minima): n * 2^-24 of their total, far below one misread nibble."""
    codes, scales, mins = random_int4(out, groups, seed)
    w = _int4.Int4(codes, scales, mins)
    gen = torch.Generator().manual_seed(seed + 1)
    n = groups * 32
    x = torch.randn(rows, n + pad, generator=gen)[:, :n]
    b = torch.randn(out, generator=gen) if bias else None
    r = torch.randn(rows, out + pad, generator=gen)[:, :out] if res else None
    xb = x.to(torch.bfloat16).double()
    want = xb @ _reference(w, codes).t() + (0 if b is None else b.double()) + (
        0 if r is None else r.double())
    terms = xb.abs() @ (143 * w.scales.double().abs().repeat_interleave(32, 1)
                        + w.mins.double().abs().repeat_interleave(32, 1)).t()
    with torch_threads(threads):
        got = _native.q4_matmul(x, w.codes, w.scales, w.mins, b, r)
    assert got is not None and got.shape == (rows, out) and got.dtype == torch.float32
    bound = (n + 8) * 2**-24 * (terms + (0 if b is None else b.double().abs())
                                + (0 if r is None else r.double().abs()))
    assert ((got.double() - want).abs() <= bound).all(), (got.double() - want).abs().max()


@settings(deadline=None, max_examples=10,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # (isa: one path each)
@given(rows=st.integers(1, 4), groups=st.sampled_from([2, 16, 18, 33]),
       seed=st.integers(0, 2**31 - 1))
def test_x_is_rounded_as_torch_rounds_it_ties_to_even(isa, rows, groups, seed):
    """Every value of x halfway between two bfloat16 numbers (in the blocks of 16 groups, which
    the wide path rounds in vectors, and in the tail): the product is that of x rounded as
    torch rounds it, to even, within the float32 bound of the test above; rounding a tie the
    other way moves a product by 2^-8 of it, far past that bound."""
    g = torch.Generator().manual_seed(seed)
    codes, scales, mins = random_int4(8, groups, seed)
    w = _int4.Int4(codes, scales, mins)
    n = groups * 32
    base = torch.randn(rows, n, generator=g).to(torch.bfloat16).float()
    half_ulp = (base.view(torch.int32) & 0x7F800000).view(torch.float32) * 2.0**-8
    x = base + half_ulp * (torch.randint(0, 2, (rows, n), generator=g) * 2 - 1)
    xb = x.to(torch.bfloat16).double()
    assert not torch.equal(xb, base.double())  # (ties that round away from base exist)
    want = xb @ _reference(w, codes).t()
    terms = xb.abs() @ (143 * w.scales.double().abs().repeat_interleave(32, 1)
                        + w.mins.double().abs().repeat_interleave(32, 1)).t()
    got = _native.q4_matmul(x, w.codes, w.scales, w.mins)
    assert ((got.double() - want).abs() <= (n + 8) * 2**-24 * terms).all()


@pytest.mark.skipif(_native.status() != "ready", reason="headwise's kernel is not built here")
@settings(deadline=None, max_examples=10)
@given(out=st.integers(1, 70), groups=st.sampled_from([1, 6, 18, 33]), rows=st.integers(5, 11),
       seed=st.integers(0, 2**31 - 1))
def test_many_rows_give_each_row_what_it_gets_alone(out, groups, rows, seed):
    """A prompt's rows go in fours over blocks of W: each row's values are those of the row
    multiplied on its own (the step's), bit for bit."""
    codes, scales, mins = random_int4(out, groups, seed)
    w = _int4.Int4(codes, scales, mins)
    x = torch.randn(rows, groups * 32, generator=torch.Generator().manual_seed(seed + 1))
    r = torch.randn(rows, out)
    whole = w.matmul(x, None, r)
    for i in range(rows):
        assert torch.equal(whole[i], w.matmul(x[i:i + 1], None, r[i:i + 1])[0])


@settings(deadline=None, max_examples=25,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # (isa: one path each)
@example(rows=4, out=45, groups=18, pairs=6, threads=1, seed=0)  # SmolLM2's 576 inputs
@example(rows=3, out=13, groups=48, pairs=8, threads=2, seed=1)  # its 1536: three blocks
@example(rows=2, out=9, groups=33, pairs=3, threads=1, seed=2)  # 2 x 16 + a last 1
@example(rows=4, out=8, groups=22, pairs=4, threads=1, seed=3)  # 16 + 4 + a last 2
@given(rows=st.integers(1, 4), out=st.integers(1, 45),
       groups=st.one_of(st.integers(1, 6), st.integers(15, 50)), pairs=st.integers(1, 8),
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**31 - 1))
def test_q4_rows_are_each_row_of_x_and_of_w_alone_bit_for_bit(isa, rows, out, groups, pairs,
                                                              threads, seed):
    """However many rows of x (1-4) and of W (four per pass, the rest one at a time) a pass
    takes, each output keeps its order of sums: the product is bit for bit that of each row of
    x alone and of each row of W alone, so the decoding step's tokens do not depend on the
    batch or on how the kernel walks W. x holds +-2^20 pairs that cancel, within a group (the
    same code at both places: the float32 sum of its chain rounds at 2^3 until they meet) and
    across groups (lanes and blocks added at 2^20 scale), so another order of sums shows."""
    codes, scales, mins = random_int4(out, groups, seed)
    g = torch.Generator().manual_seed(seed + 1)
    n = groups * 32
    x = torch.randn(rows, n, generator=g)
    for _ in range(pairs):
        i, j = torch.randint(0, n, (2,), generator=g).tolist()
        if i // 32 == j // 32 or torch.rand(1, generator=g).item() < 0.5:
            j = i // 32 * 32 + (i + 1 + j % 31) % 32  # another place in i's group
            codes[:, j] = codes[:, i]
        sign = torch.randint(0, 2, (rows, 1), generator=g) * 2 - 1
        x[:, [i, j]] = torch.tensor([2.0**20, -2.0**20]) * sign
    w = _int4.Int4(codes, scales, mins)
    with torch_threads(threads):
        whole = _native.q4_matmul(x, w.codes, w.scales, w.mins)
        by_x = [_native.q4_matmul(x[b:b + 1], w.codes, w.scales, w.mins) for b in range(rows)]
        by_w = [_native.q4_matmul(x, w.codes[o:o + 1], w.scales[o:o + 1], w.mins[o:o + 1])
                for o in range(out)]
    assert whole is not None and whole.shape == (rows, out)
    assert torch.equal(whole, torch.cat(by_x, 0))
    assert torch.equal(whole, torch.cat(by_w, 1))


@settings(deadline=None, max_examples=10)
@given(out=st.sampled_from([16, 48]), groups=st.integers(1, 3), rows=st.integers(1, 7),
       seed=st.integers(0, 2**31 - 1))
def test_without_the_kernel_torchs_runs_close_to_the_same_product(out, groups, rows, seed):
    """HEADWISE_NATIVE=0: torch's int4 kernel runs (the reason is kept): it holds scale and zero
    in bfloat16, so its weights move by up to 2^-9 of |8 scale| + |zero| each, on top of the
    rows' bfloat16 rounding."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADWISE_NATIVE", "0")
        mp.setattr(_native, "_state", {})
        mp.setattr(_native, "_declined", {})
        _test_torch_kernel(out, groups, rows, seed)
        assert _native.declined()["q4_matmul"] == "HEADWISE_NATIVE=0"


def _test_torch_kernel(out, groups, rows, seed):
    codes, scales, mins = random_int4(out, groups, seed)
    w = _int4.Int4(codes, scales, mins)
    x = torch.randn(rows, groups * 32, generator=torch.Generator().manual_seed(seed + 1))
    want = x.to(torch.bfloat16).double() @ _reference(w, codes).t()
    got = w(x)
    assert got.dtype == x.dtype and got.shape == (rows, out)
    per_weight = 2**-8 * (8 * w.scales.double() + (w.mins.double() + 8 * w.scales.double()).abs())
    bound = x.double().abs() @ per_weight.repeat_interleave(32, 1).t() + 1e-4
    assert ((got.double() - want).abs() <= bound).all()


@settings(deadline=None, max_examples=20)
@given(out=st.integers(1, 5), groups=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
def test_codes_hold_each_weight_where_the_layout_says(out, groups, seed):
    """pack's layout, read back one nibble at a time from its description: in a block of 16
    groups, 32-bit lane L of 64-byte part u holds weight 8 u + 4 p + k of group L in bits
    16 p + 4 k; a tail group's 16-bit word j holds weights j, 8 + j, 16 + j, 24 + j."""
    codes = torch.randint(0, 16, (out, groups * 32), generator=torch.Generator().manual_seed(seed))
    packed = _int4.Int4(codes, torch.ones(out, groups), torch.zeros(out, groups)).codes
    assert packed.shape == (out, groups * 16) and packed.dtype == torch.uint8
    full = groups // 16 * 16
    lanes = packed[:, :full * 16].contiguous().view(torch.int32).view(out, -1, 4, 16)
    words = packed[:, full * 16:].contiguous().view(torch.int16).view(out, -1, 8).int() & 0xFFFF
    for g in range(groups):
        for i in range(32):
            if g < full:
                u, p, k = i // 8, i // 4 % 2, i % 4
                got = lanes[:, g // 16, u, g % 16] >> (16 * p + 4 * k) & 0xF
            else:
                got = words[:, g - full, i % 8] >> (4 * (i // 8)) & 0xF
            assert torch.equal(got.long(), codes[:, g * 32 + i])
    assert torch.equal(_int4.unpack(packed).long(), codes)


def test_the_dequantized_matrix_is_one_float32_rounding_of_the_codes():
    for groups in (3, 18):
        codes, scales, mins = random_int4(24, groups, 5)
        w = _int4.Int4(codes, scales, mins)
        want = _reference(w, codes)
        assert torch.equal(w.unpacked().long(), codes)
        assert ((w.dequantize().double() - want).abs() <= 2**-24 * want.abs()).all()
        assert w.shape == (24, groups * 32) and w.nbytes() == 24 * groups * (16 + 2 * 2)


def test_bad_shapes_and_scales_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="multiple of 32"):
        _int4.Int4(torch.zeros(4, 40, dtype=torch.long), torch.ones(4, 1), torch.ones(4, 1))
    with pytest.raises(ValueError, match="finite in float16"):
        _int4.Int4(torch.zeros(4, 32, dtype=torch.long), torch.full((4, 1), 1e6),
                   torch.ones(4, 1))


@settings(deadline=None, max_examples=10)
@given(seed=st.integers(0, 2**31 - 1), bias=st.booleans(), lead=st.sampled_from([(2,), (2, 3)]))
def test_int4_linear_is_a_linear_layer_on_its_codes(seed, bias, lead):
    torch.manual_seed(seed)
    codes, scales, mins = random_int4(32, 2, seed)
    b = torch.randn(32) if bias else None
    layer = _int4.Int4Linear(_int4.Int4(codes, scales, mins), b, torch.float32)
    assert (layer.in_features, layer.out_features) == (64, 32)
    assert [n for n, _ in layer.named_parameters()] == (["bias"] if bias else [])  # no weight
    w = layer.weight  # dequantized on demand, the matrix the kernels multiply by
    assert w.shape == (32, 64) and torch.equal(w, layer.int4.dequantize())
    x = torch.randn(*lead, 64)
    want = layer.int4.matmul(x.reshape(-1, 64), b).view(*lead, 32)
    torch.testing.assert_close(layer(x), want, rtol=0, atol=0)
    # near F.linear with the dequantized weight: x rounded to bfloat16 inside the kernel moves
    # each product by at most 2^-9 |x_k w_k| (a bound per element; relative fails on
    # cancellation), plus float32 sums of terms up to 143 |scale| |x_k| (the AVX-512 path)
    bound = 2**-8 * (x.abs() @ w.abs().t()) + 1e-5
    assert ((layer(x) - torch.nn.functional.linear(x, w, b)).abs() <= bound).all()
    assert _int4.dtype_of(layer) == torch.float32
    layer.to(torch.bfloat16)  # the model's dtype moves; the codes stay
    assert _int4.dtype_of(layer) == layer.weight.dtype == torch.bfloat16
    assert layer.int4.codes.dtype == torch.uint8 and layer.int4.scales.dtype == torch.float16
    assert layer(x.to(torch.bfloat16)).dtype == torch.bfloat16
    plain = torch.nn.Linear(3, 2).double()
    assert _int4.dtype_of(plain) == torch.float64


@settings(deadline=None, max_examples=20,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # (isa: one path each)
@given(outs=st.lists(st.sampled_from([16, 32, 48, 80]), min_size=2, max_size=3),
       groups=st.integers(1, 5), rows=st.integers(1, 6), bias=st.booleans(),
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**31 - 1))
def test_shared_codes_multiply_as_each_layer_alone(isa, outs, groups, rows, bias, threads, seed):
    """share() gives q|k|v-like layers one set of codes: each layer's Int4 is a view of its
    rows of the joined one (no second copy), with the same codes, scales and minima as
    before; the joined product's column blocks are each layer's own product bit for bit (each
    output row of the kernel depends only on its row of W), on each path, 1 or 2 threads,
    1-6 rows, with or without biases."""
    g = torch.Generator().manual_seed(seed)
    layers, before = [], []
    for i, out in enumerate(outs):
        w = _int4.Int4(*random_int4(out, groups, seed + i))
        before.append(w)
        layers.append(_int4.Int4Linear(w, torch.randn(out, generator=g) if bias else None,
                                       torch.float32))
    assert _int4.joined([layer.int4 for layer in layers]) is None  # separate storages
    assert _int4.share(layers)
    whole = _int4.joined([layer.int4 for layer in layers])
    assert whole is not None and whole.shape == (sum(outs), groups * 32)
    assert _int4.joined([layer.int4 for layer in layers]) is whole  # (the same object again)
    for f in _int4.FIELDS:
        base = getattr(whole, f)
        assert base.untyped_storage().nbytes() == base.numel() * base.element_size()  # one copy
        for layer, old in zip(layers, before, strict=True):
            part = getattr(layer.int4, f)
            assert torch.equal(part, getattr(old, f))
            assert part.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    x = torch.randn(rows, groups * 32, generator=g)
    with torch_threads(threads):
        joint = whole.matmul(x)
        alone = [layer(x) for layer in layers]
        separate = [old.matmul(x) for old in before]
    at = 0
    for layer, got, want in zip(layers, alone, separate, strict=True):
        out = layer.out_features
        want_bias = want if layer.bias is None else want + layer.bias
        assert torch.equal(joint[:, at:at + out] + (0 if layer.bias is None else layer.bias),
                           want_bias)
        assert torch.equal(got, want_bias)
        at += out
    assert _int4.share(layers)  # (already shared: nothing moves)
    assert _int4.joined([layers[1].int4, layers[0].int4]) is None  # (out of order)


def test_share_leaves_other_layers_alone():
    w = _int4.Int4(*random_int4(16, 1, 0))
    plain = torch.nn.Linear(32, 16)
    assert not _int4.share([_int4.Int4Linear(w, None, torch.float32), plain])
    wide = _int4.Int4Linear(_int4.Int4(*random_int4(16, 2, 1)), None, torch.float32)
    assert not _int4.share([_int4.Int4Linear(w, None, torch.float32), wide])  # other widths


def test_a_deep_copy_multiplies_by_its_own_codes():
    """The bound product reads its tensors' addresses at each call: a deep copy of a layer
    already used (its product bound) multiplies by the copy's codes, also after the original
    is changed and gone."""
    layer = _int4.Int4Linear(_int4.Int4(*random_int4(32, 2, 3)), None, torch.float32)
    x = torch.randn(2, 64)
    want = layer(x)
    twin = copy.deepcopy(layer)
    layer.int4.codes.zero_()
    del layer
    assert torch.equal(twin(x), want)


@settings(deadline=None, max_examples=10)
@given(outs=st.lists(st.sampled_from([16, 32, 48]), min_size=2, max_size=3),
       groups=st.integers(1, 4), rows=st.integers(1, 5), bound=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_place_moves_every_code_into_one_huge_page_buffer(outs, groups, rows, bound, seed):
    """place() copies a model's 4-bit fields (shared sets once, each layer still a view of its
    rows) and its Q8 codes into one buffer advised to huge pages, 64-byte aligned, in module
    order; every product is what it was bit for bit, also when the kernel had bound the old
    addresses (``bound``) before the move."""
    from headwise.fast import large as _large
    from headwise.fast import q8 as _q8
    g = torch.Generator().manual_seed(seed)
    shared = [_int4.Int4Linear(_int4.Int4(*random_int4(out, groups, seed + i)), None,
                               torch.float32) for i, out in enumerate(outs)]
    single = _int4.Int4Linear(_int4.Int4(*random_int4(16, groups, seed + 9)),
                              torch.randn(16, generator=g), torch.float32)
    codes, scales, w = random_q8(24, groups, seed)
    head = torch.nn.Linear(groups * 32, 24, bias=False)
    head.weight = torch.nn.Parameter(w)
    head.q8 = _q8.Q8(codes, scales, head.weight)
    model = torch.nn.ModuleList([*shared, single, head])
    assert _int4.share(shared)
    x = torch.randn(rows, groups * 32, generator=g)
    want = [m.int4.matmul(x) for m in (*shared, single)]
    want_head = head.q8.matmul(x[:4]) if bound else None  # (the Q8 kernel takes 1-4 rows)
    calls, huge = [], _large.huge
    with pytest.MonkeyPatch.context() as mp:  # (huge()'s advice: tests/fast/test_large.py)
        mp.setattr(_large, "huge", lambda n, dtype: calls.append((n, dtype)) or huge(n, dtype))
        placed = _int4.place(model)
    held = [getattr(_int4.joined([m.int4 for m in shared]), f) for f in _int4.FIELDS]
    held += [getattr(single.int4, f) for f in _int4.FIELDS] + [head.q8.codes, head.q8.scales]
    ptrs = [t.data_ptr() for t in held]
    assert len({t.untyped_storage().data_ptr() for t in held}) == 1  # one buffer
    assert ptrs == sorted(ptrs) and all(p % 64 == 0 for p in ptrs)  # in order, aligned
    assert placed == sum(-(-t.nbytes // 64) * 64 for t in held)
    assert calls == [(placed, torch.uint8)]
    assert _int4.joined([m.int4 for m in shared]) is shared[0].int4._base  # still one set
    for m, y in zip((*shared, single), want, strict=True):
        assert torch.equal(m.int4.matmul(x), y)
    assert _q8.of(head) is head.q8  # (the weight untouched: the codes still stand for it)
    if want_head is not None:  # (None: no kernel built here)
        assert torch.equal(head.q8.matmul(x[:4]), want_head)
