"""The ``headwise`` command line: fast help (no torch), "did you mean", the subcommand's own
usage on its errors, ``--version`` and a runnable example in every help text."""

import shlex
import subprocess
import sys

import pytest

import headwise
from headwise.cli import build_parser, command_names, main
from headwise.errors import CheckpointError


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_import_cli_and_build_the_parser_imports_no_torch():
    loaded = _modules_after("import headwise.cli as c\nc.build_parser([])")
    assert "headwise.cli" in loaded and "torch" not in loaded and "numpy" not in loaded


@pytest.mark.parametrize("argv", [["--help"], *[[c, "--help"] for c in command_names()]])
def test_help_imports_no_torch(argv):
    code = ("import contextlib, io\nfrom headwise.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            f"    try:\n        main({argv!r})\n    except SystemExit as e:\n"
            "        assert e.code == 0, e.code\nassert 'usage: headwise' in out.getvalue()")
    loaded = _modules_after(code)
    assert "torch" not in loaded, f"headwise {' '.join(argv)} imported torch"


def test_the_package_still_exposes_its_api_lazily():
    import headwise.attend  # noqa: F401  (the functions' modules: importing them rebinds nothing)
    import headwise.decoding  # noqa: F401
    import headwise.tracing  # noqa: F401

    assert callable(headwise.trace) and headwise.trace.__name__ == "trace"
    assert callable(headwise.attention) and callable(headwise.generate)
    assert headwise.MultiHeadAttention.__name__ == "MultiHeadAttention"
    assert set(headwise.__all__) <= set(dir(headwise))
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        headwise.nonsense  # noqa: B018


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"headwise {headwise.__version__}"


@pytest.mark.parametrize("argv,usage,hint", [
    (["trce"], "usage: headwise [-h]", "did you mean 'trace'?"),
    (["view", "--chekpoint", "x", "--src", "ab"], "usage: headwise view", "did you mean '--checkpoint'?"),
    (["trace", "mha", "--embed-dimm", "8"], "usage: headwise trace", "did you mean '--embed-dim'?"),
    (["view", "--checkpoint", "x", "--kind", "crss"], "usage: headwise view", "did you mean 'cross'?"),
    (["params", "mha", "--heads", "2", "stray"], "usage: headwise params", "unrecognized arguments: stray"),
])
def test_mistakes_get_the_subcommand_usage_and_a_suggestion(argv, usage, hint, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and hint in err and "Traceback" not in err
    # the error line itself is one line, after the usage
    assert err.rstrip().splitlines()[-1].startswith(f"headwise{' ' + argv[0] if usage != 'usage: headwise [-h]' else ''}: error:")


def test_a_far_off_word_gets_no_suggestion(capsys):
    with pytest.raises(SystemExit):
        main(["zzzzqqq"])
    assert "did you mean" not in capsys.readouterr().err


@pytest.mark.parametrize("command", command_names())
def test_every_help_has_an_example_that_parses(command, capsys):
    parser = build_parser([command])
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    assert f"usage: headwise {command}" in text
    example = text.split("example:\n", 1)[1].strip().splitlines()[0]
    words = shlex.split(example)
    assert words[:2] == ["headwise", command]
    args = parser.parse_args(words[1:])  # the example is a valid command line
    assert args.command == command and callable(args.func)


def test_top_level_help_lists_every_command_with_its_help_line(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for name in command_names():
        assert f"    {name}" in text
    assert "example:\n  headwise demo" in text


@pytest.mark.parametrize("bug", [KeyError("step"), AttributeError("'NoneType' object has no "
                                                                  "attribute 'shape'"),
                                 TypeError("unsupported operand"), IndexError("list index"),
                                 RuntimeError("shape mismatch")])
def test_an_internal_bug_prints_its_traceback_and_exits_non_zero(monkeypatch, capsys, bug):
    """An exception that is not a user error, raised inside a command, is headwise's bug: the
    maintainer gets the whole traceback, the exit status is non-zero (and not 2, the user's)."""
    from headwise.commands import params

    def broken(args):
        raise bug

    monkeypatch.setattr(params, "run", broken)
    code = main(["params", "mha", "--embed-dim", "8", "--heads", "2"])
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback (most recent call last):" in err and "in broken" in err
    assert f"{type(bug).__name__}: " in err and "internal error" in err
    assert len(err.strip().splitlines()) > 3


@pytest.mark.parametrize("error", [
    ValueError("--heads must be >= 1, got 0"),
    CheckpointError("checkpoint folder 'x' does not exist"),
    FileNotFoundError(2, "No such file or directory", "corpus.txt"),
    PermissionError(13, "Permission denied", "out/model.safetensors"),
    IsADirectoryError(21, "Is a directory", "out"),
    NotADirectoryError(20, "Not a directory", "file/x"),
    OSError(30, "Read-only file system", "/ro/run"),
    OSError(28, "No space left on device", "/full/run"),
    ValueError("a message\nthat spans\nthree lines"),
])
def test_a_user_error_prints_exactly_one_line_and_exits_2(monkeypatch, capsys, error):
    from headwise.commands import params

    def refuse(args):
        raise error

    monkeypatch.setattr(params, "run", refuse)
    code = main(["params", "mha", "--embed-dim", "8", "--heads", "2"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("headwise params: error: ")
    assert "Traceback" not in err
    first = str(error).splitlines()[0]
    assert first in err


def test_a_real_user_error_from_a_real_command_is_one_line(capsys):
    code = main(["params", "mha", "--embed-dim", "30", "--heads", "4"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and "not divisible" in err
