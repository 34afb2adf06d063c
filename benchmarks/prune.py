"""Physical head pruning without retraining: metric and inference latency at 0, 10, ..., 50% of
the heads pruned, every pruned copy timed against the unpruned model in the same process
(interleaved rounds in a rotating order; ratio = median of per-round time ratios).

Models, metrics and workloads (:mod:`headwise.commands._prune_targets`):

- ``reverse``: the demo's reversal Transformer (``headwise-demo/checkpoint`` when present, else
  trained here with the demo's recipe); held-out exact match; greedy decoding of 256 strings.
- ``minilm``: all-MiniLM-L6-v2; Spearman correlation of pairwise sentence cosine similarities
  with the unpruned model over English Ding sentences; 64 sentences in one batch, and 16 Austen
  passages of 256 tokens. Goal: latency <= 0.85x of unpruned at 50% of heads pruned (passages).
- ``smollm2``: SmolLM2-135M-Instruct, cut by whole key/value groups; perplexity on held-out
  Austen text; a forward over 4 x 256 tokens.

The head order: least important first by :func:`headwise.importance`'s default (greedy zero
ablation of each target's loss: see the targets), or with ``--order norm``
the mean norm of each head's write to the residual stream.

    python benchmarks/prune.py [--quick] [--models reverse,minilm,smollm2] [--threads N]
                               [--order importance|norm]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import _common as C  # noqa: E402

FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)


def rows_of(target, steps) -> list[dict]:
    rows = []
    for s in steps:
        row = {"model": target.name, "heads pruned": f"{s.pruned}/{s.heads} "
                                                     f"({s.pruned / s.heads:.0%})",
               target.metric_name: s.metric}
        for name in s.ratio:
            row[f"{name} ms"] = s.latency_ms[name]
            row[f"{name} ratio"] = s.ratio[name]
        rows.append(row)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="smaller evaluation sets and workloads, fewer rounds (a smoke run)")
    p.add_argument("--models", default="reverse,minilm,smollm2")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--order", default="importance", choices=("importance", "norm"))
    args = p.parse_args(argv)
    from headwise.analysis.prune_sweep import sweep
    from headwise.commands._heads_prune import head_order
    from headwise.commands._prune_targets import TARGETS

    if args.threads:
        torch.set_num_threads(args.threads)
    rounds = args.rounds or (3 if args.quick else 7)
    print(f"# head pruning sweep: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{rounds}+ interleaved rounds, head order: {args.order}"
          f"{' (--quick)' if args.quick else ''}\n")
    for name in args.models.split(","):
        t0 = time.perf_counter()
        target = TARGETS[name](quick=args.quick)
        scores = head_order(target, args.order)
        print(f"head order: {scores.describe()}")
        steps = sweep(target.model, scores.scores, FRACTIONS, target.metric, target.runs,
                      rounds=rounds, budget_s=10.0 if args.quick else 40.0)
        rows = rows_of(target, steps)
        print(f"## {name}: {target.workloads}\n")
        print(C.table(rows, list(rows[0])))
        print(f"\n({time.perf_counter() - t0:.0f} s)\n", flush=True)


if __name__ == "__main__":
    main()
