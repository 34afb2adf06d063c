"""Which modules are attention layers, switching a loaded model, and refusing one headwise
cannot serve."""

from __future__ import annotations

import pytest
import torch

from tests.hf.tiny import FAMILIES, build

hh = pytest.importorskip("headwise.hf", reason="the hf wing needs transformers")
from headwise.hf.model import head_count  # noqa: E402


@pytest.mark.parametrize("family", FAMILIES)
def test_every_block_has_one_attention_layer_with_its_head_count(family):
    model = build(family)
    layers = hh.attention_layers(model)
    assert len(layers) == model.config.num_hidden_layers
    assert all(head_count(m) == model.config.num_attention_heads for m in layers)


def test_use_switches_a_loaded_model_and_returns_it():
    model = build("llama", "sdpa")
    assert hh.use(model) is model
    assert model.config._attn_implementation == "headwise"


def test_a_model_with_inline_attention_is_refused_in_one_line(transformers):
    config = transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=1, n_head=4)
    model = transformers.BloomForCausalLM(config)
    with pytest.raises(ValueError, match="BloomForCausalLM does not call transformers' "
                                         "attention interface") as info:
        hh.use(model)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="does not call"):
        with hh.weights(model, {"layers": [0]}):
            pass


def test_something_else_than_a_transformers_model_is_a_type_error():
    with pytest.raises(TypeError, match="expected a transformers PreTrainedModel, got Linear"):
        hh.use(torch.nn.Linear(2, 2))


def test_a_module_without_a_head_count_is_named():
    with pytest.raises(ValueError, match="cannot tell how many heads Linear has"):
        head_count(torch.nn.Linear(2, 2))
