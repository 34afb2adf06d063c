"""Two-process DDP (gloo) through `headwise train --nproc 2`: after one step, the gradients
(Adam's first moment is (1 - beta1) * grad) and the weights equal single-process training on
the same global batch; for the encoder-decoder and for the Llama-style text preset."""

import subprocess
import sys

import torch
from safetensors.torch import load_file

ARGS = ["reverse", "--steps", "1", "--batch-size", "8", "--min-len", "4", "--max-len", "10",
        "--d-model", "32", "--heads", "2", "--layers", "1", "--d-ff", "64", "--dropout", "0",
        "--warmup", "0", "--lr", "1e-3", "--eval-size", "8", "--precision", "fp32", "--quiet"]


def _run(out, nproc, args=ARGS):
    cmd = [sys.executable, "-m", "headwise.cli", "train", *args, "--out", str(out),
           "--nproc", str(nproc)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return (load_file(str(out / "checkpoint" / "model.safetensors")),
            load_file(str(out / "checkpoint" / "train_state.safetensors")))


def test_two_process_ddp_equals_single_process(tmp_path):
    _assert_same(*_run(tmp_path / "single", 1), *_run(tmp_path / "ddp", 2))


def test_llama_preset_under_ddp_equals_single_process(tmp_path):
    # RoPE, RMSNorm, SwiGLU, 4 query heads on 2 key/value heads, tied embeddings, no biases
    text = tmp_path / "austen.txt"
    text.write_text("It is a truth universally acknowledged, that a single man in possession "
                    "of a good fortune, must be in want of a wife. " * 20, encoding="utf-8")
    args = ["text", "--size", "llama", "--text", str(text), "--context", "32", "--steps", "1",
            "--batch-size", "8", "--dropout", "0", "--warmup", "0", "--lr", "1e-3", "--eval-size", "8",
            "--precision", "fp32", "--d-model", "32", "--d-ff", "86", "--layers", "2",
            "--quiet"]
    w1, s1 = _run(tmp_path / "single", 1, args)
    w2, s2 = _run(tmp_path / "ddp", 2, args)
    assert not [k for k in w1 if k.endswith(".bias")]  # the Llama-style model did run
    # Adam's first step moves a weight by lr * g / (|g| + eps): where the tied embedding's
    # gradient is ~eps, float noise in g moves the step by a fraction of lr (1e-3)
    _assert_same(w1, s1, w2, s2, weight_atol=5e-5)


def _assert_same(w1, s1, w2, s2, weight_atol=1e-6):
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
        torch.testing.assert_close(w2[key], w1[key], rtol=0, atol=weight_atol)
