"""``headwise heads prune`` end to end on a (barely) trained reversal model: the table, the JSON
rows and the plot in the report folder; bad arguments are one-line errors."""

from __future__ import annotations

import json

import pytest

from headwise.analysis.head_scores import HeadScores
from headwise.cli import main


@pytest.fixture(scope="module")
def reversal_checkpoint(tmp_path_factory):
    from headwise.commands.demo import demo_config
    from headwise.train import train

    out = tmp_path_factory.mktemp("reverse")
    train(demo_config(steps=4), out=out, progress=False, verbose=False)
    return out / "checkpoint"


def test_prune_writes_the_table_json_and_plot(reversal_checkpoint, tmp_path, capsys):
    code = main(["heads", "prune", "--checkpoint", str(reversal_checkpoint), "--fractions",
                 "0,0.25", "--quick", "--rounds", "1", "-o", str(tmp_path / "report")])
    out = capsys.readouterr().out
    assert code == 0
    assert "0/24 (0%)" in out and "6/24 (25%)" in out and "(1.00x)" in out
    saved = json.loads((tmp_path / "report" / "prune.json").read_text())
    assert saved["metric"] == "exact match"
    assert [(r["fraction"], r["pruned"], r["heads"]) for r in saved["rows"]] == [
        (0, 0, 24), (0.25, 6, 24)]
    assert saved["rows"][0]["ratio"] == {"decode 256 strings": 1.0}
    assert 0 <= saved["rows"][1]["metric"] <= 1
    png = (tmp_path / "report" / "prune.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    grid = HeadScores.from_json((tmp_path / "report" / "importance.json").read_text())
    assert grid.method == "greedy" and "head order: greedy (zero) on 256 examples" in out
    assert {k: tuple(t.shape) for k, t in grid.scores.items()} == {
        "encoder_self": (2, 4), "decoder_self": (2, 4), "cross": (2, 4)}
    assert all(bool(t.isfinite().all()) and float(t.abs().sum()) > 0 for t in grid.scores.values())
    assert (tmp_path / "report" / "importance.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("argv, message", [
    (["--fractions", "0.1,0.2"], "--fractions must start at 0"),
    (["--fractions", "0,x"], "--fractions must be numbers"),
    (["--model", "minilm", "--checkpoint", "x"], "--checkpoint is for --model reverse"),
    (["--rounds", "0"], "--rounds must be >= 1"),
    (["-o", "table.html"], "expected a folder"),
    (["--threads", "100000"], "--threads must be an int in [1, "),  # was accepted
    (["--threads", "0"], "--threads must be an int in [1, "),  # was taken as "torch's default"
])
def test_bad_arguments_are_one_line_errors(argv, message, capsys):
    assert main(["heads", "prune", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
