"""Per-head weights on a CUDA device against float64 on the CPU (skipped without CUDA).

The CPU-only suite checks the shapes, the kernel choice and the op counts of this path with
fake CUDA tensors (tests/fast/test_cuda_lse.py, tests/attend/test_fused_gpu_weights.py) and the
Triton kernel's values under its interpreter in float32/float16
(tests/fast/test_triton_weights.py); what only a GPU can show is here: each CUDA kernel's LSE
against a float64 logsumexp, the weights in bfloat16/float16/float32 against float64, the output
and its gradients unchanged by asking for weights, no host sync, and the peak memory.

Tolerances: the reference takes the same (rounded) inputs upcast to float64, so the error is the
float32 accumulation (~1e-6 relative on scores and LSE) plus one rounding of each weight (<= 1)
to the output dtype: 2^-8 (bf16), 2^-11 (fp16), 2^-24 (fp32), doubled for the LSE's own error.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import headwise as hw

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DEV = "cuda"
WEIGHT_TOL = {torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 2e-5}


def _reference(q, k, mask=None, causal=False):
    """float64 weights (b, h, i, j) on the CPU: masked -> 0, fully masked rows -> 0."""
    b, h, nq, d = q.shape
    kk = k.double().cpu().repeat_interleave(h // k.shape[1], 1)
    s = q.double().cpu() @ kk.transpose(-1, -2) / math.sqrt(d)
    if mask is not None:
        s = s.masked_fill(~mask.cpu(), -math.inf)
    if causal:
        s = s.masked_fill(~hw.masks.causal(nq, k.shape[2]), -math.inf)
    return torch.softmax(s, -1).nan_to_num(nan=0.0), torch.logsumexp(s, -1)


def _inputs(dtype, b=2, h=4, g=4, nq=200, nk=200, d=64):
    q = torch.randn(b, h, nq, d, device=DEV).to(dtype)
    k = torch.randn(b, g, nk, d, device=DEV).to(dtype)
    v = torch.randn(b, g, nk, d, device=DEV).to(dtype)
    return q, k, v


@pytest.mark.parametrize("kernel, dtype, masked", [
    ("FLASH_ATTENTION", torch.bfloat16, False), ("FLASH_ATTENTION", torch.float16, False),
    ("EFFICIENT_ATTENTION", torch.float32, False), ("EFFICIENT_ATTENTION", torch.float32, True),
    ("EFFICIENT_ATTENTION", torch.bfloat16, True), ("CUDNN_ATTENTION", torch.bfloat16, False)])
def test_each_kernels_lse_matches_a_float64_logsumexp(kernel, dtype, masked):
    from headwise.fast import cuda_lse
    q, k, v = _inputs(dtype, nq=1000, nk=1000)                        # 1000: padded to 1024
    mask = torch.rand(2, 1, 1, 1000, device=DEV) > 0.2 if masked else None
    got = cuda_lse.with_lse(q, k, v, mask, False, None, kernel)
    if got is None and kernel == "CUDNN_ATTENTION":
        pytest.skip("cuDNN attention refused these inputs on this build")
    assert got is not None, f"{kernel} refused {dtype} inputs"
    out, lse = got
    _, ref = _reference(q, k, mask if mask is None else mask.expand(2, 1, 1000, 1000))
    assert lse.shape == (2, 4, 1000) and lse.dtype == torch.float32
    torch.testing.assert_close(lse.double().cpu(), ref, atol=1e-4, rtol=1e-5)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, want, atol=WEIGHT_TOL[dtype], rtol=0)


SELECTIONS = {"all": True, "one head": hw.Selection(heads=2),
              "last 16 rows": hw.Selection(rows=slice(-16, None)),
              "64-key range": hw.Selection(keys=slice(40, 104)),
              "scattered": hw.Selection(heads=[3, 0], rows=[5, 1, 100], keys=[0, 7, 149])}


def _pick(w, sel, h, nq, nk):
    for dim, index in zip((1, 2, 3), sel.resolve(h, nq, nk, "cpu"), strict=True):
        w = w.narrow(dim, index.start, index.stop - index.start) if isinstance(index, slice) \
            else w.index_select(dim, index)
    return w


CASES = ["plain", "causal nq<nk, gqa", "causal nq>nk", "padding mask", "gqa g=1"]


# every case in bf16 and fp32; fp16 (the same kernel code as bf16) on two: each variant is a
# Triton compile (~1-2 s), and the module should stay under a minute
@pytest.mark.parametrize("dtype, case", [
    *((torch.bfloat16, c) for c in CASES), *((torch.float32, c) for c in CASES),
    (torch.float16, "plain"), (torch.float16, "padding mask")])
def test_every_selection_matches_float64(dtype, case):
    shape = {"plain": {}, "causal nq<nk, gqa": {"g": 2, "nq": 150},
             "causal nq>nk": {"nk": 150},  # bottom-right: the first 50 rows see no key: zeros
             "padding mask": {}, "gqa g=1": {"g": 1}}[case]
    q, k, v = _inputs(dtype, **shape)
    b, h, nq, nk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    mask = None
    if case == "padding mask":
        mask = torch.ones(b, 1, 1, nk, dtype=torch.bool, device=DEV)
        mask[0, ..., 150:] = False
    causal = case.startswith("causal")
    ref, _ = _reference(q, k, None if mask is None else mask.expand(b, 1, nq, nk), causal)
    for name, sel in SELECTIONS.items():
        out, w = hw.attention(q, k, v, mask=mask, causal=causal, return_weights=sel)
        want = ref if sel is True else _pick(ref, sel, h, nq, nk)
        assert w.dtype == dtype and w.device.type == torch.device(DEV).type, name
        torch.testing.assert_close(w.double().cpu(), want, atol=WEIGHT_TOL[dtype], rtol=0,
                                   msg=lambda m, name=name: f"{case} {name}: {m}")


def test_asking_for_weights_leaves_the_output_and_its_gradients_unchanged():
    q, k, v = (t.requires_grad_() for t in _inputs(torch.float32, g=2))
    out, w = hw.attention(q, k, v, causal=True, return_weights=True)
    grads = torch.autograd.grad((out * out).sum(), (q, k, v))
    out0, _ = hw.attention(q, k, v, causal=True)
    grads0 = torch.autograd.grad((out0 * out0).sum(), (q, k, v))
    torch.testing.assert_close(out, out0, atol=1e-5, rtol=1e-5)
    for a, b in zip(grads, grads0, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert not w.requires_grad


def test_the_nan_policy_on_the_gpu_weights():
    q, k, v = _inputs(torch.float32, g=4, nq=64, nk=64)
    q[0, 0, 5, 3] = math.nan
    k[1, 2, 9, 0] = math.nan
    _, w = hw.attention(q, k, v, causal=True, return_weights=True)
    assert w[0, 0, 5].isnan().all() and w[1, 2].isnan().all()
    rest = torch.ones_like(w, dtype=torch.bool)
    rest[0, 0, 5] = False
    rest[1, 2] = False
    assert w[rest].isfinite().all()


@pytest.mark.parametrize("sel", list(SELECTIONS)[:4])
def test_a_weights_call_does_not_synchronise_with_the_host(sel):
    q, k, v = _inputs(torch.bfloat16, nq=256, nk=256)
    hw.attention(q, k, v, causal=True, return_weights=SELECTIONS[sel])  # compile, warm up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        hw.attention(q, k, v, causal=True, return_weights=SELECTIONS[sel])
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_all_weights_need_at_most_1_2x_the_returned_tensor():
    q, k, v = _inputs(torch.bfloat16, b=4, h=16, g=16, nq=1024, nk=1024)
    with torch.inference_mode():
        hw.attention(q, k, v, return_weights=True)  # warm up
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out, w = hw.attention(q, k, v, return_weights=True)
        peak = torch.cuda.max_memory_allocated() - before
    assert peak <= 1.2 * w.numel() * w.element_size(), peak / (w.numel() * w.element_size())
