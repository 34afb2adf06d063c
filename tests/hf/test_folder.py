"""headwise.hf.folder: a damaged or mismatched model folder is one CheckpointError line naming
the file, the problem and the fix, from headwise.hf.load, load_pruned and every ``--hf``
command (exit 2), before transformers reads it; wrong arguments are a TypeError/ValueError
naming the argument. Each case was a traceback (or a base model without its head) before."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import warnings

import pytest

from headwise.errors import CheckpointError
from tests.hf import tiny

hh = pytest.importorskip("headwise.hf", reason="the hf wing needs transformers")


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf") / "llama"
    tiny.save("llama", folder)
    return folder


def _weights(d):
    return d / "model.safetensors"


def _cut(d, keep):
    data = _weights(d).read_bytes()
    _weights(d).write_bytes(data[:keep(len(data))])


def _patch(d, at, new: bytes):
    data = bytearray(_weights(d).read_bytes())
    data[at:at + len(new)] = new
    _weights(d).write_bytes(bytes(data))


def _config(d, **change):
    config = json.loads((d / "config.json").read_text())
    for key, value in change.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (d / "config.json").write_text(json.dumps(config))


DAMAGE = {
    "half": (lambda d: _cut(d, lambda n: n // 2), "not at its end"),
    "minus one byte": (lambda d: _cut(d, lambda n: n - 1), "not at its end"),
    "0 bytes": (lambda d: _cut(d, lambda n: 0), "too short for a safetensors header"),
    "random bytes": (lambda d: _weights(d).write_bytes(
        os.urandom(_weights(d).stat().st_size)), "header claims|header is not"),
    "header overwritten": (lambda d: _patch(d, 8, b"x" * 32), "its header is not JSON"),
    "header of 2**62 bytes": (lambda d: _patch(d, 0, struct.pack("<Q", 2**62)),
                              "its header claims 4611686018427387904 bytes"),
    "hidden 32 under hidden 64": (lambda d: _config(d, hidden_size=64, head_dim=16),
                                  r"is \[64, 32\] but config.json makes it \[64, 64\]"),
    "no architectures": (lambda d: _config(d, architectures=None),
                         r'names no model class .* \["LlamaForCausalLM"\]'),
    "unknown class": (lambda d: _config(d, architectures=["LlamaForNothing"]),
                      r"names \['LlamaForNothing'\], which transformers"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_or_mismatched_folder_is_one_checkpoint_error(good, tmp_path, damage):
    make, message = DAMAGE[damage]
    folder = tmp_path / "m"
    shutil.copytree(good, folder)
    make(folder)
    with pytest.raises(CheckpointError, match=message) as info:
        hh.load(folder)
    assert "\n" not in str(info.value) and "headwise.hf.load:" in str(info.value)


def test_a_symlink_loop_is_named(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(CheckpointError, match="is a symlink loop"):
        hh.load(loop)


@pytest.mark.parametrize("source, error, message", [
    (None, TypeError, "source must be a folder.*got NoneType"),
    (42, TypeError, "source must be a folder.*got int"),
])
def test_a_source_of_another_type_is_a_type_error(source, error, message):
    with pytest.raises(error, match=message):
        hh.load(source)


def test_a_bad_device_is_a_value_error_naming_it(good):
    with pytest.raises(ValueError, match="device='bogus' is not a torch device"):
        hh.load(good, device="bogus")


def _pruned(tmp_path, record):
    model = tiny.build("llama")
    hh.prune_heads(model, {"layers": {1: [0, 1]}})
    model.save_pretrained(tmp_path)
    tiny.tokenizer().save_pretrained(tmp_path)
    _config(tmp_path, headwise_pruned_heads=record)
    return tmp_path


def test_load_pruned_of_a_missing_folder_says_it_does_not_exist(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(CheckpointError, match="'.*missing' does not exist") as info:
            hh.load_pruned(tmp_path / "missing")
    assert "Repo id" not in str(info.value)


@pytest.mark.parametrize("loader", ["load", "load_pruned"])
def test_an_edited_pruned_record_that_does_not_match_the_weights_is_one_line(tmp_path, loader):
    folder = _pruned(tmp_path, [[0, 1], [0, 1]])  # layer 0 was not pruned
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(CheckpointError, match=r"k_proj.weight is \[16, 32\] but config.json"
                           if loader == "load" else "the weights do not fit config.json") as info:
            getattr(hh, loader)(folder)
    assert "\n" not in str(info.value)


def test_read_header_returns_each_tensor_of_a_whole_file(good):
    from headwise.hf import folder as hf_folder

    tensors = hf_folder.read_header(_weights(good), "here")
    assert tensors["model.embed_tokens.weight"] == ("F32", (tiny.VOCAB, 32))


@pytest.mark.parametrize("command", [["explain", "--hf", "{d}", "the cat"],
                                     ["heads", "score", "--hf", "{d}", "--method", "ablation"]])
def test_every_hf_command_says_one_line_and_exits_2(good, tmp_path, command):
    folder = tmp_path / "m"
    shutil.copytree(good, folder)
    _cut(folder, lambda n: n // 2)
    run = subprocess.run([sys.executable, "-m", "headwise", *[c.format(d=folder) for c in command]],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 2, run.stderr[-1500:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "not at its end" in lines[0] and "Traceback" not in run.stderr
