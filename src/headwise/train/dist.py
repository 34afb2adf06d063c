"""Where a run executes: its device, its precision, and its processes (torchrun / DDP).

Under ``torchrun`` every process reads ``WORLD_SIZE`` / ``RANK`` / ``LOCAL_RANK`` from the
environment; a single process needs none of it and never touches ``torch.distributed``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

import torch

from headwise import fast
from headwise._device import parse_device

__all__ = ["Dist", "all_sum", "any_rank", "barrier", "global_sum", "init_distributed",
           "pick_precision", "shutdown", "upload"]


def _cpu_has_native_bf16() -> bool:
    """True if the CPU has bf16 matrix instructions (AVX512-BF16 or AMX); oneDNN must agree."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = f.read()
    except OSError:
        flags = ""
    native = any(flag in flags for flag in ("avx512_bf16", "amx_bf16"))
    return native and torch.backends.mkldnn.is_available() and bool(
        torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pick_precision(requested: str, device: torch.device) -> tuple[str, str]:
    """``(precision, reason)``: ``"auto"`` is bf16 where the hardware has bf16 units."""
    if requested != "auto":
        return requested, "requested"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", f"{torch.cuda.get_device_name(device)} supports bf16"
        return "fp32", "this GPU has no bf16 support"
    if _cpu_has_native_bf16():
        return "bf16", "this CPU has bf16 matrix units (AVX512-BF16/AMX)"
    return "fp32", "this CPU has no native bf16 units (no AVX512-BF16/AMX)"


@dataclass
class Dist:
    """This process's place in the run: ``rank`` of ``world`` (``local_rank`` on its host)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device_name: str) -> tuple[Dist, torch.device]:
    """Join the torchrun process group (if any) and pick this process's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(), parse_device(device_name)
    import torch.distributed as dist
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = parse_device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), local), device


def all_sum(value: torch.Tensor, d: Dist) -> torch.Tensor:
    """``value`` summed over every process (itself when alone), left on its device: no read."""
    if d.world > 1:
        import torch.distributed as dist
        value = value.clone()
        dist.all_reduce(value)
    return value


def global_sum(value: torch.Tensor, d: Dist) -> float:
    """``value`` summed over every process, read back (a device sync off the CPU)."""
    return float(all_sum(value, d))


def upload(batch, device: torch.device):
    """A host batch (a dataclass of CPU tensors) on ``device``, each tensor copied by
    :func:`headwise.fast.upload` (no host sync on a GPU)."""
    return type(batch)(**{f.name: fast.upload(getattr(batch, f.name), device)
                          for f in fields(batch)})


def any_rank(flag: bool, d: Dist, device: torch.device) -> bool:
    """True when ``flag`` is true on any process (so that every process takes the same turn)."""
    if d.world <= 1:
        return flag
    return global_sum(torch.tensor(float(flag), device=device), d) > 0


def barrier(d: Dist) -> None:
    if d.world > 1:
        import torch.distributed as dist
        dist.barrier()


def shutdown() -> None:
    """Leave the process group (torchrun runs only)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
