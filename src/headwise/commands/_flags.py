"""The commands' flags, each declared once, and the one check of their ranges.

A command's parser is a table (:func:`parser`): rows made with :func:`flag` for its own flags,
or taken from here for the flags several commands share (:data:`DEVICE`, :func:`output`,
:data:`DATA`, :data:`SIZES`, ...; ``ROW.but(help=...)`` where one command words it for its own
case). :class:`OneOf` is a mutually exclusive choice, :class:`Group` a titled part of
``--help``.

A row's ``at_least`` (and ``limit``, a :data:`headwise.limits.MAX` kind) is the range its value
must lie in: :func:`parser` makes the command check every one of them before its ``run`` starts
(one line: ``--examples must be >= 1, got 0``), before any model loads or tensor is made.

Imports nothing heavy: ``headwise COMMAND --help`` stays fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["DATA", "DEVICE", "GGUF", "KINDS", "SIZES", "Flag", "Group", "OneOf", "check", "flag",
           "hf", "output", "parser"]


@dataclass(frozen=True)
class Flag:
    """One flag: ``add_argument(*names, **options)``; its value must be ``>= at_least`` and
    within the :data:`headwise.limits.MAX` ``limit`` kind (None: not checked)."""

    names: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)
    at_least: float | None = None
    limit: str | None = None

    def but(self, **options) -> Flag:
        """The same flag with some options changed (a command's own help or default)."""
        return replace(self, options={**self.options, **options})

    @property
    def dest(self) -> str:
        long = next((n for n in self.names if n.startswith("--")), self.names[0])
        return self.options.get("dest", long.lstrip("-").replace("-", "_"))


@dataclass(frozen=True)
class OneOf:
    """Rows of which at most one may be given (exactly one when ``required``)."""

    rows: tuple[Flag, ...]
    required: bool = False


@dataclass(frozen=True)
class Group:
    """Rows shown under a title in ``--help``."""

    title: str
    rows: tuple[Row, ...]


Row = Flag | OneOf | Group


def flag(*names: str, at_least: float | None = None, limit: str | None = None,
         **options) -> Flag:
    """A row: ``flag("--top", type=int, default=5, at_least=1, help=...)``."""
    return Flag(names, options, at_least, limit)


def flags(rows: Iterable[Row]) -> Iterator[Flag]:
    """Every :class:`Flag` of ``rows``, groups and choices opened."""
    for row in rows:
        if isinstance(row, Flag):
            yield row
        else:
            yield from flags(row.rows)


def _add(target, rows: Iterable[Row], parser: argparse.ArgumentParser) -> None:
    for row in rows:
        if isinstance(row, Flag):
            target.add_argument(*row.names, **row.options)
        elif isinstance(row, OneOf):
            _add(target.add_mutually_exclusive_group(required=row.required), row.rows, parser)
        else:
            _add(parser.add_argument_group(row.title), row.rows, parser)


def parser(subparsers, name: str, description: str, rows: Iterable[Row],
           run: Callable[[argparse.Namespace], int], **defaults) -> argparse.ArgumentParser:
    """The parser of command ``name`` built from its table; ``func`` checks every row's range
    (:func:`check`) and then calls ``run``. ``defaults``: more ``set_defaults`` (as
    ``full_command``)."""
    rows = tuple(rows)
    p = subparsers.add_parser(name, description=description)
    _add(p, rows, p)
    p.set_defaults(func=_Checked(tuple(flags(rows)), run,
                                 defaults.get("full_command", name)), **defaults)
    return p


@dataclass(frozen=True)
class _Checked:
    """``func`` of a parser: :func:`check`, then the command's ``run``."""

    rows: tuple[Flag, ...]
    run: Callable[[argparse.Namespace], int]
    command: str

    def __call__(self, args: argparse.Namespace) -> int:
        check(args, self.rows, self.command)
        return self.run(args)


def check(args: argparse.Namespace, rows: Iterable[Flag], command: str) -> None:
    """Every given value within its row's range, else one ValueError naming the flag."""
    for row in rows:
        value = getattr(args, row.dest, None)
        if value is None or isinstance(value, (bool, str, list)):
            continue
        name = row.names[-1]
        if row.at_least is not None and value < row.at_least:
            raise ValueError(f"{name} must be >= {row.at_least}, got {value}")
        if row.limit is not None:
            from headwise import limits
            limits.size(value, name, row.limit, command)


# ------------------------------------------------------------------- flags several commands take
DEVICE = flag("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
THREADS = flag("--threads", type=int, metavar="T", help="torch threads (default: torch's)")
SEED = flag("--seed", type=int, default=0, help="random seed (default 0)")
QUIET = flag("--quiet", action="store_true", help="no progress bar")
TITLE = flag("--title", help="page title")
CHECKPOINT = flag("--checkpoint", metavar="DIR", help="a headwise checkpoint folder")
GGUF = flag("--gguf", metavar="FILE",
            help="a llama-architecture GGUF file instead of SmolLM2-135M-Instruct's")
GENERATE = flag("--generate", type=int, default=0, metavar="N", at_least=0,
                help="a decoder (a language model, smollm2): continue the text greedily by up "
                     "to N tokens and show the attention over prompt + continuation in one view "
                     "(what each new token looked at)")
MAX_NEW_TOKENS = flag("--max-new-tokens", type=int, metavar="N", at_least=1)
HEATMAPS = flag("--heatmaps", metavar="FILE.png|svg|pdf",
                help="the heatmap grid's file (default: heatmaps.png in the report folder)")


def hf(reads: str) -> Flag:
    """``--hf DIR``, a local Hugging Face model (:mod:`headwise.commands._hf`); ``reads``:
    what the command runs it on."""
    return flag("--hf", metavar="DIR",
                help="any local Hugging Face model folder (or .gguf file) on attn_implementation="
                     f"'headwise', with its own tokenizer: {reads}; nothing downloads")


def output(folder: str, file: str | None = None) -> Flag:
    """``-o/--output``: the report folder (default ``headwise-reports/FOLDER/``), or with
    ``file`` (what a ``.html`` path names) one page."""
    return flag("-o", "--output", metavar="DIR|FILE.html" if file else "DIR",
                help=f"report folder{f', or {file}' if file else ''} (default: "
                     f"headwise-reports/{folder}/)")


#: what ``--hf`` (and the pretrained models) of ``heads score`` and ``heads catalogue`` run on
DATA = (
    flag("--sentences", metavar="FILE",
         help="the text: one sentence per line for an encoder (default: the English side of "
              "the Ding pairs), one text cut into windows for a causal LM (default: Austen's "
              "Emma; both from `make corpora`)"),
    flag("--length", type=int, default=128, at_least=1, limit="length",
         help="a causal LM: tokens per window (default 128)"),
    flag("--examples", type=int, default=256, at_least=1, limit="batch",
         help="inputs to run: held-out examples of a checkpoint's task, sentences or windows "
              "(default 256)"),
    flag("--batch-size", type=int, default=32, at_least=1, help="inputs per forward pass "
                                                                 "(default 32)"),
)

#: the models ``params`` and ``trace`` build from nothing, and their sizes
KINDS = ("mha", "encoder", "decoder", "transformer", "lm")
SIZES = (
    flag("--embed-dim", type=int, default=512, at_least=1, limit="dim",
         help="model dim m (default 512)"),
    flag("--heads", type=int, default=8, at_least=1, limit="heads",
         help="query heads h (default 8)"),
    flag("--head-dim", type=int, at_least=1, limit="dim", help="per-head size d (default m // h)"),
    flag("--kv-heads", type=int, at_least=1, limit="heads",
         help="key/value heads g (grouped-query)"),
    flag("--kdim", type=int, at_least=1, limit="dim", help="mha: key input size (cross-attention)"),
    flag("--vdim", type=int, at_least=1, limit="dim",
         help="mha: value input size (cross-attention)"),
    flag("--out-dim", type=int, at_least=1, limit="dim",
         help="mha: output size (default m: headwise returns to the query size)"),
    flag("--ff", type=int, at_least=1, limit="dim",
         help="models: feed-forward width (default 4 * m)"),
    flag("--vocab", type=int, default=1000, at_least=1, limit="vocab",
         help="models: vocabulary size (default 1000)"),
    flag("--layers", type=int, default=6, at_least=1, limit="layers",
         help="models: blocks per stack (default 6)"),
)
