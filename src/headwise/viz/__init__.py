"""See the heads: static heatmaps, the standalone interactive head view, attention rollout.

- :func:`heatmaps` — a matplotlib grid (rows = layers, columns = heads) saved as PNG/SVG/PDF.
- :func:`head_view` — one offline HTML file: model view, lines/matrix detail, rollout, pickers.
- :func:`attention_rollout` — Abnar & Zuidema (2020) rollout as a tensor.
"""

from headwise.viz.head_view import head_view
from headwise.viz.heatmaps import heatmaps
from headwise.viz.rollout import attention_rollout

__all__ = ["attention_rollout", "head_view", "heatmaps"]
