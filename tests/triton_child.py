"""Run a script that uses headwise's Triton kernels under Triton's interpreter, on the CPU.

``TRITON_INTERPRET=1`` must be set before ``triton.jit`` decorates a kernel, so the script runs
in a child process (with this tree's ``src`` first on its path). It gets a random seed as
``sys.argv[1]`` and prints ``@@`` then its results as JSON; the caller gets ``(results, seed)``
(the seed goes into assertion messages, so a failure can be replayed)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path


def run_interpreted(script: str, timeout: float = 600.0):
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"),
                                          os.environ.get("PYTHONPATH", "")])}
    seed = random.randrange(2**31)
    done = subprocess.run([sys.executable, "-c", script, str(seed)], capture_output=True,
                          text=True, timeout=timeout, env=env)
    assert done.returncode == 0 and "@@" in done.stdout, done.stderr[-4000:]
    return json.loads(done.stdout.split("@@", 1)[1]), seed
