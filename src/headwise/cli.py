"""``headwise`` command line. Each subcommand lives in ``headwise/commands/<name>.py`` and
exposes ``HELP`` (one line), ``EXAMPLE`` (one command line) and ``register(subparsers)``, whose
parser sets ``func=run(args)``.

Start-up stays under a second: command modules import torch and other heavy modules only inside
their run function, and only the parser of the command being run is built (the others are
listed by their ``HELP`` line). Errors a user can cause (bad arguments, missing files,
inconsistent sizes: :data:`headwise.errors.USER_ERRORS`) exit 2 with one readable line, never a
traceback; any other exception is a bug in headwise and prints its full traceback (exit 1). A
mistyped command or flag gets a "did you mean".
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import pkgutil
import sys
import traceback
from collections.abc import Collection

from headwise import __version__, commands
from headwise.errors import USER_ERRORS, one_line

__all__ = ["USER_ERRORS", "Subparsers", "build_parser", "command_names", "main"]


def command_names() -> list[str]:
    """Every subcommand, from the module names in ``headwise/commands`` (nothing imported)."""
    return sorted(m.name for m in pkgutil.iter_modules(commands.__path__)
                  if not m.name.startswith("_"))


def did_you_mean(word: str, choices) -> str:
    """``"; did you mean 'trace'?"`` for a close match among ``choices``, else ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class Parser(argparse.ArgumentParser):
    """argparse with "did you mean" for invalid choices (commands, ``--kind`` values, ...)."""

    def _check_value(self, action, value):
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(repr, action.choices))
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r} (choose from {choices})"
                + did_you_mean(value, action.choices))


class _Formatter(argparse.HelpFormatter):
    """Wraps descriptions as usual but keeps the ``example:`` epilog's lines as written."""

    def _fill_text(self, text, width, indent):
        if text.startswith("example:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class Subparsers:
    """What a command's ``register`` receives: ``add_parser`` with the module's ``HELP`` line,
    its ``EXAMPLE`` as the epilog and our parser class."""

    def __init__(self, action, module):
        self.action, self.module = action, module

    def add_parser(self, name, **kwargs):
        kwargs.setdefault("help", self.module.HELP)
        kwargs.setdefault("epilog", f"example:\n  {self.module.EXAMPLE}")
        kwargs.setdefault("formatter_class", _Formatter)
        return self.action.add_parser(name, **kwargs)


def build_parser(full: Collection[str] | None = None) -> Parser:
    """The ``headwise`` parser. The commands in ``full`` (default: all) get their own parser
    (importing what their ``register`` needs); every other command is a one-line entry, which
    is all ``headwise --help`` and the choice check need."""
    parser = Parser(prog="headwise", description="Multi-head attention that is fast and "
                    "see-through.", epilog="example:\n  headwise demo\n\n"
                    "`headwise COMMAND --help` for a command's options and an example.",
                    formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"headwise {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    subparsers.required = True
    for name in command_names():
        module = importlib.import_module(f"headwise.commands.{name}")
        if full is None or name in full:
            module.register(Subparsers(subparsers, module))
        else:
            subparsers.add_parser(name, help=module.HELP)
    return parser


def _command_in(argv: list[str]) -> str | None:
    """The subcommand named in ``argv``: the first word that is not an option (the top-level
    parser takes no option with a value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def _check_flags(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Report an unknown ``--flag`` of a subcommand with that subcommand's usage and the
    closest real flag, before argparse complains about something else (a required option the
    typo was meant to be)."""
    known = [s for a in parser._actions for s in a.option_strings]
    nested = next((a.choices for a in parser._actions
                   if isinstance(a, argparse._SubParsersAction)), None)
    word = _command_in(argv)
    if nested and word in nested:  # `headwise heads catalogue --flag`: the subcommand's flags
        _check_flags(nested[word], argv[argv.index(word) + 1:])
        argv = argv[:argv.index(word)]
    for arg in argv:
        if arg == "--":
            return
        if not arg.startswith("--"):
            continue
        flag = arg.split("=", 1)[0]
        if flag in known or sum(k.startswith(flag) for k in known) == 1:
            continue  # exact, or an unambiguous prefix argparse accepts
        parser.error(f"unrecognized argument {flag}" + did_you_mean(flag, known))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command_in(argv)
    parser = build_parser([command] if command else [])
    sub = parser._subparsers._group_actions[0].choices.get(command) if command else None
    if sub is not None:
        _check_flags(sub, argv[argv.index(command) + 1:])
    args, extra = parser.parse_known_args(argv)
    if extra:
        (sub or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        result = args.func(args)
    except KeyboardInterrupt:
        print("headwise: interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as exc:
        # a nested subcommand (``heads catalogue``) names itself with ``full_command``
        print(f"headwise {getattr(args, 'full_command', args.command)}: error: "
              f"{one_line(exc)}", file=sys.stderr)
        return 2
    except Exception:  # a bug in headwise: everything a maintainer needs to act on it
        traceback.print_exc()
        print(f"headwise {args.command}: internal error (a bug in headwise, not in your input); "
              "please report it with the traceback above", file=sys.stderr)
        return 1
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
