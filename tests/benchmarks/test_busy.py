"""benchmarks/busy.py's busy loops die with certainty: on the way out of the block (also when it
raises) and when the benchmark process itself is killed (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
busy = importlib.import_module("busy")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_the_busy_loops_are_killed_when_the_block_raises():
    with pytest.raises(RuntimeError, match="boom"), busy.busy_loops(2) as procs:
        pids = [p.pid for p in procs]
        assert all(p.poll() is None for p in procs)  # spinning
        raise RuntimeError("boom")
    assert all(p.returncode is not None for p in procs)  # killed and reaped
    assert not any(_alive(pid) for pid in pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_busy_loops_die_with_a_benchmark_killed_by_sigkill():
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); import busy\n"
            "with busy.busy_loops(2) as procs:\n"
            "    print(*[p.pid for p in procs], flush=True); time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code, str(BENCH)], stdout=subprocess.PIPE,
                              text=True)
    pids = [int(x) for x in parent.stdout.readline().split()]
    assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    os.kill(parent.pid, signal.SIGKILL)  # no finally runs
    parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)
