"""Checking a local model folder before transformers reads it: each problem one
:class:`~headwise.errors.CheckpointError` line naming the file, what is wrong and the fix.

transformers' readers fail on a damaged folder with their own tracebacks (safetensors'
``Error while deserializing header``, a size-mismatch report, a hub repo-id rule for a path that
does not exist), or not at all (a config naming a class transformers lacks loaded a base model
without its head). So :func:`check_weights` reads each ``*.safetensors`` file's header (8 bytes
of length, then JSON; no tensor data) and requires that its tensors cover the file exactly and
have the shapes the model built from ``config.json`` has; :func:`check_source_type`,
:func:`check_device` and :func:`resolve` check the arguments and the path first.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import torch

from headwise.errors import CheckpointError

__all__ = ["HEADER_MAX", "check_device", "check_folder", "check_source_type", "check_weights",
           "read_header", "resolve"]

HEADER_MAX = 100 * 2**20  # safetensors' own limit on a header
# bytes per element of each safetensors dtype
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
FIX = "save the model again (model.save_pretrained(DIR)) or copy the folder again"


def check_source_type(source, where: str) -> None:
    """A TypeError unless ``source`` is a path (``str`` or ``os.PathLike``)."""
    if not isinstance(source, str | os.PathLike):
        raise TypeError(f"{where}: source must be a folder, a .gguf file or an installed "
                        f"model's name (a str or a path), got {type(source).__name__}")


def check_device(device, where: str) -> torch.device:
    """``device`` as a torch.device, or a ValueError naming the argument."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{where}: device={device!r} is not a torch device; use 'cpu', "
                         "'cuda' or 'cuda:N'") from None


def resolve(path: Path, where: str) -> Path | None:
    """``path`` when it exists, None when it does not; a CheckpointError for a symlink loop or
    a path that cannot be read (no permission)."""
    try:
        path.resolve(strict=True)
        os.stat(path)
    except FileNotFoundError:
        return None
    except (RuntimeError, OSError) as e:  # (3.11 raises RuntimeError for a loop)
        loop = isinstance(e, RuntimeError) or getattr(e, "errno", None) == 40
        problem = "is a symlink loop" if loop else f"cannot be read ({e.strerror})"
        raise CheckpointError(f"{where}: {str(path)!r} {problem}; pass the model folder "
                              "itself (ls -l shows where a link points)") from None
    return path


def read_header(file: Path, where: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` of a safetensors file, after checking that its header
    parses and that its tensors' byte ranges cover the file exactly (nothing else read)."""
    size = file.stat().st_size

    def bad(problem: str):
        return CheckpointError(f"{where}: {file} ({size} bytes): {problem}, so the file is "
                               f"damaged or not a safetensors file; {FIX}")

    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise bad("too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > min(HEADER_MAX, size - 8):
            raise bad(f"its header claims {n} bytes")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, ValueError):
            raise bad("its header is not JSON") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    tensors, ranges = {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = entry["dtype"], tuple(entry["shape"]), \
                entry["data_offsets"]
            want = math.prod(shape) * SIZES[dtype]
        except (KeyError, TypeError, ValueError):
            raise bad(f"tensor {name!r} has no valid dtype, shape and data_offsets") from None
        if end - start != want:
            raise bad(f"tensor {name!r} {dtype}{list(shape)} spans {end - start} bytes, "
                      f"not {want}")
        tensors[name] = dtype, shape
        ranges.append((start, end))
    covered = 0
    for start, end in sorted(ranges):
        if start != covered:
            raise bad(f"its tensors leave a gap or overlap at byte {8 + n + covered}")
        covered = end
    if 8 + n + covered != size:
        raise bad(f"its tensors end at byte {8 + n + covered}, not at its end")
    return tensors


def check_weights(folder: Path, model, where: str) -> None:
    """Every ``*.safetensors`` file of ``folder`` is whole (:func:`read_header`), and each of
    its tensors that ``model`` (built from the folder's config, on the meta device) also has
    has that tensor's shape there."""
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    prefix = getattr(model, "base_model_prefix", "") + "."
    for file in sorted(folder.glob("*.safetensors")):
        for name, (_, shape) in read_header(file, where).items():
            want = shapes.get(name, shapes.get(name.removeprefix(prefix)))
            if want is not None and want != shape:
                raise CheckpointError(
                    f"{where}: {file}: {name} is {list(shape)} but config.json makes it "
                    f"{list(want)}: the weights and the config belong to different models "
                    "(or config.json, or its headwise_pruned_heads, was edited); put the "
                    "config.json saved with these weights beside them")


def check_folder(path, where: str) -> None:
    """A folder with ``config.json`` and whole safetensors files (:func:`read_header`), or a
    CheckpointError (TypeError for a source of another type), before transformers reads it."""
    check_source_type(path, where)
    path = Path(path).expanduser()
    if resolve(path, where) is None or not (path / "config.json").is_file():
        raise CheckpointError(f"{where}: {str(path)!r} does not exist or holds no config.json; "
                              "pass the folder save_pretrained wrote")
    for file in sorted(path.glob("*.safetensors")):
        read_header(file, where)
