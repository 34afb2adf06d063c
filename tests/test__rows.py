"""The decoding step's weight layouts: both float layouts give nn.Linear's result; the 4-bit
:class:`~headwise._rows.Int4` multiplies by its codes."""

import copy

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import headwise as hw
from headwise import _rows
from headwise.models.feedforward import GatedFeedForward


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 6), n_in=st.integers(1, 9), n_out=st.integers(1, 9), bias=st.booleans(),
       transpose=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_linear_and_residual_match_the_module_in_either_layout(b, n_in, n_out, bias, transpose,
                                                               seed):
    torch.manual_seed(seed)
    layer = nn.Linear(n_in, n_out, bias=bias)  # float32: the dtype of the column form
    x, res = torch.randn(b, n_in), torch.randn(b, n_out)
    w = _rows.of_linear(layer, transpose)
    assert w[2] is transpose and not w[0].requires_grad
    assert w[0].shape == ((n_in, n_out) if transpose else (n_out, n_in))
    with torch.no_grad():
        # 2..COLUMN_ROWS rows of an untransposed weight go through (W @ x^T)^T: rows again
        out, summed = _rows.linear(x, w), _rows.residual(res, x, w)
        torch.testing.assert_close(out, layer(x))
        torch.testing.assert_close(summed, res + layer(x))
    assert out.is_contiguous() and summed.is_contiguous()


@settings(max_examples=20, deadline=None)
@given(threads=st.integers(2, 4), n_in=st.integers(1, 64), per_part=st.integers(1, 48),
       layout=st.sampled_from(["rows", "stored W^T", "W^T copy"]), bias=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_one_row_split_across_threads_matches_float64(threads, n_in, per_part, layout, bias,
                                                      seed):
    """From two threads on, one row times a large enough matrix is one batched product over
    a block of output features per thread (views of the weight's storage, no copy): the same
    values as the float64 product, in every storage the step can hand it."""
    torch.manual_seed(seed)
    n_out = threads * per_part
    layer = nn.Linear(n_in, n_out, bias=bias)
    if layout == "stored W^T":
        layer.weight.data = layer.weight.data.t().contiguous().t()
    w = _rows.of_linear(layer, layout == "W^T copy")
    x, res = torch.randn(1, n_in), torch.randn(1, n_out)
    ref = x.double() @ layer.weight.double().t()
    if bias:
        ref = ref + layer.bias.double()
    before, split_min = torch.get_num_threads(), _rows.SPLIT_MIN
    torch.set_num_threads(threads)
    _rows.SPLIT_MIN = 1  # the split, whatever the matrix's size
    try:
        with torch.no_grad():
            assert _rows._split_product(x, w[0], w[2], None) is not None
            out, summed = _rows.linear(x, w), _rows.residual(res, x, w)
    finally:
        torch.set_num_threads(before)
        _rows.SPLIT_MIN = split_min
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(summed.double(), res.double() + ref, rtol=1e-5, atol=1e-5)
    assert out.shape == summed.shape == (1, n_out)


def test_the_split_leaves_other_products_alone(monkeypatch):
    """Not split: one thread, two rows, a small matrix, a thread count not dividing the
    output features, a strided weight, bfloat16."""
    monkeypatch.setattr(_rows, "SPLIT_MIN", 64)
    w, x = torch.randn(12, 8), torch.randn(1, 8)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert _rows._split_product(x, w, False, None) is not None
        assert _rows._split_product(torch.randn(2, 8), w, False, None) is None
        assert _rows._split_product(x, w[:6], False, None) is None  # 48 elements
        assert _rows._split_product(x, w[:, ::2].repeat(1, 2)[:, ::2], False, None) is None
        assert _rows._split_product(x, w.bfloat16(), False, None) is None
        torch.set_num_threads(1)
        assert _rows._split_product(x, w, False, None) is None
        if before >= 5:  # 12 output features do not split 5 ways
            torch.set_num_threads(5)
            assert _rows._split_product(x, w, False, None) is None
    finally:
        torch.set_num_threads(before)


def test_the_column_form_is_float32_only():
    """bfloat16 rows keep F.linear (oneDNN's kernels: the column form measured no faster)."""
    layer = nn.Linear(16, 8).to(torch.bfloat16)
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    w = _rows.of_linear(layer, False)
    with torch.no_grad():
        assert torch.equal(_rows.linear(x, w), torch.nn.functional.linear(x, *w[:2]))


def test_the_untransposed_weight_is_the_modules_own_tensor():
    layer = nn.Linear(3, 2)
    assert _rows.of_linear(layer, False)[0].data_ptr() == layer.weight.data_ptr()
    assert _rows.of_linear(layer, True)[0].data_ptr() != layer.weight.data_ptr()


def _random_int4(out, groups, seed):
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
    codes, scales, zeros = _random_int4(out, groups, seed)
    w = _rows.Int4(codes, scales, zeros, 32)
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
@given(seed=st.integers(0, 2**31 - 1), bias=st.booleans())
def test_linear_and_residual_take_int4_from_the_layer(seed, bias):
    torch.manual_seed(seed)
    layer = torch.nn.Linear(64, 32, bias=bias)
    codes, scales, zeros = _random_int4(32, 2, seed)
    layer.int4 = _rows.Int4(codes, scales, zeros, 32)
    w = _rows.of_linear(layer, transpose=True)  # codes win over any float layout
    assert w[2] is _rows.INT4 and _rows.quantized(torch.nn.Sequential(layer))
    x, res = torch.randn(3, 64), torch.randn(3, 32)
    plain = layer.int4(x) + (layer.bias if bias else 0)
    torch.testing.assert_close(_rows.linear(x, w), plain, rtol=0, atol=0)
    torch.testing.assert_close(_rows.residual(res, x, w), res + plain, rtol=1e-6, atol=1e-6)
    del layer.int4
    assert _rows.of_linear(layer, transpose=False)[2] is False
    assert not _rows.quantized(torch.nn.Sequential(layer))


@settings(deadline=None, max_examples=10)
@given(seed=st.integers(0, 2**31 - 1), bias=st.booleans(), lead=st.sampled_from([(2,), (2, 3)]))
def test_int4_linear_is_a_linear_layer_on_its_codes(seed, bias, lead):
    torch.manual_seed(seed)
    codes, scales, zeros = _random_int4(32, 2, seed)
    b = torch.randn(32) if bias else None
    layer = _rows.Int4Linear(_rows.Int4(codes, scales, zeros, 32), b, torch.float32)
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
    assert _rows.dtype_of(layer) == torch.float32
    layer.to(torch.bfloat16)  # the model's dtype moves; the codes stay
    assert _rows.dtype_of(layer) == layer.weight.dtype == torch.bfloat16
    assert layer.int4.packed.dtype == torch.uint8
    assert layer(x.to(torch.bfloat16)).dtype == torch.bfloat16
    plain = torch.nn.Linear(3, 2).double()
    assert _rows.dtype_of(plain) == torch.float64


def _wide_and_tall(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 15), nn.Linear(15, 6, bias=False), nn.Linear(6, 6),
                          nn.Linear(6, 15, bias=False))
    model[3].weight = model[0].weight  # tied: one parameter, laid out once
    return model


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_lay_out_moves_only_the_storage(seed):
    """One row: wide matrices stored (in, out), the rest (out, in); 2..COLUMN_ROWS rows: all
    (out, in); more rows: untouched. Same Parameter objects, shapes, values and outputs."""
    model = _wide_and_tall(seed)
    params = list(model.parameters())
    values = [p.detach().clone() for p in params]
    x = torch.randn(3, 6)
    want = model(x).detach()
    with torch.inference_mode():  # as in generate: the copies must still be ordinary tensors
        assert _rows.lay_out(model, 1) == 1  # the tied wide matrix, once
    wide, tall = model[0].weight, model[1].weight
    assert _rows.stored_transposed(wide) and wide is model[3].weight
    assert tall.is_contiguous() and model[2].weight.is_contiguous()
    assert list(model.parameters()) == params
    assert all(torch.equal(p, v) for p, v in zip(params, values, strict=True))
    assert not any(p.is_inference() for p in params)
    torch.testing.assert_close(model(x), want)
    assert _rows.lay_out(model, 1) == 0  # already laid out: nothing copied
    assert _rows.lay_out(model, _rows.COLUMN_ROWS + 1) == 0  # many rows: left as they are
    assert _rows.stored_transposed(wide)
    assert _rows.lay_out(model, 2) == 1 and wide.is_contiguous()
    assert all(torch.equal(p, v) for p, v in zip(params, values, strict=True))


def test_a_laid_out_model_trains_and_its_row_forms_match():
    model = _wide_and_tall(0)
    _rows.lay_out(model, 1)
    with torch.no_grad():
        for layer in model:  # one row through either storage equals nn.Linear's result
            x, res = torch.randn(1, layer.in_features), torch.randn(1, layer.out_features)
            w = _rows.of_linear(layer, False)
            torch.testing.assert_close(_rows.linear(x, w), layer(x))
            torch.testing.assert_close(_rows.residual(res, x, w), res + layer(x))
    x = torch.randn(4, 6)
    model(x).square().sum().backward()
    assert model[0].weight.grad.shape == (15, 6)
    before = model[0].weight.detach().clone()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert not torch.equal(model[0].weight, before)
    assert _rows.stored_transposed(model[0].weight)  # an optimizer step keeps the storage


class _Siblings(nn.Module):
    """Three projections of one input (as self-attention's q, k, v), listed for lay_out."""

    def __init__(self, n_in: int, outs: tuple[int, ...], bias: bool):
        super().__init__()
        self.parts = nn.ModuleList(nn.Linear(n_in, n, bias=bias) for n in outs)

    def joint_linears(self):
        return (tuple(self.parts),)

    def forward(self, x):
        return torch.cat([p(x) for p in self.parts], -1)


@settings(max_examples=15, deadline=None)
@given(n_in=st.integers(2, 12), outs=st.lists(st.integers(1, 12), min_size=2, max_size=3),
       bias=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_joint_linears_are_laid_out_as_one_matrix_without_a_copy(n_in, outs, bias, seed):
    """lay_out stores a component's joint linears as blocks of one buffer, laid out as their
    joined matrix (one row, wider than tall: W^T; 2-4 rows: (out, in)); joined() hands that
    matrix (and bias) out as views of the very storage the parameters use: equal to the
    concatenation, writes to one show in the other. Unrelated layers are not joined."""
    torch.manual_seed(seed)
    model = _Siblings(n_in, tuple(outs), bias)
    params = list(model.parameters())
    x = torch.randn(3, n_in)
    want = model(x).detach()
    torch.set_grad_enabled(False)  # (joined() hands out no detached view to autograd)
    assert _rows.joined(model.parts) is None  # separate tensors
    for rows in (1, 2, 1):
        _rows.lay_out(model, rows)
        w, b = _rows.joined(model.parts)
        torch.testing.assert_close(w, torch.cat([p.weight for p in model.parts]), rtol=0,
                                   atol=0)
        assert (b is None) is not bias
        if bias:
            assert torch.equal(b, torch.cat([p.bias for p in model.parts]))
        wide = rows == 1 and sum(outs) > n_in
        assert _rows.stored_transposed(w) is wide and w.is_contiguous() is not wide
        assert list(model.parameters()) == params
        torch.testing.assert_close(model(x), want)
        with torch.no_grad():  # one storage: a write through a parameter shows in the view
            model.parts[-1].weight[0, 0] += 1.0
            assert w[sum(outs[:-1]), 0] == model.parts[-1].weight[0, 0]
            model.parts[-1].weight[0, 0] -= 1.0
    other = nn.Linear(n_in, 4)
    assert _rows.joined((model.parts[0], other)) is None
    assert _rows.joined(tuple(reversed(model.parts))) is None  # not in storage order
    torch.set_grad_enabled(True)
    assert _rows.joined(model.parts) is None  # autograd needs each parameter's own product


@settings(max_examples=10, deadline=None)
@given(rows=st.integers(1, 2), bias=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_laid_out_joint_linears_still_train_every_parameter(rows, bias, seed):
    """After a generation laid self-attention's q/k/v and SwiGLU's gate/up out as one buffer
    each, training gives every parameter the gradients of a model never laid out (the joined
    view is detached: the module path must not multiply through it under autograd)."""
    torch.manual_seed(seed)
    model = nn.Sequential(hw.MultiHeadAttention(12, 4, num_kv_heads=2, bias=bias),
                          GatedFeedForward(12, 20, bias=bias))
    twin = copy.deepcopy(model)
    _rows.lay_out(model, rows)
    with torch.no_grad():
        assert all(_rows.joined(g) is not None for m in model for g in m.joint_linears())
    x = torch.randn(2, 5, 12)
    for m in (model, twin):
        m[1](m[0](x)[0]).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_4bit_layers_are_never_joined_nor_dequantized_to_look(monkeypatch):
    """An Int4Linear's ``weight`` dequantizes its codes: joined() and lay_out() must not read
    it (a decoding step asks for every layer's joined form once per generation)."""
    g = torch.Generator().manual_seed(0)
    layers = nn.ModuleList(
        _rows.Int4Linear(_rows.Int4(torch.randint(0, 16, (16, 32), generator=g),
                                    torch.rand(16, 1, generator=g) + 0.1,
                                    torch.randn(16, 1, generator=g), 32), None, torch.float32)
        for _ in range(2))

    def refuse(self):
        raise AssertionError("dequantized")
    monkeypatch.setattr(_rows.Int4Linear, "weight", property(refuse))
    assert _rows.joined(tuple(layers)) is None
    assert _rows.lay_out(layers, 1) == 0
    group = _Siblings(32, (16, 16), False)  # listed as joint linears, as a SwiGLU's gate/up
    group.parts = layers
    assert _rows.lay_out(group, 1) == 0
