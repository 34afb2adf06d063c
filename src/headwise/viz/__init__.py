"""See the heads: static heatmaps, the standalone interactive head view, attention rollout.

- :func:`heatmaps` — a matplotlib grid (rows = layers, columns = heads) saved as PNG/SVG/PDF.
- :func:`head_view` — one offline HTML file: model view (layers x heads thumbnails, importance
  scores), detail view (BertViz-style token lines, matrix, rollout), kind and example pickers,
  head toggles. Opens from disk with no network; 1024 tokens x 48 heads fit in < 40 MB.
- :func:`catalogue_page` — the head catalogue (:func:`headwise.catalogue`) as one offline HTML
  file: every head's dataset-level scores, averaged pattern and top tokens, sortable.
- :func:`long_view` -- the long-document head view: one offline HTML file from a long-context
  profile (:class:`headwise.long.LongProfile`, passed in): block-map thumbnails of every head on
  one scale, sortable by any score; one head's map, distance profile, received mass over the
  text, top keys of a query block, and exact per-token rows asked for; a size budget it keeps.
- :func:`attention_rollout` — Abnar & Zuidema (2020) rollout as a tensor.

Example (any headwise model; ``return_weights=True`` gives ``{kind: [per layer (b, h, i, j)]}``)::

    logits, att = model(src, tgt, return_weights=True)
    head_view(att, {"src": src_tokens, "tgt": tgt_tokens}, "view.html",
              importance={"cross": scores})                      # scores: (layers, heads)
    heatmaps([w[0] for w in att["cross"]], query_tokens=tgt_tokens[0],
             key_tokens=src_tokens[0], path="cross.png")

May import (the rule and its check: the table in ``tests/test_wings.py``): numpy, matplotlib, the core (``masks``, ``heads``, ``attend``,
``weights``, ``observe``, ``layers``) and ``models`` for their shapes; never a tool: the tools'
results reach it as arguments (a :class:`~headwise.HeadScores` is read through its ``scores``).
Only the command line, :mod:`headwise.hf.tools` and the catalogue (for its page) import it.
"""

from headwise.viz.catalogue import catalogue_page
from headwise.viz.head_view import head_view
from headwise.viz.heatmaps import heatmaps
from headwise.viz.long_view import long_view
from headwise.viz.rollout import attention_rollout

__all__ = ["attention_rollout", "catalogue_page", "head_view", "heatmaps", "long_view"]
