"""Every CUDA-only test runs with TF32 off: float32 products exact to float32, as the float64
references' tolerances assume (torch's own default; a test that changes it gets it back)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
