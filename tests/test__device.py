"""The one reading of a device name."""

import pytest
import torch

import headwise as hw
from headwise._device import parse_device
from headwise.models import LMConfig, build


def test_cpu_and_auto_name_real_devices():
    assert parse_device("cpu") == torch.device("cpu")
    assert parse_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("name, match", [
    ("gpu", "is not a torch device; use auto, cpu, cuda or cuda:N"),
    ("meta", "headwise runs on cpu or cuda, not 'meta'"),
    ("cuda:99", "CUDA is not available here|this machine has"),
])
def test_a_bad_device_is_one_readable_value_error(name, match):
    if name == "cuda:99" and not torch.cuda.is_available():
        match = "CUDA is not available here; use --device cpu"
    with pytest.raises(ValueError, match=match):
        parse_device(name)


@pytest.mark.parametrize("call", ["attention", "weights", "module", "lm"])
def test_meta_tensors_are_refused_at_the_boundary_not_at_a_value_read(call):
    """Meta tensors reached .item() (a raw 'cannot be called on meta tensors') or the autocast
    dispatch; now every entry names the device and the fix."""
    meta = torch.device("meta")
    q = torch.randn(1, 2, 3, 4, device=meta)
    if call in ("attention", "weights"):
        with pytest.raises(ValueError, match=r"attention: q is on 'meta', but headwise runs on "
                                             r"cpu or cuda.*\.to\('cpu'\)"):
            hw.attention(q, q, q, return_weights=call == "weights")
    elif call == "module":
        mha = hw.MultiHeadAttention(8, 2).to(meta)
        with pytest.raises(ValueError, match="MultiHeadAttention: query is on 'meta'"):
            mha(torch.randn(1, 3, 8, device=meta))
    else:
        lm = build(LMConfig(vocab_size=11, d_model=16, num_heads=2, num_layers=1, d_ff=32,
                            max_len=32)).to(meta)
        with pytest.raises(ValueError, match="TransformerLM: tokens is on 'meta'"):
            lm(torch.zeros(1, 3, dtype=torch.long, device=meta))

