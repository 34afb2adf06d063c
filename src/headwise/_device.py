"""The one reading of a device name: ``--device`` of every command and ``TrainConfig.device``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["DEVICE_TYPES", "check_tensor_device", "parse_device"]

# where headwise runs: meta holds no data (a value read such as .item() fails), mps, xpu, ...
# are untested
DEVICE_TYPES = ("cpu", "cuda")


def parse_device(name: str) -> torch.device:
    """``"auto"`` (CUDA when available, else the CPU), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` ->
    a :class:`torch.device`; a bad or absent device is one readable ``ValueError``."""
    import torch  # here, not at the top: `headwise <command> --help` imports this module

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"--device {name!r} is not a torch device; use auto, cpu, cuda or "
                         "cuda:N") from None
    if device.type not in DEVICE_TYPES:
        raise ValueError(f"--device {name}: headwise runs on cpu or cuda, not {device.type!r}; "
                         "use --device cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available here; use --device cpu")
    if device.type == "cuda" and device.index is not None \
            and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA "
                         "device(s); use cuda:0 or --device cpu")
    return device


def check_tensor_device(t: torch.Tensor, name: str, where: str) -> None:
    """ValueError unless ``t`` is on a device headwise runs on (:data:`DEVICE_TYPES`)."""
    if t.device.type not in DEVICE_TYPES:
        raise ValueError(f"{where}: {name} is on {t.device.type!r}, but headwise runs on cpu or "
                         "cuda (a meta tensor holds no values to read); move it and the module "
                         "with .to('cpu') or .to('cuda')")
