"""The ``headwise`` command line: fast help (no torch), "did you mean", the subcommand's own
usage on its errors, ``--version`` and a runnable example in every help text."""

import shlex
import subprocess
import sys

import pytest

import headwise
from headwise.cli import build_parser, command_names, main

# `train`'s options are defined next to the training loop (headwise.train imports torch), so its
# parser cannot be built without torch; every other command's help must not import it.
HELP_NEEDS_TORCH = {"train"}


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_import_cli_and_build_the_parser_imports_no_torch():
    loaded = _modules_after("import headwise.cli as c\nc.build_parser([])")
    assert "headwise.cli" in loaded and "torch" not in loaded and "numpy" not in loaded


@pytest.mark.parametrize("argv", [["--help"], *[[c, "--help"] for c in command_names()
                                                if c not in HELP_NEEDS_TORCH]])
def test_help_imports_no_torch(argv):
    code = ("import contextlib, io\nfrom headwise.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            f"    try:\n        main({argv!r})\n    except SystemExit as e:\n"
            "        assert e.code == 0, e.code\nassert 'usage: headwise' in out.getvalue()")
    loaded = _modules_after(code)
    assert "torch" not in loaded, f"headwise {' '.join(argv)} imported torch"


def test_the_package_still_exposes_its_api_lazily():
    import headwise.attention  # noqa: F401  (binds the submodule name; the function must win)
    import headwise.tracing  # noqa: F401  (trace's implementation: no name clash to win)

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
        main([command, "--help"]) if command not in HELP_NEEDS_TORCH else parser.parse_args(
            [command, "--help"])
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
