"""``headwise train TASK ...``: train a model (see :mod:`headwise.train`).

``--nproc N`` runs the same training in N processes under ``torch.distributed.run`` (torchrun)
with DistributedDataParallel: gloo on CPU, NCCL on CUDA.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

HELP = "train a model on a synthetic task, a text file, sentence pairs or a corpus"
EXAMPLE = "headwise train reverse --steps 300 --out runs/reverse"


def register(subparsers) -> None:
    from headwise.train import add_arguments
    p = subparsers.add_parser(
        "train",
        description="Train with AdamW, warm-up + cosine decay, evaluation, atomic checkpoints "
                    "and exact --resume. Options left out take the task's preset.")
    add_arguments(p)
    p.add_argument("--nproc", type=int, default=1,
                   help="processes (DDP via torchrun; gloo on CPU, NCCL on CUDA)")
    p.set_defaults(func=run)


def torchrun_command(args: argparse.Namespace) -> list[str]:
    """The ``python -m torch.distributed.run ... -m headwise.train ...`` command for ``args``."""
    from headwise.train import _OPTIONS
    argv = [args.task] if args.task else []
    for flag, dest, _, _ in _OPTIONS:
        value = getattr(args, dest)
        if value is not None:
            argv += [flag, str(value)]
    for flag, value in (("--out", args.out), ("--resume", args.resume)):
        if value is not None:
            argv += [flag, str(value)]
    if args.quiet:
        argv.append("--quiet")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={args.nproc}", "-m", "headwise.train", *argv]


def run(args: argparse.Namespace) -> int:
    from headwise.train import TrainConfig, config_from_args, run_args
    if args.nproc < 1:
        raise ValueError(f"--nproc must be >= 1; got {args.nproc}")
    if args.nproc == 1:
        return run_args(args)
    # Check what can be checked here, so a user error is one line, not N ranks' worth.
    config, given = config_from_args(args)
    if config is not None:
        cfg = TrainConfig(**{**config.to_dict(), **given, "betas": tuple(config.betas)})
        resolved = cfg.resolved()
        if resolved.batch_size % args.nproc:
            raise ValueError(f"batch_size={resolved.batch_size} is not divisible by --nproc "
                             f"{args.nproc}; pass --batch-size a multiple of {args.nproc}")
        from headwise.data import make_task
        make_task(cfg.task, seed=cfg.seed, min_len=cfg.min_len, max_len=cfg.max_len,
                  num_symbols=cfg.num_symbols, context=cfg.context, tokenizer=cfg.tokenizer,
                  text=cfg.text, pairs=cfg.pairs)
    return subprocess.call(torchrun_command(args))
