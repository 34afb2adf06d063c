"""Batches in every accepted form, run through a model, and the model's own loss on them."""

import pytest
import torch

from headwise.analysis.run import as_batches, default_loss, run_batch
from headwise.data import make_task
from headwise.models import LMConfig, build


def _lm():
    torch.manual_seed(0)
    return build(LMConfig(vocab_size=12, d_model=8, num_heads=2, num_layers=1, d_ff=8,
                          max_len=16)).eval()


def test_every_batch_form_runs_and_gives_the_same_logits():
    model, ids = _lm(), torch.randint(0, 12, (2, 6))
    assert len(as_batches(ids, "f")) == 1 and len(as_batches([ids, ids], "f")) == 2
    want = model(ids)[0]
    for batch in (ids, {"tokens": ids}, (ids,)):
        torch.testing.assert_close(run_batch(model, batch)[0], want)
    moved = as_batches({"tokens": ids, "note": "x"}, "f", torch.device("cpu"))[0]
    assert moved["note"] == "x" and torch.equal(moved["tokens"], ids)


def test_default_loss_is_next_token_cross_entropy():
    model, ids = _lm(), torch.randint(1, 12, (2, 6))  # no pad id: every label counts
    logits = model(ids)[0][:, :-1]
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    torch.testing.assert_close(default_loss(model, ids), want)
    task = make_task("induction", min_len=3, max_len=4)
    assert torch.isfinite(default_loss(build(LMConfig(vocab_size=task.tokenizer.vocab_size,
                                                      d_model=8, num_heads=2, num_layers=1,
                                                      d_ff=8, max_len=16)),
                                       task.eval_set(2)))


def test_bad_batches_are_clear_errors():
    with pytest.raises(ValueError, match="f: no data: batches is empty"):
        as_batches([], "f")
    with pytest.raises(TypeError, match="f: batches must be a batch or an iterable"):
        as_batches(3, "f")
    with pytest.raises(TypeError, match="cannot run TransformerLM on a str"):
        run_batch(_lm(), "abc")
    with pytest.raises(TypeError, match="no default loss for TransformerLM on a dict"):
        default_loss(_lm(), {"tokens": torch.zeros(1, 2, dtype=torch.long)})
