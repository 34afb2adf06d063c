"""The attention layers of a model another library built: a registry the core asks and the wing
for that library fills when it is imported.

The core (:func:`headwise.stats.collect`, :func:`headwise.models.attention_layers`) never imports
the wing that knows such a model: ``import headwise.hf`` registers its :class:`Finder` for
transformers models here, as it registers ``attn_implementation="headwise"`` with transformers.
A transformers model met while no finder is registered cannot be running headwise's attention
(that same import is what makes the name exist), so it is refused with the fix.

A leaf: imports nothing of headwise (the wing table: ``tests/test_wings.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Finder", "head_count", "layers", "register", "registered", "transformers_model"]


@dataclass(frozen=True)
class Finder:
    """What a wing for another library's models registers.

    Attributes:
        library: the library's name (``"transformers"``); registering it again replaces it.
        owns: whether a model is one of that library's.
        layers: ``layers(model, where)``: the model's attention layers, in the order the head
            tools number them, or a ValueError starting with ``where`` when they do not report
            to headwise (and saying how to make them).
        owns_layer: whether a module is one of those attention layers.
        head_count: the query heads of one such layer.
    """

    library: str
    owns: Callable[[object], bool]
    layers: Callable[[object, str], list]
    owns_layer: Callable[[object], bool]
    head_count: Callable[[object], int]


_FINDERS: dict[str, Finder] = {}  # library -> its finder, in registration order


def register(finder: Finder) -> None:
    """Add ``finder`` (replacing one registered for the same library)."""
    if not isinstance(finder, Finder):
        raise TypeError(f"register expects a headwise.finders.Finder, got "
                        f"{type(finder).__name__}")
    _FINDERS[finder.library] = finder


def registered() -> list[str]:
    """The libraries whose finders are registered."""
    return list(_FINDERS)


def transformers_model(model) -> bool:
    """A transformers PreTrainedModel (transformers is not imported to find out)."""
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(model, transformers.PreTrainedModel)


def layers(model, where: str) -> list | None:
    """The attention layers of ``model`` by the finder that owns it; None when no finder owns
    it (a headwise model, or any module whose attention is headwise's own). A transformers
    model with no finder registered is a ValueError naming the fix."""
    for finder in _FINDERS.values():
        if finder.owns(model):
            return finder.layers(model, where)
    if transformers_model(model):
        raise ValueError(f"{where}: {type(model).__name__} is a transformers model, which "
                         "reports its heads to headwise only on attn_implementation='headwise'; "
                         "import headwise.hf and call headwise.hf.use(model) first")
    return None


def head_count(module) -> int:
    """The query heads of an attention layer a registered finder owns; ValueError otherwise."""
    for finder in _FINDERS.values():
        if finder.owns_layer(module):
            return finder.head_count(module)
    raise ValueError(f"cannot tell how many heads {type(module).__name__} has: it is not a "
                     f"headwise MultiHeadAttention and no registered finder (registered: "
                     f"{registered() or 'none'}) owns it; a transformers attention layer needs "
                     "import headwise.hf")
