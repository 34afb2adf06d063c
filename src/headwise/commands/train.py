"""``headwise train TASK ...``: train a model (see :mod:`headwise.train`).

This module owns the option table: one row per option. A row whose name is a field of the
model config (``d_model``, ``num_heads``, ...) goes into ``TrainConfig.model``; any other into
the TrainConfig field of that name; so a new model option is one row here.

``--nproc N`` runs the same training in N processes under ``torch.distributed.run`` (torchrun)
with DistributedDataParallel: gloo on CPU, NCCL on CUDA. Nothing heavy is imported until a
command runs (``train --help`` lists the presets and their estimated time without torch).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from headwise.commands import _flags as F
from headwise.commands._flags import flag

HELP = "train a model on a synthetic task, a text file, sentence pairs or a corpus"
EXAMPLE = "headwise train reverse --steps 300 --out runs/reverse"


def _yes_no(text: str) -> bool:
    """``yes``/``no`` (also true/false, 1/0) for a boolean option."""
    value = {"yes": True, "true": True, "1": True, "no": False, "false": False, "0": False}.get(
        text.strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected yes or no, got {text!r}")
    return value


OPTIONS = (  # every default None: the task's preset at --size, or the resumed run's value
    flag("--size", help="preset size: 'small' (default; minutes on a CPU), 'large' (text and "
                        "pairs tasks) or 'llama' (text tasks: RoPE, RMSNorm, SwiGLU, "
                        "grouped-query heads; see the table below)"),
    flag("--text", help="UTF-8 text file (task 'text')"),
    flag("--pairs", help="source<TAB>target file (task 'pairs')"),
    flag("--min-len", type=int, help="shortest synthetic sequence"),
    flag("--max-len", type=int, help="longest synthetic sequence / sentence pair"),
    flag("--num-symbols", type=int, help="synthetic alphabet size (2-52)"),
    flag("--context", type=int, help="language-model window (text tasks)"),
    flag("--tokenizer", help="'char' (default) or 'byte'"),
    # model-config fields (TrainConfig.model)
    flag("--d-model", type=int, help="model width m"),
    flag("--heads", dest="num_heads", type=int, help="attention heads h"),
    flag("--head-dim", type=int, help="per-head size d (default d_model / heads, which must "
                                      "then divide evenly)"),
    flag("--kv-heads", dest="num_kv_heads", type=int,
         help="key/value heads g (grouped-query attention)"),
    flag("--layers", dest="num_layers", type=int, help="layers (encoder and decoder each)"),
    flag("--d-ff", type=int, help="feed-forward width"),
    flag("--dropout", type=float, help="dropout rate"),
    flag("--positional", help="'sinusoidal' (default), 'learned' or 'rope' (rotary positions "
                              "on q and k)"),
    flag("--rope-theta", type=float, help="RoPE base theta (with --positional rope)"),
    flag("--activation", help="'relu' (default), 'gelu', 'gelu_tanh' or 'silu'"),
    flag("--norm", help="'layer' (LayerNorm, default) or 'rms' (RMSNorm)"),
    flag("--ffn", help="'mlp' (default) or 'glu' (gated; SwiGLU with --activation silu)"),
    flag("--bias", type=_yes_no, help="biases in every projection: yes (default) or no"),
    flag("--tie-embeddings", type=_yes_no,
         help="the output projection shares the token embedding: yes or no"),
    flag("--window", dest="sliding_window", type=int,
         help="sliding-window attention: each query sees itself and the SLIDING_WINDOW - 1 "
              "positions before it"),
    # optimisation and the run
    flag("--steps", type=int, help="optimizer steps"),
    flag("--batch-size", type=int, help="global batch size (all processes)"),
    flag("--lr", type=float, help="peak learning rate"),
    flag("--warmup", type=int, help="linear warm-up steps, fewer than --steps (then cosine "
                                    "decay)"),
    flag("--weight-decay", type=float, help="AdamW weight decay (matrices only)"),
    flag("--grad-clip", type=float, help="max gradient norm (0 = off)"),
    flag("--label-smoothing", type=float, help="label smoothing"),
    flag("--eval-every", type=int, help="evaluate every N steps (and at the end)"),
    flag("--eval-size", type=int, help="held-out examples per evaluation"),
    flag("--checkpoint-every", type=int, help="save every N steps (0 = only at the end)"),
    F.SEED.but(default=None, help="seed (data, init, dropout)"),
    flag("--precision", choices=("auto", "fp32", "bf16"),
         help="'auto' (bf16 where supported), 'fp32' or 'bf16'"),
    F.DEVICE.but(default=None, help="'auto', 'cpu', 'cuda' or 'cuda:N'"),
    F.THREADS.but(help="CPU threads per process (default: torch's choice)"),
)
"""The options that set a TrainConfig field, or (``d_model``, ``num_heads``, ...) a field of
its model config, by their ``dest``."""

_TASKS = {"synthetic": "reverse, copy, sort", "induction": "induction", "text": "text, austen",
          "pairs": "pairs, de-en"}
_EPILOG = "\x00presets"  # replaced by the preset table when the help is shown


def presets_table() -> str:
    """The presets with their sizes and estimated time on this machine (torch-free)."""
    from headwise import limits
    from headwise.train.config import PRESETS, TrainConfig, estimate_seconds, format_seconds
    rows = [f"presets (`headwise train TASK --size SIZE`; time estimated on this machine, "
            f"{limits.cpu_count()} CPUs, from a quick matmul benchmark):",
            f"  {'task':<20} {'size':<6} {'model':<30} {'steps':>6} {'batch':>6}  estimate"]
    for family, sizes in PRESETS.items():
        task = _TASKS[family].split(",")[0]
        for k, size in enumerate(sizes):
            cfg = TrainConfig(task=task, size=size).filled()
            m = cfg.model
            kv = f", {m['num_kv_heads']} kv" if m.get("num_kv_heads") else ""
            model = f"d {m['d_model']}, {m['num_layers']} layers, {m['num_heads']} heads{kv}"
            rows.append(f"  {_TASKS[family] if k == 0 else '':<20} {size:<6} {model:<30} "
                        f"{cfg.steps:>6} {cfg.batch_size:>6}  "
                        f"~{format_seconds(estimate_seconds(cfg))}")
    rows += ["", "example:", f"  {EXAMPLE}",
             "  headwise train austen                    # the small size: minutes",
             "  headwise train austen --size large --device cuda",
             "  headwise train austen --size llama       # RoPE, RMSNorm, SwiGLU, GQA",
             "  headwise train --resume runs/reverse     # continue after Ctrl-C or a crash"]
    return "\n".join(rows)


class _HelpWithPresets(argparse.HelpFormatter):
    """Computes the preset table only when the help is printed, and keeps its lines."""

    def add_text(self, text):
        super().add_text(presets_table() if text == _EPILOG else text)

    def _fill_text(self, text, width, indent):
        if text.startswith("presets"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The training options (every default None = the task preset / the saved run)."""
    p.add_argument("task", nargs="?", default=None,
                   help="reverse, copy, sort, induction, text, austen, pairs or de-en")
    for row in OPTIONS:
        p.add_argument(*row.names, **row.options)
    p.add_argument("--out", default=None, help="run folder (default headwise-runs/TASK)")
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the run saved in DIR (a run or checkpoint folder)")
    p.add_argument(*F.QUIET.names, **F.QUIET.but(
        help="no progress bar (set-up and evaluation lines are still printed)").options)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        description="Train with AdamW, warm-up + cosine decay, evaluation, atomic checkpoints "
                    "and exact --resume (Ctrl-C saves one). Options left out take the task's "
                    "preset at --size.",
        epilog=_EPILOG, formatter_class=_HelpWithPresets)
    add_arguments(p)
    p.add_argument("--nproc", type=int, default=1,
                   help="processes (DDP via torchrun; gloo on CPU, NCCL on CUDA)")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    """``(TrainConfig or None when resuming, overrides)`` from parsed options: explicit
    options only, by field name (model fields included)."""
    from headwise.train.config import TrainConfig
    given = {row.dest: getattr(args, row.dest) for row in OPTIONS
             if getattr(args, row.dest, None) is not None}
    if args.resume:
        if args.task is not None:
            given["task"] = args.task
        return None, given
    if args.task is None:
        raise ValueError("which task? e.g. `headwise train reverse` (or --resume DIR)")
    return TrainConfig(task=args.task), given


def run_args(args: argparse.Namespace) -> int:
    """One process of ``headwise train`` (also ``python -m headwise.train`` under torchrun)."""
    import os

    from headwise import checkpoint as ckpt
    from headwise.errors import CheckpointError
    from headwise.train import train
    from headwise.train.config import TrainConfig
    config, given = config_from_args(args)
    resume = None
    if args.resume:
        resume = ckpt.read_config(args.resume)  # every file hashed once, here, for the run
        saved = ckpt.load_train_state(resume.path, checked=resume)
        try:
            saved_task = TrainConfig.from_dict(saved["config"]).task
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{resume.path}: its training state is not a headwise run's "
                                  f"({type(exc).__name__}: {exc})") from None
        if given.pop("task", saved_task) != saved_task:
            raise CheckpointError(f"{args.resume} is a run of task {saved_task!r}, not "
                                  f"{args.task!r}; drop the task or pick another folder")
    out = args.out
    if out is None:
        if resume is not None:
            path = resume.path
            out = path.parent if path.name == "checkpoint" else path.parent / "resumed"
        else:
            out = Path("headwise-runs") / config.task
    result = train(config, out=out, resume=resume, progress=not args.quiet, **given)
    if result.metrics and int(os.environ.get("RANK", "0")) == 0:
        print(f"run saved in {out}/ (checkpoint/, metrics.json, log.jsonl)")
    return 0


def torchrun_command(args: argparse.Namespace) -> list[str]:
    """The ``python -m torch.distributed.run ... -m headwise.train ...`` command for ``args``."""
    argv = [args.task] if args.task else []
    for row in OPTIONS:
        value = getattr(args, row.dest)
        if value is not None:
            argv += [row.names[0], str(value)]
    for name, value in (("--out", args.out), ("--resume", args.resume)):
        if value is not None:
            argv += [name, str(value)]
    if args.quiet:
        argv.append("--quiet")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={args.nproc}", "-m", "headwise.train", *argv]


def as_flags(message: str) -> str:
    """``message`` with the config field names in it spelled as this command's flags
    (``head_dim=21`` -> ``--head-dim 21``), so an error from the model config names what to
    type here, from the one table that maps them (:data:`OPTIONS`)."""
    import re
    for row in OPTIONS:
        flag, dest = row.names[0], row.dest
        message = re.sub(rf"(?<![\w.-]){dest}=", f"{flag} ", message)
        if "_" in dest:  # a bare field name; plain words (text, size, norm) stay words
            message = re.sub(rf"(?<![\w.-]){dest}\b", flag, message)
    return message


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ValueError as exc:  # the configs name fields; this command's user types flags
        exc.args = (as_flags(str(exc)),)
        raise


def _run(args: argparse.Namespace) -> int:
    if args.nproc < 1:
        raise ValueError(f"--nproc must be >= 1; got {args.nproc}")
    if args.nproc == 1:
        return run_args(args)
    # Check what can be checked here, so a user error is one line, not N ranks' worth.
    config, given = config_from_args(args)
    if config is not None:
        resolved = config.updated(**given).resolved()
        if resolved.batch_size % args.nproc:
            raise ValueError(f"batch_size={resolved.batch_size} is not divisible by --nproc "
                             f"{args.nproc}; pass --batch-size a multiple of {args.nproc}")
        from headwise.train import task_for
        task_for(resolved)
    return subprocess.call(torchrun_command(args))


def main(argv: list[str] | None = None) -> int:
    """``python -m headwise.train`` (torchrun's entry): ``headwise train ARGS`` in this
    process (the same parser and error reporting), then leave the process group."""
    from headwise.cli import main as cli_main
    from headwise.train.dist import shutdown
    try:
        return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])
    finally:
        shutdown()
