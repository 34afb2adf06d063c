"""The commands' flag tables: a row's range is checked once, before the command's run starts
(no model loads, nothing is read), in one readable line; groups and choices build as argparse's;
a shared row reads the same in every command that takes it."""

from __future__ import annotations

import argparse

import pytest

from headwise.cli import build_parser, main
from headwise.commands import _flags as F


@pytest.mark.parametrize("argv, message", [
    (["heads", "catalogue", "--checkpoint", "x", "--window", "0"], "--window must be >= 1, got 0"),
    (["heads", "score", "--checkpoint", "x", "--examples", "0"], "--examples must be >= 1, got 0"),
    (["heads", "prune", "--rounds", "0"], "--rounds must be >= 1, got 0"),
    (["view", "--checkpoint", "x", "--generate", "-1"], "--generate must be >= 0, got -1"),
    (["chat", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    (["params", "mha", "--heads", "5000"], "--heads=5000 is over the maximum 4,096"),
    (["trace", "mha", "--seq", "0"], "--seq must be >= 1, got 0"),
])
def test_a_range_is_refused_before_the_command_runs(monkeypatch, capsys, argv, message):
    import importlib

    name = {"heads": f"_heads_{argv[1]}"}.get(argv[0], argv[0])
    module = importlib.import_module(f"headwise.commands.{name}")
    runner = "run_command" if name == "trace" else "run"

    def never(args):
        raise AssertionError("run started before the flags were checked")

    monkeypatch.setattr(module, runner, never)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    full = " ".join(argv[:2]) if argv[0] == "heads" else argv[0]
    assert err.startswith(f"headwise {full}: error: ")


def test_groups_and_choices_build_as_argparse_does(capsys):
    parser = build_parser(["trace", "explain"])
    trace = parser._subparsers._group_actions[0].choices["trace"]
    titles = [g.title for g in trace._action_groups]
    assert {"sizes", "run", "output"} <= set(titles)
    sizes = next(g for g in trace._action_groups if g.title == "sizes")
    assert [a.option_strings[0] for a in sizes._group_actions][:3] == ["--embed-dim", "--heads",
                                                                       "--head-dim"]
    # trace reads "not given" as None (a checkpoint's sizes are its own); params gets defaults
    args = parser.parse_args(["trace", "mha"])
    assert args.embed_dim is None and args.heads is None
    assert build_parser(["params"]).parse_args(["params"]).embed_dim == 512
    with pytest.raises(SystemExit):
        main(["explain", "text", "--model", "smollm2", "--hf", "x"])
    assert "not allowed with argument --model" in capsys.readouterr().err


def test_a_row_changed_with_but_keeps_the_rest_and_check_skips_what_is_not_given():
    chat_device = F.DEVICE.but(help="cpu only")
    assert chat_device.names == ("--device",) and chat_device.options["default"] == "cpu"
    assert F.DEVICE.options["help"] == "cpu, cuda, cuda:1, ..."  # the shared row is unchanged
    assert F.flag("--window", dest="sliding_window").dest == "sliding_window"
    assert F.flag("-o", "--output").dest == "output"
    rows = (F.flag("--n", type=int, at_least=1, limit="batch"),)
    F.check(argparse.Namespace(n=None), rows, "x")  # not given: nothing to check
    with pytest.raises(ValueError, match=r"x: --n=2000000 is over the maximum"):
        F.check(argparse.Namespace(n=2_000_000), rows, "x")


def test_every_command_that_takes_a_shared_flag_reads_it_from_one_row():
    """--device, --gguf, --checkpoint and the --hf data flags: one declaration each; a command
    that words one for itself says so with .but (its names and type unchanged)."""
    parser = build_parser()
    seen: dict[str, set] = {}

    def walk(p, where):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, f"{where} {name}".strip())
            elif a.option_strings:
                seen.setdefault(a.option_strings[-1], set()).add((a.type, a.nargs, a.const))
    walk(parser, "")
    for name in ("--device", "--gguf", "--checkpoint", "--sentences", "--length",
                 "--examples", "--batch-size", "--generate", "--threads", "--hf"):
        assert len(seen[name]) == 1, (name, seen[name])
