"""``headwise heads score``: score every head of a checkpoint and write the importance grid.

    headwise heads score --checkpoint headwise-demo/checkpoint
    headwise heads score --checkpoint runs/lm --method ablation --ablation mean -o scores/
    headwise heads score --checkpoint headwise-demo/checkpoint --compare
    headwise heads score --hf path/to/saved_model --sentences my_text.txt --examples 8

The data are held-out examples of the task the checkpoint was trained on (its saved training
config); with ``--hf DIR`` (any local Hugging Face model, :mod:`headwise.commands._hf`) windows
of its own tokens of *Emma* or of ``--sentences FILE``, scored by its next-token loss (an
encoder: a behaviour method on sentences). Prints how the scores were made (method, examples, agreement with single-head zero
ablation on the same examples, computed for every method that estimates it), the
``(layers, heads)`` grid of each attention kind and the most and least important heads; writes
``importance.json`` and ``importance.png`` to the report folder
(``headwise-reports/heads-score-<checkpoint>/``, or ``-o DIR``).

``--compare`` checks the methods against what removing heads does: every ranking method on the
same examples, the Spearman correlations between them, and the task's metric on as many *other*
held-out examples after zeroing the k = 10% and 25% least important heads by each method,
against k random heads (mean of 10 draws); written to ``compare.md`` too. The metric: exact
match by greedy decoding (sequence-to-sequence tasks scored by exact match), else the held-out
loss per token (language models; translation, whose small presets barely move BLEU).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from headwise.commands import _flags as F
from headwise.commands._common import parse_device, report_paths
from headwise.commands._flags import flag

# torch is imported inside run: `headwise heads score --help` stays fast
HELP = "score every head (greedy ablation by default, or another method) and write the grid"
EXAMPLE = "headwise heads score --checkpoint headwise-demo/checkpoint --method ablation"


FLAGS = (
    F.OneOf((F.CHECKPOINT, F.hf(
        "a causal LM scored by its next-token loss on windows of --length tokens of Emma (`make "
        "corpora`) or of --sentences FILE; an encoder has no loss: use a behaviour method on "
        "its sentences")), required=True),
    *F.DATA,
    flag("--method", default="greedy",
         help="greedy (default: heads zeroed one by one, each time the one whose removal raises "
              "the loss least), ablation (the loss change when the head alone is removed), "
              "attribution (its first-order estimate), gradient (Michel et al. 2019), or a "
              "behaviour: prev_token, induction, sink, entropy"),
    flag("--ablation", default="zero", choices=("zero", "mean"),
         help="what removing a head means (greedy, ablation, attribution): zero its output, or "
              "set it to its mean"),
    flag("--compare", action="store_true",
         help="compare every ranking method: Spearman between them, and the task's metric on "
              "other held-out examples after removing each one's 10%% and 25%% least important "
              "heads, against random heads (10 draws)"),
    flag("--top", type=int, default=5, at_least=1,
         help="how many most/least important heads to list (default 5)"),
    F.output("heads-score-CHECKPOINT"),
    F.DEVICE,
)


def register(subparsers) -> None:
    F.parser(subparsers, "score", "Score every head of a checkpoint on held-out examples of its "
             "training task: print the (layers, heads) grid per attention kind and the most and "
             "least important heads; write importance.json and importance.png.", FLAGS, run,
             full_command="heads score")


def run(args: argparse.Namespace) -> int:
    from headwise import checkpoint
    from headwise.analysis.scoring import METHODS, importance
    from headwise.cli import did_you_mean

    if args.method not in METHODS:  # before any model loads
        raise ValueError(f"unknown method {args.method!r} for --method; choose from "
                         f"{', '.join(METHODS)}{did_you_mean(args.method, METHODS)}")
    if args.hf and args.compare:
        raise ValueError("--compare measures a checkpoint's task metric; with --hf, score one "
                         "method at a time (--method)")
    if args.hf is None and args.sentences is not None:
        raise ValueError("--sentences goes with --hf (a checkpoint is scored on its own task)")
    folder = _folder(args.output, args.checkpoint or args.hf)
    if args.hf:
        model, data = _hf(args)
    else:
        loaded = checkpoint.load(args.checkpoint, device=parse_device(args.device))
        model, data = loaded.model, held_out(loaded, args.examples, args.checkpoint)
    scores = importance(model, data, method=args.method, ablation=args.ablation)
    if args.method in ESTIMATES and scores.agreement is None:  # greedy (zero) brings its own
        scores = scores.with_agreement(importance(model, data, method="ablation"))
    print(f"importance: {scores.describe()}")
    print_grid(scores)
    _print_extremes(scores, args.top)
    json_path = folder / "importance.json"
    scores.to_json(json_path)
    name = Path(args.checkpoint or args.hf).name
    png = scores.plot(folder / "importance.png",
                      title=f"{name}: head importance ({scores.method})")
    print(f"importance: {json_path} and {png}")
    if args.compare:
        _compare(loaded, args, folder)
    return 0


def _hf(args):
    """``--hf DIR``: the model and its batches. Every check that needs no weights comes first
    (the model's kind from its configuration, the method against it, the text), and what fails
    of them is one line together, so a user with two things to fix is told both at once, in
    seconds, before the weights load."""
    from headwise.analysis.scoring import BEHAVIOURS
    from headwise.commands import _hf as hf
    from headwise.errors import USER_ERRORS, one_line

    found = hf.model_kind(args)
    wrong = []
    if found == "encoder_self" and args.method not in BEHAVIOURS:
        wrong.append(f"--hf {args.hf} is an encoder: it has no next-token loss for method "
                     f"{args.method!r}; pass --method with one of {', '.join(BEHAVIOURS)}")
    try:
        data = hf.read_data(args, found)
    except USER_ERRORS as exc:
        if not wrong:
            raise
        wrong.append(f"and its text: {one_line(exc)}")
    if wrong:
        raise ValueError("; ".join(wrong))
    device = parse_device(args.device)
    model, tokenizer = hf.load(args.hf, device)
    return model, hf.batches(model, tokenizer, data, args, device)[0]


ESTIMATES = ("greedy", "attribution", "gradient")  # rankings checked against zero ablation
COMPARED = ("greedy", "ablation", "attribution", "gradient")


def _compare(loaded, args, folder: Path) -> None:
    """Every ranking method on the scoring examples; the metric after removing heads on as many
    other held-out examples; printed and written to ``compare.md``."""
    from headwise.analysis.removal import compare
    from headwise.analysis.scoring import importance
    from headwise.models import head_counts

    data, measured, task = held_out(loaded, args.examples, args.checkpoint,
                                    measured=args.examples)
    metric, name, higher = task_metric(task, measured)
    heads = sum(sum(c) for c in head_counts(loaded.model).values())
    most = max(1, round(0.25 * heads))  # compare's largest k: greedy need go no further
    ranked = {m: importance(loaded.model, data, method=m, ablation=args.ablation,
                            **({"steps": most} if m == "greedy" else {}))
              for m in COMPARED}
    found = compare(loaded.model, ranked, metric, higher=higher)
    text = (f"{Path(args.checkpoint).name}: rankings on {args.examples} held-out examples, "
            f"{name} on {args.examples} others ({'higher' if higher else 'lower'} is better; "
            f"heads removed = zeroed, ablation {args.ablation})\n\n{found.table(name)}\n")
    print(text)
    (folder / "compare.md").write_text(text, encoding="utf-8")
    print(f"compare: {folder / 'compare.md'}")


def task_metric(task, measured):
    """``(metric(model) -> float, name, higher)`` of a task on the held-out batch ``measured``:
    exact match by greedy decoding where the task is scored by it, else the loss per token."""
    from headwise.analysis.removal import seq2seq_metrics
    from headwise.analysis.run import default_loss
    from headwise.data import Seq2SeqBatch

    if isinstance(measured, Seq2SeqBatch) and task.metric == "exact_match":
        return (lambda m: seq2seq_metrics(m, measured, task.tokenizer)["exact_match"],
                "exact match", True)
    return lambda m: float(default_loss(m, measured)), "loss/token", False


def _folder(output: str | None, checkpoint: str) -> Path:
    """The report folder: ``-o DIR`` or ``headwise-reports/heads-score-<checkpoint>/``."""
    if output is not None and Path(output).suffix:
        raise ValueError(f"-o {output}: expected a folder (importance.json and importance.png "
                         "go inside it)")
    page, _ = report_paths(output, "heads-score", Path(checkpoint).resolve().name)
    return page.parent


def held_out(loaded, examples: int, where: str, *, measured: int = 0):
    """``examples`` held-out examples of the task a checkpoint was trained on; with
    ``measured``, also that many other held-out examples and the task:
    ``(examples, others, task)``."""
    from headwise.train.config import TrainConfig
    from headwise.train.recipe import task_for

    saved = loaded.metadata.get("train_config")
    if not saved:
        raise ValueError(f"checkpoint {where} has no saved training config (metadata "
                         "'train_config'), so there is no task to draw examples from; score it "
                         "in Python with headwise.importance(model, batches)")
    task = task_for(TrainConfig.from_dict(saved).resolved())
    if not measured:
        return task.eval_set(examples)
    both = task.eval_set(examples + measured)
    names = [f.name for f in dataclasses.fields(both)]
    first, second = (type(both)(**{n: getattr(both, n)[part] for n in names})
                     for part in (slice(0, examples), slice(examples, None)))
    return first, second, task


def print_grid(scores, width: int | None = None) -> None:
    """One grid per attention kind, layers down and heads across, that fits the terminal
    (``width`` columns, default the terminal's: ``$COLUMNS``)."""
    import shutil

    width = width or shutil.get_terminal_size().columns
    for kind in scores.kinds:
        print("\n".join(grid(scores[kind].tolist(), f"{kind}: {scores.method} importance",
                              width)))


def grid(rows: list[list[float]], title: str, width: int = 80) -> list[str]:
    """The lines of one ``(layers, heads)`` grid within ``width`` columns: every value as a
    whole number of at most three digits, scaled by one power of ten said in the title (the
    largest value keeps three significant digits), ``–`` for a head not scored; heads that do
    not fit across go on in another block below."""
    import math

    finite = [abs(v) for row in rows for v in row if v == v and math.isfinite(v)]
    big = max(finite, default=0.0)
    power = 2 - math.floor(math.log10(big)) if big > 0 else 0
    cells = [["–" if v != v else str(round(v * 10.0 ** power)) if math.isfinite(v) else
              ("inf" if v > 0 else "-inf") for v in row] for row in rows]
    heads = max(map(len, rows), default=0)
    cell = max([len(f"H{heads - 1}"), *(len(c) for row in cells for c in row)]) + 1
    label = max(len("layer"), len(str(len(rows) - 1)))
    across = max(1, (width - label) // (cell + 1))
    scale = "" if power == 0 else (f" (shown x {10.0 ** power:g}: {round(big * 10 ** power)} "
                                   f"is {big:.3g})")
    lines = [title + scale]
    for first in range(0, heads, across):
        part = range(first, min(heads, first + across))
        lines.append(f"{'layer':>{label}} " + " ".join(f"{f'H{h}':>{cell}}" for h in part))
        lines += [f"{layer:>{label}} " + " ".join(f"{row[h] if h < len(row) else '':>{cell}}"
                                                  for h in part)
                  for layer, row in enumerate(cells)]
    return lines


def _print_extremes(scores, top: int) -> None:
    ranked = scores.ranked()

    def fmt(rows):
        return ", ".join(f"{kind} L{layer} H{head} ({v:.3g})" for kind, layer, head, v in rows)

    print(f"most important: {fmt(ranked[:top])}")
    print(f"least important: {fmt(ranked[::-1][:top])}")
