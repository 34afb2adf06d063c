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


# measured in the run (time, memory, float32 rounding between two kernels): compared with the
# numbers blanked, so the rest of the line (layout, kernel) still has to match
MEASURED = re.compile(r"\d ms |max \|difference\|")

# each answer's key lines: (a word of the command, patterns its output must contain)
KEY_LINES = [
    ("--vocab 33300", [r"split heads q +\(b=1, h=8, i=8, d=64\) +b n \(h d\) -> b h n d",
                       r"merge heads +\(b=1, i=8, \(h d\)=512\)"]),
    ("--out-dim 6", [r"MultiHeadAttention +self +sdpa"]),
    ("--tgt-pad 1", [r"self_attn: .*self-attention, causal, mask bool \(b=1, h=1, i=1, j=4\) = "
                     r"key padding", r"fused attention +\(b=1, h=2, i=4, d=8\) +sdpa\[weights @ v\].*"
                     r"mask: bool \(1, 1, 1, 4\); causal: is_causal"]),
    ("--explain", [r"folded == unfolded: yes", r"bit for bit: yes",
                   r"4\. fold \(optional\) +\(3, 2, 2, 3\) +-> \(6, 2, 3\)",
                   r"4-D \(b, h, n, d\) +FLASH_ATTENTION", r"3-D \(b\*h, n, d\) folded +MATH",
                   r"one big head of size h\*d=6 instead: .*\(a different function\)"]),
]


def normalise(text: str) -> str:
    lines = [re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#", line) if MEASURED.search(line) else line
             for line in text.splitlines()]
    return " ".join(" ".join(lines).split())


def _decoder_self_rows(out: str) -> list[list[str]]:
    block = out.split("decoder_self[0]:")[1].split("\n\n")[0]
    return [line.split()[1:] for line in block.splitlines() if line.strip().startswith("i=")]


def test_the_page_asks_every_learner_question():
    text = DOC.read_text()
    for question in ("Where are the heads created", "no more parameters than one big head",
                     "hidden size is not the query size", "keys of size 3, values of size 2",
                     "each head's weights", "padding and causal masks",
                     "folding just one huge single-head attention",
                     "keys and values come from the encoder output", "Bottom-right alignment",
                     "combined mask", "output size is a convention"):
        assert question in text
    assert len(blocks(text)) >= 10


@pytest.mark.parametrize("command, shown", blocks(DOC.read_text()),
                         ids=[command for command, _ in blocks(DOC.read_text())])
def test_documented_output_is_still_true(command, shown, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # commands that write files (--png) write here
    got = run(command)
    assert normalise(got) == normalise(shown), f"{command}\n--- got ---\n{got}"
    assert got.strip(), command
    for word, patterns in KEY_LINES:
        if word in command:
            for pattern in patterns:
                assert re.search(pattern, got), (command, pattern)
    if "--tgt-pad 1" in command:  # causal AND target padding: a triangle, last key column 0
        rows = _decoder_self_rows(got)
        assert len(rows) == 8 and all(row[-1] == "0" for row in rows)
        assert all(row[n + 1:] == ["0"] * (3 - n) for n, row in enumerate(rows[:4]))


def test_every_key_line_belongs_to_a_documented_command():
    commands = [command for command, _ in blocks(DOC.read_text())]
    for word, _ in KEY_LINES:
        assert any(word in command for command in commands), word


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
