"""The head catalogue as one self-contained, offline HTML page.

Every head of a :class:`~headwise.analysis.catalogue.Catalogue` is a row: its scores (sortable by
clicking a column), its averaged attention pattern (a ``grid x grid`` heatmap on positions
scaled to each input's length), its relative-offset profile (self-attention) and the tokens it
attends to most. Above the table, one layers x heads grid per attention kind is coloured by the
score the table is sorted by; clicking a cell jumps to its row. Filters: attention kind, a
minimum score, and free text (``L2``, ``H3``, ``L2H3`` or a token).

The catalogue's JSON sits in the page; ``assets/catalogue.js`` and ``.css`` are inlined. No
request of any kind leaves the page (the same Content-Security-Policy as the head view).
"""

from __future__ import annotations

import html
import json
import os

from headwise.kinds import KINDS
from headwise.viz.display import HeadView, asset

__all__ = ["catalogue_page"]


def catalogue_page(catalogue, path: str | os.PathLike | None = None, *,
                   title: str | None = None) -> HeadView:
    """The page of ``catalogue`` (a :class:`~headwise.analysis.catalogue.Catalogue`); written to
    ``path`` (``.html``, atomically) when given. Displays inline in Jupyter."""
    # duck-typed: the Catalogue class imports this module for its .page()
    if not (isinstance(getattr(catalogue, "meta", None), dict)
            and isinstance(getattr(catalogue, "heads", None), list)):
        raise TypeError(f"catalogue_page expects a headwise Catalogue (headwise.catalogue(...)),"
                        f" got {type(catalogue).__name__}")
    meta = dict(catalogue.meta)
    meta["title"] = title or f"{meta['model']}: head catalogue"
    # the kinds present, in the one table's order and with its labels (catalogue.js has none)
    meta["kindOrder"] = [k for k in KINDS if k in meta["kinds"]]
    meta["kindLabels"] = {k: KINDS[k].label for k in meta["kinds"]}
    data = {"meta": meta, "heads": catalogue.heads}
    # "<" escaped so no token can close the <script> element
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    page = "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:;\">",
        f"<title>{html.escape(meta['title'])}</title>",
        f"<style>{asset('catalogue.css')}</style></head>\n<body>",
        f'<script type="application/json" id="hw-catalogue">{text}</script>\n',
        f"<script>{asset('catalogue.js')}</script>\n</body></html>\n"])
    view = HeadView(page, height=900)
    return view if path is None else view.save(path)
