"""What is trained and how: the model config a task needs, the task itself, the memory check
before anything is built, the learning-rate schedule and the optimizer (used by
:mod:`headwise.train`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from headwise import checkpoint as ckpt
from headwise import limits
from headwise.data import make_task
from headwise.errors import CheckpointError
from headwise.train.config import FAMILY, TrainConfig, tokens_per_example

__all__ = ["RESUME_OVERRIDES", "build_model_config", "check_fits", "check_resumable",
           "configure", "lr_at", "make_optimizer", "step_seed", "task_for"]

# what --resume may change (everything else continues the saved run)
RESUME_OVERRIDES = ("steps", "eval_every", "eval_size", "checkpoint_every", "device",
                    "precision", "threads")




def build_model_config(cfg: TrainConfig, task):
    """The model config for ``task``: the model fields of a resolved ``cfg`` plus what the
    task decides (vocabularies, longest sequence, padding id)."""
    from headwise.models import LMConfig, TransformerConfig
    vocab, pad = task.tokenizer.vocab_size, task.tokenizer.pad_id
    if task.kind == "lm":
        length = cfg.context if FAMILY[cfg.task] == "text" else 2 * task.max_len
        return LMConfig(vocab_size=vocab, max_len=length, pad_id=pad, **cfg.model)
    # a target is <bos> + up to max_len tokens + <eos>
    return TransformerConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, max_len=task.max_len + 2,
                             pad_id=pad, **cfg.model)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``min_lr_ratio * lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not biases, norms or embeddings' rows)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and "embed" not in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    # The fused kernel (one pass per tensor) replaces the default loop of small ops per
    # parameter, which dominates a small model's step on the CPU; torch has it for CPU and CUDA.
    fused = all(p.device.type in ("cpu", "cuda") for p in decay + no_decay)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=fused or None)


def step_seed(seed: int, step: int, rank: int) -> int:
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1)[0])


def task_for(cfg: TrainConfig):
    """The task (data and tokenizer) of a resolved ``cfg``."""
    return make_task(cfg.task, seed=cfg.seed, min_len=cfg.min_len, max_len=cfg.max_len,
                     num_symbols=cfg.num_symbols, context=cfg.context, tokenizer=cfg.tokenizer,
                     text=cfg.text, pairs=cfg.pairs)


def check_fits(cfg: TrainConfig, model_config, task) -> None:
    """Refuse a run whose weights, optimizer state or batch cannot fit in this machine's
    memory, before anything is allocated (numbers in the error)."""
    n = limits.parameter_count(model_config.kind, model_config.to_dict())
    # weights + gradients + AdamW's two moments, float32
    limits.check_memory(16 * n, f"a {model_config.kind} model of {n:,} parameters (training)",
                        "train", "pass smaller --d-model/--layers/--d-ff")
    src, tgt = tokens_per_example(cfg)
    c = model_config
    layers = c.num_layers * (1 if c.kind == "lm" else 3)
    per_token = 4 * (layers * (8 * c.d_model + 2 * c.d_ff) + 3 * task.tokenizer.vocab_size)
    limits.check_memory(cfg.batch_size * (src + tgt) * per_token,
                        f"batch_size={cfg.batch_size:,} (activations for backward)", "train",
                        "pass a smaller --batch-size")


def configure(config, resume, overrides) -> tuple[TrainConfig, int, list, tuple | None]:
    """``(resolved config, start step, history, verified checkpoint or None)``."""
    if config is not None and not isinstance(config, TrainConfig):
        raise TypeError(f"train(config=...) expects a TrainConfig; got {type(config).__name__}")
    cfg = config or TrainConfig()
    if resume is None:
        return cfg.updated(**overrides).resolved(), 0, [], None
    # every file is hashed once per resume: here, or by the caller who hands over a Verified
    checked = resume if isinstance(resume, ckpt.Verified) else ckpt.read_config(resume)
    saved = ckpt.load_train_state(resume, checked=checked)
    bad = sorted(set(overrides) - set(RESUME_OVERRIDES))
    if bad:
        raise ValueError(f"--resume continues the saved run; {bad} cannot change (only "
                         f"{sorted(RESUME_OVERRIDES)} can)")
    try:
        cfg = TrainConfig.from_dict(saved["config"])
        start, history = int(saved["step"]), list(saved.get("history", []))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{checked[0]}: its training state is not a headwise run's "
                              f"({type(exc).__name__}: {exc})") from None
    return cfg.updated(**overrides).resolved(), start, history, checked


def check_resumable(path: Path, model_config, meta: dict[str, Any]) -> None:
    theirs = meta["config"] if isinstance(meta["config"], dict) else {}
    if meta["kind"] == model_config.kind:
        try:  # a run saved before ``attention``: its flat keys read as today's config's
            theirs = type(model_config).from_dict(theirs).to_dict()
        except (TypeError, ValueError):
            pass  # not a config of this kind: it differs, and the diff below says where
    if meta["kind"] != model_config.kind or theirs != model_config.to_dict():
        diff = sorted(k for k in set(theirs) | set(model_config.to_dict())
                      if theirs.get(k) != model_config.to_dict().get(k))
        raise CheckpointError(f"checkpoint {path} holds a different model ({meta['kind']}; "
                              f"differs in {diff[:5]}) from the one this run builds "
                              f"({model_config.kind}); resume with the same task and sizes")
