"""make_task: every task by name, of the model kind the table says, and clear errors."""

import pytest
import torch

from headwise.data import TASKS, make_task


@pytest.mark.parametrize("name, kind", [("reverse", "transformer"), ("copy", "transformer"),
                                        ("sort", "transformer"), ("induction", "lm")])
def test_synthetic_tasks_by_name(name, kind):
    task = make_task(name, seed=3, min_len=3, max_len=5)
    assert task.kind == kind and name in TASKS
    a, b = task.batch(7, 4), make_task(name, seed=3, min_len=3, max_len=5).batch(7, 4)
    fields = vars(a)  # a pure function of the seed and the step
    assert fields and all(torch.equal(value, vars(b)[name]) for name, value in fields.items())


def test_file_tasks_read_their_files(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("abc abd abe. " * 50, encoding="utf-8")
    assert make_task("text", text=str(text), context=8).kind == "lm"
    pairs = tmp_path / "p.tsv"
    pairs.write_text("\n".join(f"a{i}\tb{i}" for i in range(40)), encoding="utf-8")
    task = make_task("pairs", pairs=str(pairs), max_len=6)
    assert task.kind == "transformer"
    assert ("a1", "b1") in task.train_pairs + task.eval_pairs


@pytest.mark.parametrize("name, kwargs, match", [
    ("text", {}, "task 'text' needs a file: pass --text FILE"),
    ("pairs", {}, "task 'pairs' needs a file: pass --pairs FILE"),
    ("reversed", {}, "unknown task 'reversed'; expected one of: reverse"),
])
def test_missing_files_and_unknown_names_are_clear_errors(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_task(name, **kwargs)
