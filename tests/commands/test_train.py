"""Bad input to `headwise train`: one readable line on stderr and a non-zero exit."""

import hashlib
import json
import shutil

import pytest

from headwise.cli import main

TINY = ["--steps", "1", "--batch-size", "4", "--d-model", "16", "--heads", "2", "--layers", "1",
        "--d-ff", "16", "--eval-size", "4", "--precision", "fp32", "--quiet"]


def _fails(capsys, argv, match):
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("headwise train: error:") and match in err, err


def test_unknown_task(capsys):
    _fails(capsys, ["train", "reverso", *TINY], "unknown task 'reverso'")


def test_missing_text_file(capsys, tmp_path):
    _fails(capsys, ["train", "text", "--text", str(tmp_path / "nope.txt"), *TINY],
           "does not exist")


def test_empty_text_file(capsys, tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n  \n", encoding="utf-8")
    _fails(capsys, ["train", "text", "--text", str(path), *TINY], "is empty")


def test_tsv_line_without_tab(capsys, tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("Hallo.\tHello.\nDanke schön, thanks\n", encoding="utf-8")
    _fails(capsys, ["train", "pairs", "--pairs", str(path), *TINY], "pairs.tsv:2: expected")


def test_text_task_without_file(capsys):
    _fails(capsys, ["train", "text", *TINY], "--text FILE")


@pytest.mark.parametrize("bad", [["--steps", "0"], ["--lr", "-1"], ["--num-symbols", "99"]])
def test_bad_numbers(capsys, bad):
    _fails(capsys, ["train", "reverse", *TINY, *bad], "must be")


def test_resume_with_a_checkpoint_of_another_model(capsys, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", "reverse", *TINY, "--out", str(a)]) == 0
    assert main(["train", "reverse", *TINY, "--d-model", "24", "--out", str(b)]) == 0
    capsys.readouterr()
    # another task's run
    _fails(capsys, ["train", "sort", "--resume", str(a), "--quiet"], "is a run of task 'reverse'")
    # changing the model while resuming
    _fails(capsys, ["train", "--resume", str(a), "--d-model", "24", "--quiet"], "cannot change")
    # weights of another model (consistent files, so not reported as corrupted)
    shutil.copy(b / "checkpoint" / "model.safetensors", a / "checkpoint" / "model.safetensors")
    meta = json.loads((a / "checkpoint" / "config.json").read_text())
    meta["files"]["model.safetensors"] = hashlib.sha256(
        (a / "checkpoint" / "model.safetensors").read_bytes()).hexdigest()
    (a / "checkpoint" / "config.json").write_text(json.dumps(meta))
    _fails(capsys, ["train", "--resume", str(a), "--steps", "2", "--quiet"], "do not fit")
    # a corrupted file
    (b / "checkpoint" / "train_state.safetensors").write_bytes(b"garbage")
    _fails(capsys, ["train", "--resume", str(b), "--steps", "2", "--quiet"], "corrupted")
    _fails(capsys, ["train", "--resume", str(tmp_path / "missing"), "--quiet"], "does not exist")
