"""Reading a local Hugging Face checkpoint folder: its ``config.json`` and its safetensors
weights (one file or a sharded index). Never pickle, never the network. And :func:`skeleton`,
the empty model every loader fills."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch.overrides import TorchFunctionMode

from headwise.errors import CheckpointError

# Random draws a module's initialisation makes (nn.Embedding, headwise's init_weights).
_DRAWS = {torch.nn.init.normal_, torch.Tensor.normal_}


class _NoDraws(TorchFunctionMode):
    """Random draws on meta tensors return the tensor untouched (there are no values)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DRAWS:  # nn.init.normal_ passes its tensor by keyword
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


@contextmanager
def skeleton() -> Iterator[None]:
    """Modules built inside are on the meta device with nothing drawn: a loader then assigns
    every tensor (``load_state_dict(..., assign=True)``).

    Why not plain ``torch.device("meta")``: torch's meta ``normal_`` runs a Python reference
    that imports ``torch._dynamo`` and sympy, about 70 MB resident for the rest of the process
    (0.14x SmolLM2-135M's float32 weights) to draw values a meta tensor does not have."""
    with torch.device("meta"), _NoDraws():
        yield


def read_config(path: Path) -> dict[str, Any]:
    folder = path if path.is_dir() else path.parent
    file = folder / "config.json"
    if not path.exists():
        raise CheckpointError(f"{path} does not exist; expected a folder with config.json and "
                              "model.safetensors")
    if not file.is_file():
        raise CheckpointError(f"{folder} has no config.json; pass config= or point at the "
                              "checkpoint folder")
    try:
        config = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{file} is not valid JSON ({exc})") from None
    if not isinstance(config, dict):  # file content: the user's error, not a TypeError
        raise CheckpointError(f"{file} must hold a JSON object (a Hugging Face config), got a "
                              f"{type(config).__name__}")
    return config


def _shards(index: Path) -> list[Path]:
    """The shard files a ``model.safetensors.index.json`` names, in order."""
    try:
        shards = json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()
        names = sorted({str(name) for name in shards})
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{index} is not a safetensors index (expected {{\"weight_map\": "
                              f"{{tensor name: shard file}}}}; {type(exc).__name__}: {exc})") \
            from None
    return [index.parent / name for name in names]


def read_weights(path: Path, device) -> dict[str, torch.Tensor]:
    if path.is_dir():
        index = path / "model.safetensors.index.json"
        files = ([path / "model.safetensors"] if (path / "model.safetensors").is_file() else
                 _shards(index) if index.is_file() else [])
        if not files:
            found = sorted(p.name for p in path.iterdir())
            pickled = [n for n in found if n.endswith((".bin", ".pt", ".pth", ".ckpt"))]
            hint = (f"; {pickled} are pickle files, which headwise never loads: convert them "
                    "with safetensors.torch.save_file" if pickled else "")
            raise CheckpointError(f"{path} has no model.safetensors (found {found}){hint}")
    elif path.suffix == ".safetensors":
        files = [path]
    else:
        raise CheckpointError(f"{path} is neither a checkpoint folder nor a .safetensors file")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(str(file), device=str(device)))
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{file}: cannot read safetensors ({exc})") from None
    return state
