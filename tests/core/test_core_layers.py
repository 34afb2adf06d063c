"""MultiHeadAttention against the per-head loop, torch's MHA and the float64 reference."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import headwise as hw
from tests.reference import reference_attention

configs = st.fixed_dictionaries({
    "b": st.integers(1, 3), "m": st.sampled_from([4, 6, 8, 12]), "g": st.integers(1, 3),
    "r": st.integers(1, 2), "d": st.sampled_from([2, 3, 5]), "kdim": st.sampled_from([3, 7]),
    "vdim": st.sampled_from([2, 5]), "out": st.sampled_from([None, 3]), "nq": st.integers(1, 7),
    "nk": st.integers(1, 7), "bias": st.booleans(), "causal": st.booleans(),
    "lens": st.booleans(), "seed": st.integers(0, 2**31 - 1),
})


def reference_mha(mha, query, key, value, mask, causal):
    """The module's math in float64, from its own weights, via the independent reference."""
    def proj(linear, x, heads):
        y = x.double() @ linear.weight.double().T
        if linear.bias is not None:
            y = y + linear.bias.double()
        return y.reshape(*x.shape[:2], heads, -1).transpose(1, 2)
    q = proj(mha.q_proj, query, mha.num_heads)
    k = proj(mha.k_proj, key, mha.num_kv_heads)
    v = proj(mha.v_proj, value, mha.num_kv_heads)
    out, w = reference_attention(q, k, v, mask, causal)
    out = out.transpose(1, 2).reshape(query.shape[0], query.shape[1], -1)
    out = out @ mha.out_proj.weight.double().T
    if mha.out_proj.bias is not None:
        out = out + mha.out_proj.bias.double()
    return out, w


@given(cfg=configs)
def test_module_paths_agree_with_float64_reference(cfg):
    torch.manual_seed(cfg["seed"])
    g, h = cfg["g"], cfg["g"] * cfg["r"]
    mha = hw.MultiHeadAttention(cfg["m"], h, head_dim=cfg["d"], kdim=cfg["kdim"],
                                vdim=cfg["vdim"], num_kv_heads=g, out_dim=cfg["out"],
                                bias=cfg["bias"])
    b, nq, nk = cfg["b"], cfg["nq"], cfg["nk"]
    query = torch.randn(b, nq, cfg["m"])
    key, value = torch.randn(b, nk, cfg["kdim"]), torch.randn(b, nk, cfg["vdim"])
    valid = torch.randint(0, nk + 1, (b,)) if cfg["lens"] else None
    mask = hw.masks.from_valid_lens(valid, nk) if valid is not None else None
    ref_out, ref_w = reference_mha(mha, query, key, value, mask, cfg["causal"])
    for backend in ("eager", "sdpa"):
        mha.backend = backend
        out, w = mha(query, key, value, valid_lens=valid, causal=cfg["causal"],
                     return_weights=True)
        torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(w.double(), ref_w, rtol=1e-5, atol=1e-6)
        fast, none = mha(query, key, value, valid_lens=valid, causal=cfg["causal"])
        assert none is None
        torch.testing.assert_close(fast.double(), ref_out, rtol=1e-5, atol=1e-5)
    per_head = hw.unfuse(mha)
    loop_out, loop_w = per_head(query, key, value, mask=mask, causal=cfg["causal"])
    torch.testing.assert_close(loop_out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loop_w.double(), ref_w, rtol=1e-5, atol=1e-6)
    n_params = sum(p.numel() for p in mha.parameters())
    assert sum(p.numel() for p in per_head.parameters()) == n_params
    back = hw.fuse(per_head)
    assert sum(p.numel() for p in back.parameters()) == n_params
    torch.testing.assert_close(back(query, key, value, mask=mask, causal=cfg["causal"])[0], out)


def test_the_4_3_2_example_from_the_issue():
    mha = hw.MultiHeadAttention(4, 2, head_dim=3, kdim=3, vdim=2)
    assert (mha.q_proj.weight.shape, mha.k_proj.weight.shape, mha.v_proj.weight.shape,
            mha.out_proj.weight.shape) == ((6, 4), (6, 3), (6, 2), (4, 6))
    out, w = mha(torch.randn(2, 5, 4), torch.randn(2, 7, 3), torch.randn(2, 7, 2),
                 return_weights=True)
    assert out.shape == (2, 5, 4) and w.shape == (2, 2, 5, 7)


torch_configs = st.fixed_dictionaries({
    "b": st.integers(1, 3), "h": st.sampled_from([1, 2, 4]), "d": st.sampled_from([2, 4]),
    "kdim": st.sampled_from([None, 5]), "nq": st.integers(1, 6), "nk": st.integers(1, 6),
    "bias": st.booleans(), "pad": st.booleans(), "attn": st.sampled_from([None, "bool", "float"]),
    "seed": st.integers(0, 2**31 - 1),
})


@given(cfg=torch_configs)
def test_matches_torch_multihead_attention_after_from_torch(cfg):
    torch.manual_seed(cfg["seed"])
    e = cfg["h"] * cfg["d"]
    kdim = cfg["kdim"] or e
    ref = nn.MultiheadAttention(e, cfg["h"], bias=cfg["bias"], kdim=kdim, vdim=kdim,
                                batch_first=True)
    ours = hw.MultiHeadAttention.from_torch(ref)
    b, nq, nk = cfg["b"], cfg["nq"], cfg["nk"]
    q, k, v = torch.randn(b, nq, e), torch.randn(b, nk, kdim), torch.randn(b, nk, kdim)
    # torch: True = blocked; headwise: True = may attend. Keep >= 1 key per row (torch -> NaN).
    kpm = torch.zeros(b, nk, dtype=torch.bool)
    if cfg["pad"]:
        for row, n_valid in enumerate(torch.randint(1, nk + 1, (b,)).tolist()):
            kpm[row, n_valid:] = True
    attn = None
    if cfg["attn"] == "bool":
        attn = torch.rand(nq, nk) > 0.6
        attn[:, 0] = False
        kpm[:, 0] = False
    elif cfg["attn"] == "float":
        attn = torch.randn(nq, nk)
    ref_out, ref_w = ref(q, k, v, key_padding_mask=kpm if cfg["pad"] else None, attn_mask=attn,
                         need_weights=True, average_attn_weights=False)
    mask = ~kpm[:, None, None, :] if cfg["pad"] else None
    if attn is not None:
        mask = hw.masks.combine(mask, ~attn if attn.dtype == torch.bool else attn)
    for backend in ("eager", "sdpa"):
        ours.backend = backend
        out, w = ours(q, k, v, mask=mask, return_weights=True)
        torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(w, ref_w, rtol=1e-5, atol=1e-6)
    back = ours.to_torch()
    out2 = back(q, k, v, key_padding_mask=kpm if cfg["pad"] else None, attn_mask=attn)[0]
    torch.testing.assert_close(out2, ref_out, rtol=1e-5, atol=1e-5)


def test_head_mask_scales_each_head_and_zero_removes_it():
    torch.manual_seed(0)
    mha = hw.MultiHeadAttention(8, 4)
    x = torch.randn(2, 5, 8)
    full, _ = mha(x)
    assert torch.allclose(mha(x, head_mask=torch.ones(4))[0], full)
    keep = torch.tensor([1.0, 0.0, 1.0, 1.0])
    masked, _ = mha(x, head_mask=keep)
    per_head = hw.unfuse(mha)
    per_head.q_heads[1].weight.data.zero_()
    per_head.v_heads[1].weight.data.zero_()
    per_head.v_heads[1].bias.data.zero_()
    torch.testing.assert_close(masked, per_head(x)[0], rtol=1e-5, atol=1e-6)
    per_batch = torch.stack([torch.ones(4), keep])
    both, _ = mha(x, head_mask=per_batch)
    torch.testing.assert_close(both[0], full[0])
    torch.testing.assert_close(both[1], masked[1])


def test_weights_requested_do_not_change_the_output():
    torch.manual_seed(1)
    mha = hw.MultiHeadAttention(16, 4, num_kv_heads=2)
    x = torch.randn(3, 9, 16)
    fast, _ = mha(x, causal=True, valid_lens=torch.tensor([9, 4, 1]))
    slow, w = mha(x, causal=True, valid_lens=torch.tensor([9, 4, 1]), return_weights=True)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)
    assert w.shape == (3, 4, 9, 9)


@pytest.mark.parametrize("make,match", [
    (lambda: hw.MultiHeadAttention(510, 8), "embed_dim=510 is not divisible by num_heads=8; "
                                            "pass head_dim=63 or use num_heads="),
    (lambda: hw.MultiHeadAttention(16, 4, num_kv_heads=3), "not a multiple of num_kv_heads"),
    (lambda: hw.MultiHeadAttention(16, 0), "num_heads must be >= 1"),
    (lambda: hw.MultiHeadAttention(16, 4, dropout=1.5), "dropout"),
    (lambda: hw.MultiHeadAttention(16, 4, backend="nope"), "unknown backend"),
    (lambda: hw.MultiHeadAttention(16, 4, head_dim=2.5), "head_dim must be an int"),
])
def test_bad_configs(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_bad_forward_inputs():
    mha = hw.MultiHeadAttention(8, 2, kdim=5)
    x, kv = torch.randn(2, 4, 8), torch.randn(2, 6, 5)
    cases = [
        (dict(query=torch.randn(4, 8), key=kv), "batch-first"),
        (dict(query=torch.randn(2, 4, 7), key=kv), "expected 8"),
        (dict(query=x, key=torch.randn(2, 6, 8)), "kdim=8"),
        (dict(query=x, key=torch.randn(3, 6, 5)), "batch sizes differ"),
        (dict(query=x, key=kv, value=torch.randn(2, 5, 5)), "positions"),
        (dict(query=x, key=kv, mask=torch.ones(2, 1, 1, 4, dtype=torch.bool)), "broadcast"),
        (dict(query=x, key=kv, mask=torch.ones(2, 1, 1, 6, dtype=torch.long)), "bool"),
        (dict(query=x, key=kv, valid_lens=torch.tensor([1, 2, 3])), "valid_lens"),
        (dict(query=x, key=kv, head_mask=torch.ones(3)), "head_mask"),
    ]
    for kwargs, match in cases:
        with pytest.raises((ValueError, TypeError), match=match):
            mha(**kwargs)


def test_to_torch_refuses_configs_torch_cannot_express():
    for mha in (hw.MultiHeadAttention(8, 2, head_dim=3), hw.MultiHeadAttention(8, 2, out_dim=4),
                hw.MultiHeadAttention(8, 4, num_kv_heads=2)):
        with pytest.raises(ValueError, match="no torch.nn.MultiheadAttention equivalent"):
            mha.to_torch()
    with pytest.raises(ValueError, match="add_bias_kv"):
        hw.MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))


def test_split_and_merge_are_inverse_and_named():
    x = torch.randn(2, 5, 12)
    heads = hw.split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    assert torch.equal(heads[:, 1], x[..., 4:8])  # head 1 is column block 1
    assert torch.equal(hw.merge_heads(heads), x)
    with pytest.raises(ValueError, match="divisible"):
        hw.split_heads(x, 5)


@pytest.mark.parametrize("update", ["fused AdamW", "p.data.add_"])
def test_inference_after_in_place_weight_updates_uses_the_new_weights(update):
    """Neither the fused AdamW kernel nor ``p.data.add_`` bumps a tensor's version counter: a
    concatenated-weight cache keyed on versions would silently keep the old weights."""
    torch.manual_seed(0)
    mha = hw.MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        mha(x)  # an inference call before the update
    if update == "fused AdamW":
        opt = torch.optim.AdamW(mha.parameters(), lr=0.1, fused=True)
        mha(x)[0].square().sum().backward()
        opt.step()
    else:
        for p in mha.parameters():
            p.data.add_(torch.randn_like(p))
    with torch.no_grad():
        got, _ = mha(x)
        fresh = hw.MultiHeadAttention(16, 4)
        fresh.load_state_dict(mha.state_dict())
        want, _ = fresh(x)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
