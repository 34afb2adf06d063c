"""Text and pair files: windows, held-out tail, the pairs split, bad files fail with one clear line."""

import pytest
import torch

from headwise.data import make_task


def test_text_task_windows_and_heldout_tail(tmp_path):
    path = tmp_path / "t.txt"
    text = "".join(chr(97 + (i * 7) % 26) for i in range(5000))
    path.write_text(text, encoding="utf-8")
    task = make_task("text", text=str(path), context=32)
    b = task.batch(0, 4)
    assert b.inputs.shape == (4, 32) and torch.equal(b.inputs[:, 1:], b.labels[:, :-1])
    assert task.tokenizer.decode(b.inputs[0].tolist()) in text[:4500]
    e = task.eval_set(8)
    assert task.tokenizer.decode(e.inputs[0].tolist()) in text[4500:]

def test_pairs_file_split(tmp_path):
    path = tmp_path / "p.tsv"
    path.write_text("".join(f"src {i}\tziel {i}\n" for i in range(200)), encoding="utf-8")
    task = make_task("pairs", pairs=str(path))
    assert len(task.train_pairs) + len(task.eval_pairs) == 200
    assert not set(task.train_pairs) & set(task.eval_pairs)
    b = task.batch(0, 4)
    assert task.tokenizer.decode(b.src[0].tolist()).startswith("src ")

@pytest.mark.parametrize("body, match", [("", "empty"), ("a\tb\nno tab here\n", ":2: expected")])
def test_bad_text_files(tmp_path, body, match):
    path = tmp_path / "f.txt"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        make_task("pairs", pairs=str(path))
