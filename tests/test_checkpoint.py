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


def test_recovers_a_save_killed_between_the_two_renames(tmp_path):
    model, cfg = _lm()
    ckpt.save(tmp_path / "c", model, cfg)
    (tmp_path / "c").rename(tmp_path / ".c.old")  # the state after the first os.replace
    assert ckpt.load(tmp_path / "c").config == cfg


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


def test_optimizer_of_another_model_is_refused(tmp_path):
    model, cfg = _lm()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, 11, (2, 8)))[0].sum().backward()
    opt.step()
    ckpt.save(tmp_path / "c", model, cfg, optimizer=opt, train_state={"step": 1})
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
    give bit-identical logits, attention weights and greedy / beam / sampled generations."""
    from safetensors.torch import load_file

    from tests.fixtures.old_checkpoints.make import HERE, outputs

    loaded = ckpt.load(HERE / name)
    assert loaded.config.kind == name.replace("reverse", "transformer")
    assert loaded.tokenizer is not None and loaded.metadata["written_by"].endswith("make.py")
    want = load_file(str(HERE / f"{name}.expected.safetensors"))
    got = outputs(name, loaded.model)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
