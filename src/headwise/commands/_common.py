"""Helpers shared by subcommands (not a subcommand: the leading underscore hides it)."""

from __future__ import annotations

import re
from pathlib import Path

from headwise._device import parse_device

__all__ = ["parse_device", "report_paths"]  # the one device rule lives in headwise._device


REPORTS = Path("headwise-reports")


def report_paths(output: str | None, command: str, label: str,
                 files: tuple[str, str] = ("head_view.html", "heatmaps.png"),
                 ) -> tuple[Path, Path | None]:
    """Where ``view``/``explain`` (and ``heads catalogue``, with its own ``files``) write:
    ``(page .html, second file or None)``.

    ``-o FILE.html`` -> that file and no second file unless asked; ``-o DIR`` ->
    ``DIR/head_view.html`` and ``DIR/heatmaps.png``; nothing -> the report folder
    ``headwise-reports/<command>-<label>/`` (never loose files in the working directory)."""
    if output is not None and Path(output).suffix.lower() in (".html", ".htm"):
        return Path(output), None
    if output is not None and Path(output).suffix:
        raise ValueError(f"-o {output}: expected a folder or a .html file (e.g. -o view.html)")
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")[:40] or "input"
    folder = Path(output) if output is not None else REPORTS / f"{command}-{slug}"
    return folder / files[0], folder / files[1]
