"""A GGUF's own 4-bit blocks as the decoding step's weights: the blocks are read as llama.cpp
wrote them, q/k rows come back in rotate-half order, and the step on the codes stays close to
the step on the dequantized float32 weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.pretrained import tiny_gguf


@settings(deadline=None, max_examples=25)
@given(kind=st.sampled_from(["Q4_0", "Q4_1"]), rows=st.integers(1, 5), blocks=st.integers(1, 4),
       scale=st.floats(0.01, 10), seed=st.integers(0, 2**31 - 1))
def test_fields_reproduce_ggufs_dequantization(kind, rows, blocks, scale, seed):
    import gguf

    from headwise.pretrained.q4 import fields

    x = (np.random.default_rng(seed).standard_normal((rows, blocks * 32)) * scale).astype(
        np.float32)
    t = gguf.GGMLQuantizationType[kind]
    raw = gguf.quants.quantize(x, t)
    want = torch.from_numpy(gguf.quants.dequantize(raw, t).copy()).double()
    codes, scales, mins = fields(raw, kind)
    assert codes.shape == x.shape and int(codes.min()) >= 0 and int(codes.max()) <= 15
    # the file's float16 values as they are (Q4_0's min = -8 d exactly)
    assert torch.equal(scales.half().float(), scales) and torch.equal(mins.half().float(), mins)
    s, m = (v.double().repeat_interleave(32, 1) for v in (scales, mins))
    got = codes.double() * s + m
    # gguf dequantizes in float32: one rounding of d q + m
    assert ((got - want).abs() <= 2**-24 * (m.abs() + 16 * s.abs())).all()
    assert (got - torch.from_numpy(x).double()).abs().max() > 0  # really quantized


def _q4_gguf(path, seed=0):
    import gguf

    weights = tiny_gguf.random_weights(layers=2, d_model=64, heads=4, kv_heads=2, d_ff=96,
                                       seed=seed)
    kinds = (gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1)
    types = {tiny_gguf.gguf_name(k): kinds[i % 2]
             for i, k in enumerate(weights) if k.endswith("proj.weight")}
    return tiny_gguf.write(path, weights, heads=4, kv_heads=2, types=types), types


def test_every_4bit_matrix_gets_its_codes_in_rotate_half_order(tmp_path):
    from headwise.fast.int4 import Int4Linear
    from headwise.pretrained.gguf import headwise_name, load_gguf, read_gguf

    path, types = _q4_gguf(tmp_path / "q4.gguf")
    file = read_gguf(path)
    model = load_gguf(file, q4=True).model
    dequantized = file.tensors()
    assert len(types) == 14
    for name in types:
        layer = model.get_submodule(headwise_name(name).removesuffix(".weight"))
        want = dequantized[name]  # the file's weights, q/k unpermuted by the float path
        got = layer.int4.dequantize()
        # scale and zero held in bfloat16 (8 significant bits): |q - 8| <= 8 steps of a scale
        # rounded by <= 2**-9 relative, plus the zero's rounding
        bound = 2**-9 * (8 * want.abs().amax() + want.abs().amax())
        assert (got - want).abs().max() <= bound, name
        # no float copy is kept: the codes are the layer's only weights
        assert isinstance(layer, Int4Linear) and not list(layer.parameters())
        assert torch.equal(layer.weight, got) and layer.weight.dtype == torch.float32
    kept = {n for n, _ in model.named_parameters()}  # tied lm_head: named once
    assert kept == {n for n, _ in load_gguf(file).model.named_parameters()
                    if not n.endswith(("proj.weight", "ff.gate.weight", "ff.up.weight",
                                       "ff.down.weight"))}, kept
    assert getattr(model.embed.tokens, "int4", None) is None
    assert getattr(load_gguf(file).model.blocks[0].ff.up, "int4", None) is None  # opt-in


def _step_logits(model, ids, feed):
    """Logits of the cached decoding step fed ``feed (b, t)`` after the prompt ``ids``."""
    from headwise.step import DecodeStep

    cache = model.new_cache(ids.shape[0], ids.shape[1] + feed.shape[1])
    with torch.inference_mode():
        model._forward(ids, cache, model._no_weights, last_only=True)
        step = DecodeStep(model, cache)
        return torch.stack([step(feed[:, t]) for t in range(feed.shape[1])], 1)


@pytest.mark.parametrize("batch", [1, 3])
def test_step_on_codes_stays_close_to_the_float32_step(tmp_path, batch):
    """The same tokens fed to both steps. Measured here: max |logit difference| ~1% of the
    largest logit (bfloat16 activations into the products, bfloat16 scales)."""
    from headwise.pretrained.gguf import load_gguf, read_gguf

    file = read_gguf(_q4_gguf(tmp_path / "q4.gguf", seed=batch)[0])
    full, codes = load_gguf(file).model, load_gguf(file, q4=True).model
    g = torch.Generator().manual_seed(batch)
    ids, feed = torch.randint(3, 261, (batch, 6), generator=g), torch.randint(3, 261, (batch, 16),
                                                                              generator=g)
    want, got = _step_logits(full, ids, feed), _step_logits(codes, ids, feed)
    diff = (want - got).abs().max() / want.abs().max()
    assert 0 < diff < 0.03, diff


def test_layers_reading_one_input_share_their_codes_and_one_product(tmp_path, monkeypatch):
    """q|k|v and gate|up each hold one set of codes (every layer a view of its rows, the same
    values as the file's), so the step multiplies 4 matrices a layer, not 7, with the module
    path's tokens."""
    from headwise.fast import int4 as _int4
    from headwise.fast import native as _native
    from headwise.pretrained.gguf import load_gguf, read_gguf

    file = read_gguf(_q4_gguf(tmp_path / "q4.gguf", seed=3)[0])
    model, full = load_gguf(file, q4=True).model, load_gguf(file).model
    for block, plain in zip(model.blocks, full.blocks, strict=True):
        groups = (*block.self_attn.joint_linears(), *block.ff.joint_linears())
        assert [len(g) for g in groups] == [3, 2]
        for group in groups:
            whole = _int4.joined([layer.int4 for layer in group])
            assert whole is not None and whole.shape[0] == sum(m.out_features for m in group)
            assert whole.codes.data_ptr() == group[0].int4.codes.data_ptr()  # (no copy)
            assert all(layer.int4.codes.untyped_storage().data_ptr()  # (place(): one buffer
                       == whole.codes.untyped_storage().data_ptr() for layer in group)  # for all)
        names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "ff.gate", "ff.up")
        for name in names:  # the view's values are the file's (the float model dequantizes it)
            got, want = block.get_submodule(name).weight, plain.get_submodule(name).weight
            assert (got - want).abs().max() <= 2**-8 * want.abs().max(), name
    if _native.status() != "ready":
        pytest.skip("headwise's kernel is not built here")
    from headwise.fast.plan import KINDS
    from headwise.step import DecodeStep

    calls = []
    product = _native.Product.__call__
    monkeypatch.setattr(_native.Product, "__call__",
                        lambda self, *a: calls.append(self.name) or product(self, *a))
    ids, feed = torch.randint(3, 261, (1, 5)), torch.randint(3, 261, (1, 3))
    cache = model.new_cache(1, 8)
    with torch.inference_mode():
        model._forward(ids, cache, model._no_weights, last_only=True)
        step = DecodeStep(model, cache)
        calls.clear()
        logits = step(feed[:, 0])
    # the layers' products as the step's plan binds them (one C call a layer, no Python
    # call per product); the unbound step (no plan) calls each product
    kinds = [op[0] for op in step.plan.ops]
    assert kinds.count(KINDS["q4_matmul"]) == 4 * len(model.blocks), kinds
    assert "q4_matmul" not in calls, calls
    with torch.inference_mode():
        unbound = DecodeStep(model, cache)
        unbound.plan = None
        unbound(feed[:, 1])
    assert calls.count("q4_matmul") == 4 * len(model.blocks), calls
    with torch.inference_mode():
        whole, _ = model(torch.cat((ids, feed[:, :1]), 1))
    diff = (whole[:, -1] - logits).abs().max() / logits.abs().max()
    assert diff < 1e-3, diff  # (as the module path vs step test: float32 sums in other orders)


def test_q4_needs_the_cpu(tmp_path):
    """q4 runs torch's CPU int4 kernel: another device is refused before the file is read,
    meta by the one device rule (parse_device), a GPU by q4's own check."""
    from headwise.pretrained.gguf import load_gguf

    with pytest.raises(ValueError, match="runs on cpu or cuda, not 'meta'"):
        load_gguf(tmp_path / "never-read.gguf", q4=True, device="meta")
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="got device='cuda'; pass device='cpu'"):
            load_gguf(tmp_path / "never-read.gguf", q4=True, device="cuda")


@pytest.mark.parametrize("batch", [1, 2])
def test_q4_module_path_agrees_with_its_own_decode_step(tmp_path, batch):
    """Both paths multiply by the same codes (bfloat16 activations into the products); they
    differ only by float32 rounding in a different order, which a bfloat16 rounding of an
    activation can grow to ~2**-8 of that activation. Measured: 3-4e-7 of the largest logit."""
    from headwise.pretrained.gguf import load_gguf, read_gguf

    file = read_gguf(_q4_gguf(tmp_path / "q4.gguf", seed=7 + batch)[0])
    model = load_gguf(file, q4=True).model
    g = torch.Generator().manual_seed(batch)
    ids, feed = (torch.randint(3, 261, (batch, n), generator=g) for n in (5, 12))
    with torch.inference_mode():
        whole, _ = model(torch.cat((ids, feed), 1))
    want, got = whole[:, ids.shape[1]:], _step_logits(model, ids, feed)
    diff = (want - got).abs().max() / want.abs().max()
    assert diff < 1e-3, diff
    assert torch.equal(want.argmax(-1), got.argmax(-1))


def test_q4_model_still_returns_its_attention_weights(tmp_path):
    """explain / trace run the module path with weights: on the codes they stay close to the
    float32 model's (bfloat16 activations into the projections)."""
    from headwise.pretrained.gguf import load_gguf, read_gguf

    file = read_gguf(_q4_gguf(tmp_path / "q4.gguf", seed=3)[0])
    ids = torch.randint(3, 261, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        _, full = load_gguf(file).model(ids, return_weights=True)
        _, codes = load_gguf(file, q4=True).model(ids, return_weights=True)
    for a, b in zip(full["decoder_self"], codes["decoder_self"], strict=True):
        assert a.shape == b.shape == (2, 4, 9, 9)
        torch.testing.assert_close(b.sum(-1), torch.ones(2, 4, 9))
        assert torch.equal(b.triu(1), torch.zeros_like(b))  # causal
        assert 0 < (a - b).abs().max() < 0.05


@settings(deadline=None, max_examples=15)
@given(rows=st.integers(1, 5), blocks=st.integers(1, 4), scale=st.floats(0.01, 10),
       seed=st.integers(0, 2**31 - 1))
def test_fields_q8_reproduce_ggufs_q8_0_dequantization(rows, blocks, scale, seed):
    import gguf

    from headwise.pretrained.q4 import fields_q8

    x = (np.random.default_rng(seed).standard_normal((rows, blocks * 32)) * scale).astype(
        np.float32)
    t = gguf.GGMLQuantizationType.Q8_0
    raw = gguf.quants.quantize(x, t)
    want = torch.from_numpy(gguf.quants.dequantize(raw, t).copy())
    codes, scales = fields_q8(raw)
    assert codes.dtype == torch.int8 and scales.dtype == torch.float16
    assert torch.equal(codes.float() * scales.float().repeat_interleave(32, 1), want)  # exact


@pytest.mark.parametrize(("tied", "batch"), [(True, 1), (True, 4), (False, 2)])
def test_a_q8_0_head_is_read_as_its_codes_by_the_step(tmp_path, tied, batch):
    """A Q8_0 token table (tied: it is the head) or output matrix: the q4 model's head carries
    the file's 8-bit codes beside its float32 weight, which they dequantize to exactly, and the
    step's logits through them equal those through the float32 weight to float32 summation
    (the codes removed: the step multiplies by the weight)."""
    import gguf

    from headwise.fast import native
    from headwise.pretrained.gguf import load_gguf, read_gguf

    weights = tiny_gguf.random_weights(layers=2, d_model=64, heads=4, kv_heads=2, d_ff=96,
                                       seed=batch, tied=tied)
    types = {tiny_gguf.gguf_name(k): gguf.GGMLQuantizationType.Q4_1
             for k in weights if k.endswith("proj.weight")}
    types["token_embd.weight" if tied else "output.weight"] = gguf.GGMLQuantizationType.Q8_0
    file = read_gguf(tiny_gguf.write(tmp_path / "q8.gguf", weights, heads=4, kv_heads=2,
                                     types=types))
    model = load_gguf(file, q4=True).model
    head = model.lm_head
    assert (head.weight is model.embed.tokens.weight) is tied
    assert torch.equal(head.q8.dequantize(), head.weight) and head.q8.source is head.weight
    g = torch.Generator().manual_seed(batch)
    ids, feed = (torch.randint(3, 261, (batch, n), generator=g) for n in (5, 8))
    got = _step_logits(model, ids, feed)
    del head.q8
    want = _step_logits(model, ids, feed)
    scale = want.abs().max()
    gap = (got - want).abs().max()
    assert gap <= 64 * 2**-24 * 8 * scale
    if native.isa() is not None:  # (no kernel: the weight both times, through torch's product
        assert gap > 0            # for the Weight the codes carry, its layout possibly another)
