"""``headwise heads score``: score every head of a checkpoint and write the importance grid.

    headwise heads score --checkpoint headwise-demo/checkpoint
    headwise heads score --checkpoint runs/lm --method ablation --ablation mean -o scores/

The data are held-out examples of the task the checkpoint was trained on (its saved training
config). Prints the ``(layers, heads)`` grid of each attention kind and the most and least
important heads; writes ``importance.json`` and ``importance.png`` to the report folder
(``headwise-reports/heads-score-<checkpoint>/``, or ``-o DIR``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from headwise.commands._common import parse_device, report_paths

# torch is imported inside run: `headwise heads score --help` stays fast
HELP = "score every head (gradient, ablation or a behaviour) and write the importance grid"
EXAMPLE = "headwise heads score --checkpoint headwise-demo/checkpoint --method ablation"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "score",
        description="Score every head of a checkpoint on held-out examples of its training "
                    "task: print the (layers, heads) grid per attention kind and the most and "
                    "least important heads; write importance.json and importance.png.")
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="checkpoint folder")
    p.add_argument("--method", default="gradient",
                   help="gradient (default; Michel et al. 2019), ablation (loss change when the "
                        "head is removed), or a behaviour: prev_token, induction, sink, entropy")
    p.add_argument("--ablation", default="zero", choices=("zero", "mean"),
                   help="--method ablation: zero the head's output, or set it to its mean")
    p.add_argument("--examples", type=int, default=256,
                   help="held-out examples to score on (default 256)")
    p.add_argument("--top", type=int, default=5, help="how many most/least important heads "
                   "to list (default 5)")
    p.add_argument("-o", "--output", metavar="DIR",
                   help="report folder (default: headwise-reports/heads-score-CHECKPOINT/)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from headwise import checkpoint, limits
    from headwise.analysis.scoring import importance

    for flag, value in (("--examples", args.examples), ("--top", args.top)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    limits.size(args.examples, "--examples", "batch", "heads score")  # before the task is built
    folder = _folder(args.output, args.checkpoint)
    loaded = checkpoint.load(args.checkpoint, device=parse_device(args.device))
    data = held_out(loaded, args.examples, args.checkpoint)
    scores = importance(loaded.model, data, method=args.method, ablation=args.ablation)
    print_grid(scores)
    _print_extremes(scores, args.top)
    json_path = folder / "importance.json"
    scores.to_json(json_path)
    png = scores.plot(folder / "importance.png",
                      title=f"{Path(args.checkpoint).name}: head importance ({scores.method})")
    print(f"importance: {json_path} and {png}")
    return 0


def _folder(output: str | None, checkpoint: str) -> Path:
    """The report folder: ``-o DIR`` or ``headwise-reports/heads-score-<checkpoint>/``."""
    if output is not None and Path(output).suffix:
        raise ValueError(f"-o {output}: expected a folder (importance.json and importance.png "
                         "go inside it)")
    page, _ = report_paths(output, "heads-score", Path(checkpoint).resolve().name)
    return page.parent


def held_out(loaded, examples: int, where: str):
    """``examples`` held-out examples of the task a checkpoint was trained on."""
    from headwise.train.config import TrainConfig
    from headwise.train.recipe import task_for

    saved = loaded.metadata.get("train_config")
    if not saved:
        raise ValueError(f"checkpoint {where} has no saved training config (metadata "
                         "'train_config'), so there is no task to draw examples from; score it "
                         "in Python with headwise.importance(model, batches)")
    task = task_for(TrainConfig.from_dict(saved).resolved())
    return task.eval_set(examples)


def print_grid(scores) -> None:
    """One table per attention kind: layers down, heads across."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for kind in scores.kinds:
        t = scores[kind]
        console.print(f"{kind}: {scores.method} importance")
        table = Table()
        table.add_column("layer")
        for h in range(t.shape[1]):
            table.add_column(f"H{h}", justify="right")
        for layer, row in enumerate(t.tolist()):
            table.add_row(str(layer), *("–" if v != v else f"{v:.3g}" for v in row))
        console.print(table)


def _print_extremes(scores, top: int) -> None:
    ranked = scores.ranked()

    def fmt(rows):
        return ", ".join(f"{kind} L{layer} H{head} ({v:.3g})" for kind, layer, head, v in rows)

    print(f"most important: {fmt(ranked[:top])}")
    print(f"least important: {fmt(ranked[::-1][:top])}")
