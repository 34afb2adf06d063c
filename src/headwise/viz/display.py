"""What :func:`~headwise.viz.head_view` and :func:`~headwise.viz.heatmaps` return: results
that save to a file and display inline in Jupyter, offline.

- :class:`HeadView` -- the head view page. ``_repr_html_`` puts the whole self-contained page
  in an ``<iframe srcdoc>`` (its scripts, styles and ids stay apart from the notebook's and from
  other views; nothing is fetched).
- :class:`Heatmaps` -- the matplotlib grid. ``_repr_png_`` gives the PNG bytes.
- :func:`asset` -- a script or style from ``viz/assets``, which every offline page inlines.

Both are path-like once saved (``open(result)``, ``Path(result)``), so code that treated the
return value as the written path keeps working.
"""

from __future__ import annotations

import html
import io
import os
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from headwise._io import atomic_write

__all__ = ["HeadView", "Heatmaps", "asset"]


def asset(name: str) -> str:
    """The text of ``headwise/viz/assets/<name>`` (``head_view.js``, ``catalogue.css``, ...)."""
    return resources.files("headwise.viz").joinpath("assets", name).read_text("utf-8")


class _Saved:
    path: Path | None

    def __fspath__(self) -> str:
        if self.path is None:
            raise TypeError(f"this {type(self).__name__} was not written to a file; call "
                            ".save(path) first (or pass path= when making it)")
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path) if self.path is not None else repr(self)


@dataclass(frozen=True, eq=False)
class HeadView(_Saved):
    """The interactive head view: ``html`` is one self-contained page; ``path`` where it was
    written (``None`` if not yet). ``height`` is the inline frame's height in a notebook."""

    html: str
    path: Path | None = None
    height: int = 820

    def save(self, path: str | os.PathLike) -> HeadView:
        """Write the page to ``path`` (``.html``, atomically); returns the saved view."""
        path = Path(path)
        if path.suffix.lower() not in (".html", ".htm"):
            raise ValueError(f"head_view path {str(path)!r} must end in .html (e.g. view.html)")
        atomic_write(path, lambda f: f.write(self.html), binary=False)
        return replace(self, path=path)

    def _repr_html_(self) -> str:
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" sandbox="allow-scripts" '
                f'style="width: 100%; height: {int(self.height)}px; border: 0;" '
                'title="headwise head view"></iframe>')

    def __repr__(self) -> str:
        where = f"path={str(self.path)!r}" if self.path else "not saved"
        return f"HeadView({where}, {len(self.html.encode()) / 1e6:.2f} MB)"


@dataclass(frozen=True, eq=False)
class Heatmaps(_Saved):
    """The heatmap grid: ``figure`` (matplotlib, Agg canvas) and ``path`` where it was written
    (``None`` if not yet)."""

    figure: Any
    path: Path | None = None
    dpi: int = 130

    FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}

    def save(self, path: str | os.PathLike) -> Heatmaps:
        """Write the grid to ``path``; the format comes from the extension (.png/.svg/.pdf)."""
        path = Path(path)
        fmt = self.FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise ValueError(f"heatmaps path {str(path)!r} has extension {path.suffix!r}; "
                             f"expected one of {sorted(self.FORMATS)} (e.g. heads.png)")
        atomic_write(path, lambda f: self._draw(f, fmt))
        return replace(self, path=path)

    def png(self) -> bytes:
        """The grid as PNG bytes."""
        buf = io.BytesIO()
        self._draw(buf, "png")
        return buf.getvalue()

    def _repr_png_(self) -> bytes:
        return self.png()

    def _draw(self, f, fmt: str) -> None:
        self.figure.savefig(f, format=fmt, dpi=self.dpi, facecolor="white",
                            metadata={"Software": "headwise"} if fmt == "png" else None)

    def __repr__(self) -> str:
        where = f"path={str(self.path)!r}" if self.path else "not saved"
        w, h = self.figure.get_size_inches()
        return f"Heatmaps({where}, {w * self.dpi:.0f}x{h * self.dpi:.0f} px)"
