"""Helpers shared by subcommands (not a subcommand: the leading underscore hides it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # command modules import nothing heavy until they run
    import torch


def parse_device(name: str) -> torch.device:
    """``--device`` value -> torch.device, with one readable error for a bad or absent device."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r} is not a torch device; use cpu, cuda or cuda:N") \
            from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available here; use --device cpu")
    return device
