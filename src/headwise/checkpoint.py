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

Recovery: a process killed *between* the two renames leaves no ``<name>`` folder, the previous
checkpoint in ``.<name>.old`` and the complete new one in ``.<name>.tmp-<pid>``. The next
load (or save) promotes the newest temp folder whose writer is gone and whose files match their
sha256, so the newer checkpoint wins, never silently the older one. Temp folders of writers
that are gone (killed mid-save) are removed by the next save.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from headwise import _swap, limits
from headwise._device import parse_device
from headwise._swap import writing
from headwise.errors import CheckpointError

__all__ = ["Loaded", "Verified", "load", "load_train_state", "read_config", "save", "writing"]

FORMAT = 1
_MODEL, _CONFIG = "model.safetensors", "config.json"
_STATE, _STATE_JSON = "train_state.safetensors", "train_state.json"
_FILES = (_MODEL, _STATE, _STATE_JSON)  # the only names config.json may list
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class Verified(NamedTuple):
    """What :func:`read_config` returns: the checkpoint folder and its parsed ``config.json``,
    every listed file's sha256 checked. Hand it on (``load_train_state(checked=...)``,
    ``train(resume=...)``) so that nothing is hashed twice."""

    path: Path
    meta: dict[str, Any]


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


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model


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
    _check_save_args(config, tokenizer, metadata, train_state)
    folder = Path(folder)
    with writing(folder):
        folder.parent.mkdir(parents=True, exist_ok=True)
        if not (folder / _CONFIG).is_file():
            _recover(folder)  # a newer complete checkpoint left by a killed save comes first
        _swap.clean_stale(folder)
        tmp = _swap.temp_for(folder)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _write_files(tmp, folder, model, config, tokenizer, optimizer, train_state, metadata)
    return folder


def _check_save_args(config, tokenizer, metadata, train_state) -> None:
    """TypeError before anything is written: a config without ``kind``/``to_dict()`` (a plain
    dict), a tokenizer without ``to_dict()``, or metadata / train state JSON cannot hold."""
    if not (hasattr(config, "kind") and callable(getattr(config, "to_dict", None))):
        raise TypeError(f"checkpoint.save: config must be the model's config (a dataclass with "
                        f".kind and .to_dict()), got {type(config).__name__}; pass model.config")
    if tokenizer is not None and not callable(getattr(tokenizer, "to_dict", None)):
        raise TypeError(f"checkpoint.save: tokenizer must have .to_dict() (a headwise "
                        f"tokenizer) or be None, got {type(tokenizer).__name__}")
    for name, facts in (("metadata", metadata), ("train_state", train_state)):
        if facts is not None and not isinstance(facts, dict):
            raise TypeError(f"checkpoint.save: {name} must be a dict, got {type(facts).__name__}")
        for key, value in (facts or {}).items():
            try:
                json.dumps({key: value})
            except (TypeError, ValueError):
                raise TypeError(f"checkpoint.save: {name}[{key!r}] is a {type(value).__name__}, "
                                "which JSON cannot hold; store plain numbers, strings, lists "
                                "and dicts (a tensor: .tolist() or float(x))") from None


def _write_files(tmp: Path, folder: Path, model, config, tokenizer, optimizer, train_state,
                 metadata) -> None:
    """Fill ``tmp``, fsync it, swap it in for ``folder`` (two renames)."""
    try:
        _save_model(_unwrap(model), tmp / _MODEL)
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
        _swap.fsync_dir(tmp)
        _swap.swap_in(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _save_model(model: nn.Module, path: Path) -> None:
    """safetensors' ``save_model`` (tied weights written once) for weights in any storage
    layout: a decoding step may store a matrix transposed, or several as blocks of one buffer
    (:func:`headwise.fast.rows.lay_out`), which ``save_model`` cannot take. Each such tensor is
    copied once, so tensors that are one (tied) still share the copy and stay tied in the
    file."""
    from types import SimpleNamespace

    from safetensors.torch import save_model
    state, copies = model.state_dict(), {}
    for name, t in state.items():
        whole = t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.nbytes
        if not (t.is_contiguous() and whole):
            key = (t.data_ptr(), tuple(t.shape), t.stride())
            if key not in copies:
                copies[key] = t.clone(memory_format=torch.contiguous_format)
            state[name] = copies[key]
    save_model(SimpleNamespace(state_dict=lambda: state), str(path))


def _resolve(folder: str | Path) -> Path:
    folder = Path(folder)
    if (folder / _CONFIG).is_file():
        return folder
    if (folder / "checkpoint" / _CONFIG).is_file():  # a run folder (headwise train --out)
        return folder / "checkpoint"
    for cand in (folder, folder / "checkpoint"):  # killed between the two renames of save()
        found = _recover(cand)
        if found is not None:
            return found
    if not folder.exists():
        raise CheckpointError(f"checkpoint folder {str(folder)!r} does not exist")
    raise CheckpointError(f"{folder} is not a headwise checkpoint: no {_CONFIG} in it (or in "
                          f"{folder / 'checkpoint'})")


def _check_meta(meta: Any, where: Path) -> None:
    """The shape of a parsed ``config.json``: every field of the right type, files only
    from the checkpoint's own names (never a path out of the folder)."""
    if not isinstance(meta, dict) or not {"kind", "config", "files"} <= set(meta):
        raise CheckpointError(f"{where} is not a headwise checkpoint config (needs kind, "
                              f"config, files)")
    if not isinstance(meta["kind"], str) or not isinstance(meta["config"], dict):
        raise CheckpointError(f"{where}: 'kind' must be a string and 'config' an object; got "
                              f"{type(meta['kind']).__name__} and {type(meta['config']).__name__}")
    files = meta["files"]
    if (not isinstance(files, dict) or _MODEL not in files
            or not all(n in _FILES and isinstance(h, str) and _SHA256.match(h)
                       for n, h in files.items())):
        raise CheckpointError(f"{where}: 'files' must map {list(_FILES)} (model.safetensors at "
                              f"least) to sha256 hex digests; got {str(files)[:120]}")
    for key in ("metadata", "tokenizer"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            raise CheckpointError(f"{where}: '{key}' must be an object; got "
                                  f"{type(meta[key]).__name__}")


def _verify(path: Path) -> dict[str, Any]:
    """Parse and check ``path/config.json`` and the sha256 of every file it lists."""
    try:
        meta = json.loads((path / _CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path / _CONFIG} is corrupted ({type(exc).__name__}: {exc})") from None
    _check_meta(meta, path / _CONFIG)
    for name, digest in meta["files"].items():
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path} is missing {name}")
        if _sha256(path / name) != digest:
            raise CheckpointError(f"checkpoint file {path / name} is corrupted (its sha256 does "
                                  f"not match config.json); re-save or retrain it")
    return meta


def _complete(path: Path) -> bool:
    try:
        _verify(path)
    except CheckpointError:
        return False
    return True


def _recover(folder: Path) -> Path | None:
    """A save was killed between its renames: the newest complete copy wins (sha256)."""
    return _swap.recover(folder, _complete, _CONFIG)


def read_config(folder: str | Path) -> Verified:
    """``(checkpoint path, parsed config.json)``, with every listed file's sha256 verified."""
    path = _resolve(folder)
    return Verified(path, _verify(path))


def build_config(meta: dict[str, Any], where: Path):
    """The model config of a checkpoint, refused when the model it describes could not fit
    in memory or in its own weights file (an edited ``config.json``)."""
    from headwise.models import config_from_dict
    try:
        config = config_from_dict(meta["kind"], meta["config"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{where / _CONFIG}: bad model config: {exc}") from None
    n = limits.parameter_count(config.kind, config.to_dict())
    on_disk = (where / _MODEL).stat().st_size if (where / _MODEL).is_file() else 0
    if on_disk and 4 * n > 4 * on_disk + (1 << 20):
        raise CheckpointError(f"{where / _CONFIG} describes a model of {n:,} parameters "
                              f"({limits.format_bytes(4 * n)}) but {_MODEL} holds "
                              f"{limits.format_bytes(on_disk)}; the config was edited")
    try:
        limits.check_memory(4 * n, f"the model of {where} ({n:,} parameters)", "load",
                            "load it on a machine with more memory")
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    return config


def load_weights(model: nn.Module, path: Path) -> None:
    """Load ``model.safetensors`` of checkpoint ``path`` into ``model`` (strict); a checkpoint
    of a model with other heads (pruned) is refused naming both structures."""
    from safetensors.torch import load_model

    from headwise.models.pruned import check_structure
    check_structure(_unwrap(model), path / _MODEL, path / _CONFIG)
    try:
        load_model(_unwrap(model), str(path / _MODEL), strict=True)
    except Exception as exc:  # safetensors / torch raise many kinds; report one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"weights in {path / _MODEL} do not fit the model: {first[:300]}") from None


def load(folder: str | Path, device: str | torch.device = "cpu") -> Loaded:
    """Rebuild the model of a checkpoint folder (or a run folder holding ``checkpoint/``)."""
    from headwise.data.tokenizers import tokenizer_from_dict
    from headwise.models import build

    device = parse_device(str(device))  # a bad device fails before any file is read
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
    if _STATE_JSON not in meta["files"] or _STATE not in meta["files"]:
        raise CheckpointError(f"checkpoint {path} has no training state (it was saved for "
                              f"inference only); it cannot be resumed")
    try:
        saved = json.loads((path / _STATE_JSON).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path / _STATE_JSON} is corrupted ({type(exc).__name__})") from None
    if (not isinstance(saved, dict) or not isinstance(saved.get("state"), dict)
            or not isinstance(saved.get("optimizer"), (dict, type(None)))):
        raise CheckpointError(f"{path / _STATE_JSON} is not a headwise training state (needs "
                              f"'state' and 'optimizer' objects)")
    if optimizer is not None:
        opt = saved.get("optimizer")
        if opt is None:
            raise CheckpointError(f"checkpoint {path} has no optimizer state to resume from")
        try:
            tensors = load_file(str(path / _STATE))
        except Exception as exc:  # safetensors raises its own kinds for a damaged header
            raise CheckpointError(f"{path / _STATE} is not a readable safetensors file "
                                  f"({type(exc).__name__}); re-save or retrain it") from None
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
