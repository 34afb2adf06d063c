"""The BERT loader is general (any size saved by transformers loads and matches) and strict
(a wrong folder, architecture or state dict fails with one line naming what is wrong)."""

from __future__ import annotations

import json

import pytest
import torch

from headwise.errors import CheckpointError
from headwise.models.bert import BertModel
from headwise.pretrained import (
    bert_config_from_hf,
    from_hf_state_dict,
    load_bert,
)


# ------------------------------------------------------------------------------- bad input
def _hf_dict(**changes):
    base = dict(model_type="bert", architectures=["BertModel"], vocab_size=30, hidden_size=8,
                num_attention_heads=2, num_hidden_layers=1, intermediate_size=12,
                max_position_embeddings=10)
    base.update(changes)
    return base


def test_folder_without_weights_names_what_is_missing(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_hf_dict()))
    with pytest.raises(CheckpointError, match=r"has no model\.safetensors \(found \['config"):
        load_bert(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin.*pickle"):
        load_bert(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_bert(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_bert(empty)
    (empty / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="must hold a JSON object.*got a list"):
        load_bert(empty)


def test_config_of_another_architecture_is_refused(tmp_path):
    gpt2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 8,
            "n_head": 2, "n_layer": 1, "vocab_size": 30}
    with pytest.raises(CheckpointError, match=r"model_type='gpt2'.*GPT2LMHeadModel.*not a BERT"):
        bert_config_from_hf(gpt2)
    (tmp_path / "config.json").write_text(json.dumps(gpt2))
    with pytest.raises(CheckpointError, match="model_type='gpt2'"):
        load_bert(tmp_path)
    with pytest.raises(CheckpointError, match="position_embedding_type='relative_key'"):
        bert_config_from_hf(_hf_dict(position_embedding_type="relative_key"))
    with pytest.raises(CheckpointError, match="hidden_act='mish'"):
        bert_config_from_hf(_hf_dict(hidden_act="mish"))
    with pytest.raises(CheckpointError, match="missing key 'hidden_size'"):
        bert_config_from_hf({k: v for k, v in _hf_dict().items() if k != "hidden_size"})
    with pytest.raises(CheckpointError, match="not divisible by num_heads=3"):
        bert_config_from_hf(_hf_dict(num_attention_heads=3))


def test_state_dict_with_missing_or_unexpected_keys_names_them(transformers):
    hf = transformers.BertModel(transformers.BertConfig(**{
        k: v for k, v in _hf_dict().items() if k not in ("model_type", "architectures")}))
    state = hf.state_dict()
    config = bert_config_from_hf(_hf_dict())
    assert set(from_hf_state_dict(state, config)) == set(BertModel(config).state_dict())

    broken = dict(state)
    del broken["encoder.layer.0.attention.self.key.weight"]
    del broken["embeddings.LayerNorm.bias"]
    broken["encoder.layer.0.attention.self.rotary.weight"] = torch.zeros(2)
    with pytest.raises(CheckpointError) as info:
        load_bert(broken, _hf_dict())
    message = str(info.value)
    assert "missing keys: embeddings.LayerNorm.bias, " \
           "encoder.layer.0.attention.self.key.weight" in message
    assert "unexpected keys: encoder.layer.0.attention.self.rotary.weight" in message
    assert "\n" not in message

    extra_layer = dict(state)
    extra_layer["encoder.layer.1.output.dense.bias"] = torch.zeros(8)
    with pytest.raises(CheckpointError, match=r"unexpected keys: encoder\.layer\.1\.output\.dense\.bias"):
        load_bert(extra_layer, _hf_dict())

    wrong_shape = dict(state)
    wrong_shape["encoder.layer.0.intermediate.dense.weight"] = torch.zeros(13, 8)
    with pytest.raises(CheckpointError, match=r"encoder\.layer\.0\.intermediate\.dense\.weight \(13, 8\) "
                                              r"\(expected \(12, 8\)\)"):
        load_bert(wrong_shape, _hf_dict())
    with pytest.raises(TypeError, match="needs config="):
        load_bert(state)
    with pytest.raises(TypeError, match="BertConfig or a config.json dict"):
        load_bert(state, config=3)


