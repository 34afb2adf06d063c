"""docs/questions.md: every `$ headwise ...` block still prints what the page shows.

Run ``python tests/e2e/test_questions_doc.py --update`` to rewrite the outputs after a change.
Only whitespace is normalised (rich pads table lines to the console width).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "questions.md"
BLOCK = re.compile(r"```console\n\$ (headwise [^\n]*)\n(.*?)```", re.S)


def blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


def run(command: str) -> str:
    """Run one documented command in-process; return its stdout."""
    from headwise.cli import main

    argv = shlex.split(command)[1:]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    assert code == 0, f"{command} exited with {code}"
    return out.getvalue()


def normalise(text: str) -> str:
    return " ".join(text.split())


def test_the_page_asks_every_learner_question():
    text = DOC.read_text()
    for question in ("Where are the heads created", "no more parameters than one big head",
                     "hidden size is not the query size", "keys of size 3, values of size 2",
                     "each head's weights", "padding and causal masks"):
        assert question in text
    assert len(blocks(text)) >= 10


@pytest.mark.parametrize("command, shown", blocks(DOC.read_text()),
                         ids=[command for command, _ in blocks(DOC.read_text())])
def test_documented_output_is_still_true(command, shown, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # commands that write files (--png) write here
    got = run(command)
    assert normalise(got) == normalise(shown), f"{command}\n--- got ---\n{got}"
    assert got.strip(), command


def update() -> None:
    """Rewrite every block's output with what the command prints now."""
    text = DOC.read_text()
    cwd = os.getcwd()

    def fill(match: re.Match) -> str:
        command = match.group(1)
        os.chdir(DOC.parent)
        try:
            got = run(command)
        finally:
            os.chdir(cwd)
        lines = [line.rstrip() for line in got.rstrip("\n").splitlines()]
        return f"```console\n$ {command}\n" + "\n".join(lines) + "\n```"

    DOC.write_text(BLOCK.sub(fill, text))


if __name__ == "__main__":
    if "--update" in sys.argv:
        update()
        print(f"updated {DOC}")
