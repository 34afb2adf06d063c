"""The decoding step's weight layouts: both float layouts and the C kernel give nn.Linear's
result, 4-bit layers multiply by their codes, and lay_out moves storage only (into huge-page
buffers it frees again)."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import headwise as hw
from headwise.fast import int4 as _int4
from headwise.fast import rows as _rows
from headwise.models.feedforward import GatedFeedForward
from tests.fast.test_int4 import random_int4


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


@settings(deadline=None, max_examples=10)
@given(seed=st.integers(0, 2**31 - 1), bias=st.booleans())
def test_linear_and_residual_take_int4_from_the_layer(seed, bias):
    torch.manual_seed(seed)
    layer = torch.nn.Linear(64, 32, bias=bias)
    layer.int4 = _int4.Int4(*random_int4(32, 2, seed))
    w = _rows.of_linear(layer, transpose=True)  # codes win over any float layout
    assert w[2] is _rows.INT4 and _int4.quantized(torch.nn.Sequential(layer))
    x, res = torch.randn(3, 64), torch.randn(3, 32)
    plain = layer.int4(x) + (layer.bias if bias else 0)
    torch.testing.assert_close(_rows.linear(x, w), plain, rtol=0, atol=0)
    torch.testing.assert_close(_rows.residual(res, x, w), res + plain, rtol=1e-6, atol=1e-6)
    del layer.int4
    assert _rows.of_linear(layer, transpose=False)[2] is False
    assert not _int4.quantized(torch.nn.Sequential(layer))


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
    (out, in); more rows: untouched. Same Parameter objects, shapes, values and outputs. Every
    matrix moves once into lay_out's buffers (the tied one once), then only when its layout
    changes or its storage was replaced."""
    model = _wide_and_tall(seed)
    params = list(model.parameters())
    values = [p.detach().clone() for p in params]
    x = torch.randn(3, 6)
    want = model(x).detach()
    with torch.inference_mode():  # as in generate: the copies must still be ordinary tensors
        assert _rows.lay_out(model, 1) == 3  # each matrix, the tied wide one once
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
    tall.data = tall.detach().clone()  # a storage lay_out did not place
    assert _rows.lay_out(model, 2) == 1 and _rows.lay_out(model, 2) == 0
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
       bias=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       seed=st.integers(0, 2**31 - 1))
def test_joint_linears_are_laid_out_as_one_matrix_without_a_copy(n_in, outs, bias, dtype, seed):
    """lay_out stores a component's joint linears as blocks of one buffer, laid out as their
    joined matrix (one row, wider than tall, float32: W^T; 2-4 rows and bfloat16: (out, in),
    the layout the bfloat16 kernel reads); joined() and of_group() hand that
    matrix (and bias) out as views of the very storage the parameters use: equal to the
    concatenation, writes to one show in the other. Unrelated layers are not joined."""
    torch.manual_seed(seed)
    model = _Siblings(n_in, tuple(outs), bias).to(dtype)
    params = list(model.parameters())
    x = torch.randn(3, n_in, dtype=dtype)
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
        wide = rows == 1 and sum(outs) > n_in and dtype is torch.float32
        assert _rows.stored_transposed(w) is wide and w.is_contiguous() is not wide
        assert w.dtype is dtype and _rows.of_group(model.parts, False)[2] is wide
        assert list(model.parameters()) == params
        if dtype is torch.float32:
            torch.testing.assert_close(model(x), want)
        else:  # bfloat16: torch's kernel for another storage may round x @ W^T to bfloat16
            # before the bias (<= 2^-9 of |x| @ |W|^T + |b| on each side) and rounds the result
            # (<= 2^-9 |y| each side): sums in float32, in whichever order
            terms = x.float().abs() @ torch.cat([p.weight for p in model.parts]).float().abs().t()
            if bias:
                terms += torch.cat([p.bias for p in model.parts]).float().abs()
            diff = (model(x).float() - want.float()).abs()
            assert (diff <= 2**-8 * (terms + want.float().abs()) + 1e-6).all()
        with torch.no_grad():  # one storage: a write through a parameter shows in the view
            before = model.parts[-1].weight[0, 0].clone()  # (bfloat16: +1 then -1 rounds)
            model.parts[-1].weight[0, 0] += 1.0
            assert w[sum(outs[:-1]), 0] == model.parts[-1].weight[0, 0]
            model.parts[-1].weight[0, 0] = before
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
        _int4.Int4Linear(_int4.Int4(torch.randint(0, 16, (16, 32), generator=g),
                                    torch.rand(16, 1, generator=g) + 0.1,
                                    torch.randn(16, 1, generator=g)), None, torch.float32)
        for _ in range(2))

    def refuse(self):
        raise AssertionError("dequantized")
    monkeypatch.setattr(_int4.Int4Linear, "weight", property(refuse))
    assert _rows.joined(tuple(layers)) is None
    assert _rows.of_group(tuple(layers), False) is None  # (separate codes)
    assert _rows.lay_out(layers, 1) == 0
    assert _int4.share(layers)  # one set of codes: one product, still never dequantized
    joint = _rows.of_group(tuple(layers), False)
    assert joint[2] is _rows.INT4 and joint[0].shape == (32, 32) and joint[1] is None
    group = _Siblings(32, (16, 16), False)  # listed as joint linears, as a SwiGLU's gate/up
    group.parts = layers
    assert _rows.lay_out(group, 1) == 0


def _held_and_needed(model: nn.Module) -> tuple[int, int]:
    """Bytes of the distinct storages the parameters live in, and bytes of the parameters."""
    params = list(model.parameters())
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in params}
    return sum(storages.values()), sum(p.numel() * p.element_size() for p in params)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), arena_kib=st.sampled_from([64, 1 << 16]),
       rows=st.lists(st.integers(1, 4), min_size=1, max_size=5))
def test_lay_out_moves_matrices_into_huge_page_buffers_that_it_frees_again(seed, arena_kib,
                                                                          rows):
    """What lay_out moves goes into buffers advised to huge pages (an madvise span inside each
    one over 4 MiB), of about ARENA_BYTES each (small: several buffers; large: one); after any
    sequence of row counts the parameters' storages hold nothing but the parameters (every
    buffer a relayout left was freed whole: q/k/v here are no wider than the model, so they
    are moved once and stay, while gate/up and the head move at every change), the values
    never change, and the model still computes what it did."""
    from headwise.fast import large as _large
    torch.manual_seed(seed)
    model = hw.models.TransformerLM(hw.models.LMConfig(
        vocab_size=300, d_model=128, num_heads=4, num_kv_heads=2, head_dim=16, num_layers=3,
        d_ff=2048, max_len=16, ffn="glu", norm="rms", positional="rope", activation="silu",
        tie_embeddings=True, dropout=0.0)).eval()
    values = {name: p.detach().clone() for name, p in model.named_parameters()}
    ids = torch.randint(0, 300, (2, 7))
    with torch.no_grad():
        want = model(ids)[0]
    held, needed = _held_and_needed(model)
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_large, "_MADVISE", lambda at, n, flag: calls.append((at, n, flag)))
        mp.setattr(_rows, "ARENA_BYTES", arena_kib << 10)
        for n in [1, *rows]:
            calls.clear()
            moved = _rows.lay_out(model, n)
            assert _held_and_needed(model) == (held, needed)  # no buffer kept for nothing
            buffers = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
                       for p in model.parameters() if p.dim() == 2}
            for at, size in buffers.items():
                if moved and size > 4 << 20:  # (one buffer of every wide group, ~6 MiB)
                    assert any(f == 14 and at <= a and a + m <= at + size for a, m, f in calls)
    with torch.no_grad():
        gate_up = _rows.joined(model.blocks[0].ff.joint_linears()[0])[0]
    assert _rows.stored_transposed(gate_up) is (rows[-1] == 1)
    wide = {p.untyped_storage().data_ptr() for p in model.parameters()
            if p.dim() == 2 and p.shape[0] > p.shape[1]}
    assert len(wide) > 1 if arena_kib == 64 else len(wide) == 1
    for name, p in model.named_parameters():
        assert torch.equal(p, values[name]), name
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[0], want, atol=1e-5, rtol=1e-5)
