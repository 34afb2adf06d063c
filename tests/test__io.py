"""Atomic writes: all or nothing, usual permissions."""

import os
import stat

import pytest

from headwise._io import atomic_write


def test_writes_the_file_with_umask_permissions_and_leaves_no_temp(tmp_path):
    path = atomic_write(tmp_path / "sub" / "a.bin", lambda f: f.write(b"\x00\x01"))
    assert path.read_bytes() == b"\x00\x01"
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
    atomic_write(path, lambda f: f.write("héllo"), binary=False)
    assert path.read_text(encoding="utf-8") == "héllo"
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.bin"]


def test_a_failing_writer_leaves_the_previous_file_untouched(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("old")

    def half(f):
        f.write("new, half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, half, binary=False)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]
