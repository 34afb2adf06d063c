"""Training on a CUDA device (skipped without one): a step of the LM equals a float64 CPU step,
the training loop issues no host synchronisation per step, and a diverging run stops naming the
same step as on the CPU. Each test takes seconds on an H100."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from headwise.errors import TrainingDiverged
from headwise.models import LMConfig, build
from headwise.train import TrainConfig, train
from headwise.train import loop as loop_module

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")


def _lm():
    cfg = LMConfig(vocab_size=97, d_model=64, num_heads=4, num_layers=2, d_ff=128, max_len=64,
                   dropout=0.0, activation="gelu", positional="learned", tie_embeddings=True)
    return build(cfg)


def _loss_and_grads(model, tokens, autocast=False):
    model.zero_grad(set_to_none=True)
    with torch.autocast(tokens.device.type, dtype=torch.bfloat16, enabled=autocast):
        logits, _ = model(tokens[:, :-1])
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 up, f64 kept
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return loss.detach(), {n: p.grad.detach() for n, p in model.named_parameters()}


@pytest.mark.parametrize("autocast", [False, True])
def test_a_cuda_training_step_equals_the_float64_cpu_step(autocast):
    torch.manual_seed(torch.seed() % 2**31)
    ref = _lm().double()
    tokens = torch.randint(0, 97, (4, 65))
    want_loss, want = _loss_and_grads(ref, tokens)
    model = _lm().to(CUDA)
    model.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    loss, got = _loss_and_grads(model, tokens.to(CUDA), autocast=autocast)
    # fp32 (TF32 off): ~1e-6 relative per op over a few hundred ops; bf16 autocast: 8 bits of
    # mantissa in every matmul input (2^-8 relative), averaged over d=64..128 terms
    rtol, atol = (2e-2, 2e-3) if autocast else (1e-4, 1e-6)
    torch.testing.assert_close(loss.double().cpu(), want_loss, rtol=rtol, atol=atol)
    for name, g in want.items():
        scale = g.abs().max().item()
        torch.testing.assert_close(got[name].double().cpu(), g, rtol=0,
                                   atol=(5e-2 if autocast else 1e-4) * scale + atol, msg=name)


def _syncs_per_step(monkeypatch, steps, *, with_forward, task="induction"):
    """Host syncs in each training step on CUDA (the sync debug mode's warnings); the model's
    forward (``loss_sum``) counted only ``with_forward``."""
    per_step = []
    real_step, real_loss = loop_module._train_step, loop_module.loss_sum

    def loss_sum(*args, **kwargs):
        if with_forward:
            return real_loss(*args, **kwargs)
        torch.cuda.set_sync_debug_mode("default")
        try:
            return real_loss(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("warn")

    def train_step(run, step):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                out = real_step(run, step)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        per_step.append([str(w.message)[:200] for w in caught if "synchroniz" in str(w.message)])
        return out

    monkeypatch.setattr(loop_module, "loss_sum", loss_sum)
    monkeypatch.setattr(loop_module, "_train_step", train_step)
    cfg = TrainConfig(task=task, steps=steps, batch_size=8, eval_every=0, eval_size=8,
                      warmup=0, model=dict(d_model=32, num_heads=2, num_layers=1, d_ff=64),
                      precision="bf16", device="cuda")
    result = train(cfg, progress=False, verbose=False)
    return per_step, result


@pytest.mark.parametrize("task", ["induction", "copy"])  # a decoder LM, an encoder-decoder
def test_the_training_loop_syncs_nothing_per_step(monkeypatch, task):
    per_step, result = _syncs_per_step(monkeypatch, 6, with_forward=False, task=task)
    assert per_step[1:] == [[]] * 5, per_step  # step 0 warms up the pinned-memory pool
    assert result.metrics["train_loss"] > 0


@pytest.mark.parametrize("task", ["induction", "copy"])  # a decoder LM, an encoder-decoder
def test_a_whole_training_step_syncs_nothing(monkeypatch, task):
    """The loop and the model together (the model's forward is the attention's budget)."""
    per_step, _ = _syncs_per_step(monkeypatch, 4, with_forward=True, task=task)
    assert per_step[1:] == [[]] * 3, per_step


def test_a_diverging_cuda_run_names_the_same_step_as_the_cpu():
    cfg = TrainConfig(task="copy", steps=12, batch_size=4, eval_every=0, eval_size=4, warmup=0,
                      model=dict(d_model=16, num_heads=2, num_layers=1, d_ff=16),
                      lr=float("inf"), precision="fp32", device="cuda")
    with pytest.raises(TrainingDiverged, match=r"at step 2 of 12: the training loss is nan"):
        train(cfg, progress=False, verbose=False)
