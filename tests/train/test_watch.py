"""The divergence guard off the CPU: the loss checked on the device (no host read per step),
the update of a non-finite step and every later one skipped, the run stopped at the next read
naming the first bad step. The GPU path runs here on CPU tensors by switching the device rule
(:func:`headwise.fast.host`) off."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import headwise.fast
from headwise.errors import TrainingDiverged
from headwise.train import TrainConfig, train
from headwise.train import loop as loop_module
from headwise.train.watch import LossWatch
from tests.fake_cuda import SYNC_OPS


@pytest.fixture
def device_path(monkeypatch):
    """Every tensor counts as off the host: the loop takes its GPU path on the CPU."""
    monkeypatch.setattr(headwise.fast, "host", lambda *tensors: False)


class _Reads(TorchDispatchMode):
    """Counts host reads of tensor values (``.item()``, ``float()``, ``bool()``, ``.tolist()``,
    data-dependent shapes): each is a device sync on a GPU."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if not self.paused and name.startswith(SYNC_OPS):
            self.names.append(name)
        return func(*args, **(kwargs or {}))


def _small(**changes):
    base = dict(task="copy", steps=3, batch_size=4, eval_every=0, eval_size=4, warmup=0,
                model=dict(d_model=16, num_heads=2, num_layers=1, d_ff=16), precision="fp32")
    return TrainConfig(**{**base, **changes})


def _reference_steps(losses, lr=0.1):
    """A parameter trained by fused AdamW on the finite losses before the first non-finite
    one, as the CPU loop does (it stops there)."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5))
    opt = torch.optim.AdamW([p], lr=lr, fused=True)
    grads = torch.randn(len(losses), 5)
    for loss, g in zip(losses, grads, strict=True):
        if not math.isfinite(loss):
            break
        p.grad = g.clone()
        opt.step()
    return p.detach(), opt.state.get(p, {}).get("step", torch.tensor(0.0)).item(), grads


@pytest.mark.parametrize("losses", [[1.0, 2.0, float("nan"), 3.0, 4.0],
                                    [float("inf"), 1.0, 2.0], [1.0, 2.0, 3.0]])
def test_on_the_device_the_bad_step_and_all_later_updates_are_skipped(device_path, losses):
    want, want_steps, grads = _reference_steps(losses)
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5))
    opt = torch.optim.AdamW([p], lr=0.1, fused=True)
    watch = LossWatch(opt, every=100)
    for step, (loss, g) in enumerate(zip(losses, grads, strict=True)):
        assert watch.see(step, torch.tensor(loss)) is None  # not read
        p.grad = g.clone()
        opt.step()
    torch.testing.assert_close(p.detach(), want, rtol=0, atol=0)
    assert opt.state[p]["step"].item() == want_steps
    value, bad = watch.read()
    assert value == losses[-1] or (math.isnan(value) and math.isnan(losses[-1]))
    first = next((i for i, x in enumerate(losses) if not math.isfinite(x)), None)
    if first is None:
        assert bad is None
    else:
        assert bad[0] == first and str(bad[1]) == str(losses[first])


def test_on_the_cpu_the_loss_is_read_every_step():
    p = torch.nn.Parameter(torch.randn(3))
    watch = LossWatch(torch.optim.AdamW([p], fused=True))
    assert watch.see(0, torch.tensor(2.5)) == 2.5
    assert not hasattr(watch.optimizer, "found_inf")  # the CPU path never gates the update


def test_an_optimizer_without_found_inf_is_read_every_step(device_path):
    p = torch.nn.Parameter(torch.randn(3))
    watch = LossWatch(torch.optim.AdamW([p], foreach=False))
    assert watch.see(0, torch.tensor(2.5)) == 2.5


@pytest.mark.parametrize("steps", [3, 25])
def test_the_device_path_names_the_same_step_as_the_cpu_path(device_path, steps):
    # lr=inf: step 1's update makes the weights inf, step 2's loss is nan; read at step 10 or 3
    with pytest.raises(TrainingDiverged, match=rf"at step 2 of {steps}: the training loss is nan"):
        train(_small(steps=steps, lr=float("inf")), progress=False, verbose=False)


def _count_step_reads(monkeypatch, steps):
    """Host reads inside each training step, the model's forward (``loss_sum``) left out:
    those are the attention's to answer for (tests/attend); this counts the loop's own."""
    mode, per_step, reads = _Reads(), [], []
    real_step, real_loss, real_read = (loop_module._train_step, loop_module.loss_sum,
                                       LossWatch.read)

    def loss_sum(*args, **kwargs):
        mode.paused = True
        try:
            return real_loss(*args, **kwargs)
        finally:
            mode.paused = False

    def train_step(run, step):
        before = len(mode.names)
        with mode:
            out = real_step(run, step)
        per_step.append(mode.names[before:])
        return out

    def read(self):
        reads.append(len(per_step))
        return real_read(self)

    monkeypatch.setattr(loop_module, "loss_sum", loss_sum)
    monkeypatch.setattr(loop_module, "_train_step", train_step)
    monkeypatch.setattr(LossWatch, "read", read)
    result = train(_small(steps=steps), progress=False, verbose=False)
    return per_step, reads, result


def test_a_device_training_step_reads_nothing_back(device_path, monkeypatch):
    per_step, reads, result = _count_step_reads(monkeypatch, 12)
    assert per_step == [[]] * 12  # no host read (= no device sync) in any step
    assert reads == [10, 12]  # the loss is read every 10 steps and at the end
    assert math.isfinite(result.metrics["train_loss"])


def test_a_cpu_training_step_reads_its_loss(monkeypatch):
    per_step, reads, _ = _count_step_reads(monkeypatch, 4)
    assert [len(r) for r in per_step] == [1] * 4 and reads == []
