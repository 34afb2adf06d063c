"""Checkpoints: a folder of safetensors + JSON, written atomically, never pickle.

Layout of a checkpoint folder::

    model.safetensors        the weights (tied weights stored once)
    config.json              {"kind", "config", "tokenizer", "metadata", "files": {name: sha256}}
    train_state.safetensors  optimizer tensors (optional)
    train_state.json         step, optimizer hyper-parameters, training config, history (optional)

:func:`save` writes every file into a temporary sibling folder, fsyncs it, then swaps it in
with two ``os.replace`` calls (the previous checkpoint is kept as ``.<name>.old`` between them),
so a process killed at any instant leaves either the old or the new checkpoint, complete.
:func:`load` checks the sha256 of every file, so a truncated or altered file is reported as
corrupted instead of surfacing a torch traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from headwise.errors import CheckpointError

__all__ = ["Loaded", "load", "load_train_state", "read_config", "save"]

FORMAT = 1
_MODEL, _CONFIG = "model.safetensors", "config.json"
_STATE, _STATE_JSON = "train_state.safetensors", "train_state.json"


@dataclass
class Loaded:
    """What :func:`load` returns: the built model (eval mode), its config, tokenizer or None,
    and the ``metadata`` dict saved with it."""

    model: nn.Module
    config: Any
    tokenizer: Any
    metadata: dict[str, Any]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model


def _old(folder: Path) -> Path:
    return folder.parent / f".{folder.name}.old"


def save(folder: str | Path, model: nn.Module, config: Any, tokenizer: Any = None, *,
         optimizer: torch.optim.Optimizer | None = None, train_state: dict[str, Any] | None = None,
         metadata: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint folder atomically (see the module docstring) and return its path.

    Args:
        model: the model (a DDP wrapper is unwrapped).
        config: its config dataclass (``kind`` attribute + ``to_dict()``).
        tokenizer: anything with ``to_dict()``, or None.
        optimizer: if given, its state goes to ``train_state.safetensors`` (tensors) and
            ``train_state.json`` (hyper-parameters), together with ``train_state`` (JSON-safe).
        metadata: JSON-safe facts stored in ``config.json`` (task, metrics, ...).
    """
    from safetensors.torch import save_model

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        save_model(_unwrap(model), str(tmp / _MODEL))
        files = [_MODEL]
        if optimizer is not None or train_state is not None:
            from safetensors.torch import save_file
            tensors, opt_json = _flatten_optimizer(optimizer) if optimizer else ({}, None)
            save_file(tensors, str(tmp / _STATE))
            _write_json(tmp / _STATE_JSON, {"format": FORMAT, "optimizer": opt_json,
                                            "state": train_state or {}})
            files += [_STATE, _STATE_JSON]
        _write_json(tmp / _CONFIG, {
            "format": FORMAT, "kind": config.kind, "config": config.to_dict(),
            "tokenizer": tokenizer.to_dict() if tokenizer is not None else None,
            "metadata": metadata or {}, "files": {n: _sha256(tmp / n) for n in files}})
        for name in [*files, _CONFIG]:
            with open(tmp / name, "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(tmp)
        old = _old(folder)
        shutil.rmtree(old, ignore_errors=True)
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
        _fsync_dir(folder.parent)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _resolve(folder: str | Path) -> Path:
    folder = Path(folder)
    if (folder / _CONFIG).is_file():
        return folder
    if (folder / "checkpoint" / _CONFIG).is_file():  # a run folder (headwise train --out)
        return folder / "checkpoint"
    for cand in (folder, folder / "checkpoint"):  # killed between the two renames of save()
        if (_old(cand) / _CONFIG).is_file():
            return _old(cand)
    if not folder.exists():
        raise CheckpointError(f"checkpoint folder {str(folder)!r} does not exist")
    raise CheckpointError(f"{folder} is not a headwise checkpoint: no {_CONFIG} in it (or in "
                          f"{folder / 'checkpoint'})")


def read_config(folder: str | Path) -> tuple[Path, dict[str, Any]]:
    """``(checkpoint path, parsed config.json)``, with every listed file's sha256 verified."""
    path = _resolve(folder)
    try:
        meta = json.loads((path / _CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path / _CONFIG} is corrupted ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta, dict) or not {"kind", "config", "files"} <= set(meta):
        raise CheckpointError(f"{path / _CONFIG} is not a headwise checkpoint config (needs "
                              f"kind, config, files)")
    for name, digest in meta["files"].items():
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path} is missing {name}")
        if _sha256(path / name) != digest:
            raise CheckpointError(f"checkpoint file {path / name} is corrupted (its sha256 does "
                                  f"not match config.json); re-save or retrain it")
    return path, meta


def build_config(meta: dict[str, Any], where: Path):
    from headwise.models import config_from_dict
    try:
        return config_from_dict(meta["kind"], meta["config"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{where / _CONFIG}: bad model config: {exc}") from None


def load_weights(model: nn.Module, path: Path) -> None:
    """Load ``model.safetensors`` of checkpoint ``path`` into ``model`` (strict)."""
    from safetensors.torch import load_model
    try:
        load_model(_unwrap(model), str(path / _MODEL), strict=True)
    except Exception as exc:  # safetensors / torch raise many kinds; report one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"weights in {path / _MODEL} do not fit the model: {first[:300]}") from None


def load(folder: str | Path, device: str | torch.device = "cpu") -> Loaded:
    """Rebuild the model of a checkpoint folder (or a run folder holding ``checkpoint/``)."""
    from headwise.data.tokenizers import tokenizer_from_dict
    from headwise.models import build

    path, meta = read_config(folder)
    config = build_config(meta, path)
    model = build(config)
    load_weights(model, path)
    tokenizer = None
    if meta.get("tokenizer") is not None:
        try:
            tokenizer = tokenizer_from_dict(meta["tokenizer"])
        except ValueError as exc:
            raise CheckpointError(f"{path / _CONFIG}: bad tokenizer: {exc}") from None
    return Loaded(model.to(device).eval(), config, tokenizer, meta.get("metadata", {}))


def _flatten_optimizer(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for key, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{pid}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{pid}.{key}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def load_train_state(folder: str | Path, optimizer: torch.optim.Optimizer | None = None, *,
                     checked: tuple[Path, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Restore ``optimizer`` (if given) from a checkpoint and return its ``train_state`` dict.

    ``checked``: what :func:`read_config` returned for ``folder``, so that a caller who already
    verified the files (every sha256) does not pay for it again.

    Raises CheckpointError if the checkpoint has no training state or the optimizer does not
    match it (other parameters)."""
    from safetensors.torch import load_file

    path, meta = read_config(folder) if checked is None else checked
    if _STATE_JSON not in meta["files"]:
        raise CheckpointError(f"checkpoint {path} has no training state (it was saved for "
                              f"inference only); it cannot be resumed")
    saved = json.loads((path / _STATE_JSON).read_text(encoding="utf-8"))
    if optimizer is not None:
        opt = saved.get("optimizer")
        if opt is None:
            raise CheckpointError(f"checkpoint {path} has no optimizer state to resume from")
        tensors = load_file(str(path / _STATE))
        state: dict[int, dict[str, Any]] = {}
        for name, t in tensors.items():
            _, pid, key = name.split(".", 2)
            state.setdefault(int(pid), {})[key] = t
        for name, value in opt["scalars"].items():
            pid, key = name.split(".", 1)
            state.setdefault(int(pid), {})[key] = value
        mine = optimizer.state_dict()["param_groups"]
        theirs = opt["param_groups"]
        if [len(g["params"]) for g in mine] != [len(g["params"]) for g in theirs]:
            raise CheckpointError(f"optimizer state in {path} is for another model "
                                  f"({[len(g['params']) for g in theirs]} parameters per group, "
                                  f"this model has {[len(g['params']) for g in mine]})")
        try:
            optimizer.load_state_dict({"state": state, "param_groups": theirs})
        except (ValueError, RuntimeError, KeyError) as exc:
            raise CheckpointError(f"optimizer state in {path} does not fit: {exc}") from None
        for group in optimizer.param_groups:  # shapes were checked only by count above
            for p in group["params"]:
                for key, v in optimizer.state.get(p, {}).items():
                    if isinstance(v, torch.Tensor) and v.dim() and v.shape != p.shape:
                        raise CheckpointError(f"optimizer state {key} in {path} has shape "
                                              f"{tuple(v.shape)}, its parameter {tuple(p.shape)}")
    return saved["state"]
