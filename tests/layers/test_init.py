"""MultiHeadAttention against the per-head loop, torch's MHA and the float64 reference."""

import pytest
import torch
from torch import nn

import headwise as hw


def test_the_4_3_2_example_from_the_issue():
    mha = hw.MultiHeadAttention(4, 2, head_dim=3, kdim=3, vdim=2)
    assert (mha.q_proj.weight.shape, mha.k_proj.weight.shape, mha.v_proj.weight.shape,
            mha.out_proj.weight.shape) == ((6, 4), (6, 3), (6, 2), (4, 6))
    out, w = mha(torch.randn(2, 5, 4), torch.randn(2, 7, 3), torch.randn(2, 7, 2),
                 return_weights=True)
    assert out.shape == (2, 5, 4) and w.shape == (2, 2, 5, 7)


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


def test_to_torch_refuses_configs_torch_cannot_express():
    for mha in (hw.MultiHeadAttention(8, 2, head_dim=3), hw.MultiHeadAttention(8, 2, out_dim=4),
                hw.MultiHeadAttention(8, 4, num_kv_heads=2)):
        with pytest.raises(ValueError, match="no torch.nn.MultiheadAttention equivalent"):
            mha.to_torch()
    with pytest.raises(ValueError, match="add_bias_kv"):
        hw.MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))


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


def test_window_softcap_sinks_and_rope_paths_in_the_trace():
    """A sliding window is a banded bool mask the fused kernel takes (the CPU flash kernel with
    is_causal); soft-capping and sinks run eager and say why; RoPE is a step of its own after the
    head split, and grouped key/value heads are named."""
    from headwise.rope import RotaryEmbedding
    torch.manual_seed(0)
    x = torch.randn(2, 7, 16)
    mha = hw.MultiHeadAttention(16, 4, num_kv_heads=2, rope=RotaryEmbedding(4), window=3).eval()
    t = hw.trace(mha, x, causal=True)
    names = [s.name for s in t.steps]
    assert names.index("split heads k") < names.index("rotary positions q") \
        < names.index("fused attention")
    fused = next(s for s in t.steps if s.name == "fused attention")
    assert "FLASH_ATTENTION" in str(fused.info), fused.info
    # the window is a mask: same output as the eager reference with the same band
    eager = hw.MultiHeadAttention(16, 4, num_kv_heads=2, rope=RotaryEmbedding(4), window=3,
                                  backend="eager").eval()
    eager.load_state_dict(mha.state_dict())
    torch.testing.assert_close(mha(x, causal=True)[0], eager(x, causal=True)[0], atol=1e-6,
                               rtol=0)
    for kw in (dict(softcap=2.0), dict(sinks=True)):
        capped = hw.MultiHeadAttention(16, 4, **kw).eval()
        t = hw.trace(capped, x, causal=True)
        summed = next(s for s in t.steps if s.name == "weighted sum")
        assert "no fused kernel takes them" in str(summed.info), summed.info


def test_module_compiles_with_fullgraph_on_the_fused_path():
    """No graph break in MultiHeadAttention.forward (self- and cross-attention, padding,
    causal, grouped heads), forward and backward."""
    torch.manual_seed(0)
    mha = hw.MultiHeadAttention(16, 4, num_kv_heads=2, kdim=12)
    x, mem = torch.randn(2, 5, 16), torch.randn(2, 7, 12)
    lens = torch.tensor([7, 3])
    compiled = torch.compile(mha, fullgraph=True, backend="eager")
    out = compiled(x, mem, valid_lens=lens)[0]
    torch.testing.assert_close(out, mha(x, mem, valid_lens=lens)[0], rtol=0, atol=0)
    out.sum().backward()
    self_attn = hw.MultiHeadAttention(16, 4)
    compiled = torch.compile(self_attn, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, causal=True)[0], self_attn(x, causal=True)[0],
                               rtol=0, atol=0)
    torch._dynamo.reset()


def test_changed_sizes_names_only_what_differs_from_its_default():
    assert hw.MultiHeadAttention(8, 2).changed_sizes() == {}
    mha = hw.MultiHeadAttention(8, 4, head_dim=3, kdim=5, vdim=6, num_kv_heads=2, out_dim=7)
    assert mha.changed_sizes() == {"kdim": 5, "vdim": 6, "num_kv_heads": 2, "out_dim": 7}
    assert hw.MultiHeadAttention(8, 2, kdim=5, vdim=5).changed_sizes() == {"kdim": 5}
