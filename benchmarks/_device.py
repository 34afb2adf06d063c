"""Benchmark helpers for a GPU (``--device cuda``): synchronised interleaved timing, CUDA
kernels and host synchronisations per call (torch.profiler and the sync debug mode), peak device
memory, and the card / torch / CUDA line every GPU table starts with.

On a GPU a call returns when its kernels are queued, so a timed candidate is ``k`` calls then
``torch.cuda.synchronize()``, and its time is divided by ``k`` (``k`` chosen once per table so
that a measurement lasts a few milliseconds: a single 0.2 ms call would be dominated by the
launch and the sync). Ratios are medians of per-round ratios, as on the CPU (:mod:`_common`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

import torch

import _common as C

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
SYNC_WARNING = "called a synchronizing"  # torch's warning for each host sync in "warn" mode


def describe(device: torch.device) -> str:
    """``card, torch, CUDA`` of ``device`` (the header of every GPU table)."""
    if device.type != "cuda":
        return f"device {device}, torch {torch.__version__} (no GPU: a plumbing run)"
    p = torch.cuda.get_device_properties(device)
    return (f"{p.name} ({p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs), "
            f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"cuDNN {torch.backends.cudnn.version()}, TF32 off")


def setup(device: torch.device) -> None:
    """Exact fp32 matmuls (TF32 off), as gpu-facts.md measured."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def repeats(fn: Callable[[], object], device: torch.device, target_s: float = 0.005) -> int:
    """Calls per measurement so that one lasts about ``target_s`` (1 on the CPU)."""
    if device.type != "cuda":
        return 1
    fn()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    one = max(time.perf_counter() - t0, 1e-6)
    return max(1, min(200, round(target_s / one)))


def interleave(fns: dict[str, Callable[[], object]], device: torch.device, *, k: int = 1,
               **kwargs) -> dict[str, list[float]]:
    """:func:`_common.interleave` of ``k`` calls per measurement, synchronised on a GPU;
    seconds per call."""
    def batch(fn):
        def run():
            for _ in range(k):
                fn()
            sync(device)
        return run
    times = C.interleave({name: batch(fn) for name, fn in fns.items()}, **kwargs)
    return {name: [t / k for t in ts] for name, ts in times.items()}


def counts(fn: Callable[[], object], device: torch.device) -> dict:
    """One call's CUDA kernels (torch.profiler), memory copies, and host synchronisations (the
    sync debug mode's warnings, and the runtime's synchronize calls inside the call).
    ``{"kernels": .., "copies": .., "syncs": .., "sync calls": ..}``; empty off CUDA."""
    if device.type != "cuda":
        return {}
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function
    fn()
    sync(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # torch warns "called a synchronizing CUDA operation" per sync; the mode's own one-time
    # notice ("... does not yet detect all synchronizing operations") is not one
    syncs = sum(SYNC_WARNING in str(w.message) for w in caught)
    sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("measured"):
            fn()
        sync(device)
    events = prof.events()
    span = next(e for e in events
                if e.name == "measured" and e.device_type == DeviceType.CPU).time_range
    # device-side events less the GPU copies of record_function ranges (user annotations:
    # "measured", the optimizer's step, ...): kernels, memcpys and memsets
    gpu = [e for e in events if e.device_type == DeviceType.CUDA
           and not getattr(e, "is_user_annotation", False) and e.name != "measured"]
    copies = sum(e.name.startswith(("Memcpy", "Memset")) for e in gpu)
    calls = sum(e.name in SYNC_CALLS and span.start <= e.time_range.start <= span.end
                for e in events)
    return {"kernels": len(gpu) - copies, "copies": copies, "syncs": syncs, "sync calls": calls}


def peak_extra(fn: Callable[[], object], device: torch.device) -> tuple[float, object]:
    """``(peak device bytes above the resting level during one call, its result)``."""
    fn()
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    out = fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - base, out


def goal(label: str, values: list, limit: float, *, at_least: bool = False) -> str:
    """One line ``goal LABEL <= LIMIT: v1, v2 PASS|FAIL`` (``>=`` with ``at_least``); values
    that are not numbers (an uncounted row) make it ``NOT MEASURED``."""
    nums = [v for v in values if isinstance(v, (int, float))]
    shown = ", ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in values)
    if len(nums) != len(values) or not nums:
        verdict = "NOT MEASURED"
    else:
        ok = all(v >= limit for v in nums) if at_least else all(v <= limit for v in nums)
        verdict = "PASS" if ok else "FAIL"
    return f"goal {label} {'>=' if at_least else '<='} {limit:g}: {shown} {verdict}"
