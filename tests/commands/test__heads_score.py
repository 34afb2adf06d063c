"""``headwise heads score`` end to end on a tiny saved reversal checkpoint: the grid it prints
and saves equals headwise.importance on the same held-out examples, with how it was made and
its agreement with ablation; ``--compare`` prints and writes the table of every method against
random heads; user errors are one line."""

from __future__ import annotations

import json

import pytest
import torch

import headwise as hw
from headwise.cli import main


@pytest.fixture(scope="module")
def reverse_checkpoint(tmp_path_factory):
    from headwise import checkpoint
    from headwise.data.tokenizers import CharTokenizer
    from headwise.models import TransformerConfig, build

    torch.manual_seed(0)
    tok = CharTokenizer("abcdefghij")
    cfg = TransformerConfig(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size,
                            d_model=16, num_heads=2, num_layers=2, d_ff=32, max_len=32,
                            dropout=0.0, pad_id=tok.pad_id)
    root = tmp_path_factory.mktemp("ckpt")
    saved = checkpoint.save(root / "rev", build(cfg), cfg, tok,
                            metadata={"train_config": {"task": "reverse", "min_len": 4,
                                                       "max_len": 16, "num_symbols": 10}})
    bare = checkpoint.save(root / "bare", build(cfg), cfg, tok)
    return saved, bare


@pytest.mark.parametrize("method", ["greedy", "gradient", "ablation", "sink"])
def test_score_prints_and_writes_the_grid(reverse_checkpoint, tmp_path, capsys, method):
    from headwise import checkpoint
    from headwise.commands._heads_score import held_out

    saved, _ = reverse_checkpoint
    out = tmp_path / "report"
    assert main(["heads", "score", "--checkpoint", str(saved), "--method", method,
                 "--examples", "32", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    for kind in ("encoder_self", "decoder_self", "cross"):
        assert f"{kind}: {method} importance" in printed
    assert "most important:" in printed and "least important:" in printed
    written = hw.HeadScores.from_json((out / "importance.json").read_text())
    loaded = checkpoint.load(saved)
    want = hw.importance(loaded.model, held_out(loaded, 32, str(saved)), method=method)
    for kind in want.kinds:
        torch.testing.assert_close(written[kind], want[kind], atol=1e-9, rtol=1e-6)
    assert (out / "importance.png").stat().st_size > 5000
    saved_json = json.loads((out / "importance.json").read_text())
    assert saved_json["method"] == method and saved_json["examples"] == 32
    if method in ("greedy", "gradient"):  # estimates: checked against zero ablation
        reference = hw.importance(loaded.model, held_out(loaded, 32, str(saved)),
                                  method="ablation")
        assert saved_json["agreement"] == pytest.approx(want.spearman(reference), abs=1e-12)
        assert f"zero ablation: Spearman {saved_json['agreement']:.2f}" in printed
    assert f"importance: {written.describe()}" in printed


def test_default_is_greedy_and_compare_writes_the_table(reverse_checkpoint, tmp_path, capsys):
    """No --method: greedy ablation. --compare: every method's Spearman with the others and the
    metric after removing its 10% and 25% least important heads (of 12: 1 and 3) against
    random heads, equal to headwise.analysis.removal.compare on the same data."""
    from headwise import checkpoint
    from headwise.analysis.removal import compare
    from headwise.commands._heads_score import COMPARED, held_out, task_metric

    saved, _ = reverse_checkpoint
    out = tmp_path / "report"
    assert main(["heads", "score", "--checkpoint", str(saved), "--examples", "16", "--compare",
                 "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "importance: greedy (zero) on 16 examples" in printed
    table = (out / "compare.md").read_text()
    loaded = checkpoint.load(saved)
    data, measured, task = held_out(loaded, 16, str(saved), measured=16)
    metric, name, higher = task_metric(task, measured)
    assert (name, higher) == ("exact match", True)
    want = compare(loaded.model, {m: hw.importance(loaded.model, data, method=m)
                                  for m in COMPARED}, metric, higher=higher)
    assert want.table(name) in table and want.table(name) in printed
    assert "random (mean of 10)" in table and "3 (25%)" in table


def test_default_report_folder(reverse_checkpoint, tmp_path, monkeypatch, capsys):
    saved, _ = reverse_checkpoint
    monkeypatch.chdir(tmp_path)
    assert main(["heads", "score", "--checkpoint", str(saved), "--examples", "8"]) == 0
    assert (tmp_path / "headwise-reports" / "heads-score-rev" / "importance.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["--method", "gradeint"], "unknown method 'gradeint'"),
    (["--examples", "0"], "--examples must be >= 1"),
    # was "internal error" and a traceback from building a billion held-out examples
    (["--examples", "1000000000"], "--examples=1000000000 is over the maximum 1,048,576"),
    (["-o", "scores.json"], "expected a folder"),
])
def test_user_errors_are_one_line(reverse_checkpoint, capsys, argv, message):
    saved, _ = reverse_checkpoint
    assert main(["heads", "score", "--checkpoint", str(saved), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_checkpoint_without_a_task_is_a_clear_error(reverse_checkpoint, capsys):
    _, bare = reverse_checkpoint
    assert main(["heads", "score", "--checkpoint", str(bare)]) == 2
    assert "no saved training config" in capsys.readouterr().err


def test_a_mistyped_flag_of_the_subcommand_gets_a_suggestion(capsys):
    with pytest.raises(SystemExit):
        main(["heads", "score", "--checkpont", "x"])
    assert "--checkpoint" in capsys.readouterr().err


def test_score_a_checkpoint_written_by_training(tmp_path, capsys):
    """The train config a real run saves is enough to draw held-out examples."""
    import dataclasses

    from headwise.commands.demo import demo_config
    from headwise.train import train

    cfg = dataclasses.replace(demo_config(steps=2, seed=0, precision="fp32", threads=1),
                              eval_size=20, eval_every=0, warmup=1)
    train(cfg, out=tmp_path / "run", progress=False, verbose=False)
    assert main(["heads", "score", "--checkpoint", str(tmp_path / "run" / "checkpoint"),
                 "--examples", "16", "-o", str(tmp_path / "scores")]) == 0
    scores = hw.HeadScores.from_json((tmp_path / "scores" / "importance.json").read_text())
    assert {k: tuple(t.shape) for k, t in scores.scores.items()} == {
        "encoder_self": (2, 4), "decoder_self": (2, 4), "cross": (2, 4)}


def test_the_grid_fits_80_columns_and_keeps_three_digits(monkeypatch, capsys):
    """12 heads of scores in (0, 1) at 80 columns: whole numbers scaled by the power of ten the
    title states, none cut to '0.…'; 32 heads wrap into blocks; every line fits."""
    from headwise.commands._heads_score import grid, print_grid

    values = [[(7 * layer + 3 * head) % 97 / 97 + 0.005 for head in range(12)]
              for layer in range(6)]
    lines = grid(values, "layers: sink importance", 80)
    assert all(len(line) <= 80 for line in lines) and "…" not in "\n".join(lines)
    assert lines[0].startswith("layers: sink importance (shown x 1000: ")
    assert lines[1].split() == ["layer", *(f"H{h}" for h in range(12))]
    for layer, line in enumerate(lines[2:]):
        layer_, *cells = line.split()
        assert int(layer_) == layer
        assert [int(c) for c in cells] == [round(v * 1000) for v in values[layer]]
    wide = grid([[float(h) for h in range(32)], [float("nan")] * 32], "t", 80)
    assert all(len(line) <= 80 for line in wide)
    shown = [c for line in wide if line.split()[0] in ("0", "1") for c in line.split()[1:]]
    assert len(shown) == 64 and shown.count("–") == 32  # every head, in blocks; NaN as –
    monkeypatch.setenv("COLUMNS", "80")
    print_grid(hw.HeadScores("sink", {"layers": torch.tensor(values, dtype=torch.float64)}))
    printed = capsys.readouterr().out
    assert all(len(line) <= 80 for line in printed.splitlines()) and "…" not in printed
