"""MultiHeadAttention against the float64 reference and torch.nn.MultiheadAttention."""

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
