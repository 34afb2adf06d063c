"""Regression tests for the last tracebacks outside the model folder and the kernel cache:
each was a traceback ("internal error" on the command line) and is now one readable line."""

from __future__ import annotations

import json

import pytest
import torch

import headwise as hw
from tests.robustness.probes import _checkpoint
from tests.robustness.runner import CliError, cli


def test_a_char_tokenizer_dict_whose_alphabet_is_not_a_string_is_a_value_error():
    from headwise.data.tokenizers import tokenizer_from_dict

    with pytest.raises(ValueError, match="alphabet must be a string of its characters, got int"):
        tokenizer_from_dict({"kind": "char", "alphabet": 5})


@pytest.mark.parametrize("argv", [["view", "--text", "ab"], ["trace"]])
def test_view_and_trace_of_a_checkpoint_with_a_bad_alphabet_are_one_line(tmp_path, argv):
    ckpt = _checkpoint(tmp_path)
    meta = json.loads((ckpt / "config.json").read_text())
    meta["tokenizer"] = {"kind": "char", "alphabet": 5}
    (ckpt / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CliError, match="exit 2: .*bad tokenizer.*alphabet must be a string"):
        cli(argv[0], "--checkpoint", str(ckpt), *argv[1:], "-o", str(tmp_path / "v.html")
            ) if argv[0] == "view" else cli("trace", "--checkpoint", str(ckpt))


def test_explain_of_text_that_is_not_utf8_is_one_line():
    text = b"caf\xe9 \xff".decode("utf-8", "surrogateescape")  # what argv gives Python
    with pytest.raises(CliError, match=r"exit 2: .*text 0 is not valid UTF-8 \(byte 0xe9"):
        cli("explain", text)


def test_selection_of_a_meta_tensor_is_a_value_error():
    with pytest.raises(ValueError, match="heads is a meta tensor"):
        hw.Selection(heads=torch.tensor([0, 1], device="meta"))


def test_head_stats_with_meta_token_ids_is_a_value_error():
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="token_ids is a meta tensor"):
        hw.stats.head_stats(q, k, token_ids=torch.zeros(1, 3, dtype=torch.long, device="meta"))


def test_importance_of_a_batch_of_0_rows_is_a_value_error():
    tiny = pytest.importorskip("tests.hf.tiny")
    model = tiny.build("llama", "headwise")
    with pytest.raises(ValueError, match="batch 0 has 0 rows"):
        hw.importance(model, [{"input_ids": torch.zeros(0, 5, dtype=torch.long),
                               "attention_mask": torch.ones(0, 5, dtype=torch.long)}])


def test_heads_prune_of_an_induction_run_is_one_line(tmp_path):
    run = tmp_path / "run"
    cli("train", "induction", "--steps", "1", "--d-model", "16", "--heads", "2", "--layers",
        "1", "--d-ff", "32", "--eval-every", "1", "--eval-size", "4", "--batch-size", "2",
        "--out", str(run), "--quiet")
    with pytest.raises(CliError, match="exit 2: .*kind 'lm' trained on induction"):
        cli("heads", "prune", "--checkpoint", str(run), "--quick", "-o", str(tmp_path / "p"))
