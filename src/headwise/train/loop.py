"""The training loop: steps, evaluation, checkpoints, resume, Ctrl-C, DDP (the wing's
API and what it promises: :mod:`headwise.train`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from headwise import _progress
from headwise import checkpoint as ckpt
from headwise.data import Seq2SeqBatch
from headwise.errors import TrainingDiverged
from headwise.models import build
from headwise.train.config import TrainConfig, estimate_seconds, format_seconds
from headwise.train.dist import (
    Dist,
    all_sum,
    any_rank,
    barrier,
    init_distributed,
    pick_precision,
    upload,
)
from headwise.train.evaluate import evaluate, format_metrics, loss_sum
from headwise.train.interrupt import StopOnSigint
from headwise.train.recipe import (
    build_model_config,
    check_fits,
    check_resumable,
    configure,
    lr_at,
    make_optimizer,
    step_seed,
    task_for,
)
from headwise.train.watch import LossWatch

__all__ = ["TrainResult", "train"]

@dataclass
class TrainResult:
    """What :func:`train` returns (on rank 0; other ranks get the same minus metrics)."""

    model: nn.Module
    model_config: Any
    tokenizer: Any
    task: Any
    config: TrainConfig
    metrics: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)
    out: Path | None = None
    seconds: float = 0.0
    precision: str = "fp32"


# --------------------------------------------------------------------------------------------
# the run: set-up, one step, evaluation and saving, the loop


@dataclass
class _Run:
    """Everything one run holds while it trains (one object instead of fifteen locals)."""

    cfg: TrainConfig
    dist: Dist
    device: torch.device
    precision: str
    task: Any
    model_config: Any
    model: nn.Module
    wrapped: nn.Module
    optimizer: torch.optim.Optimizer
    out: Path | None
    console: Any
    show: bool
    start_step: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    saved_step: int | None = None
    watch: LossWatch | None = None

    @property
    def autocast(self) -> bool:
        return self.precision == "bf16"


def _log(console, enabled: bool, text: str) -> None:
    if enabled:
        console.print(text, highlight=False)


def _setup(cfg: TrainConfig, checked, verbose: bool) -> _Run:
    """Threads, processes, device, precision, task, model and optimizer (and resumed state)."""
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    dist, device = init_distributed(cfg.device)
    precision, why = pick_precision(cfg.precision, device)
    if precision == "bf16" and device.type == "cpu" and not torch.backends.mkldnn.is_available():
        raise ValueError("--precision bf16 needs oneDNN (mkldnn) on CPU; use --precision fp32")
    task = task_for(cfg)
    if cfg.batch_size % dist.world:
        raise ValueError(f"batch_size={cfg.batch_size} is not divisible by the "
                         f"{dist.world} processes; use a multiple of {dist.world}")
    model_config = build_model_config(cfg, task)
    check_fits(cfg, model_config, task)
    torch.manual_seed(cfg.seed)  # same initial weights on every rank (DDP also broadcasts)
    model = build(model_config).to(device)
    optimizer = make_optimizer(model, cfg)
    if checked is not None:
        check_resumable(checked[0], model_config, checked[1])
        ckpt.load_weights(model, checked[0])
        ckpt.load_train_state(checked[0], optimizer, checked=checked)
    wrapped = model
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel
        wrapped = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    from rich.console import Console
    run = _Run(cfg, dist, device, precision, task, model_config, model, wrapped, optimizer,
               None, Console(), verbose and dist.main)
    run.watch = LossWatch(optimizer)
    _describe(run, why)
    return run


def _describe(run: _Run, why: str) -> None:
    """The set-up lines: task, model, precision, and the time estimate (before any step)."""
    cfg, show, console = run.cfg, run.show, run.console
    m = cfg.model
    _log(console, show, f"[bold]task[/] {run.task.describe()}")
    _log(console, show, f"[bold]model[/] {run.model_config.kind} "
         f"{sum(p.numel() for p in run.model.parameters()) / 1e6:.2f}M parameters, d_model "
         f"{m['d_model']}, {m['num_heads']} heads, {m['num_layers']} layers (size {cfg.size})")
    world = run.dist.world
    _log(console, show, f"[bold]precision[/] {run.precision} on {run.device} ({why})"
         + (f"; {world} processes (DDP, {'nccl' if run.device.type == 'cuda' else 'gloo'})"
            if world > 1 else ""))
    if show:
        whole = estimate_seconds(cfg)
        left = whole * (cfg.steps - run.start_step) / cfg.steps
        hint = ("; `--size small` finishes in minutes" if left > 1800 and cfg.size != "small"
                else "")
        _log(console, show, f"[bold]estimate[/] about {format_seconds(left)} for steps "
             f"{run.start_step + 1}-{cfg.steps} on this machine (the progress bar refines it; "
             f"Ctrl-C saves a checkpoint to --resume){hint}")


def _host_counts(batch, pad: int) -> tuple[int, int]:
    """``(target tokens, all tokens)`` of a host (CPU) batch, counted with numpy: host data,
    no device involved (tests count the loop's tensor reads, which on a GPU are syncs)."""
    if isinstance(batch, Seq2SeqBatch):
        src = int(np.count_nonzero(batch.src.numpy() != pad))
        tgt = int(np.count_nonzero(batch.tgt_out.numpy() != pad))
        return tgt, src + tgt
    labels = int(np.count_nonzero(batch.labels.numpy() != pad))
    return labels, labels


def _train_step(run: _Run, step: int) -> tuple[float | None, int]:
    """One optimizer step; ``(global mean loss or None when not read this step, tokens in the
    global batch)``. A non-finite loss raises before the update where the loss is read every
    step (the CPU); elsewhere :class:`~headwise.train.watch.LossWatch` skips the update on the
    device and the loop raises at the next read, so the weights stay those of the last good
    step either way."""
    cfg, d = run.cfg, run.dist
    pad = run.task.tokenizer.pad_id
    torch.manual_seed(step_seed(cfg.seed, step, d.rank))
    for group in run.optimizer.param_groups:
        group["lr"] = lr_at(step, cfg)
    full = run.task.batch(step, cfg.batch_size)
    n_global, tokens = _host_counts(full, pad)
    batch = upload(full.shard(d.rank, d.world), run.device)
    local = loss_sum(run.wrapped, batch, pad_id=pad, label_smoothing=cfg.label_smoothing,
                     autocast=run.autocast)
    loss_value = run.watch.see(step, all_sum(local.detach(), d) / n_global)
    if loss_value is not None and not math.isfinite(loss_value):
        _diverged(run, step + 1, f"the training loss is {loss_value}")
    # DDP averages gradients over ranks: scale so the result is d(global mean)/dw
    (local * (d.world / n_global)).backward()
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.grad_clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return loss_value, tokens


def _read_loss(run: _Run) -> float:
    """The latest step's loss, read back; raises if any loss since the last read was not
    finite (the device-side check of :class:`~headwise.train.watch.LossWatch`)."""
    value, bad = run.watch.read()
    if bad is not None:
        _diverged(run, bad[0] + 1, f"the training loss is {bad[1]}")
    return value


def _diverged(run: _Run, step: int, what: str) -> None:
    cfg = run.cfg
    kept = (f"the checkpoint of step {run.saved_step} is kept" if run.saved_step
            else "nothing was saved")
    raise TrainingDiverged(
        f"training diverged at step {step} of {cfg.steps}: {what} (lr {cfg.lr:g}, weight decay "
        f"{cfg.weight_decay:g}, grad clip {cfg.grad_clip:g}); {kept}; lower --lr or check "
        f"--weight-decay")


def _check_weights(run: _Run, step: int) -> None:
    """Every parameter finite, with one host read (one device sync, at saves and evaluations)."""
    finite = torch.stack([torch.isfinite(p).all() for p in run.model.parameters()])
    if not bool(finite.all()):
        _diverged(run, step, "the weights are no longer finite")


def _evaluate(run: _Run, done: int, loss_value: float, console, on_eval) -> None:
    """Rank 0: held-out metrics, the log line, ``log.jsonl`` and the ``on_eval`` callback."""
    import json
    cfg = run.cfg
    run.metrics = {"step": done, "train_loss": loss_value, "lr": lr_at(done - 1, cfg),
                   **evaluate(run.model, run.task, size=cfg.eval_size, autocast=run.autocast)}
    run.history.append(run.metrics)
    _log(console, run.show, format_metrics(done, run.metrics))
    if run.out is not None:
        with ckpt.writing(run.out / "log.jsonl"):
            with open(run.out / "log.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(run.metrics) + "\n")
    if on_eval is not None:
        on_eval(done, run.metrics)


def _save(run: _Run, done: int) -> None:
    """Rank 0 writes the checkpoint of step ``done``; every rank waits for it."""
    if run.dist.main:
        cfg = run.cfg
        ckpt.save(run.out / "checkpoint", run.model, run.model_config, run.task.tokenizer,
                  optimizer=run.optimizer,
                  train_state={"step": done, "config": cfg.to_dict(), "history": run.history,
                               "precision": run.precision},
                  metadata={"task": cfg.task, "metrics": run.metrics,
                            "train_config": cfg.to_dict()})
        run.saved_step = done
    barrier(run.dist)


def _loop(run: _Run, progress: bool, on_eval, stop: StopOnSigint) -> None:
    """Steps ``start_step .. steps``, evaluating and saving on schedule; on Ctrl-C, saves the
    last finished step and raises ``KeyboardInterrupt``."""
    cfg, d = run.cfg, run.dist
    run.model.train()
    tokens_seen, timed_from = 0, time.perf_counter()
    bar = _progress.bar("[bold]train", "loss {task.fields[loss]:.4f}",
                        "{task.fields[tps]:>7,.0f} tok/s", enabled=progress and d.main)
    with bar:
        handle = bar.add_task("train", total=cfg.steps, completed=run.start_step,
                              loss=float("nan"), tps=0.0)
        for step in range(run.start_step, cfg.steps):
            loss_value, tokens = _train_step(run, step)
            tokens_seen += tokens
            done = step + 1
            last = done == cfg.steps
            evaluate_now = (cfg.eval_every and done % cfg.eval_every == 0) or last
            save_now = run.out is not None and (
                (cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or last)
            if loss_value is None and (evaluate_now or save_now or run.watch.due(step)):
                loss_value = _read_loss(run)
            elapsed = time.perf_counter() - timed_from
            bar.update(handle, completed=done, tps=tokens_seen / elapsed if elapsed > 0 else 0.0,
                       **({} if loss_value is None else {"loss": loss_value}))
            if evaluate_now or save_now:
                _check_weights(run, done)
            if evaluate_now and d.main:
                _evaluate(run, done, loss_value, bar.console, on_eval)
            if save_now:
                _save(run, done)
            # several processes agree on Ctrl-C through a collective and a read: on a GPU only
            # at the steps whose loss is read anyway (the CPU reads every step)
            if (d.world == 1 or loss_value is not None) and not last and any_rank(
                    stop.requested, d, run.device):
                _interrupted(run, done, saved=save_now)


def _interrupted(run: _Run, done: int, *, saved: bool) -> None:
    if run.out is not None:
        if not saved:
            _read_loss(run)
            _check_weights(run, done)
            _save(run, done)
        _log(run.console, run.dist.main, f"[bold yellow]interrupted[/] after step {done} of "
             f"{run.cfg.steps}: checkpoint saved in {run.out / 'checkpoint'}; continue with "
             f"`headwise train --resume {run.out}`")
    raise KeyboardInterrupt


def _write_summary(run: _Run, seconds: float) -> None:
    import json
    cfg = run.cfg
    summary = {"task": cfg.task, "steps": cfg.steps, "seconds": seconds,
               "precision": run.precision, "device": str(run.device),
               "world_size": run.dist.world, "metrics": run.metrics, "history": run.history,
               "config": cfg.to_dict(), "model_config": run.model_config.to_dict()}
    with ckpt.writing(run.out / "metrics.json"):
        (run.out / "metrics.json").write_text(json.dumps(summary, indent=2) + "\n",
                                              encoding="utf-8")


def train(config: TrainConfig | None = None, *, out: str | Path | None = None,
          resume: str | Path | ckpt.Verified | None = None, progress: bool = True, verbose: bool = True,
          on_eval: Callable[[int, dict[str, float]], None] | None = None,
          **overrides: Any) -> TrainResult:
    """Train a model on ``config.task`` and return it with its held-out metrics.

    Args:
        config: the run (default ``TrainConfig()``); keyword ``overrides`` replace fields
            (TrainConfig fields, or model fields such as ``d_model=64``).
        out: run folder: ``checkpoint/`` (latest, atomic), ``metrics.json`` (final metrics and
            history), ``log.jsonl`` (one line per evaluation). None: nothing is written.
        resume: a checkpoint or run folder with training state; the run continues from its step
            with its saved config (``overrides`` may change ``steps`` and evaluation/saving).
        progress: show the rich progress bar (rank 0 only).
        verbose: print the set-up lines (task, model, precision, time estimate) and one line
            per evaluation (rank 0 only).
        on_eval: called on rank 0 as ``on_eval(step, metrics)`` after each evaluation.

    Ctrl-C (SIGINT) finishes the current step, saves a checkpoint (when ``out`` is given) and
    raises ``KeyboardInterrupt``; a second Ctrl-C stops at once.
    """
    cfg, start, history, checked = configure(config, resume, overrides)
    run = _setup(cfg, checked, verbose)
    run.start_step, run.history = start, history
    run.metrics = history[-1] if history else {}
    if checked is not None:
        _log(run.console, run.show, f"[bold]resumed[/] from {checked[0]} at step {start}")
        run.saved_step = start
    if out is not None:
        run.out = Path(out)
        if run.dist.main:
            with ckpt.writing(run.out):
                run.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with StopOnSigint() as stop:
        _loop(run, progress, on_eval, stop)
    seconds = time.perf_counter() - t0
    if run.out is not None and run.dist.main:
        _write_summary(run, seconds)
    run.model.eval()
    return TrainResult(model=run.model, model_config=run.model_config, tokenizer=run.task.tokenizer,
                       task=run.task, config=cfg, metrics=run.metrics, history=run.history,
                       out=run.out, seconds=seconds, precision=run.precision)
