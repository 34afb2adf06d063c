"""Training: AdamW + warm-up/cosine, clipping, label smoothing, bf16 autocast, evaluation with
task metrics, atomic checkpoints, exact resume, Ctrl-C that saves, and DistributedDataParallel.

API::

    from headwise.train import TrainConfig, train
    result = train(TrainConfig(task="reverse", steps=600), out="runs/reverse")
    result.model, result.metrics["exact_match"]

Command line (same options; see :mod:`headwise.commands.train`; ``python -m headwise.train``
runs :mod:`headwise.train.__main__`)::

    headwise train reverse --steps 600 --out runs/reverse
    headwise train reverse --nproc 2                      # spawns torchrun
    torchrun --nproc_per_node=2 -m headwise.train reverse # or directly
    headwise train reverse --resume runs/reverse          # continue a killed run

Determinism: the global batch of step ``s`` is a pure function of ``(seed, s)``
(:mod:`headwise.data`), the learning rate a pure function of ``s``, and the dropout RNG is
re-seeded from ``(seed, s, rank)`` at every step. A checkpoint therefore needs only the weights,
the optimizer tensors and ``s`` to continue bit for bit: a run killed with SIGKILL (or stopped
with Ctrl-C) and resumed ends with the same weights as one that was never interrupted (CPU;
same thread count).

Multi-process: each of ``world`` ranks takes rows ``rank::world`` of the global batch (the
DistributedSampler split) and the loss is normalised by the *global* count of target tokens, so
DDP's gradient average equals the single-process gradient of the whole batch. Rank 0 alone
evaluates, logs and writes checkpoints.

A non-finite loss stops the run with :class:`~headwise.errors.TrainingDiverged` naming the
step, with the weights of the step before it; weights are checked finite before every save. On
the CPU the loss is read every step and the run stops before the bad update; on a GPU reading
it would be a host sync per step, so the check stays on the device (fused AdamW skips the bad
update and every later one) and the run stops at the next read, every 10 steps and at each
evaluation and save (:mod:`headwise.train.watch`).

Modules: ``config`` (:class:`TrainConfig`, presets and time estimates; torch-free, for
``headwise train --help``), ``recipe`` (model config, optimizer, schedule per task), ``loop``
(:func:`train`), ``evaluate`` (task metrics, greedy decoding), ``dist`` (DDP set-up, precision),
``interrupt`` (Ctrl-C), ``watch`` (the divergence guard, on the device off the CPU). May import
(the rule and its check: the table in ``tests/test_wings.py``): ``models``, ``data``, ``checkpoint``, ``decode`` and ``fast``, and
``train.__main__`` also ``commands.train``; nothing outside it imports ``loop`` but the
commands. Names are imported on first use (PEP 562),
so ``headwise.train.config`` stays torch-free.
"""

from __future__ import annotations

from headwise import _lazy

_EXPORTS = {
    "TrainConfig": "headwise.train.config",
    "TrainResult": "headwise.train.loop",
    "build_model_config": "headwise.train.recipe",
    "greedy_decode": "headwise.train.evaluate",
    "loss_sum": "headwise.train.evaluate",
    "lr_at": "headwise.train.recipe",
    "make_optimizer": "headwise.train.recipe",
    "pick_precision": "headwise.train.dist",
    "task_for": "headwise.train.recipe",
    "train": "headwise.train.loop",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = _lazy.exports(__name__, _EXPORTS)
