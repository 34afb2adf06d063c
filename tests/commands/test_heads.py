"""`headwise heads`: the subcommand group; each subcommand registers like a top-level command."""

import importlib

import pytest

from headwise.cli import build_parser, main
from headwise.commands.heads import SUBCOMMANDS


def test_every_subcommand_has_its_module_and_help(capsys):
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"headwise.commands._heads_{name}")
        assert module.HELP and module.EXAMPLE.startswith(f"headwise heads {name}")
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["heads", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SUBCOMMANDS) and "example:" in out


def test_a_missing_or_unknown_subcommand_is_a_usage_error(capsys):
    for argv in (["heads"], ["heads", "scroe"]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 2
    assert "Traceback" not in capsys.readouterr().err
