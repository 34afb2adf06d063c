"""headwise.hf.load (module headwise.hf.local): a saved folder comes back running attn_implementation="headwise" with its
own tokenizer and the saved model's logits; what cannot be loaded is one line, before any
weights are read."""

from __future__ import annotations

import pytest
import torch

from tests.hf import tiny

hh = pytest.importorskip("headwise.hf", reason="the hf wing needs transformers")
from headwise.hf import local as hf_local  # noqa: E402


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf") / "llama"
    return folder, tiny.save("llama", folder)


def test_a_saved_folder_loads_on_headwise_with_its_tokenizer_and_equal_logits(saved):
    folder, original = saved
    model, tok = hh.load(folder)
    assert model.config._attn_implementation == "headwise" and not model.training
    assert tok("the cat")["input_ids"] == [1, 4, 5]
    ids, mask = tiny.batch("left")
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).logits
        want = original(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=0)


def test_a_pruned_folder_loads_with_its_per_layer_head_counts(tmp_path):
    model = tiny.build("llama")
    hh.prune_heads(model, {"layers": {1: [0, 1]}})  # one whole key/value group of layer 1
    model.save_pretrained(tmp_path)
    tiny.tokenizer().save_pretrained(tmp_path)
    loaded, _ = hh.load(tmp_path)
    assert [hh.model.head_count(m) for m in hh.attention_layers(loaded)] == [4, 2]
    ids, mask = tiny.batch("right")
    with torch.no_grad():
        got = loaded(input_ids=ids, attention_mask=mask).logits
        want = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=0)


def test_the_skeleton_reads_no_weights(saved, monkeypatch):
    folder, _ = saved
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("weights read")

    monkeypatch.setattr(transformers.LlamaForCausalLM, "from_pretrained", refuse)
    model = hf_local.skeleton(folder)
    assert next(model.parameters()).device.type == "meta"
    assert len(hh.attention_layers(model)) == 2


def _bloom(folder):
    import transformers
    config = transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=1, n_head=4)
    config.save_pretrained(folder)  # the config alone: the refusal comes before the weights


@pytest.mark.parametrize("make, message", [
    (lambda d: None, "does not exist; pass a local Hugging Face model folder"),
    (lambda d: d.mkdir(), "has no config.json, so it is not a Hugging Face model folder"),
    (lambda d: (d.mkdir(), (d / "config.json").write_text('{"model_type": "nonsense"}')),
     "cannot read the configuration of"),
    (lambda d: (d.mkdir(), _bloom(d)),
     "Bloom(ForCausalLM|Model) does not call transformers' attention interface"),
])
def test_what_cannot_be_loaded_is_one_line(tmp_path, make, message):
    folder = tmp_path / "m"
    make(folder)
    with pytest.raises(ValueError, match=message) as info:
        hh.load(folder)
    assert "\n" not in str(info.value)


def test_a_file_that_is_not_a_gguf_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="is a file, not a model folder"):
        hf_local.check_source(tmp_path / "config.json")


def test_a_folder_without_a_tokenizer_is_one_line(saved, tmp_path):
    folder, original = saved
    original.save_pretrained(tmp_path / "bare")  # no tokenizer files
    with pytest.raises(ValueError, match="no tokenizer could be read from") as info:
        hh.load(tmp_path / "bare")
    assert "\n" not in str(info.value)
