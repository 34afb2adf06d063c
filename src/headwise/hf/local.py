"""A local Hugging Face model, loaded for headwise's tools with nothing downloaded: what
``headwise explain --hf DIR`` and ``headwise heads catalogue|score --hf DIR`` run.

``DIR`` is a folder as ``save_pretrained`` writes it (``config.json``, the weights as
safetensors, the tokenizer files; a model :func:`headwise.hf.prune_heads` pruned loads with its
per-layer head counts), one ``.gguf`` file (transformers reads its config, weights and
tokenizer: ``gguf_file=``), or the name of a real model a pip package installed (``"minilm"``,
``"smollm2"``: :data:`headwise.installed.MODELS`, listed by ``headwise models``). A
GGUF's metadata (its whole vocabulary: 49k-262k entries) is parsed into a config once, and
that config goes to the tokenizer and the model (transformers' own weight reader parses it once
more, as in its own ``from_pretrained``). Every check that needs no weights comes first, each one
readable line: a missing path, a folder without ``config.json``, a configuration transformers
does not know, a config naming no model class or one transformers lacks, a model class whose
attention does not go through the attention interface (built on the meta device, so no weights
are read), no tokenizer, a damaged safetensors file or weights of another shape
(:mod:`headwise.hf.folder`); what transformers' loader still raises is one
:class:`~headwise.errors.CheckpointError` line. Everything is read with ``local_files_only=True``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from headwise.errors import CheckpointError, one_line
from headwise.hf import folder as _folder
from headwise.hf.model import NAME, refuse_unless_served
from headwise.installed import MODELS

__all__ = ["CONFIG", "check_source", "load", "skeleton"]

CONFIG = "config.json"


def check_source(source, where: str = "headwise.hf.load") -> Path:
    """``source`` as a path that can hold a model (a folder with ``config.json`` or a ``.gguf``
    file), else a ValueError naming what is missing. A name of :data:`MODELS` that is not a
    path here is that installed model's folder or file. Reads nothing but directory listings."""
    _folder.check_source_type(source, where)
    path = Path(source).expanduser()
    if _folder.resolve(path, where) is None and isinstance(source, str) and source in MODELS:
        return MODELS[source].path()  # not installed: a CheckpointError saying how to install
    if not path.exists():
        names = ", ".join(f"{m.name!r} ({m.title})" for m in MODELS.values())
        raise ValueError(f"{where}: {str(source)!r} does not exist; pass a local Hugging Face "
                         "model folder (config.json, model.safetensors, tokenizer files, as "
                         "save_pretrained writes them), a .gguf file or the name of an "
                         f"installed model: {names} (`headwise models` lists them)")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"{where}: {str(source)!r} is a file, not a model folder; pass the "
                             f"folder that holds {CONFIG} (or a .gguf file)")
        return path
    if not (path / CONFIG).is_file():
        raise ValueError(f"{where}: {str(source)!r} has no {CONFIG}, so it is not a Hugging Face "
                         "model folder; pass the folder save_pretrained wrote (config.json, "
                         "model.safetensors, tokenizer files)")
    return path


def _files(path: Path) -> dict:
    """``from_pretrained``'s location arguments: the folder, or a GGUF file's folder + name."""
    if path.is_file():
        return {"pretrained_model_name_or_path": path.parent, "gguf_file": path.name,
                "local_files_only": True}
    return {"pretrained_model_name_or_path": path, "local_files_only": True}


def _model_class(config, where: str, gguf: bool):
    """The class named in ``config.architectures`` (transformers' own), else the causal-LM
    class of a GGUF file's config (GGUF files hold decoders; their configs name none). A
    folder's config naming none, or only classes transformers lacks, is a CheckpointError
    (``AutoModel``'s class would load the weights without their head)."""
    import transformers

    named = getattr(config, "architectures", None) or ()
    for name in named:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    auto = transformers.AutoModelForCausalLM
    if not gguf:
        lm = [a._model_mapping.get(type(config), None) for a in (
            auto, transformers.AutoModelForMaskedLM, transformers.AutoModel)]
        hint = next((c.__name__ for c in lm if isinstance(c, type)), "the model's class")
        problem = (f"names {list(named)}, which transformers {transformers.__version__} has "
                   "no class for") if named else "names no model class (no \"architectures\")"
        raise CheckpointError(f"{where}: config.json {problem}; set \"architectures\": "
                              f"[\"{hint}\"] in it (what save_pretrained writes)")
    try:
        return auto._model_mapping[type(config)]
    except KeyError:
        raise ValueError(f"{where}: transformers has no model class for "
                         f"{type(config).__name__}") from None


def skeleton(source, where: str = "headwise.hf.load"):
    """The model of ``source`` built from its configuration alone on the meta device (no
    weights are read): which attention layers it has, which kind; a ValueError (one line) for
    a missing path, a configuration transformers cannot read or a class headwise cannot
    serve."""
    import transformers

    files = _files(check_source(source, where))
    try:
        config = transformers.AutoConfig.from_pretrained(**files)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{where}: cannot read the configuration of {str(source)!r}: "
                         f"{one_line(e)}") from None
    with torch.device("meta"):
        model = _model_class(config, where, "gguf_file" in files)(config)
    refuse_unless_served(model, where)
    return model


def tokenizer(files: dict, config, where: str = "headwise.hf.load"):
    """The tokenizer of ``from_pretrained``'s location arguments ``files`` (:func:`_files`),
    whose model has ``config``.

    For a GGUF file with no tokenizer files beside it, the class ``AutoTokenizer`` would pick
    for that config (its mapping of config types, else ``TokenizersBackend``) is called
    directly: ``AutoTokenizer`` itself first parses the file's whole metadata again to rebuild
    the config we hold (SmolLM2's 49k-entry vocabulary: a third of its load)."""
    import transformers
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

    folder = Path(files["pretrained_model_name_or_path"])
    cls = transformers.AutoTokenizer
    if "gguf_file" in files and not getattr(config, "tokenizer_class", None) and not any(
            (folder / n).is_file() for n in ("tokenizer_config.json", "tokenizer.json")):
        mapped = TOKENIZER_MAPPING.get(type(config), None)
        cls = mapped if isinstance(mapped, type) else transformers.TokenizersBackend
        if cls.__name__ == "MistralCommonBackend":  # AutoTokenizer decides on more than the config
            cls = transformers.AutoTokenizer
    try:
        return cls.from_pretrained(**files)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{where}: no tokenizer could be read from "
                         f"{str(files.get('gguf_file') or folder)!r} (save it beside the model: "
                         f"tokenizer.save_pretrained(DIR)): {one_line(e)}") from None


def load(source, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
         where: str = "headwise.hf.load"):
    """``(model, tokenizer)`` of a local model folder, ``.gguf`` file or installed model's name
    (``"minilm"``, ``"smollm2"``; ``headwise models`` lists them), the model running
    ``attn_implementation="headwise"``, in eval mode, on ``device`` in ``dtype``.

    The one loader: a folder :func:`headwise.hf.prune_heads` pruned (and ``save_pretrained``
    wrote) loads with its per-layer head counts, so the deprecated
    :func:`headwise.hf.load_pruned` is no longer needed (``headwise.hf.prune.from_pretrained``
    is the ``from_pretrained`` it wraps, for a model class or options of your own).

    Raises ValueError (one line, before any weights are read) for a missing path or unknown
    name (the message lists the names), a folder without ``config.json``, a configuration or
    tokenizer transformers cannot read, or a model class headwise cannot serve."""
    from safetensors import SafetensorError

    from headwise.hf.prune import from_pretrained, restructure

    device = _folder.check_device(device, where)
    structure = skeleton(source, where)
    files = _files(check_source(source, where))
    if "gguf_file" not in files:  # a damaged or mismatched folder: one line, nothing read yet
        restructure(structure)
        _folder.check_weights(files["pretrained_model_name_or_path"], structure, where)
    tok = tokenizer(files, structure.config, where)
    try:  # a checkpoint headwise.hf.prune_heads pruned gets its per-layer head counts first
        where_from = files.pop("pretrained_model_name_or_path")
        model = from_pretrained(where_from, type(structure), config=structure.config, **files,
                                attn_implementation=NAME, dtype=dtype)
    except (OSError, RuntimeError, ValueError, KeyError, SafetensorError) as e:  # loaders
        raise CheckpointError(f"{where}: cannot read the weights of {str(source)!r}: "
                              f"{one_line(e)[:300]}; {_folder.FIX}") from None
    return model.to(device).eval(), tok
