"""Checkpoints: safetensors + JSON round trips (weights, tied weights, tokenizer, optimizer), and
one clear CheckpointError for missing, corrupted or mismatched folders."""

import json

import pytest
import torch

from headwise import checkpoint as ckpt
from headwise.data import CharTokenizer
from headwise.errors import CheckpointError
from headwise.models import LMConfig, TransformerConfig, build


def _lm(tie=False, d_model=32):
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=11, d_model=d_model, num_heads=4, num_layers=2, d_ff=48,
                   max_len=16, dropout=0.0, tie_embeddings=tie)
    return build(cfg), cfg


@pytest.mark.parametrize("tie", [False, True])
def test_round_trip_gives_identical_outputs(tmp_path, tie):
    model, cfg = _lm(tie)
    tok = CharTokenizer("abcdefg")
    ckpt.save(tmp_path / "c", model, cfg, tok, metadata={"note": "x"})
    loaded = ckpt.load(tmp_path / "c")
    assert loaded.config == cfg and loaded.metadata == {"note": "x"}
    assert loaded.tokenizer.to_dict() == tok.to_dict()
    x = torch.randint(0, 11, (3, 9))
    assert torch.equal(model.eval()(x)[0], loaded.model(x)[0])
    if tie:
        assert loaded.model.lm_head.weight is loaded.model.embed.tokens.weight
    assert not list(tmp_path.glob(".c.*"))  # no temp or old folder left behind


def _flat(d):
    """A config dict as headwise wrote it before ``attention``: its options as flat keys."""
    from headwise.models.config import FLAT_ATTENTION_KEYS
    flat = {k: v for k, v in d.items() if k != "attention"}
    return {**flat, **{old: d["attention"][new] for old, new in FLAT_ATTENTION_KEYS.items()}}


@pytest.mark.parametrize("kind", ["lm", "transformer"])
def test_a_checkpoint_with_flat_attention_keys_loads_the_same_model(tmp_path, kind):
    """config.json written before the attention options moved into ``attention`` (every one
    set away from its default, under its old name) loads the same config and outputs."""
    from headwise.layers import AttentionConfig

    attention = AttentionConfig(num_kv_heads=2, window=3, softcap=4.0, sinks=True,
                                rope_theta=500.0, rotary_dim=4, backend="eager")
    sizes = dict(d_model=32, num_heads=4, num_layers=1, d_ff=48, max_len=16, dropout=0.0,
                 positional="rope", attention=attention)
    cfg = (LMConfig(11, **sizes) if kind == "lm" else TransformerConfig(11, 11, **sizes))
    torch.manual_seed(0)
    model = build(cfg).eval()
    with torch.no_grad():  # the sinks start at 0: make them matter
        for p in model.parameters():
            if p.dim() == 1 and p.shape == (4,):
                p.normal_()
    ckpt.save(tmp_path / "c", model, cfg)
    path = tmp_path / "c" / "config.json"
    meta = json.loads(path.read_text())
    assert meta["config"]["attention"] == attention.to_dict()
    meta["config"] = _flat(meta["config"])
    assert "attention" not in meta["config"] and meta["config"]["sliding_window"] == 3
    path.write_text(json.dumps(meta))
    loaded = ckpt.load(tmp_path / "c")
    assert loaded.config == cfg
    x = torch.randint(0, 11, (2, 9))
    args = (x,) if kind == "lm" else (x, x)
    assert torch.equal(model(*args)[0], loaded.model(*args)[0])


def test_optimizer_state_round_trip(tmp_path):
    model, cfg = _lm()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randint(0, 11, (2, 8)))[0].sum().backward()
    opt.step()
    ckpt.save(tmp_path / "c", model, cfg, optimizer=opt, train_state={"step": 1})
    model2, _ = _lm()
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    assert ckpt.load_train_state(tmp_path / "c", opt2) == {"step": 1}
    for p, q in zip(opt.param_groups[0]["params"], opt2.param_groups[0]["params"], strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], opt2.state[q][key])


def test_saving_again_replaces_atomically(tmp_path):
    model, cfg = _lm()
    ckpt.save(tmp_path / "c", model, cfg)
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    ckpt.save(tmp_path / "c", model, cfg)
    assert torch.equal(ckpt.load(tmp_path / "c").model.lm_head.weight, model.lm_head.weight)


def test_without_a_newer_copy_the_previous_checkpoint_is_used_with_a_warning(tmp_path):
    model, cfg = _lm()
    ckpt.save(tmp_path / "c", model, cfg)
    (tmp_path / "c").rename(tmp_path / ".c.old")  # the state after the first os.replace
    with pytest.warns(UserWarning, match="no complete newer copy"):
        assert ckpt.load(tmp_path / "c").config == cfg
    assert (tmp_path / "c" / "config.json").is_file()  # restored in place


def test_missing_folder_and_files(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        ckpt.load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="not a headwise checkpoint"):
        ckpt.load(tmp_path / "empty")
    model, cfg = _lm()
    ckpt.save(tmp_path / "c", model, cfg)
    (tmp_path / "c" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing model.safetensors"):
        ckpt.load(tmp_path / "c")


def test_corrupted_weights_are_detected(tmp_path):
    model, cfg = _lm()
    ckpt.save(tmp_path / "c", model, cfg)
    path = tmp_path / "c" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # one flipped byte inside a tensor
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted"):
        ckpt.load(tmp_path / "c")
    (tmp_path / "c" / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(CheckpointError, match="corrupted"):
        ckpt.load(tmp_path / "c")


def test_weights_of_another_model_are_refused(tmp_path):
    model, cfg = _lm(d_model=32)
    ckpt.save(tmp_path / "c", model, cfg)
    meta = json.loads((tmp_path / "c" / "config.json").read_text())
    meta["config"]["d_model"] = 64  # the config now describes another model
    (tmp_path / "c" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="do not fit"):
        ckpt.load(tmp_path / "c")
    meta["kind"] = "transformer"
    (tmp_path / "c" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="bad model config"):
        ckpt.load(tmp_path / "c")


def _saved_after_one_step(folder):
    """A tiny LM saved with its AdamW state after one step: ``(model, config, optimizer)``."""
    model, cfg = _lm()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, 11, (2, 8)))[0].sum().backward()
    opt.step()
    ckpt.save(folder, model, cfg, optimizer=opt, train_state={"step": 1})
    return model, cfg, opt


def test_optimizer_of_another_model_is_refused(tmp_path):
    model, cfg, opt = _saved_after_one_step(tmp_path / "c")
    torch.manual_seed(0)
    other = build(TransformerConfig(src_vocab_size=5, tgt_vocab_size=5, d_model=16, num_heads=2,
                                    num_layers=1, d_ff=16, max_len=8))
    with pytest.raises(CheckpointError, match="another model"):
        ckpt.load_train_state(tmp_path / "c", torch.optim.AdamW(other.parameters()))
    ckpt.save(tmp_path / "inference", model, cfg)
    with pytest.raises(CheckpointError, match="no training state"):
        ckpt.load_train_state(tmp_path / "inference")


@pytest.mark.parametrize("name", ["reverse", "lm"])
def test_checkpoints_written_before_the_rework_load_with_identical_outputs(name):
    """Two tiny checkpoints saved by headwise at commit 5fb359a (before issue 11 moved configs,
    heads and modules; see tests/fixtures/old_checkpoints/make.py) load with today's code and
    give the outputs recorded then: the token ids (greedy, beam and sampled generations, on the
    fused kernel then and now) exactly, and the logits and attention weights (recorded with
    ``return_weights=True``, which sent the old code to the eager softmax, so recomputed on
    the ``"eager"`` backend) to float32 rounding.

    Not bit for bit: the recording machine's float32 reductions (the SIMD path MKL and ATen
    pick per CPU) need not sum in this machine's order. Each value is a few layers of dot
    products of <= 32 terms, so its rounding is a few ulps of the largest value: measured up
    to 8 eps x max(1, |value|) between an AMD EPYC and the recording; the bound is 64 eps. A
    wrong mask, scale or weight moves these by 1e-2 or more. The default path (output from
    the fused kernel's blocked online softmax, weights from its log-sum-exp) is checked to 1e-5."""
    from safetensors.torch import load_file

    from headwise.layers import MultiHeadAttention
    from tests.fixtures.old_checkpoints.make import HERE, outputs

    loaded = ckpt.load(HERE / name)
    assert loaded.config.kind == name.replace("reverse", "transformer")
    assert loaded.tokenizer is not None and loaded.metadata["written_by"].endswith("make.py")
    want = load_file(str(HERE / f"{name}.expected.safetensors"))
    fused = outputs(name, loaded.model)
    for module in loaded.model.modules():
        if isinstance(module, MultiHeadAttention):
            module.backend = "eager"
    eager = outputs(name, loaded.model)
    assert sorted(fused) == sorted(eager) == sorted(want)
    for key, value in want.items():
        weighted = key == "logits" or key.startswith("attention.")
        got = eager[key] if weighted else fused[key]
        assert got.dtype == value.dtype, key
        if value.is_floating_point():
            ulps = 64 * torch.finfo(value.dtype).eps * max(1.0, value.abs().max().item())
            torch.testing.assert_close(got, value, atol=ulps, rtol=0, msg=key)
        else:
            assert torch.equal(got, value), key
        if weighted:
            torch.testing.assert_close(fused[key], value, atol=1e-5, rtol=0, msg=key)


# --------------------------------------------------------------------------------------------
# edited, truncated and absurd checkpoints: one CheckpointError each, before any allocation


def _edit(folder, **changes):
    meta = json.loads((folder / "config.json").read_text())
    meta.update(changes)
    (folder / "config.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("change, match", [
    ({"files": ["model.safetensors"]}, "'files' must map"),
    ({"files": {"../../etc/passwd": "0" * 64}}, "'files' must map"),
    ({"config": "x"}, "'config' an object"),
    ({"kind": 3}, "'kind' must be a string"),
    ({"tokenizer": [1]}, "'tokenizer' must be an object"),
])
def test_edited_config_json_is_one_clear_error(tmp_path, change, match):
    model, cfg = _lm()
    ckpt.save(tmp_path / "c", model, cfg)
    _edit(tmp_path / "c", **change)
    with pytest.raises(CheckpointError, match=match):
        ckpt.load(tmp_path / "c")


@pytest.mark.parametrize("field", ["d_model", "num_layers"])
def test_a_config_claiming_a_huge_model_is_refused_at_once(tmp_path, field):
    import time
    model, cfg = _lm()
    ckpt.save(tmp_path / "c", model, cfg)
    meta = json.loads((tmp_path / "c" / "config.json").read_text())
    meta["config"][field] = 1_000_000 if field == "num_layers" else 1_000_000
    meta["config"]["num_heads"] = 4
    (tmp_path / "c" / "config.json").write_text(json.dumps(meta))
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=r"parameters|over the maximum"):
        ckpt.load(tmp_path / "c")
    assert time.perf_counter() - start < 5


def test_a_truncated_train_state_is_reported_as_corrupted(tmp_path):
    model, cfg, opt = _saved_after_one_step(tmp_path / "c")
    path = tmp_path / "c" / "train_state.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="corrupted"):
        ckpt.load_train_state(tmp_path / "c", opt)
    # and with its sha256 updated (an edit, not a crash): still one clear error
    import hashlib
    meta = json.loads((tmp_path / "c" / "config.json").read_text())
    meta["files"]["train_state.safetensors"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (tmp_path / "c" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        ckpt.load_train_state(tmp_path / "c", opt)


@pytest.mark.parametrize("errno_", [28, 30, 13])  # ENOSPC, EROFS, EACCES
def test_a_filesystem_error_during_save_is_one_output_error(tmp_path, monkeypatch, errno_):
    import os

    import safetensors.torch

    from headwise.errors import OutputError
    model, cfg = _lm()

    def fail(*args, **kwargs):
        raise OSError(errno_, os.strerror(errno_))
    monkeypatch.setattr(safetensors.torch, "save_model", fail)
    with pytest.raises(OutputError, match=f"cannot write .*{os.strerror(errno_)}"):
        ckpt.save(tmp_path / "c", model, cfg)
    assert not list(tmp_path.glob(".c.tmp-*"))  # nothing half-written left behind


@pytest.mark.parametrize("device", ["bogus", "meta", "cuda:99"])
def test_load_refuses_a_bad_device_before_reading(tmp_path, device):
    """checkpoint.load(device=...) from Python: one ValueError, not torch's RuntimeError."""
    with pytest.raises(ValueError, match="device"):
        ckpt.load(tmp_path / "does-not-matter", device=device)


@pytest.mark.parametrize("kwargs, words", [
    (dict(config={"d_model": 32}), r"config must be the model's config .* got dict"),
    (dict(tokenizer="chars"), r"tokenizer must have \.to_dict\(\)"),
    (dict(metadata={"loss": torch.tensor(1.5)}), r"metadata\['loss'\] is a Tensor"),
    (dict(metadata={"tags": {"a"}}), r"metadata\['tags'\] is a set"),
    (dict(metadata=[1]), r"metadata must be a dict, got list"),
    (dict(train_state={"step": torch.tensor(3)}), r"train_state\['step'\] is a Tensor"),
])
def test_save_of_what_cannot_be_stored_is_a_type_error_and_writes_nothing(tmp_path, kwargs,
                                                                         words):
    """save(config=dict) raised AttributeError('kind') and metadata={tensor} json's raw
    TypeError, both from inside the write; now one TypeError first, and an existing
    checkpoint at the same path stays as it was."""
    model, config = _lm()
    folder = ckpt.save(tmp_path / "run", model, config)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    args = {"config": config, **kwargs}
    with pytest.raises(TypeError, match=words):
        ckpt.save(folder, model, **args)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
