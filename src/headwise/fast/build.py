"""Building and loading a C library of kernels (:mod:`headwise.fast.native` decides what to build
and when; this module only runs the compiler and opens the result).

- :func:`start`: compile in a thread, so a slow or hung compiler never holds up the caller
  longer than it chooses to wait; the compiler runs in its own process group (session), so a
  hung one is killed with its children (cc1, as, ld) at the time limit or when this process
  exits; the library is written to a temporary file, flushed to disk and renamed into place
  (another process sees all of it or nothing), then its stamp beside it (``.so.stamp``: the
  library's size and sha256 and the sha256 of its sources and flags);
- :func:`verify`: why a cached library may not be loaded (``""``: it may): no stamp, a stamp
  that does not match the file (truncated by a full disk or an interrupted copy, another
  library copied in its place) or its sources, a function the table needs missing. Mapping a
  truncated library dies of SIGBUS, so nothing is opened before it is verified;
- :func:`open_library`: ``ctypes`` with each function's C signature, from a compact table;
- :func:`ensure`: the cached library, verified, else rebuilt (with :func:`start`), waiting only
  as long as the caller chooses;
- :func:`target`: the compiler and the library's path.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

from headwise import _io

__all__ = ["TYPES", "compile_library", "ensure", "kill", "open_library", "source_key", "start",
           "stamp_path", "target", "verify"]

# the letters of a signature (open_library): pointer, long, int, float
TYPES = {"p": ctypes.c_void_p, "l": ctypes.c_long, "i": ctypes.c_int, "f": ctypes.c_float}
_started: list[dict] = []  # the states of builds this process started (killed at exit)


def start(cc: str, sources, flags, path: Path, state: dict, timeout: float) -> threading.Thread:
    """Build ``sources`` (the ``.c`` ones; the others are headers) with ``cc`` and ``flags``
    into ``path`` in a thread, stored as ``state["thread"]``; the compiler process is
    ``state["proc"]`` while it runs, and ``state["failed"]`` says why it failed (``""``: it
    did not)."""

    def build():
        try:
            state["failed"] = compile_library(cc, sources, flags, path, state, timeout)
        except (OSError, subprocess.SubprocessError) as e:
            state["failed"] = f"could not build {Path(sources[0]).name}: {e}"

    _started.append(state)
    state["thread"] = threading.Thread(target=build, name="headwise-cc", daemon=True)
    state["thread"].start()
    return state["thread"]


def compile_library(cc: str, sources, flags, path: Path, state: dict, timeout: float) -> str:
    """Build the library at ``path``; ``""`` or why not (module docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        built = Path(tmp) / path.name
        proc = subprocess.Popen([cc, *flags, *(str(p) for p in sources if Path(p).suffix == ".c"),
                                 "-o", str(built)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        state["proc"] = proc
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill(proc)
            return (f"{cc} did not finish within {timeout:g} s (killed with its "
                    "children); set CC to a working compiler, or HEADWISE_NATIVE=0")
        finally:
            state.pop("proc", None)
        if proc.returncode != 0:
            return f"{cc} failed: {err.strip()[-300:]}"
        data = built.read_bytes()
        with open(built, "rb+") as f:
            os.fsync(f.fileno())  # on disk before the rename makes it visible
        stamp = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                 "sources": source_key(sources, flags)}
        os.replace(built, path)  # atomic: another process sees all of it or nothing
        _io.atomic_write(stamp_path(path), lambda f: json.dump(stamp, f), binary=False)
    return ""


def stamp_path(path: Path) -> Path:
    """Where the stamp of the library at ``path`` lies."""
    return path.with_name(path.name + ".stamp")


def source_key(sources, flags) -> str:
    """The sha256 of ``sources``' bytes and ``flags``: what a library was built from."""
    return hashlib.sha256(b"".join(Path(p).read_bytes() for p in sources)
                          + " ".join(flags).encode()).hexdigest()


def verify(path: Path, sources, flags, symbols) -> str:
    """Why the library at ``path`` may not be loaded, in one line (``""``: it may): its stamp
    (:func:`compile_library`) must exist and match the file's size and sha256 and the sha256
    of ``sources`` and ``flags``, and each name in ``symbols`` must be among its strings."""
    try:
        stamp = json.loads(stamp_path(path).read_text(encoding="utf-8"))
        data = path.read_bytes()
    except (OSError, ValueError) as e:
        return f"no readable stamp beside it ({type(e).__name__})"
    if not isinstance(stamp, dict) or stamp.get("sources") != source_key(sources, flags):
        return "its stamp names other sources or flags"
    if stamp.get("size") != len(data):
        return f"it holds {len(data)} bytes where its stamp says {stamp.get('size')}"
    if stamp.get("sha256") != hashlib.sha256(data).hexdigest():
        return "its bytes do not match its stamp's sha256 (another file in its place)"
    missing = [s for s in symbols if b"\0" + s.encode() + b"\0" not in data]
    return f"it lacks {missing[0]} (an older build)" if missing else ""


def ensure(cc: str, path: Path, sources, flags, signatures: dict[str, str], state: dict, *,
           wait: float, timeout: float) -> tuple:
    """``(library or None, why, stale)``: the library at ``path`` opened with ``signatures``
    (:func:`open_library`) only once :func:`verify` passes; a missing one, or one whose stamp
    does not verify (``stale`` says why), is built by :func:`start` (one build per ``state``:
    a build under way is joined), waiting at most ``wait`` s for it. ``why`` (one line) says
    why no library is returned: the build is still under way (it goes on, killed after
    ``timeout`` s), it failed, or the new library does not verify either."""
    stale = verify(path, sources, flags, signatures) if path.exists() else ""
    if stale or not path.exists():  # never mapped unverified: a truncated one is SIGBUS
        thread = state.get("thread") or start(cc, sources, flags, path, state, timeout)
        thread.join(wait)
        note = f"the cached {path.name} is rebuilt, as {stale}; " if stale else ""
        if thread.is_alive():
            return None, (f"{note}{cc} is still building {Path(sources[0]).name}: this process "
                          f"uses the torch path; the build goes on (killed after {timeout:g} s) "
                          "and later processes load it"), stale
        if state.get("failed"):
            return None, note + state["failed"], stale
        if bad := verify(path, sources, flags, signatures):
            return None, f"{note}the new {path.name} is not usable: {bad}", stale
    return open_library(path, signatures), "", stale


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the compiler's whole process group, and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # no process groups (Windows): the compiler itself
            proc.kill()
    proc.communicate()


@atexit.register
def _kill_unfinished_builds() -> None:
    for state in _started:
        proc = state.get("proc")
        if proc is not None and proc.poll() is None:
            kill(proc)


def open_library(path: Path, signatures: dict[str, str]):
    """The library at ``path`` with each function's C signature set: ``signatures`` maps a name
    to its argument letters (:data:`TYPES`), ``":"``, and its result's letter (none: void),
    e.g. ``"plf:i"`` for ``int f(void*, long, float)``."""
    lib = ctypes.CDLL(str(path))
    for name, spec in signatures.items():
        args, _, result = spec.partition(":")
        fn = getattr(lib, name)
        fn.argtypes = [TYPES[c] for c in args]
        fn.restype = TYPES[result] if result else None
    return lib


def target(sources, flags) -> tuple[str, Path] | str:
    """``(compiler, library path)`` for ``sources`` built with ``flags``: ``$CC``, else ``cc`` /
    ``gcc``; the library in ``$HEADWISE_CACHE`` (default ``~/.cache/headwise``) named by a hash of
    sources and flags (an edited source builds its own); or why there is no compiler."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return "no C compiler (cc or gcc) on PATH"
    key = source_key(sources, flags)[:16]
    root = Path(os.environ.get("HEADWISE_CACHE") or Path.home() / ".cache" / "headwise")
    return cc, root / f"{Path(sources[0]).stem}-{key}.so"
