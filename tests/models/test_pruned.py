"""The pruned structure (headwise.models.pruned): configs that record it, checkpoints that
rebuild it, the per-layer plan that keeps grouped heads equal, and the refusal of a checkpoint
of another structure."""

from __future__ import annotations

import json

import pytest
import torch

from headwise import checkpoint
from headwise.analysis.prune import prune_heads
from headwise.errors import CheckpointError
from headwise.models import LMConfig, TransformerLM, attention_layers
from headwise.models.pruned import layer_plan
from tests.analysis.test_prune import lm, run, seq2seq


@pytest.mark.parametrize("make, heads", [
    (lambda: lm(8, num_kv_heads=3, attention_sinks=True),
     {"decoder_self": {0: [1, 3, 5], -1: [0, 1]}}),
    (lambda: seq2seq(9, num_kv_heads=2),
     {"encoder_self": {0: [0, 1]}, "decoder_self": {1: [2, 3]}, "cross": {0: [0, 2]}})])
def test_pruned_checkpoint_round_trips(tmp_path, make, heads):
    model = prune_heads(make(), heads)
    checkpoint.save(tmp_path / "ckpt", model, model.config)
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["config"]["pruned_heads"] == model.config.pruned_heads
    loaded = checkpoint.load(tmp_path / "ckpt")
    assert loaded.config == model.config
    assert [m.num_heads for m in attention_layers(loaded.model)["decoder_self"]] == \
        [m.num_heads for m in attention_layers(model)["decoder_self"]]
    torch.testing.assert_close(run(loaded.model), run(model), atol=0, rtol=0)

def test_pruned_checkpoint_into_an_unpruned_model_is_a_clear_error(tmp_path):
    model = prune_heads(lm(10), {"decoder_self": {1: [2, 4]}})
    checkpoint.save(tmp_path / "ckpt", model, model.config)
    unpruned = TransformerLM(model.config.replace(pruned_heads=None))
    with pytest.raises(CheckpointError, match=r"4 heads in decoder_self layer 1 but the model "
                                              r"has 6.*\[\[\], \[2, 4\], \[\]\].*checkpoint.load"):
        checkpoint.load_weights(unpruned, tmp_path / "ckpt")
    # the reverse: an unpruned checkpoint into a pruned model
    checkpoint.save(tmp_path / "full", lm(10), lm(10).config)
    with pytest.raises(CheckpointError, match="6 heads in decoder_self layer 1 but the model has 4"):
        checkpoint.load_weights(model, tmp_path / "full")

def test_old_configs_without_pruned_heads_still_load():
    d = lm().config.to_dict()
    del d["pruned_heads"]
    assert LMConfig.from_dict(d).pruned_heads is None

def test_config_rejects_impossible_pruned_structures():
    with pytest.raises(ValueError, match=r"pruned_heads\['decoder_self'\] must list the pruned "
                                         r"heads of each of its 3 layers"):
        lm().config.replace(pruned_heads={"decoder_self": [[1]]})
    with pytest.raises(ValueError, match=r"pruned_heads\['decoder_self'\]\[0\] must be a list "
                                         r"of head indices in 0..5"):
        lm().config.replace(pruned_heads={"decoder_self": [[9], [], []]})

def test_layer_plan_keeps_groups_equal():
    assert layer_plan(9, 3, [1, 4, 7], "x") == ((0, 2, 3, 5, 6, 8), (0, 1, 2))
    assert layer_plan(9, 3, [3, 4, 5, 0, 6], "x") == ((1, 2, 7, 8), (0, 2))
    with pytest.raises(ValueError, match="every key/value head must serve the same number"):
        layer_plan(9, 3, [3, 4, 5, 0], "x")
