"""``headwise chat`` answers a factual question correctly (greedy), streams it, reports tok/s,
and turns bad arguments into one-line errors."""

from __future__ import annotations

import pytest

from headwise.cli import main


def test_chat_answers_the_capital_of_france(smollm2_path, capsys):
    assert main(["chat", "What is the capital of France?", "--max-new-tokens", "24",
                 "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    assert "Paris" in out
    assert "tok/s" in err and "new tokens" in err


@pytest.mark.parametrize("argv, message", [
    (["--top-p", "0.9"], "--top-p samples; give --temperature"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--gguf", "/nonexistent/model.gguf"], "model.gguf does not exist"),
    (["--max-new-tokens", "9000"], "context is 8192 tokens: ask for at most"),
])
def test_bad_arguments_are_one_line_errors(smollm2_path, capsys, argv, message):
    assert main(["chat", "Hi", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
