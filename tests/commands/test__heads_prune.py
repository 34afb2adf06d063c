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
    assert "0/24 (0%)" in out and "6/24 (25%)" in out and ", 1.00x" in out
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


@pytest.mark.parametrize("load, contradicts", [
    ([1.0] * 5, False),  # a steady machine: 9.0 ms, 0.90x
    ([1.0, 1.0, 1.0, 0.7, 0.7], False),
    ([1.0, 1.0, 1.0, 1.3, 1.3], True),  # medians 10.0 vs 11.7 ms, "1.17x", but 0.90x per round
])
def test_the_ms_and_ratio_columns_say_why_they_disagree(load, contradicts):
    """Under a load that changes between rounds the ms medians and the median of per-round
    ratios can contradict each other (a pruned model with fewer ms but a ratio > 1); the table
    labels both and marks and explains exactly the rows where they differ by over 5%."""
    import statistics
    from types import SimpleNamespace

    from headwise.analysis.prune_sweep import Step
    from headwise.commands._heads_prune import DISAGREE, _table

    # 5 rounds; every model takes the same time within a round, the load drifts by round
    base = {0: 10.0, 0.5: 9.0}  # the pruned model is 10% faster in every round
    times = {f: [b * x for x in load] for f, b in base.items()}
    times[0.5][1] *= 3  # one slow outlier round for the pruned model
    steps = [Step(f, int(f * 8), 8, 1.0, {"w": statistics.median(t)},
                  {"w": statistics.median(a / b for a, b in zip(t, times[0], strict=True))})
             for f, t in times.items()]
    text = _table(SimpleNamespace(name="m", workloads="w", metric_name="acc"), steps)
    assert "ms (median)" in text and "median ratio" in text
    assert steps[1].ratio["w"] == pytest.approx(0.9)  # the drift cancels in each round
    of_medians = steps[1].latency_ms["w"] / steps[0].latency_ms["w"]
    odd = abs(of_medians / 0.9 - 1) > DISAGREE
    row = next(ln for ln in text.splitlines() if ln.startswith("4/8"))
    assert row.endswith(" *") == odd and ("trust the ratio" in text) == odd, (text, of_medians)
    assert odd == contradicts
