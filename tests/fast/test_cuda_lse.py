"""The CUDA kernels' LSE: which op is chosen, and every documented layout read as (b, h, i).

The private ops have meta kernels, so fake ``cuda:0`` tensors (tests/fake_cuda.py) run their
shape logic on this CPU-only machine: the layouts below are the ones the meta kernels give
(and gpu-facts.md measured on an H100): flash ``(b, h, i)``, efficient ``(b, h, ceil(i / 32) *
32)``, cuDNN ``(b, h, i, 1)``. The values are checked against float64 on a GPU
(tests/gpu/test_weights.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from headwise.fast import cuda_lse
from tests.fake_cuda import run

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64


@pytest.mark.parametrize("dtype, masked, dropout, sdpa, want", [
    (BF16, False, 0.0, "CUDNN_ATTENTION", "CUDNN_ATTENTION"),   # SDPA's own pick
    (BF16, False, 0.0, "FLASH_ATTENTION", "FLASH_ATTENTION"),
    (F16, False, 0.0, "unknown", "FLASH_ATTENTION"),            # choice unavailable
    (BF16, True, 0.0, "FLASH_ATTENTION", "EFFICIENT_ATTENTION"),  # flash takes no mask
    (BF16, True, 0.0, "CUDNN_ATTENTION", "CUDNN_ATTENTION"),
    (F32, False, 0.0, "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"),  # cuDNN gives NaN in fp32
    (F32, False, 0.0, "MATH", "EFFICIENT_ATTENTION"),
    (BF16, False, 0.0, "EFFICIENT_ATTENTION", "EFFICIENT_ATTENTION"),
    (F64, False, 0.0, "MATH", None),                            # no LSE kernel takes float64
    (BF16, False, 0.1, "FLASH_ATTENTION", None),                # dropout: the plain path
])
def test_the_chosen_kernel_returns_an_lse_for_these_inputs(dtype, masked, dropout, sdpa, want):
    mask = torch.ones(1, 1, 1, 4, dtype=torch.bool) if masked else None
    assert cuda_lse.choose(dtype, mask, dropout, sdpa) == want


def test_values_of_another_head_dim_go_to_the_efficient_kernel():
    # flash needs q, k and v of one head dim; SDPA itself would not pick it either
    assert cuda_lse.choose(BF16, None, 0.0, "unknown", same_head_dims=False) == \
        "EFFICIENT_ATTENTION"


@pytest.mark.parametrize("n", [1, 31, 32, 1000])
def test_every_documented_layout_reads_as_b_h_i(n):
    lse = torch.randn(2, 3, n, dtype=F64).float()
    padded = torch.full((2, 3, math.ceil(n / 32) * 32), float("nan"))
    padded[..., :n] = lse
    for layout in (lse, padded, lse[..., None]):
        got = cuda_lse.as_bhi(layout, n)
        assert got.shape == (2, 3, n) and got.dtype == F32
        assert torch.equal(got, lse)


def test_no_kernel_or_a_refusing_kernel_gives_none_for_the_plain_path():
    q = torch.randn(1, 2, 5, 8)
    assert cuda_lse.with_lse(q, q, q, None, False, None, None) is None
    # the CUDA ops have no CPU kernel: the op refuses on the host, nothing was started
    assert cuda_lse.with_lse(q, q, q, None, False, None, "EFFICIENT_ATTENTION") is None


def test_each_kernel_gives_out_and_a_b_h_i_float32_lse_on_fake_cuda():
    counts = run('''
        from headwise.fast import cuda_lse
        shapes = {}
        for kernel, dtype in (("FLASH_ATTENTION", torch.bfloat16),
                              ("EFFICIENT_ATTENTION", torch.float32),
                              ("EFFICIENT_ATTENTION", torch.bfloat16),
                              ("CUDNN_ATTENTION", torch.float16)):
            q = cuda(2, 8, 1000, 64, dtype=dtype)
            kv = cuda(2, 2, 1000, 64, dtype=dtype)                # grouped: 4 query heads a kv head
            mask = None if kernel == "FLASH_ATTENTION" else cuda(2, 1, 1, 1000, dtype=torch.bool)
            with counted(kernel + " " + str(dtype)):
                out, lse = cuda_lse.with_lse(q, kv, kv, mask, False, 0.125, kernel)
                assert out.shape == (2, 8, 1000, 64) and out.dtype == dtype, out.shape
                assert lse.shape == (2, 8, 1000) and lse.dtype == torch.float32, lse.shape
    ''')
    assert len(counts) == 4
    for label, c in counts.items():
        assert c.error is None, (label, c.error, c.traceback)
        assert c.syncs == [] and c.h2d == [], (label, c)
        op = "aten._scaled_dot_product_" + label.split("_")[0].lower()
        hist = c.histogram()
        assert sum(n for name, n in hist.items() if name.startswith(op)) == 1, (label, hist)
        # besides the kernel: the grouped k and v expanded (2 copies) and, with a mask, its
        # additive form and the 16-element row padding SDPA gives the efficient kernel
        assert c.kernels <= 1 + 2 + 4, (label, hist)
