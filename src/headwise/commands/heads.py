"""``headwise heads``: which heads matter and what they do (issue 14).

    headwise heads score --checkpoint headwise-demo/checkpoint
    headwise heads prune --model minilm
    headwise heads catalogue --model minilm --examples 512

One subcommand per module ``commands/_heads_<name>.py`` (each exposes ``HELP``, ``EXAMPLE``
and ``register(subparsers)`` like a top-level command); :data:`SUBCOMMANDS` lists them.
"""

from __future__ import annotations

import importlib

HELP = "which heads matter and what they do: importance, pruning, a dataset-level catalogue"
EXAMPLE = "headwise heads score --checkpoint headwise-demo/checkpoint"

SUBCOMMANDS = ("score", "prune", "catalogue")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "heads",
        description="Look at every head of a model over a dataset: `score` ranks the heads by "
                    "importance (greedy ablation by default; --compare checks every method) or "
                    "behaviour and writes the grid; `prune` cuts the "
                    "least important heads step by step and times the smaller models; "
                    "`catalogue` writes a page and JSON of each head's scores, typical pattern "
                    "and top tokens.")
    inner = p.add_subparsers(dest="heads_command", metavar="SUBCOMMAND")
    inner.required = True
    from headwise.cli import Subparsers  # the top level's add_parser: HELP, EXAMPLE, format

    for name in SUBCOMMANDS:
        module = importlib.import_module(f"headwise.commands._heads_{name}")
        module.register(Subparsers(inner, module))
