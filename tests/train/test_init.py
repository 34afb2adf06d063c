"""The training wing's public names, imported on first use (PEP 562): the torch-free config
stays torch-free, and every name resolves to the object its module defines."""

import subprocess
import sys

import pytest

import headwise.train as T


def test_every_exported_name_is_its_modules_object():
    import importlib
    for name, module in T._EXPORTS.items():
        assert getattr(T, name) is getattr(importlib.import_module(module), name), name
    assert sorted(T.__all__) == sorted(T._EXPORTS) and set(T.__all__) <= set(dir(T))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="'headwise.train' has no attribute 'trian'"):
        T.trian  # noqa: B018


def test_the_config_imports_without_torch():
    code = ("import sys, headwise.train.config as c; c.TrainConfig(task='reverse'); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
