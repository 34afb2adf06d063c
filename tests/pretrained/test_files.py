"""Reading a Hugging Face folder: config.json and safetensors (one file or shards), never pickle."""

import json

import pytest
import torch
from safetensors.torch import save_file

from headwise.errors import CheckpointError
from headwise.pretrained.files import read_config, read_weights


def test_config_and_sharded_weights_are_read(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    assert read_config(tmp_path) == {"hidden_size": 8}
    a, b = torch.randn(2, 3), torch.randn(4)
    save_file({"a": a}, str(tmp_path / "s1.safetensors"))
    save_file({"b": b}, str(tmp_path / "s2.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"b": "s2.safetensors", "a": "s1.safetensors"}}))
    state = read_weights(tmp_path, "cpu")
    assert torch.equal(state["a"], a) and torch.equal(state["b"], b)
    assert read_weights(tmp_path / "s1.safetensors", "cpu").keys() == {"a"}
    assert read_config(tmp_path / "s1.safetensors") == {"hidden_size": 8}  # the file's folder


@pytest.mark.parametrize("content, match", [
    (None, "has no config.json"),
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "must hold a JSON object"),
])
def test_bad_configs_are_checkpoint_errors(tmp_path, content, match):
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    with pytest.raises(CheckpointError, match=match):
        read_config(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        read_config(tmp_path / "missing")


def test_pickle_files_are_never_loaded_and_bad_files_are_named(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(CheckpointError, match=r"\['pytorch_model.bin'\] are pickle files"):
        read_weights(tmp_path, "cpu")
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="cannot read safetensors"):
        read_weights(tmp_path, "cpu")
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(CheckpointError, match="is not a safetensors index"):
        read_weights(tmp_path, "cpu")
    with pytest.raises(CheckpointError, match="neither a checkpoint folder nor a .safetensors"):
        read_weights(tmp_path / "pytorch_model.bin", "cpu")


def test_skeleton_builds_meta_modules_without_importing_dynamo():
    """A fresh process builds a Llama-style LM and a BERT inside skeleton(): every tensor is meta
    and torch._dynamo (imported by torch's meta normal_, ~70 MB resident) stays out."""
    import subprocess
    import sys

    code = """
import sys, torch
from headwise.models import LMConfig, TransformerLM
from headwise.models.bert import BertConfig, BertModel
from headwise.pretrained.files import skeleton
with skeleton():
    lm = TransformerLM(LMConfig(vocab_size=97, d_model=32, num_heads=4, num_kv_heads=2,
                                num_layers=2, d_ff=48, max_len=64, positional="rope",
                                norm="rms", ffn="glu", bias=False))
    bert = BertModel(BertConfig(97, d_model=32, num_heads=4, num_layers=1, d_ff=48,
                                max_len=16))
tensors = [*lm.state_dict().values(), *bert.state_dict().values()]
print(all(t.is_meta for t in tensors), "torch._dynamo" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]


def test_outside_skeleton_weights_are_drawn_again():
    from headwise.models import LMConfig, TransformerLM
    from headwise.pretrained.files import skeleton

    config = LMConfig(vocab_size=97, d_model=32, num_heads=4, num_layers=1, d_ff=48, max_len=16)
    with skeleton():
        TransformerLM(config)
    real = TransformerLM(config)
    w = real.embed.tokens.weight
    assert not w.is_meta and 0.01 < w.std().item() < 0.03  # init_weights' N(0, 0.02)
