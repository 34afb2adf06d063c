"""Helpers shared by subcommands (not a subcommand: the leading underscore hides it)."""

from __future__ import annotations

import re
from pathlib import Path

from headwise._device import parse_device

__all__ = ["MIRROR", "default_png", "indices", "mirror_head", "parse_device", "report_paths"]  # the one device rule lives in headwise._device


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


def indices(spec: str | None, size: int, flag: str) -> list[int] | None:
    """``"0,2,5"`` / ``"0-3"`` / ``"-1"`` -> sorted indices within ``range(size)``."""
    if spec is None:
        return None
    chosen: list[int] = []
    try:
        for part in spec.split(","):
            part = part.strip()
            if "-" in part[1:]:
                lo, hi = part[0] + part[1:].split("-", 1)[0], part[1:].split("-", 1)[1]
                chosen += range(int(lo), int(hi) + 1)
            else:
                chosen.append(int(part))
    except ValueError:
        raise ValueError(f"{flag} {spec!r}: expected indices like 0,2,5 or a range 0-3") from None
    bad = [i for i in chosen if not -size <= i < size]
    if bad:
        raise ValueError(f"{flag} {spec!r}: {bad} out of range; the model has {size} "
                         f"({flag.lstrip('-')} 0..{size - 1})")
    return sorted({i % size for i in chosen})


def default_png(html: Path) -> Path:
    """The heatmaps beside ``-o FILE.html``: ``FILE-heads.png``."""
    return html.with_name(html.stem + "-heads.png")


#: The one measure that decides "the mirror head" (``headwise demo``, ``heads catalogue``): the
#: catalogue's ``mirror`` score, each head's mean weight on the mirrored key ``n_k - 1 - i``
#: over a dataset (:mod:`headwise.analysis.catalogue`).
MIRROR = "mirror"


def mirror_head(cat) -> dict | None:
    """The mirror head of a :class:`~headwise.analysis.catalogue.Catalogue`: its entry with the
    highest :data:`MIRROR` score, a cross-attention head where the model has any (a reversal
    reads the mirrored source position through cross-attention); None when no head has it."""
    ranked = cat.ranked(MIRROR, kind="cross") or cat.ranked(MIRROR)
    return ranked[0] if ranked else None
