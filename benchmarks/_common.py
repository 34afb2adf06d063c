"""Shared benchmark helpers: interleaved timing with medians, peak-memory in a fresh process,
and markdown tables. Benchmarks print ratios against anchors measured in the same run."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
CLOCK = time.perf_counter  # set_clock("cpu") for 1-thread runs on a shared machine


def set_clock(name: str) -> None:
    """``"wall"`` (default) or ``"cpu"``: this process's CPU time, which a shared machine's other
    jobs do not inflate (use it with 1 thread: with more, idle threads spinning count too)."""
    global CLOCK
    CLOCK = CLOCKS[name]


def interleave(fns: dict[str, Callable[[], object]], *, warmup: int = 1, min_rounds: int = 3,
               max_rounds: int = 30, budget_s: float = 8.0) -> dict[str, list[float]]:
    """Run every candidate once per round, rotating the order, until the time budget is spent.
    Returns each candidate's list of times (seconds, of :data:`CLOCK`)."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    start = time.perf_counter()
    for r in range(max_rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            t0 = CLOCK()
            fns[name]()
            times[name].append(CLOCK() - t0)
        if r + 1 >= min_rounds and time.perf_counter() - start > budget_s:
            break
    return times


def ratio(a: list[float], b: list[float]) -> float:
    """Median of per-round ratios a/b (robust to the machine's speed drifting between rounds)."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def median_ms(ts: list[float]) -> float:
    return 1000 * statistics.median(ts)


def reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def rss_mb(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_in_subprocess(script: str, *args: str) -> dict:
    """Run ``script args`` in a fresh interpreter that prints one JSON line; glibc's mmap
    threshold is fixed at 128 KiB so every large buffer is really allocated and counted."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    out = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                         env=env, timeout=900, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
        return str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
