"""Public names a package loads on first use (PEP 562), so that importing it stays cheap."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def exports(package: str, table: Mapping[str, str | None]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package``: ``table`` maps each public name to the module
    that defines it, or None for the submodule ``package.name`` itself. A name is imported at
    its first look-up and kept in the package, so later look-ups skip ``__getattr__``."""

    def __getattr__(name: str):
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = table[name]
        value = (importlib.import_module(f"{package}.{name}") if module is None
                 else getattr(importlib.import_module(module), name))
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__
