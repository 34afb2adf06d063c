"""``headwise kvplan``: make a head-wise KV plan for a model and print it with the loss it costs.

    headwise kvplan --budget 0.5 --out plan.json
    headwise kvplan --hf smollm2 --file calib.txt --tolerance 0.01 --window 256 --out plan.json
    headwise kvplan --profile long.safetensors --budget 0.5 --out plan.json
    headwise chat "Hello" --kv-plan plan.json

The calibration text (``--file``, default Jane Austen's novels) gives ``--tokens`` tokens to rank
the key/value groups on and the next ``--tokens`` as held-out text the plan's loss is measured
on. The ranking (``--rank``): ``profile`` (default) is :func:`headwise.long.profile`'s streaming
mass per group (the attention on the sinks and the window, a group as streaming as its least
streaming query head: one pass); ``cost`` each group's measured loss when it alone streams (one
prefill per group); ``--profile FILE`` a saved :class:`headwise.long.LongProfile`'s scores. The plan is
printed (one line per layer: ``S`` streaming, ``F`` full) and written as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import sys

from headwise.commands import _flags as F
from headwise.commands._flags import flag

HELP = "make a head-wise KV plan (streaming groups keep sinks + a window) and print its loss"
EXAMPLE = "headwise kvplan --budget 0.5 --out plan.json"

FLAGS = (
    flag("--hf", metavar="NAME|DIR", help="a transformers model (installed name such as "
                                          "smollm2, or a local folder); default: the SmolLM2 "
                                          "GGUF on headwise's own decoder"),
    F.GGUF.but(help="a llama GGUF file on headwise's own decoder (default: SmolLM2)"),
    flag("--file", metavar="TEXT", help="calibration text (default: Jane Austen's novels)"),
    flag("--rank", choices=("profile", "cost"), default="profile",
         help="rank the groups by their streaming mass on the calibration text (profile, "
              "default) or by each one's measured loss cost (cost: one prefill per group)"),
    flag("--profile", metavar="FILE.safetensors",
         help="rank the groups by this long-document profile's streaming scores (a saved "
              "LongProfile of every layer) instead of measuring each group's cost"),
    F.OneOf((flag("--budget", type=float, metavar="F",
                  help="the share of key/value groups that stream (0..1; default 0.5)"),
             flag("--tolerance", type=float, metavar="T",
                  help="stream the most groups whose held-out loss stays within (1 + T) x "
                       "the full cache's, e.g. 0.01"))),
    flag("--sinks", type=int, default=4, metavar="S", at_least=0,
         help="first positions a streaming group keeps (default 4)"),
    flag("--window", type=int, default=256, metavar="W", at_least=1,
         help="latest positions a streaming group keeps (default 256)"),
    flag("--tokens", type=int, default=1024, metavar="N", at_least=2,
         help="calibration tokens, and as many held out (default 1024)"),
    flag("--out", metavar="FILE.json", help="write the plan here (atomically)"),
    F.THREADS,
)


def register(subparsers) -> None:
    F.parser(subparsers, "kvplan", "Rank a decoder's key/value groups on a calibration text, "
             "choose which stream (S sinks + W latest positions) by a budget or a loss "
             "tolerance, print the plan with the measured held-out loss, and save it.",
             FLAGS, run)


def _text(path: str | None) -> str:
    if path is None:
        from headwise.data import austen_text

        return austen_text()
    from pathlib import Path

    return Path(path).read_text(encoding="utf-8")


def load(args: argparse.Namespace):
    """``(model, encode, name)`` of the model the flags name."""
    if args.hf is not None:
        from headwise.hf import load as hf_load

        model, tok = hf_load(args.hf, where="--hf")
        return model, lambda text: tok(text)["input_ids"], str(args.hf)
    from headwise.pretrained import find_smollm2, load_gguf

    chat = load_gguf(args.gguf or find_smollm2())
    return chat.model, chat.tokenizer.encode, chat.config.name


def run(args: argparse.Namespace) -> int:
    import torch

    from headwise import limits
    from headwise.analysis.kv import kv_plan

    if args.budget is not None and not 0 <= args.budget <= 1:
        raise ValueError(f"--budget must be in [0, 1] (the share of groups that stream), got "
                         f"{args.budget}")
    if args.tolerance is not None and args.tolerance < 0:
        raise ValueError(f"--tolerance must be >= 0, got {args.tolerance}")
    if args.threads is not None:
        torch.set_num_threads(limits.threads(args.threads, "--threads"))
    text = _text(args.file)
    scores = None
    if args.profile is not None:  # (read before the model: a bad file fails fast)
        from headwise.long import LongProfile

        scores = LongProfile.load(args.profile)
    model, encode, name = load(args)
    ids = list(encode(text[: 12 * 2 * args.tokens]))
    n = args.tokens
    if len(ids) < 2 * n:
        raise ValueError(f"--file: {len(ids)} tokens, need {2 * n} (--tokens {n} to calibrate "
                         f"and as many held out); pass a longer text or a smaller --tokens")
    ids = torch.tensor([ids[:2 * n]])
    if scores is None and args.rank == "profile":
        from headwise.long import profile

        scores = profile(model, ids[:, :n], sinks=args.sinks, window=args.window,
                         progress=False)
    plan = kv_plan(model, ids[:, :n], heldout=ids[:, n:], name=name, sinks=args.sinks,
                   window=args.window, tolerance=args.tolerance, scores=scores,
                   budget=0.5 if args.budget is None else args.budget)
    print(plan.table())
    full, got = plan.loss["full"], plan.loss["plan"]
    print(f"held-out loss over {n} tokens: full cache {full:.4f}, plan {got:.4f} "
          f"({got / full - 1:+.2%}); KV bytes at {n} positions: "
          f"{plan.kv_bytes(1, n, 4) / (plan.layers * plan.groups * 2 * n * plan.head_dim * 4):.0%}"
          f" of the full cache's")
    if args.out is not None:
        print(f"plan written: {plan.save(args.out)}", file=sys.stderr)
    return 0
