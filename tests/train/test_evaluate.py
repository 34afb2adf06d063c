"""Evaluation: loss over real tokens, greedy decoding, metrics."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from headwise.data import make_task
from headwise.train.config import TrainConfig
from headwise.train.evaluate import loss_sum, strip_special
from headwise.train.recipe import build_model_config


def test_loss_sum_matches_mean_cross_entropy_over_real_tokens():
    task = make_task("reverse")
    cfg = TrainConfig(task="reverse", model=dict(d_model=32, num_heads=2, num_layers=1,
                                                 d_ff=32)).resolved()
    torch.manual_seed(0)
    from headwise.models import build
    model = build(build_model_config(cfg, task))
    batch = task.batch(0, 8)
    logits, _ = model(batch.src, batch.tgt_in, src_valid_lens=batch.src_lens)
    keep = batch.tgt_out != 0
    want = torch.nn.functional.cross_entropy(logits[keep], batch.tgt_out[keep], reduction="sum")
    got = loss_sum(model, batch, pad_id=0, label_smoothing=0.0, autocast=False)
    torch.testing.assert_close(got, want)
    smooth = loss_sum(model, batch, pad_id=0, label_smoothing=0.1, autocast=False)
    assert smooth > got * 0 and not torch.isclose(smooth, got)


@given(ids=st.lists(st.integers(0, 6), max_size=20))
def test_strip_special_keeps_what_precedes_the_first_eos_without_padding(ids):
    eos, pad = 2, 0
    got = strip_special(ids, eos, pad)
    before = ids[:ids.index(eos)] if eos in ids else ids
    assert got == [i for i in before if i != pad]
