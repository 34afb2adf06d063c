"""headwise.fast.large: large CPU tensors advised to transparent huge pages."""

from pathlib import Path

import pytest
import torch

from headwise.fast import large as _large

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def test_empty_is_torch_empty_in_shape_dtype_and_device():
    for shape, dtype in (((3, 5), torch.float32), ((2, 4, 1024, 1024), torch.float32),
                         ((1, 1 << 22), torch.bfloat16)):
        t = _large.empty(shape, dtype, "cpu")
        assert t.shape == shape and t.dtype == dtype and t.device.type == "cpu"
        t.fill_(1.5)  # writable to the last element
        assert float(t[(-1,) * len(shape)]) == 1.5


def _mappings(t: torch.Tensor) -> list[dict[str, str]]:
    """The /proc/self/smaps fields of the mappings that hold ``t`` (the advice splits the
    mapping at the 2 MiB boundaries)."""
    lo = t.data_ptr()
    hi = lo + t.numel() * t.element_size()
    maps, inside = [], False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, stop = (int(x, 16) for x in head.split("-"))
            inside = start < hi and lo < stop
            if inside:
                maps.append({})
        elif inside:
            maps[-1][head.rstrip(":")] = line.split(":", 1)[1].strip()
    return maps


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(),
                    reason="no transparent huge pages on this machine")
def test_a_large_fresh_tensor_is_advised_to_huge_pages():
    _large.release()  # fresh memory, not a kept storage
    t = _large.empty((64, 1 << 18), torch.float32, "cpu")  # 64 MiB
    t.fill_(2.0)
    maps = _mappings(t)
    # the advice itself (VM_HUGEPAGE, "hg" in VmFlags) on the mapping(s) covering the 2 MiB
    # aligned interior: whether the kernel then finds free 2 MiB blocks depends on the
    # machine's fragmentation at that moment (AnonHugePages; once seen as 0 under memory
    # pressure), so that part is only reported
    advised = [m for m in maps if "hg" in m.get("VmFlags", "").split()]
    assert advised, f"no mapping of the tensor carries the huge-page advice: {maps}"
    assert sum(int(m["Size"].split()[0]) for m in advised) >= 60 * 1024
    _large.release()


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(),
                    reason="no transparent huge pages on this machine")
def test_huge_pages_false_gives_fresh_memory_no_advice_and_still_recycles():
    _large.release()
    t = _large.empty((64, 1 << 18), torch.float32, "cpu", huge_pages=False)  # 64 MiB
    t.fill_(2.0)
    assert not [m for m in _mappings(t) if "hg" in m.get("VmFlags", "").split()]
    if _large._USE_COUNT is not None:
        address = _address(t)
        del t
        again = _large.empty((64, 1 << 18), torch.float32, "cpu", huge_pages=False)
        assert _address(again) == address
    _large.release()


def _address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


needs_use_count = pytest.mark.skipif(_large._USE_COUNT is None,
                                     reason="this torch has no storage use count")


@needs_use_count
def test_a_dropped_tensor_is_recycled_and_one_still_in_use_never_is():
    _large.release()
    shape = (2, 3, 1024, 1024)  # 24 MiB of float32: over the 16 MiB floor
    a = _large.empty(shape, torch.float32, "cpu")
    a.copy_(torch.randn(shape))
    address, before = _address(a), a.clone()
    del a
    b = _large.empty(shape, torch.float32, "cpu")
    assert _address(b) == address, "a dropped tensor's memory was not recycled"
    for holder in (lambda t: t[1], lambda t: t.numpy(), lambda t: t.untyped_storage(),
                   lambda t: (t * 1).requires_grad_() * t):  # a view, NumPy, storage, autograd
        b.copy_(before)
        kept = holder(b)
        del b
        c = _large.empty(shape, torch.float32, "cpu")
        assert _address(c) != address, "memory still in use was handed out again"
        c.fill_(7.0)
        del c, kept
        b = _large.empty(shape, torch.float32, "cpu")  # whichever is free now
        address = _address(b)
    other = _large.empty((2, 3, 512, 2048), torch.float32, "cpu")  # b holds the kept one
    assert other.shape == (2, 3, 512, 2048) and other.is_contiguous()
    _large.release()


@needs_use_count
def test_only_same_size_cpu_tensors_over_the_floor_are_recycled():
    _large.release()
    small = _large.empty((4, 1024), torch.float32, "cpu")
    assert _large._kept == [], "16 KiB should be plain torch.empty"
    del small
    a = _large.empty((5, 1 << 20), torch.float32, "cpu")  # 20 MiB
    address = _address(a)
    del a
    b = _large.empty((6, 1 << 20), torch.float32, "cpu")  # another size: fresh, kept instead
    assert _large._kept[-1].nbytes() == b.nbytes
    assert torch.equal(b[0, :3], b[0, :3])  # readable
    del b
    c = _large.empty((3, 2 << 20), torch.bfloat16, "cpu")  # same bytes, other dtype and shape
    assert c.dtype == torch.bfloat16 and c.shape == (3, 2 << 20)
    _large.release()
    assert _large._kept == []
    assert address


@needs_use_count
def test_a_loop_alternating_sizes_recycles_each_and_keeps_at_most_keep_count():
    _large.release()
    shapes = [(4 + x, 1 << 20) for x in range(_large.KEEP_COUNT + 2)]  # 16, 20, ... MiB
    first = {}
    for _ in range(3):
        for shape in shapes[:2]:  # two sizes, as "all weights" and "one head" in one loop
            t = _large.empty(shape, torch.float32, "cpu")
            first.setdefault(shape, _address(t))
            assert _address(t) == first[shape], "an alternating size was not recycled"
            del t
    for shape in shapes:
        _large.empty(shape, torch.float32, "cpu")
    assert len(_large._kept) == _large.KEEP_COUNT
    assert sum(s.nbytes() for s in _large._kept) <= _large.KEEP_MAX
    _large.release()


@needs_use_count
def test_release_memory_is_public_and_empties_the_kept_storages():
    import headwise as hw

    t = _large.empty((5, 1 << 20), torch.float32, "cpu")
    del t
    assert _large._kept, "a 20 MiB tensor should be kept for recycling"
    hw.release_memory()
    assert _large._kept == []


@needs_use_count
@pytest.mark.skipif(_large.limits.machine_memory() < 16 * 2**30, reason="needs >= 16 GiB RAM")
def test_the_2_gib_weights_of_n_4096_are_kept_and_recycled():
    # (4, 8, 4096, 4096) float32: 2 GiB, over the former cap of 1/16 of a 24 GiB machine; never
    # written here, so no page is touched
    _large.release()
    shape = (4, 8, 4096, 4096)
    a = _large.empty(shape, torch.float32, "cpu")
    first = _address(a)
    del a
    b = _large.empty(shape, torch.float32, "cpu")
    assert _address(b) == first, "the 2 GiB weights were not recycled"
    del b
    _large.release()
