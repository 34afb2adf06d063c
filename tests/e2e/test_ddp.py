"""Two-process DDP (gloo) through `headwise train --nproc 2`: after one step, the gradients
(Adam's first moment is (1 - beta1) * grad) and the weights equal single-process training on
the same global batch."""

import subprocess
import sys

import torch
from safetensors.torch import load_file

ARGS = ["reverse", "--steps", "1", "--batch-size", "8", "--min-len", "4", "--max-len", "10",
        "--d-model", "32", "--heads", "2", "--layers", "1", "--d-ff", "64", "--dropout", "0",
        "--warmup", "0", "--lr", "1e-3", "--eval-size", "8", "--precision", "fp32", "--quiet"]


def _run(out, nproc):
    cmd = [sys.executable, "-m", "headwise.cli", "train", *ARGS, "--out", str(out),
           "--nproc", str(nproc)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return (load_file(str(out / "checkpoint" / "model.safetensors")),
            load_file(str(out / "checkpoint" / "train_state.safetensors")))


def test_two_process_ddp_equals_single_process(tmp_path):
    w1, s1 = _run(tmp_path / "single", 1)
    w2, s2 = _run(tmp_path / "ddp", 2)
    grads = [k for k in s1 if k.endswith(".exp_avg")]
    assert len(grads) > 10 and s1.keys() == s2.keys()
    largest = max(s1[k].abs().max().item() for k in grads)
    real = 0
    for key in grads:
        # the key-projection bias has an exactly-zero true gradient (softmax ignores a constant
        # shift of all scores): its float noise is compared against the largest gradient
        scale = max(s1[key].abs().max().item(), 1e-6 * largest)
        real += scale > 1e-6 * largest
        torch.testing.assert_close(s2[key], s1[key], rtol=0, atol=1e-5 * scale)
    assert real >= 0.85 * len(grads)  # real, non-zero gradients were compared
    for key in w1:
        torch.testing.assert_close(w2[key], w1[key], rtol=0, atol=1e-6)
