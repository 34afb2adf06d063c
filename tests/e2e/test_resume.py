"""A run killed with SIGKILL mid-way and resumed ends bit for bit where an uninterrupted run
ends (weights and optimizer state), on CPU."""

import json
import os
import signal
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file

ARGS = ["copy", "--steps", "40", "--batch-size", "16", "--min-len", "4", "--max-len", "8",
        "--d-model", "32", "--heads", "2", "--layers", "1", "--d-ff", "64", "--dropout", "0.1",
        "--warmup", "5", "--eval-every", "10", "--eval-size", "32", "--checkpoint-every", "5",
        "--precision", "fp32", "--quiet"]


def _cmd(*extra):
    return [sys.executable, "-m", "headwise.train", *ARGS, *extra]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1"}  # same thread count in every run


def _step(run):
    try:
        return json.loads((run / "checkpoint" / "train_state.json").read_text())["state"]["step"]
    except (OSError, ValueError, KeyError):
        return 0


def test_sigkill_then_resume_is_bitwise_identical(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(_cmd("--out", str(full)), check=True, env=_env(), capture_output=True)

    proc = subprocess.Popen(_cmd("--out", str(killed)), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while _step(killed) < 15 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stopped = _step(killed)
    assert 15 <= stopped < 40, f"the run was not killed mid-way (checkpoint at step {stopped})"

    done = subprocess.run([sys.executable, "-m", "headwise.train", "--resume", str(killed),
                           "--quiet"], env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _step(killed) == 40
    for name in ("model.safetensors", "train_state.safetensors"):
        a = load_file(str(full / "checkpoint" / name))
        b = load_file(str(killed / "checkpoint" / name))
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), (name, key)
    metrics = [json.loads((r / "metrics.json").read_text())["metrics"] for r in (full, killed)]
    assert metrics[0] == metrics[1]


def test_ctrl_c_saves_a_checkpoint_that_resume_continues(tmp_path):
    run = tmp_path / "run"
    args = [*ARGS, "--steps", "2000", "--checkpoint-every", "0", "--out", str(run)]
    proc = subprocess.Popen([sys.executable, "-m", "headwise.cli", "train", *args],
                            env={**_env(), "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stdout:  # the first evaluation line: the loop (and its handler) runs
        seen.append(line)
        if line.lstrip().startswith("step"):
            break
    assert not (run / "checkpoint").exists()  # --checkpoint-every 0: nothing saved so far
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    stopped = _step(run)
    assert 10 <= stopped < 2000, "".join(seen) + out + err
    assert f"interrupted after step {stopped} of 2000" in " ".join(out.split())
    assert "Ctrl-C: saving a checkpoint after this step" in err

    done = subprocess.run([sys.executable, "-m", "headwise.cli", "train", "--resume", str(run),
                           "--steps", str(stopped + 10), "--quiet"], env=_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"at step {stopped}" in " ".join(done.stdout.split())  # rich wraps long lines
    assert _step(run) == stopped + 10
