"""CPU-only guards of the weights path on a GPU: fake ``cuda:0`` tensors (tests/fake_cuda.py)
count what ``hw.attention(..., return_weights=...)`` would launch there.

On a GPU the weights of any selection come from the LSE the fused kernel returned with the
output: the fused kernel, one float32 key-sum reduction (the NaN policy's per-head test) and
the Triton weights kernel, with no host read. (The NaN policy on the *output* is
:func:`headwise.attend.fused.nan_policy`'s own budget, guarded with the forward; it is
replaced by the identity here so these counts measure what the weights add.) torch's own
kernel choice (``aten._fused_sdp_choice``) runs on the host: no kernel.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tests.fake_cuda import run  # noqa: E402

_SCRIPT = '''
import headwise as hw
import headwise.attend.fused as fused
fused.nan_policy = lambda out, *qkv: out
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


def _kernels(c) -> int:
    return sum(1 for name in c.ops if name not in HOST_ONLY)


def test_a_weights_call_on_a_gpu_issues_no_host_sync_and_at_most_3_kernels():
    counts = run(_SCRIPT.format(plant=""))
    assert len(counts) == 2 * len(BUDGET)
    for label, c in counts.items():
        assert c.error is None, (label, c.error, c.traceback)
        assert c.syncs == [] and c.h2d == [], (label, c)
        assert _kernels(c) <= BUDGET[label.rsplit(" ", 1)[0]], (label, c.histogram())
        assert c.histogram().get("headwise.weights_from_lse") == 1, (label, c.histogram())
        # no float32 upcast copies, no per-block matmuls, no chunked logsumexp pass
        assert not {"aten._to_copy", "aten.bmm", "aten.baddbmm", "aten.logsumexp",
                    "aten._softmax"} & set(c.histogram()), (label, c.histogram())


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
    c = counts["all torch.float32"]
    assert c.syncs
    # without the read, the upcast alone breaks the kernel budget
    counts = run(_SCRIPT.format(plant=plant.replace("bool(torch.isnan(lse).any())", "False")))
    c = counts["one head torch.bfloat16"]
    assert c.syncs == [] and _kernels(c) > BUDGET["one head"], c.histogram()
