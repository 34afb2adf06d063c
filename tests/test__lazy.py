"""Public names loaded on first use: one mechanism for the root package and its wings."""

import subprocess
import sys

import pytest

import headwise
import headwise.decode
import headwise.train


@pytest.mark.parametrize("package", [headwise, headwise.decode, headwise.train])
def test_every_export_resolves_to_its_definition_and_is_listed(package):
    for name in package.__all__:
        value = getattr(package, name)
        assert name in vars(package)  # kept: the next look-up skips __getattr__
        assert getattr(package, name) is value
    assert set(package.__all__) <= set(dir(package))


def test_an_unknown_name_is_an_attribute_error_naming_the_package():
    with pytest.raises(AttributeError, match="module 'headwise.decode' has no attribute 'nope'"):
        headwise.decode.nope  # noqa: B018


def test_a_name_is_imported_only_when_first_looked_up():
    code = ("import sys, headwise.decode as d; before = 'headwise.decode.generation' in sys.modules; "
            "d.generate; print(before, 'headwise.decode.generation' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_none_names_the_submodule_itself(tmp_path, monkeypatch):
    pkg = tmp_path / "lazypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from headwise import _lazy\n"
        "__getattr__, __dir__ = _lazy.exports(__name__, {'sub': None, 'VALUE': 'lazypkg.sub'})\n")
    (pkg / "sub.py").write_text("VALUE = 41 + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import lazypkg

    assert lazypkg.VALUE == 42 and lazypkg.sub.VALUE == 42
    assert {"sub", "VALUE"} <= set(dir(lazypkg))
