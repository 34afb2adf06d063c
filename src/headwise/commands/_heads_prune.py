"""``headwise heads prune``: score the heads (:func:`headwise.importance`'s default, greedy zero
ablation, on each model's calibration data; the line ``head order:`` says how), or with
``--order norm`` the mean norm of each head's write to the residual stream,
:func:`headwise.analysis.prune_sweep.output_norms`), prune the least important at growing
fractions without retraining (:func:`headwise.prune_heads`: the matrices really shrink),
evaluate and time every pruned copy against the unpruned model in the same process, print the
table and write it (JSON) with a plot of metric and speed against heads pruned into the report
folder (``headwise-reports/heads-prune-<model>/`` or ``-o DIR``).

    headwise heads prune --model reverse [--checkpoint headwise-demo/checkpoint]
    headwise heads prune --model minilm --fractions 0,0.25,0.5
    headwise heads prune --model smollm2 --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from headwise.commands import _flags as F
from headwise.commands._flags import flag

MODELS = ("reverse", "minilm", "smollm2")
ORDERS = ("importance", "norm")


HELP = "prune the least important heads step by step: metric and latency table, plot"
EXAMPLE = "headwise heads prune --model minilm --quick"


FLAGS = (
    F.OneOf((
        flag("--model", default="reverse", choices=MODELS,
             help="reverse: the demo's model (held-out exact match); minilm: all-MiniLM-L6-v2 "
                  "(agreement of sentence similarities); smollm2: SmolLM2-135M (perplexity on "
                  "held-out Austen)"),
        F.hf("a causal LM's heads ordered by importance on windows of its own tokens of Emma "
             "(`make corpora`) or of --sentences FILE, the least important key/value groups "
             "covering --fraction of its heads cut, the pruned folder saved in the report "
             "folder"),
    )),
    flag("--fraction", type=float, default=0.25,
         help="--hf: the fraction of heads to prune (default 0.25), by whole key/value groups"),
    *F.DATA,
    F.CHECKPOINT.but(help="reverse: a trained checkpoint folder (default "
                          "headwise-demo/checkpoint, else one is trained here)"),
    flag("--fractions", default="0,0.1,0.2,0.3,0.4,0.5",
         help="fractions of heads to prune, starting at 0 (default 0,0.1,...,0.5)"),
    flag("--order", default="importance", choices=ORDERS,
         help="importance: headwise.importance's default (greedy zero ablation: heads zeroed one "
              "by one, the least harmful first); norm: the norm of each head's write to the "
              "residual stream (one forward pass)"),
    flag("--quick", action="store_true", help="smaller evaluation sets and workloads"),
    flag("--rounds", type=int, default=5, at_least=1,
         help="interleaved timing rounds (default 5)"),
    F.THREADS,
    F.output("heads-prune-MODEL"),
)


def register(subparsers) -> None:
    F.parser(subparsers, "prune", "Score every head, prune the least important ones at each "
             "fraction (whole key/value groups for grouped-query models; no retraining), "
             "evaluate, and time inference against the unpruned model, interleaved in one "
             "process.", FLAGS, run, full_command="heads prune")


def parse_fractions(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--fractions must be numbers like 0,0.1,0.2, got {text!r}") from None
    if not values or values[0] != 0 or any(not 0 <= v < 1 for v in values) \
            or values != sorted(set(values)):
        raise ValueError(f"--fractions must start at 0 and rise below 1 (e.g. 0,0.25,0.5), got "
                         f"{text!r}")
    return values


def run(args: argparse.Namespace) -> int:
    if args.hf:
        from headwise.commands._hf import prune
        return prune(args)
    fractions = parse_fractions(args.fractions)
    if args.checkpoint and args.model != "reverse":
        raise ValueError(f"--checkpoint is for --model reverse (a trained headwise checkpoint); "
                         f"{args.model} loads its own weights")
    from headwise.commands._common import report_paths

    page, pictures = report_paths(args.output, "heads", f"prune-{args.model}")
    if pictures is None:  # -o FILE.html
        raise ValueError(f"-o {args.output}: expected a folder for the table and the plot")
    folder = page.parent
    import torch

    from headwise import limits
    from headwise.analysis.prune_sweep import sweep
    from headwise.commands._prune_targets import TARGETS

    if args.threads is not None:
        torch.set_num_threads(limits.threads(args.threads, "--threads"))
    kwargs = {"checkpoint": args.checkpoint} if args.model == "reverse" else {}
    target = TARGETS[args.model](quick=args.quick, **kwargs)
    grid = head_order(target, args.order)
    print(f"head order: {grid.describe()}")
    steps = sweep(target.model, grid.scores, fractions, target.metric, target.runs,
                  rounds=args.rounds, budget_s=10.0 if args.quick else 30.0)
    print(_table(target, steps))
    folder.mkdir(parents=True, exist_ok=True)
    rows = [dict(fraction=s.fraction, pruned=s.pruned, heads=s.heads, metric=s.metric,
                 latency_ms=s.latency_ms, ratio=s.ratio) for s in steps]
    (folder / "prune.json").write_text(json.dumps(
        {"model": target.name, "metric": target.metric_name, "workloads": target.workloads,
         "order": args.order, "order_method": grid.describe(),
         "rows": rows}, indent=2) + "\n", encoding="utf-8")
    _plot(target, steps, folder / "prune.png")
    grid = dataclasses.replace(grid, details={**grid.details, "model": target.name,
                                              "used for": "the pruning order (lowest first)"})
    grid.to_json(folder / "importance.json")
    grid.plot(folder / "importance.png", title=f"{target.name}: head order ({grid.method})")
    print(f"wrote {folder / 'prune.json'}, {folder / 'prune.png'} and the importance grid "
          f"{folder / 'importance.png'} (.json)")
    return 0


def head_order(target, order: str):
    """The :class:`~headwise.HeadScores` the heads are pruned by, larger = keep longer."""
    if order == "importance":
        return target.importance(target.model)
    import torch

    from headwise.analysis.head_scores import HeadScores
    from headwise.analysis.prune_sweep import output_norms
    with torch.inference_mode():
        return HeadScores("output norm", output_norms(target.model, target.calibrate),
                          {"criterion": "mean L2 norm of each head's write to the residual "
                                        "stream (one forward pass)"})


DISAGREE = 0.05  # a row whose two latency figures differ by more than this gets a mark


def _table(target, steps) -> str:
    """The sweep as a table: per workload the median time (ms) and the median of per-round
    ratios to the unpruned model. Each round times every model back to back, so the ratio
    cancels the machine's drift between rounds and the ms medians do not: under a changing
    load the two can disagree, and a row where they differ by over 5% is marked and explained
    under the table."""
    names = list(steps[0].ratio)
    head = ["heads pruned", target.metric_name,
            *(f"{n}: ms (median), vs unpruned (median ratio)" for n in names)]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    marked = False
    for s in steps:
        cells = []
        for n in names:
            of_medians = s.latency_ms[n] / steps[0].latency_ms[n]
            odd = abs(of_medians / s.ratio[n] - 1) > DISAGREE
            marked |= odd
            cells.append(f"{s.latency_ms[n]:.1f}, {s.ratio[n]:.2f}x" + " *" * odd)
        lines.append(" | ".join([f"{s.pruned}/{s.heads} ({s.pruned / s.heads:.0%})",
                                 f"{s.metric:.4g}", *cells]))
    if marked:
        lines.append(f"* the ms medians give a ratio more than {DISAGREE:.0%} away: the load "
                     "changed between rounds; trust the ratio (each round times every model "
                     "back to back), or rerun on a quieter machine / with more --rounds")
    return f"{target.name}: {target.workloads}\n" + "\n".join(lines)


def _plot(target, steps, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [100 * s.pruned / s.heads for s in steps]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(x, [s.metric for s in steps], "o-", color="tab:blue", label=target.metric_name)
    ax.set_xlabel("heads pruned (%)")
    ax.set_ylabel(target.metric_name, color="tab:blue")
    speed = ax.twinx()
    for name, colour in zip(steps[0].ratio, ("tab:orange", "tab:green", "tab:red"),
                            strict=False):
        speed.plot(x, [s.ratio[name] for s in steps], "s--", color=colour,
                   label=f"latency ratio: {name}")
    speed.set_ylabel("latency / unpruned")
    speed.axhline(1.0, color="grey", lw=0.5)
    handles = ax.get_legend_handles_labels()[0] + speed.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="lower left")
    ax.set_title(f"{target.name}: pruning heads without retraining")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
