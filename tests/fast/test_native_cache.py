"""headwise.fast.native's cache: a cached library is loaded only once verified. A truncated one
(SIGBUS when mapped), another library in its place (libm) or an older build lacking a function
is rebuilt; the status says why in one line; and a build under way never holds up status()."""

from __future__ import annotations

import ctypes.util
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from headwise.fast import build
from headwise.fast import native as _native
from tests.fast.test_native import _builds_here, _hanging_build

needs_kernel = pytest.mark.skipif(not _builds_here(), reason="no x86-64 AVX2 CPU or no cc")

# a fresh process: settle the kernel (waiting for a rebuild), multiply once, print the status
STATUS = """
import torch
from headwise.fast import native
try:
    print(native.status(wait=native.BUILD_TIMEOUT_S))
except TypeError:  # (a status that always waits)
    print(native.status())
x, w = torch.randn(2, 8), torch.randn(5, 8)
y = native.rows_matmul(x, w)
print(y is not None and bool(torch.allclose(y, x @ w.t(), atol=1e-5)))
"""


def _status(cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HEADWISE_CACHE": str(cache), "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", STATUS], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A cache with a freshly built library: its path (a good copy kept beside the cache)."""
    cache = tmp_path_factory.mktemp("cache")
    run = _status(cache)
    assert run.returncode == 0 and run.stdout.split() == ["ready", "True"], run
    lib = next(cache.glob("step_kernels-*.so"))
    shutil.copy(lib, cache.parent / "good.so")
    return lib


def _older_build(tmp_path: Path) -> Path:
    """A library with an older build's subset of the functions (no headwise_self_rows)."""
    src = tmp_path / "old.c"
    src.write_text("int headwise_features(void) { return 0; }\n"
                   "int headwise_rows_matmul(void) { return 0; }\n")
    out = tmp_path / "old.so"
    subprocess.run([shutil.which("cc"), "-shared", "-fPIC", str(src), "-o", str(out)],
                   check=True)
    return out


@needs_kernel
@pytest.mark.parametrize("damage", ["truncated to half", "libm in its place", "an older build",
                                    "0 bytes", "stamp removed"])
def test_a_damaged_cached_library_is_rebuilt_not_mapped(built, damage, tmp_path):
    """Before, a truncated library died of SIGBUS (exit -7) and a foreign or older one was an
    AttributeError traceback; now each is found by its stamp and rebuilt, and the new one
    multiplies right."""
    good = built.parent.parent / "good.so"
    shutil.copy(good, built)
    if damage == "truncated to half":
        os.truncate(built, built.stat().st_size // 2)
    elif damage == "libm in its place":
        libm = ctypes.util.find_library("m")
        found = [p for p in (Path("/lib/x86_64-linux-gnu") / (libm or ""),
                             Path("/usr/lib/x86_64-linux-gnu") / (libm or "")) if p.is_file()]
        if not found:
            pytest.skip("no libm file found")
        shutil.copy(found[0], built)
    elif damage == "an older build":
        shutil.copy(_older_build(tmp_path), built)
    elif damage == "0 bytes":
        built.write_bytes(b"")
    else:
        build.stamp_path(built).unlink(missing_ok=True)
    run = _status(built.parent)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert run.stdout.split() == ["ready", "True"], run.stdout
    assert build.verify(built, _native.SOURCES, _native.FLAGS, _native.SIGNATURES) == ""


@needs_kernel
def test_verify_names_what_is_wrong(built, tmp_path):
    """Each mismatch in one line: size, bytes, sources, a missing function even under a stamp
    that matches the file (a forged or hand-copied stamp)."""
    lib = tmp_path / built.name
    shutil.copy(built.parent.parent / "good.so", lib)
    shutil.copy(build.stamp_path(built), build.stamp_path(lib))
    args = (_native.SOURCES, _native.FLAGS, _native.SIGNATURES)
    assert build.verify(lib, *args) == ""
    assert "other sources or flags" in build.verify(lib, _native.SOURCES, ("-O1",), {})
    os.truncate(lib, lib.stat().st_size - 1)
    assert "bytes where its stamp says" in build.verify(lib, *args)
    old = _older_build(tmp_path)
    shutil.copy(old, lib)
    stamp = build.stamp_path(built).read_text()
    import hashlib
    import json
    fake = {**json.loads(stamp), "size": old.stat().st_size,
            "sha256": hashlib.sha256(old.read_bytes()).hexdigest()}
    build.stamp_path(lib).write_text(json.dumps(fake))
    assert build.verify(lib, *args).startswith("it lacks headwise_")
    build.stamp_path(lib).unlink()
    assert "no readable stamp" in build.verify(lib, *args)


@pytest.mark.skipif(not Path("/proc").is_dir() or platform.machine().lower() not in (
    "x86_64", "amd64") or torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
    reason="needs Linux /proc and an x86-64 AVX2 CPU (else no build is tried)")
def test_status_does_not_wait_for_a_build_under_way(monkeypatch, tmp_path):
    """``headwise chat`` printed its roof line with ``status()``, which waited for a hung
    compiler's time limit (~107 s more at exit); now status answers at once with the reason."""
    _hanging_build(monkeypatch, tmp_path, 0.3, 4)
    start = time.monotonic()
    why = _native.status()
    assert time.monotonic() - start < 2.5, why
    assert "still building" in why and "\n" not in why
    assert "did not finish within 4 s" in _native.status(wait=10)
