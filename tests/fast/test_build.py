"""headwise.fast.build: a failing compiler's message comes back and nothing is left behind;
a built library opens with the C signatures its table gives."""

import shutil
import sys

import pytest

from headwise.fast import build

CC = shutil.which("cc") or shutil.which("gcc")


@pytest.mark.skipif(CC is None, reason="needs cc")
def test_a_failing_compiler_says_why_and_leaves_no_library(tmp_path):
    bad = tmp_path / "bad.c"
    bad.write_text("int f(void) { return }\n")
    state = {}
    why = build.compile_library(CC, [bad], ["-shared"], tmp_path / "lib" / "x.so", state, 60)
    assert why.startswith(f"{CC} failed") and "error" in why
    assert not (tmp_path / "lib" / "x.so").exists() and "proc" not in state


@pytest.mark.skipif(CC is None or not sys.platform.startswith("linux"), reason="needs cc")
def test_a_built_library_opens_with_its_signatures(tmp_path):
    src = tmp_path / "k.c"
    src.write_text("double scale(double *x, long n, float f) { return x[n - 1] * f; }\n"
                   "void nothing(int a) { (void)a; }\n")
    path = tmp_path / "out" / "k.so"
    state = {}
    build.start(CC, [src], ["-O1", "-shared", "-fPIC"], path, state, 60).join(60)
    assert state["failed"] == "" and path.exists()
    lib = build.open_library(path, {"nothing": "i:"})
    assert lib.nothing.restype is None and lib.nothing.argtypes == [build.TYPES["i"]]
    assert set(build.TYPES) == {"p", "l", "i", "f"}
    with pytest.raises(AttributeError):
        build.open_library(path, {"missing": ":i"})


def test_a_compiler_past_its_time_limit_is_killed(tmp_path):
    slow = tmp_path / "slowcc"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    state = {}
    why = build.compile_library(str(slow), [tmp_path / "a.c"], [], tmp_path / "x.so", state, 0.5)
    assert "did not finish within 0.5 s (killed with its children)" in why


def test_the_target_is_named_by_its_sources_and_flags(tmp_path, monkeypatch):
    """An edited source or another flag builds a library of its own; no compiler: the reason."""
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "my-cc")
    src = tmp_path / "kernels.c"
    src.write_text("int f(void) { return 1; }\n")
    cc, path = build.target((src,), ("-O2",))
    assert cc == "my-cc" and path.parent == tmp_path and path.name.startswith("kernels-")
    assert build.target((src,), ("-O3",))[1] != path
    src.write_text("int f(void) { return 2; }\n")
    assert build.target((src,), ("-O2",))[1] != path
    monkeypatch.delenv("CC")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert build.target((src,), ("-O2",)) == "no C compiler (cc or gcc) on PATH"
