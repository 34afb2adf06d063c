"""Atomic replacement of a whole folder, and recovery after a kill.

A writer fills ``.<name>.tmp-<pid>`` beside ``<name>``, fsyncs it, then swaps it in with two
renames: ``<name> -> .<name>.old`` and ``.<name>.tmp-<pid> -> <name>``. A process killed at any
instant leaves a complete folder somewhere:

- before the first rename: ``<name>`` (old) is intact; the temp folder is stale;
- between the renames: no ``<name>``; ``.<name>.old`` is the previous folder and the temp
  folder the complete new one: :func:`recover` promotes the newest complete temp folder whose
  writer is gone (the caller's ``verify`` decides "complete", e.g. by sha256), so the newer
  one wins; only with none does it fall back to ``.<name>.old``, with a warning.

:func:`clean_stale` removes temp folders whose writer process is gone (never one whose writer
still runs). :func:`writing` turns filesystem failures into one readable error.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from headwise.errors import OutputError

__all__ = ["clean_stale", "fsync_dir", "old_of", "recover", "swap_in", "temp_for", "writing"]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def old_of(folder: Path) -> Path:
    return folder.parent / f".{folder.name}.old"


def temp_for(folder: Path) -> Path:
    """This process's temp folder for ``folder``."""
    return folder.parent / f".{folder.name}.tmp-{os.getpid()}"


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Report a filesystem failure while writing ``path`` (read-only, full disk, no
    permission, ...) as one :class:`OutputError` line instead of a traceback."""
    try:
        yield
    except OutputError:
        raise
    except Exception as exc:
        why = _io_failure(exc)
        if why is None:
            raise
        raise OutputError(f"cannot write {path}: {why}; free some space, fix the permissions "
                          "or write somewhere else") from None


def _io_failure(exc: BaseException) -> str | None:
    """What the filesystem said, for an OSError or for safetensors' own error around one (a
    full disk while writing tensors is ``SafetensorError: ... I/O error: No space left``, not
    an OSError); None for anything else."""
    if isinstance(exc, OSError):
        return f"{exc.strerror or type(exc).__name__} (errno {exc.errno})"
    try:
        from safetensors import SafetensorError
    except ImportError:
        return None
    if isinstance(exc, SafetensorError) and "I/O error" in str(exc):
        return str(exc).split("I/O error:", 1)[1].strip()
    return None


def _temps(folder: Path) -> list[tuple[Path, int]]:
    """``(path, writer pid)`` of the temp folders left beside ``folder``."""
    prefix = f".{folder.name}.tmp-"
    try:
        entries = list(folder.parent.iterdir())
    except OSError:
        return []
    return [(p, int(p.name[len(prefix):])) for p in entries
            if p.name.startswith(prefix) and p.name[len(prefix):].isdigit()]


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one we may not signal exists too)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # EPERM: another user's process
    return True


def clean_stale(folder: Path) -> list[Path]:
    """Remove the temp folders of writers that are gone; returns what was removed."""
    removed = []
    for tmp, pid in _temps(folder):
        if not _alive(pid):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


def recover(folder: Path, complete: Callable[[Path], bool], marker: str) -> Path | None:
    """``folder`` is missing: promote the newest temp folder of a gone writer for which
    ``complete(path)`` holds (newest by the mtime of its ``marker`` file, written last); with
    none, ``.<name>.old`` (warning). Returns the path to read (``folder`` once promoted; the
    source itself when the filesystem is read-only), or None when nothing is there."""
    found = [((tmp / marker).stat().st_mtime_ns, str(tmp)) for tmp, pid in _temps(folder)
             if not _alive(pid) and complete(tmp)]
    old = old_of(folder)
    if found:
        source = Path(max(found)[1])
    elif complete(old):
        warnings.warn(f"{folder} is missing and no complete newer copy exists; using the "
                      f"previous one ({old})", stacklevel=3)
        source = old
    else:
        return None
    try:
        os.replace(source, folder)
        fsync_dir(folder.parent)
    except OSError:
        return source
    if source != old:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def swap_in(tmp: Path, folder: Path) -> None:
    """Replace ``folder`` by the complete, fsynced ``tmp`` (the two renames)."""
    old = old_of(folder)
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        os.replace(folder, old)
    os.replace(tmp, folder)
    fsync_dir(folder.parent)
    shutil.rmtree(old, ignore_errors=True)
