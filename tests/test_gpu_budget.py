"""The GPU path's budget, guarded on a CPU-only machine (issue #28, items 1 and 7).

A forward without weights off the CPU must issue the hand-written path's kernels (``F.linear``
per projection, one ``F.scaled_dot_product_attention``) plus at most 3, with no host read and
no copy from the host. Two counters, each where the other is blind:

- fake ``cuda:0`` tensors (:func:`tests.fake_cuda.run`) at the issue's shape (b=4, n=1024,
  embed 1024, 16 heads, bf16): no data, so any host read or host-to-device copy shows;
- real CPU tensors on the GPU's code path (:func:`tests.fake_cuda.on_device_path`, i.e.
  :func:`headwise.fast.as_device`): indexing, ``valid_lens``, autograd (fwd+bwd) and the
  values, checked against float64.

Each counts the public SDPA call as one op (the fused kernel a GPU runs) and counts the
hand-written path in the same way, in the same process, so the budget is a difference.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

import headwise
from headwise.fast import as_device, joint_qkv, kernel_nan
from headwise.models import LMConfig, TransformerLM
from tests.fake_cuda import on_device_path, run

EXTRA = 3  # kernels the fused path may add to the hand-written one (the issue's budget)
CASES = {  # name: (MultiHeadAttention keywords, forward keywords)
    "causal": ({}, {"causal": True}),
    "key padding": ({}, {"mask": "padding"}),
    "key padding, causal": ({}, {"mask": "padding", "causal": True}),
    "valid_lens": ({}, {"valid_lens": True}),
    "grouped heads (g=4), causal": ({"num_kv_heads": 4}, {"causal": True}),
    "cross-attention": ({}, {"source": True}),
    "head_mask, causal": ({}, {"head_mask": True, "causal": True}),
}


def hand_written(m, x, source=None, mask=None, causal=False):
    """The plain torch forward the budget is counted against: ``F.linear`` per projection, one
    SDPA call, the merge and the output ``F.linear``."""
    src = x if source is None else source
    q = rearrange(F.linear(x, m.q_proj.weight, m.q_proj.bias), "b n (h d) -> b h n d",
                  h=m.num_heads)
    k = rearrange(F.linear(src, m.k_proj.weight, m.k_proj.bias), "b n (h d) -> b h n d",
                  h=m.num_kv_heads)
    v = rearrange(F.linear(src, m.v_proj.weight, m.v_proj.bias), "b n (h d) -> b h n d",
                  h=m.num_kv_heads)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                         enable_gqa=m.num_kv_heads != m.num_heads)
    return F.linear(rearrange(out, "b h n d -> b n (h d)"), m.out_proj.weight, m.out_proj.bias)


def _inputs(case, b, n, m, h, dtype, device="cpu"):
    """``(module keywords, headwise call keywords, hand-written call keywords)`` for a case,
    every tensor built here, outside the counted block (the hand-written path gets its mask in
    hand: causality folded in, as SDPA refuses attn_mask with is_causal)."""
    module_kw, call = CASES[case]
    causal = call.get("causal", False)
    kw, hw_kw = {"causal": causal}, {"causal": causal}
    if call.get("mask") == "padding":
        kw["mask"] = hw_kw["mask"] = (torch.rand(b, 1, 1, n, device=device) > 0.3
                                      if device == "cpu" else
                                      torch.ones(b, 1, 1, n, dtype=torch.bool, device=device))
    if call.get("valid_lens"):
        kw["valid_lens"] = lens = torch.randint(1, n + 1, (b,))
        hw_kw["mask"] = (torch.arange(n) < lens[:, None])[:, None, None, :]
    if hw_kw.get("mask") is not None and causal:
        hw_kw["mask"] = hw_kw["mask"] & torch.ones(n, n, dtype=torch.bool, device=device).tril()
        hw_kw["causal"] = False
    if call.get("source"):
        hw_kw["source"] = kw["key"] = torch.randn(b, n // 2 + 3, m, dtype=dtype, device=device)
    if call.get("head_mask"):
        kw["head_mask"] = torch.rand(h, device=device)
    return module_kw, kw, hw_kw


@pytest.mark.parametrize("case", [c for c in CASES if c != "valid_lens"])
def test_a_forward_on_fake_cuda_at_the_issue_shape_has_no_sync_no_copy_and_fits_the_budget(case):
    # fake cuda cannot index a tensor ("not linked with support for cuda devices"): valid_lens
    # runs on the device path below
    counts = run(f"""
        from tests.test_gpu_budget import _inputs, hand_written
        module_kw, kw, hw_kw = _inputs({case!r}, 4, 1024, 1024, 16, torch.bfloat16, "cuda:0")
        m = headwise.MultiHeadAttention(1024, 16, **module_kw).requires_grad_(False)
        m = fake_module(m, dtype=torch.bfloat16)
        x = cuda(4, 1024, 1024, dtype=torch.bfloat16)
        with counted("warm"):  # the first call may build what later calls reuse
            m(x, **kw)
        with counted("headwise"):
            m(x, **kw)
        with counted("hand-written"):
            hand_written(m, x, **hw_kw)
    """, sdpa_as_one=True)
    ours, hand = counts["headwise"], counts["hand-written"]
    assert counts["warm"].syncs == [] and counts["warm"].error is None, str(counts["warm"])
    assert ours.error is None and hand.error is None, (ours.traceback, hand.traceback)
    assert ours.syncs == [] and ours.h2d == [], str(ours)
    assert ours.histogram().get("aten.scaled_dot_product_attention") == 1, str(ours)
    assert "aten.cat" not in ours.histogram(), str(ours)  # no per-call weight concatenation
    assert ours.kernels <= hand.kernels + EXTRA, f"headwise: {ours}\nhand-written: {hand}"
    assert ours.kernels <= 12, str(ours)


def _reference(m, x, hw_kw):
    """The hand-written forward in float64 on CPU copies: the values' reference."""
    m64 = _copy(m, torch.float64)
    kw = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
          for k, v in hw_kw.items()}
    return hand_written(m64, x.double(), **kw)


def _copy(m, dtype):
    out = headwise.MultiHeadAttention(m.embed_dim, m.num_heads, num_kv_heads=m.num_kv_heads)
    out.load_state_dict(m.state_dict())
    return out.to(dtype)


@pytest.mark.parametrize("case", list(CASES))
def test_a_forward_on_the_device_path_has_no_sync_fits_the_budget_and_matches_float64(case):
    b, n, dim, h = 2, 48, 64, 8
    module_kw, kw, hw_kw = _inputs(case, b, n, dim, h, torch.float32)
    m = headwise.MultiHeadAttention(dim, h, **module_kw).eval()
    x = torch.randn(b, n, dim)
    with torch.no_grad():
        with on_device_path() as ours:
            out, _ = m(x, **kw)
        with on_device_path() as hand:
            hand_written(m, x, **hw_kw)
        want = _reference(m, x, hw_kw)
    assert ours.syncs == [], str(ours)
    assert ours.kernels <= hand.kernels + EXTRA, f"headwise: {ours}\nhand-written: {hand}"
    assert "aten.cat" not in ours.histogram(), str(ours)  # no per-call weight concatenation
    if "head_mask" in kw:
        want = rearrange(rearrange(_heads_of(m, x, hw_kw), "b i (h d) -> b h i d", h=h)
                         * kw["head_mask"].double()[:, None, None], "b h i d -> b i (h d)")
        want = F.linear(want, m.out_proj.weight.double(), m.out_proj.bias.double())
    # float32 end to end over 64-wide dot products: ~1e-6 relative; 1e-5 leaves room
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def _heads_of(m, x, hw_kw):
    """The float64 merged heads before the output projection (for the head_mask case)."""
    m64 = _copy(m, torch.float64)
    m64.out_proj.weight.data = torch.eye(m.embed_dim, dtype=torch.float64)
    m64.out_proj.bias.data.zero_()
    return hand_written(m64, x.double(), **hw_kw)


def test_forward_and_backward_on_the_device_path_fit_the_budget_and_match_float64():
    b, n, dim, h = 2, 48, 64, 8
    m = headwise.MultiHeadAttention(dim, h)
    x = torch.randn(b, n, dim, requires_grad=True)
    with on_device_path() as ours:
        out, _ = m(x, causal=True)
        out.sum().backward()
    grads = [p.grad.clone() for p in (x, *m.parameters())]
    m.zero_grad()
    x.grad = None
    with on_device_path() as hand:
        hand_written(m, x, causal=True).sum().backward()
    assert ours.syncs == [], str(ours)
    assert ours.kernels <= hand.kernels + EXTRA, f"headwise: {ours}\nhand-written: {hand}"
    m64, x64 = _copy(m, torch.float64), x.detach().double().requires_grad_(True)
    hand_written(m64, x64, causal=True).sum().backward()
    for got, want in zip(grads, [x64.grad, *(p.grad for p in m64.parameters())], strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_the_cpu_keeps_its_one_qkv_gemm_and_its_nan_masks_and_the_switch_gives_them_up():
    m = headwise.MultiHeadAttention(64, 8).eval()
    x = torch.randn(2, 16, 64)
    with torch.no_grad(), on_device_path(gpu_rules=False) as cpu:
        m(x, causal=True)
    assert cpu.histogram().get("aten.addmm") == 2, str(cpu)  # cat(W_q, W_k, W_v) @ x; out
    w = m.q_proj.weight
    assert joint_qkv(x, w) and not kernel_nan(x)
    with as_device():
        assert joint_qkv(x, w) and kernel_nan(x)  # training: one GEMM forward, two backward
        with torch.no_grad():
            assert not joint_qkv(x, w)  # inference: three GEMMs, no per-call concatenation
    assert joint_qkv(x, w) and not kernel_nan(x)  # the switch is a block, not a state


LAYERS = {  # what one decoder layer must issue, and why (no more, on the GPU's path)
    # LayerNorm x2, q/k/v/out projections, SDPA, up/down projections, activation, 2 residuals
    "gpt": ({}, 2 + 4 + 1 + 2 + 1 + 2),
    # RMSNorm x2 (pow, mean, +eps, rsqrt, x*r, *w: 6 each), q/k/v/out, RoPE on q and k (flip,
    # *sin, *cos, +: 4 each), SDPA, gate/up/down, silu, gate*up, 2 residuals
    "llama": ({"num_kv_heads": 2, "norm": "rms", "ffn": "glu", "positional": "rope",
               "bias": False, "activation": "silu", "tie_embeddings": True},
              12 + 4 + 8 + 1 + 3 + 2 + 2),
}


@pytest.mark.parametrize("kind", list(LAYERS))
def test_an_lm_forward_on_the_device_path_has_no_sync_and_fits_its_per_layer_budget(kind):
    extra, per_layer = LAYERS[kind]
    tokens = torch.randint(0, 100, (2, 24))
    counts = {}
    for layers in (1, 3):
        model = TransformerLM(LMConfig(100, d_model=64, num_heads=4, num_layers=layers,
                                       d_ff=128, max_len=64, dropout=0.0, **extra)).eval()
        with torch.no_grad():
            model(tokens)  # warm: RoPE's angles are made once per length
            with on_device_path() as counts[layers]:
                model(tokens)
            on_gpu_path = _as_device_logits(model, tokens)
            torch.testing.assert_close(on_gpu_path, model(tokens)[0], rtol=1e-5, atol=1e-5)
    assert counts[1].syncs == [] and counts[3].syncs == [], str(counts[3])
    grew = counts[3].kernels - counts[1].kernels
    assert grew <= 2 * per_layer, f"{grew / 2} ops per layer > {per_layer}: {counts[3]}"


def _as_device_logits(model, tokens):
    with as_device():
        return model(tokens)[0]


def test_a_llama_forward_on_fake_cuda_has_no_sync_and_no_host_copy():
    counts = run("""
        from headwise.models import LMConfig, TransformerLM
        config = LMConfig(1000, d_model=128, num_heads=4, num_kv_heads=2, num_layers=2,
                          d_ff=256, max_len=256, dropout=0.0, norm="rms", ffn="glu",
                          positional="rope", bias=False, activation="silu")
        model = fake_module(TransformerLM(config).eval().requires_grad_(False), torch.bfloat16)
        tokens = torch.zeros(2, 64, dtype=torch.long, device="cuda:0")
        model(tokens)
        with counted("forward"):
            model(tokens)
    """, sdpa_as_one=True)
    got = counts["forward"]
    assert got.error is None, got.traceback
    assert got.syncs == [] and got.h2d == [], str(got)


def _enc_dec_and_bert():
    """``{name: (model, args, kwargs)}``: the encoder-decoder with source lengths and pad ids,
    and a BERT encoder with a padding attention mask."""
    from headwise.models import Transformer, TransformerConfig
    from headwise.models.bert import BertConfig, BertModel
    t = Transformer(TransformerConfig(50, 60, d_model=64, num_heads=4, num_layers=2, d_ff=128,
                                      max_len=64, dropout=0.0, pad_id=0)).eval()
    bert = BertModel(BertConfig(100, d_model=64, num_heads=4, num_layers=2, d_ff=128,
                                max_len=64, dropout=0.0, attention_dropout=0.0)).eval()
    src, tgt = torch.randint(0, 50, (2, 20)), torch.randint(1, 60, (2, 15))
    ids, attention = torch.randint(0, 100, (2, 20)), torch.ones(2, 20, dtype=torch.long)
    attention[1, 12:] = 0
    return {"encoder-decoder": (t, (src, tgt), {"src_valid_lens": torch.tensor([20, 9])}),
            "bert": (bert, (ids, attention), {})}


@pytest.mark.parametrize("name", ["encoder-decoder", "bert"])
def test_encoder_models_read_nothing_back_on_the_device_path(name):
    model, args, kwargs = _enc_dec_and_bert()[name]
    with torch.no_grad():
        want = model(*args, **kwargs)
        with on_device_path() as counts:
            got = model(*args, **kwargs)
    assert counts.syncs == [], str(counts)  # no range check, no "any padding?" read
    want, got = (x[0] if isinstance(x, tuple) else x for x in (want, got))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
