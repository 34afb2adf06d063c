"""Regression tests for issue 16's findings outside the core: the CLI, the viz, the BERT loader.
Each was a hang or a traceback; each is now one readable line and a non-zero exit (or a
CheckpointError naming the file or key)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from tests.robustness.probes import _bert_folder, _checkpoint, _edited, _set_config
from tests.robustness.runner import CliError, cli


def _fails(*argv, match, seconds=10.0):
    start = time.perf_counter()
    with pytest.raises(CliError, match=match):
        cli(*argv)
    assert time.perf_counter() - start < seconds


@pytest.mark.parametrize("device, match", [("bogus", "not a torch device"),
                                           ("meta", "not 'meta'"), ("mps", "not 'mps'"),
                                           ("cuda:99", "cuda")])
def test_bad_devices(tmp_path, device, match):
    ckpt = _checkpoint(tmp_path)
    _fails("view", "--checkpoint", str(ckpt), "--text", "ab", "--device", device, match=match)
    _fails("trace", "mha", "--embed-dim", "8", "--heads", "2", "--device", device, match=match)
    _fails("explain", "hi", "--device", device, match=match)


@pytest.mark.parametrize("argv, match", [
    (["params", "mha", "--embed-dim", "1000000001", "--heads", "2"], "over the maximum"),
    (["trace", "mha", "--embed-dim", "1000000001", "--heads", "2"], "over the maximum"),
    (["params", "mha", "--embed-dim", "99999999999999999999999"], "over the maximum"),
    (["params", "lm", "--layers", "1000000"], "over the maximum 1,024"),
    (["trace", "lm", "--layers", "1000000"], "over the maximum 1,024"),
    (["trace", "mha", "--embed-dim", "8", "--heads", "2", "--seq", "100000000"],
     "over the maximum"),
    (["trace", "mha", "--embed-dim", "8", "--heads", "2", "--batch", "100000000"],
     "over the maximum"),
    (["trace", "lm", "--embed-dim", "4096", "--heads", "8", "--seq", "1000000"],
     "GB of memory"),
])
def test_absurd_sizes_fail_at_once(argv, match):
    _fails(*argv, match=match)


def test_view_of_a_checkpoint_claiming_a_million_layers(tmp_path):
    good = _checkpoint(tmp_path)
    bad = _edited(tmp_path, good, "layers", _set_config(num_layers=1_000_000))
    _fails("view", "--checkpoint", str(bad), "--text", "ab", "-o", str(tmp_path / "v.html"),
           match="num_layers=1000000 is over the maximum")
    wide = _edited(tmp_path, good, "wide", _set_config(d_model=1_000_000))
    _fails("view", "--checkpoint", str(wide), "--text", "ab", match="d_model=1000000")


@pytest.mark.parametrize("flag, value", [("--max-new-tokens", "-5"), ("--max-new-tokens", "0"),
                                         ("--generate", "-1")])
def test_view_negative_counts(tmp_path, flag, value):
    ckpt = _checkpoint(tmp_path)
    _fails("view", "--checkpoint", str(ckpt), "--text", "ab", flag, value, match=f"{flag} must")


def test_demo_out_pointing_at_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    _fails("demo", "--out", str(tmp_path / "file"), "--steps", "1", match="is a file")


def test_heatmaps_zero_size_and_huge_grids(tmp_path):
    from headwise.viz import heatmaps

    for weights in (torch.zeros(1, 2, 0, 0), torch.zeros(1, 0, 3, 3)):
        with pytest.raises(ValueError, match="nothing to draw"):
            heatmaps(weights, query_tokens=None, key_tokens=None, path=tmp_path / "h.png")
    start = time.perf_counter()
    with pytest.raises(ValueError, match="10000 panels, over the maximum 256"):
        heatmaps(torch.rand(100, 100, 4, 4), query_tokens=None, key_tokens=None,
                 path=tmp_path / "h.png")
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize("change, match", [
    ({"num_hidden_layers": 100000}, "num_layers=100000 is over the maximum"),
    ({"layer_norm_eps": "x"}, "not a number"), ({"layer_norm_eps": [1]}, "not a number"),
    ({"layer_norm_eps": None}, "not a number"), ({"layer_norm_eps": -1}, "must be > 0"),
])
def test_load_bert_bad_config(tmp_path, change, match):
    from headwise.errors import CheckpointError
    from headwise.pretrained import load_bert

    folder = _bert_folder(tmp_path, "bert", **change)
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=match):
        load_bert(folder)
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize("index", ["{", "{}", "[]", '{"weight_map": 3}'])
def test_load_bert_bad_index_json(tmp_path, index):
    from headwise.errors import CheckpointError
    from headwise.pretrained import load_bert

    good = _bert_folder(tmp_path, "bert")
    (good / "model.safetensors").unlink()
    (good / "model.safetensors.index.json").write_text(index)
    with pytest.raises(CheckpointError, match="is not a safetensors index"):
        load_bert(good)


def test_load_bert_missing_key_is_named_as_the_user_named_it(tmp_path):
    from safetensors.torch import load_file

    from headwise.errors import CheckpointError
    from headwise.pretrained import load_bert

    good = _bert_folder(tmp_path, "bert")
    state = load_file(str(good / "model.safetensors"))
    hf = json.loads((good / "config.json").read_text())
    key = "encoder.layer.0.attention.self.query.weight"
    with pytest.raises(CheckpointError, match=f"missing keys: {key}"):
        load_bert({k: v for k, v in state.items() if k != key}, hf)
    prefixed = {f"bert.{k}": v for k, v in state.items() if k != key}
    with pytest.raises(CheckpointError, match=f"missing keys: bert.{key}"):
        load_bert(prefixed, hf)
