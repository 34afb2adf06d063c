"""``headwise`` command line. Each subcommand lives in ``headwise/commands/<name>.py`` and
exposes ``register(subparsers)``; the parser set by ``register`` must set ``func=run(args)``.

Errors a user can cause (bad arguments, missing files, inconsistent sizes) exit non-zero with
one readable line, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from headwise import commands
from headwise.errors import HeadwiseError

USER_ERRORS = (HeadwiseError, ValueError, TypeError, FileNotFoundError, NotADirectoryError,
               IsADirectoryError, PermissionError, KeyError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="headwise", description="Multi-head attention that is fast and see-through.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"headwise.commands.{info.name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except KeyboardInterrupt:
        print("headwise: interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"headwise {args.command}: error: {message}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
