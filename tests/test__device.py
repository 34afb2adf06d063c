"""The one reading of a device name."""

import pytest
import torch

from headwise._device import parse_device


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
