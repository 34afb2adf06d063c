"""head_stats, stats.collect and the catalogue on CUDA against float64 CPU references (skipped
without CUDA). The Triton kernel (headwise.fast.stats_triton) and the torch path
(HEADWISE_TRITON=0) are both checked; bfloat16 only here (Triton's CPU interpreter gets its
bfloat16 dot wrong). Whole module: well under a second of kernels plus ~15 Triton compilations
(~1-2 s each)."""

import pytest
import torch

import headwise as hw
from tests.attend.test_init import make_mask
from tests.reference import reference_attention
from tests.test_stats import stats_from_full_weights

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CASES = [  # b, g, r, nq, nk, d, mask kind, causal, top_k
    (2, 2, 2, 300, 300, 64, "none", True, 5),
    (1, 1, 4, 200, 120, 64, "padding", True, 8),     # causal, nq > nk: rows with no key
    (2, 2, 1, 150, 257, 32, "float", False, 1),
    (1, 2, 2, 129, 129, 64, "dead_rows", False, 16),
]
# inputs rounded to the dtype first, so the reference sees what the device saw; what is left is
# float32 accumulation (and, for top-k/max, ties): 2e-5 in float32, a little more over the
# float16/bfloat16 products' longer sums
TOL = {torch.float32: 2e-5, torch.bfloat16: 1e-4, torch.float16: 1e-4}


def _inputs(case, dtype, seed):
    b, g, r, nq, nk, d, kind, causal, top_k = case
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, g * r, nq, d, generator=gen).to(dtype)
    k = torch.randn(b, g, nk, d, generator=gen).to(dtype)
    mask = make_mask(kind, b, g * r, nq, nk, gen)
    ids = torch.randint(0, 5, (b, nk), generator=gen)
    return q, k, mask, ids


def _check(got, q, k, mask, ids, causal, top_k, tol):
    nq, nk = q.shape[2], k.shape[2]
    qd, kd = q.double(), k.double()
    _, w = reference_attention(qd, kd, kd, mask, causal)
    for name, ref in stats_from_full_weights(w, nq, nk, ids, min(top_k, nk)).items():
        torch.testing.assert_close(getattr(got, name).double().cpu(), ref, rtol=tol, atol=tol,
                                   msg=lambda m, name=name: f"{name}: {m}")
    torch.testing.assert_close(w.gather(-1, got.top_keys.cpu()), got.top_values.double().cpu(),
                               rtol=tol, atol=tol)
    assert torch.equal(got.live.cpu(), w.sum(-1) > 0.5)


@pytest.mark.parametrize("triton", [True, False], ids=["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_head_stats_on_cuda_equal_float64_cpu_reference(case, dtype, triton, monkeypatch):
    if not triton:
        monkeypatch.setenv("HEADWISE_TRITON", "0")
    q, k, mask, ids = _inputs(CASES[case], dtype, seed=case)
    causal, top_k = CASES[case][7], CASES[case][8]
    got = hw.stats.head_stats(q.cuda(), k.cuda(), mask=None if mask is None else mask.cuda(),
                              causal=causal, token_ids=ids.cuda(), top_k=top_k)
    _check(got, q, k, mask, ids, causal, top_k, TOL[dtype])


def test_head_stats_with_the_flash_kernels_lse_in_bf16_and_no_host_sync():
    """The fused kernel's own LSE (aten._scaled_dot_product_flash_attention, bf16) as the shift,
    and torch's sync detector armed around the call (after a warm-up compiles the kernel)."""
    q, k, _, ids = _inputs((1, 4, 1, 1024, 1024, 64, "none", True, 5), torch.bfloat16, seed=9)
    qc, kc, idc = q.cuda(), k.cuda(), ids.cuda()
    lse = torch.ops.aten._scaled_dot_product_flash_attention(
        qc, kc, kc, 0.0, True, False, scale=64 ** -0.5)[1]  # (b, h, n) float32, natural log
    hw.stats.head_stats(qc, kc, causal=True, lse=lse, token_ids=idc)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = hw.stats.head_stats(qc, kc, causal=True, lse=lse, token_ids=idc)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    _check(got, q, k, None, ids, True, 5, 2e-4)  # the LSE's ~1e-6, not renormalised


def test_collect_and_catalogue_on_cuda_equal_the_cpu():
    from headwise.analysis.catalogue import SCORES, catalogue
    from headwise.models import LMConfig, TransformerLM
    torch.manual_seed(0)
    lm = TransformerLM(LMConfig(vocab_size=23, d_model=64, num_heads=4, num_layers=2, d_ff=128,
                                max_len=96)).eval()
    tokens = torch.randint(0, 23, (2, 96))
    with torch.no_grad(), hw.stats.collect(lm, token_ids=tokens) as cpu:
        lm(tokens)
    cpu_cat = catalogue(lm, tokens)
    lm = lm.cuda()
    with torch.no_grad(), hw.stats.collect(lm, token_ids=tokens.cuda()) as gpu:
        lm(tokens.cuda())
    for path, (want,) in cpu.items():
        (got,) = gpu[path]
        for name in ("entropy", "max_weight", "received", "induction", "distance", "top_values"):
            torch.testing.assert_close(getattr(got, name).cpu(), getattr(want, name),
                                       rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    gpu_cat = catalogue(lm, tokens.cuda())
    for score in SCORES:
        for kind, table in cpu_cat.table(score).items():
            torch.testing.assert_close(gpu_cat.table(score)[kind], table, rtol=1e-4, atol=1e-4,
                                       equal_nan=True, msg=lambda m, s=score: f"{s}: {m}")
    for on_gpu, on_cpu in zip(gpu_cat.heads, cpu_cat.heads, strict=True):
        g, c = ({t["id"]: t["share"] for t in e["top_tokens"]} for e in (on_gpu, on_cpu))
        assert len(g.keys() & c.keys()) >= len(c) - 1  # a tie at the cut may swap the last
        assert all(abs(g[i] - c[i]) < 1e-4 for i in g.keys() & c.keys())
