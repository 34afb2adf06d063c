"""CPU-only guards of the weights path on a GPU: fake ``cuda:0`` tensors (tests/fake_cuda.py)
count what ``hw.attention(..., return_weights=...)`` would launch there.

On a GPU the weights of any selection come from the LSE the fused kernel returned with the
output: the fused kernel, one float32 key-sum reduction (the NaN policy's per-head test) and
the Triton weights kernel, with no host read. (The NaN policy on the *output* is
:func:`headwise.attend.fused.checked`'s own budget, guarded with the forward; it is
replaced by "all finite" here so these counts measure what the weights add.) torch's own
kernel choice (``aten._fused_sdp_choice``) runs on the host: no kernel.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tests.fake_cuda import run  # noqa: E402

_SCRIPT = '''
import headwise as hw
import headwise.attend.fused as fused
fused.checked = lambda q, k, v, *rest: (k, v, None, None)
{plant}
b, h, n, d = 2, 8, 1024, 64
for dtype in (torch.bfloat16, torch.float32):
    q, k, v = (cuda(b, h, n, d, dtype=dtype) for _ in range(3))
    for label, sel in (("all", True), ("one head", hw.Selection(heads=3)),
                       ("last 16 rows", hw.Selection(rows=slice(-16, None))),
                       ("64-key range", hw.Selection(keys=slice(256, 320)))):
        with counted(f"{{label}} {{dtype}}"):
            out, w = hw.attention(q, k, v, causal=True, return_weights=sel)
            assert w.dtype == dtype and w.dim() == 4, (w.dtype, w.shape)
    mask = cuda(b, 1, 1, n, dtype=torch.bool)
    with counted(f"all, padding mask {{dtype}}"):
        hw.attention(q, k, v, mask=mask, return_weights=True)
'''
HOST_ONLY = {"aten._fused_sdp_choice"}
# the fused kernel + the key sum + the weights kernel; a bool mask adds its additive form (a
# scalar and a where) for the efficient kernel
BUDGET = {"all": 3, "one head": 3, "last 16 rows": 3, "64-key range": 3, "all, padding mask": 6}
# float32 takes cuBLAS's products in device-sized blocks instead (the Triton kernel's exact
# float32 products ran 11-18x torch's need_weights on an H100): the fused kernel, q * scale,
# then per batch row (one block each here) the product, - lse, the causal mask (arange x2, add,
# le, not, fill), exp and the whole-row renormalisation (sum, clamp, div): <= 13; then the
# NaN policy per key head (a float32 sum, isfinite (abs, ne, eq, mul as fake tensors count
# it), not, one fill): 6
FP32_BUDGET = 2 + 13 * 2 + 6


def _kernels(c) -> int:
    return sum(1 for name in c.ops if name not in HOST_ONLY)


def test_a_weights_call_on_a_gpu_issues_no_host_sync_and_at_most_3_kernels():
    counts = run(_SCRIPT.format(plant=""))
    assert len(counts) == 2 * len(BUDGET)
    for label, c in counts.items():
        assert c.error is None, (label, c.error, c.traceback)
        assert c.syncs == [] and c.h2d == [], (label, c)
        # no float32 upcast copies, no chunked logsumexp pass, no softmax
        assert not {"aten._to_copy", "aten.logsumexp", "aten._softmax"} & set(c.histogram()), (
            label, c.histogram())
        if label.endswith("float32"):
            assert _kernels(c) <= FP32_BUDGET, (label, c.histogram())
            assert "headwise.weights_from_lse" not in c.histogram(), (label, c.histogram())
            continue
        assert _kernels(c) <= BUDGET[label.rsplit(" ", 1)[0]], (label, c.histogram())
        assert c.histogram().get("headwise.weights_from_lse") == 1, (label, c.histogram())
        assert not {"aten.bmm", "aten.baddbmm"} & set(c.histogram()), (label, c.histogram())


def test_the_guard_fails_when_a_host_read_or_an_extra_kernel_is_put_back():
    """Mutation check: a scalar read of the LSE (as the old path's isnan checks between blocks
    did) and a float32 upcast of q before the weights kernel are both caught."""
    plant = '''
from headwise.fast import triton_weights
launch = triton_weights.select_and_launch
def planted(q, k, lse, **kw):
    if bool(torch.isnan(lse).any()):
        pass
    return launch(q.float().to(q.dtype), k, lse, **kw)
triton_weights.select_and_launch = planted
'''
    counts = run(_SCRIPT.format(plant=plant))
    c = counts["all torch.bfloat16"]
    assert c.syncs, c  # the host read was recorded (and stopped the block)
    # without the read, the upcast alone breaks the kernel budget
    counts = run(_SCRIPT.format(plant=plant.replace("bool(torch.isnan(lse).any())", "False")))
    c = counts["one head torch.bfloat16"]
    assert c.syncs == [] and _kernels(c) > BUDGET["one head"], c.histogram()


_WIRING = r'''
import json, math, sys
import torch
import headwise as hw
import headwise.attend.fused as fused
from headwise import masks
from headwise.heads import expand_kv

# The GPU branch on real CPU values: the device rule says "GPU", and the CUDA op is stood in
# for by the CPU flash op, which returns the same (out, lse (b, h, i)) pair; the weights then
# come from the Triton kernel under the interpreter.
fused.gpu = lambda *tensors: True
def cpu_with_lse(q, k, v, mask, is_causal, scale, kernel):
    h = q.shape[1]
    bias = None if mask is None else masks.as_bias(mask, q.dtype)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, expand_kv(k, h), expand_kv(v, h), 0.0, is_causal, attn_mask=bias, scale=scale)
fused._cuda_lse.with_lse = cpu_with_lse

torch.manual_seed(int(sys.argv[1]))
out = {}
for b, h, g, nq, nk in ((2, 4, 2, 33, 33), (1, 6, 3, 20, 45), (2, 2, 1, 1, 17)):
    q, k, v = torch.randn(b, h, nq, 16), torch.randn(b, g, nk, 16), torch.randn(b, g, nk, 16)
    pad = torch.ones(b, 1, 1, nk, dtype=torch.bool)
    pad[0, ..., nk // 2:] = False
    for mname, mask in (("none", None), ("padding", pad), ("additive", torch.randn(nq, nk))):
        for causal in (False, True):
            for sname, sel in (("all", True), ("head", hw.Selection(heads=1)),
                               ("rows", hw.Selection(rows=slice(-3, None))),
                               ("keys", hw.Selection(keys=slice(2, 9))),
                               ("scattered", hw.Selection(heads=[1, 0], rows=[0, nq - 1],
                                                          keys=[nk - 1, 0, 3]))):
                o, w = hw.attention(q, k, v, mask=mask, causal=causal, return_weights=sel,
                                    scale=0.3)
                o64, w64 = hw.attention(q.double(), k.double(), v.double(), mask=mask if mask
                                        is None or mask.dtype == torch.bool else mask.double(),
                                        causal=causal, return_weights=sel, scale=0.3,
                                        backend="eager")
                out[f"{b},{h},{g},{nq},{nk} {mname} causal={causal} {sname}"] = [
                    (w.double() - w64).abs().max().item(), (o.double() - o64).abs().max().item(),
                    list(w.shape) == list(w64.shape)]
print("@@" + json.dumps(out))
'''


def test_the_gpu_branch_wired_through_attention_matches_the_eager_reference():
    """``hw.attention`` on the GPU branch (device rule forced, the CUDA op stood in for by the
    CPU flash op, the Triton kernel interpreted): masks as ``_sdpa_inputs`` hands them over,
    causal with nq != nk, the default of every selection, GQA, all equal float64 eager."""
    from tests.triton_child import run_interpreted
    res, seed = run_interpreted(_WIRING)
    assert len(res) == 3 * 3 * 2 * 5
    for name, (w_err, out_err, same_shape) in res.items():
        # float32 kernels vs float64 over d = 16 terms and <= 45 keys
        assert same_shape and w_err <= 2e-6 and out_err <= 2e-6, (seed, name, w_err, out_err)


@pytest.mark.parametrize("sel", [True, {"heads": [2, 0]}, {"rows": slice(-5, None)},
                                 {"keys": slice(3, 11)}])
def test_the_torch_weights_path_on_a_gpu_makes_a_nan_key_head_wholly_nan(monkeypatch, sel):
    """float32 on a GPU (and any dtype without triton) takes weights.from_lse in device blocks;
    the weights' NaN policy is the Triton kernel's: a NaN key anywhere in a key head makes every
    weight of its query heads NaN, causal or not (the H100 run caught rows before the NaN key
    left finite under causal masking). Run on CPU values with the GPU rule forced."""
    import math

    import torch

    import headwise as hw
    from headwise.attend import fused

    monkeypatch.setattr(fused, "gpu", lambda *t: True)
    monkeypatch.setattr(fused, "_triton_writes", lambda q: False)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 16, 8, generator=g)
    k = torch.randn(2, 2, 16, 8, generator=g)
    k[1, 1, 9, 0] = math.nan  # key head 1 of batch row 1: query heads 2 and 3 read it
    scores = torch.einsum("bhid,bhjd->bhij", q.double(), k.double().repeat_interleave(2, 1))
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    lse = (scores / math.sqrt(8)).masked_fill(~causal, -math.inf).logsumexp(-1).float()
    selection = hw.Selection(**sel) if isinstance(sel, dict) else None
    w = fused._from_lse(q, k, lse, None, True, None, selection)
    heads = torch.arange(4) if selection is None or selection.heads is None else \
        torch.tensor(selection.heads)
    for x, head in enumerate(heads.tolist()):
        assert bool(w[1, x].isnan().all()) == (head >= 2), (head, w[1, x])
        assert w[0, x].isfinite().all()
