"""The divergence guard: a non-finite training loss stops the run, naming its step, with the
weights of the last good step, at no host synchronisation per step off the CPU.

On the CPU a loss read back to Python costs nothing, so :class:`LossWatch` reads it every step
and the loop raises at once (before the update). On a GPU that read is a device sync: the host
waits for the step to finish and the device then idles while the next one is launched (what
gpu-facts.md counted in headwise's training step). There the watch keeps the verdict on the
device, as ``torch.amp.GradScaler`` does: a sticky flag, set by the first non-finite loss, is the
fused AdamW's ``found_inf``, so that step's update and every later one are skipped on the device
(the optimizer's step counts too); the flag, the first bad step and its loss are read back every
``every`` steps and at each evaluation, save and the end (nanoGPT reads its loss once per log
interval). A run that diverges therefore raises the same :class:`~headwise.errors.TrainingDiverged`
with the same weights, up to ``every - 1`` steps later. Optimizers without a fused ``found_inf``
(non-fused AdamW) are read every step on every device.
"""

from __future__ import annotations

import math

import torch

from headwise import fast

__all__ = ["LossWatch"]


class LossWatch:
    """Sees each step's loss (a device scalar) before its update; :meth:`read` says whether a
    loss so far was non-finite, and which.

    Args:
        optimizer: the run's optimizer (its ``found_inf`` is set when the check stays on the
            device).
        every: steps between reads when the check stays on the device.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, every: int = 10):
        self.optimizer, self.every = optimizer, every
        self.fused = bool(optimizer.defaults.get("fused")) and getattr(
            optimizer, "_step_supports_amp_scaling", False)
        self.bad: torch.Tensor | None = None  # float32 (), 1.0 once a loss was non-finite
        self.first_step: torch.Tensor | None = None  # int64 (), that step (0-based) or -1
        self.first_loss: torch.Tensor | None = None  # float32 (), its loss
        self.last: tuple[int, torch.Tensor] | None = None  # the latest step and its loss

    def on_device(self, loss: torch.Tensor) -> bool:
        """Whether ``loss`` is checked on its device (:func:`headwise.fast.host` is the rule)."""
        return self.fused and not fast.host(loss)

    def see(self, step: int, loss: torch.Tensor) -> float | None:
        """Before step ``step``'s update: the loss as a float when it was read now (on the
        CPU: every step), else None (the verdict stays on the device and gates the update)."""
        self.last = (step, loss)
        if not self.on_device(loss):
            return loss.item()
        if self.bad is None:
            self.bad = torch.zeros((), dtype=torch.float32, device=loss.device)
            self.first_step = torch.full((), -1, dtype=torch.int64, device=loss.device)
            self.first_loss = torch.zeros((), dtype=torch.float32, device=loss.device)
        new = torch.isfinite(loss).logical_not_().logical_and_(self.bad == 0)
        self.first_step = torch.where(new, step, self.first_step)
        self.first_loss = torch.where(new, loss.float(), self.first_loss)
        self.bad = torch.maximum(self.bad, new.float())
        self.optimizer.found_inf = self.bad  # read by the fused kernel: skip this update
        return None

    def due(self, step: int) -> bool:
        """Whether the loop should :meth:`read` after step ``step`` (0-based) though it
        neither evaluates nor saves."""
        return (step + 1) % self.every == 0

    def read(self) -> tuple[float, tuple[int, float] | None]:
        """One host read: ``(latest loss, (first bad step, its loss) or None)``."""
        step, loss = self.last
        if self.bad is None:
            value = loss.item()
            return value, (None if math.isfinite(value) else (step, value))
        both = torch.stack([loss.float(), self.bad, self.first_step.float(),
                            self.first_loss]).tolist()
        value, bad, first, first_loss = both
        return value, ((int(first), first_loss) if bad else None)
