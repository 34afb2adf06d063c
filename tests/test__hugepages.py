"""headwise._hugepages: large CPU tensors advised to transparent huge pages."""

from pathlib import Path

import pytest
import torch

from headwise import _hugepages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def test_empty_is_torch_empty_in_shape_dtype_and_device():
    for shape, dtype in (((3, 5), torch.float32), ((2, 4, 1024, 1024), torch.float32),
                         ((1, 1 << 22), torch.bfloat16)):
        t = _hugepages.empty(shape, dtype, "cpu")
        assert t.shape == shape and t.dtype == dtype and t.device.type == "cpu"
        t.fill_(1.5)  # writable to the last element
        assert float(t[(-1,) * len(shape)]) == 1.5


def _huge_kib(t: torch.Tensor) -> int:
    """AnonHugePages of the mappings that hold ``t`` (from /proc/self/smaps; the advice splits
    the mapping at the 2 MiB boundaries)."""
    lo, total, inside = t.data_ptr(), 0, False
    hi = lo + t.numel() * t.element_size()
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, stop = (int(x, 16) for x in head.split("-"))
            inside = start < hi and lo < stop
        elif inside and head == "AnonHugePages:":
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(),
                    reason="no transparent huge pages on this machine")
def test_a_large_tensor_is_backed_by_huge_pages_once_written():
    t = _hugepages.empty((64, 1 << 18), torch.float32, "cpu")  # 64 MiB
    t.fill_(2.0)
    # the advice is a hint: the kernel may be out of free 2 MiB blocks, so ask for some, not all
    assert _huge_kib(t) >= 2048, "no huge page backs the advised range"
