"""The :class:`Trace` of one forward pass: its steps, attention calls and output."""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from typing import Any

from headwise.tracing import render
from headwise.tracing.steps import AttentionRun, Node, Step

__all__ = ["Trace"]


class Trace:
    """The record of one forward pass.

    Attributes:
        steps: every :class:`Step` in execution order (a module's output comes after its
            inside, so "after the embedding" reads top to bottom).
        attention: one :class:`AttentionRun` per attention call.
        output: what the module returned (unchanged by tracing).

    ``str(trace)`` is the indented listing (repeated identical blocks collapsed; ``render(
    full=True)`` shows all), then the attention summary. ``to_dict``/``to_json`` hold only the
    structured facts (step names, shapes, axes, kernels, memory classes), no display text.
    """

    def __init__(self, root: Node, steps: list[Step], attention: list[AttentionRun],
                 output: Any):
        self._root = root
        self.steps = steps
        self.attention = attention
        self.output = output

    def find(self, name: str, path: str | None = None) -> list[Step]:
        """Steps called ``name`` (optionally only those under module ``path``)."""
        return [s for s in self.steps if s.name == name
                and (path is None or s.path == path or s.path.startswith(path + "."))]

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:
        return (f"Trace({self._root.module}, {len(self.steps)} steps, "
                f"{len(self.attention)} attention calls)")

    def _repr_html_(self) -> str:
        """Jupyter: the listing and summary, monospaced and unwrapped (plain HTML, offline)."""
        return ('<pre style="font: 12px/1.35 ui-monospace, monospace; white-space: pre; '
                f'overflow-x: auto;">{html.escape(self.render())}</pre>')

    def render(self, full: bool = False, summary: bool = True) -> str:
        """The indented listing; ``full`` shows repeated identical blocks instead of one line."""
        text = render.listing(self._root, full)
        if summary and self.attention:
            text += "\n\n" + self.summary()
        return text

    def summary(self) -> str:
        """Which attention calls ran a fused kernel and which fell back, and why."""
        return render.summary(self.attention, self._root.module)

    def to_markdown(self) -> str:
        """A Markdown table of every step, then the attention summary as a list."""
        return render.markdown(self.steps, self.attention, self._root.module)

    def to_dict(self) -> dict[str, Any]:
        """``{"module", "steps": [...], "attention": [...]}``: the structured record."""
        return {"module": self._root.module, "steps": [s.to_dict() for s in self.steps],
                "attention": [r.to_dict() for r in self.attention]}

    def to_json(self, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON."""
        return json.dumps(self.to_dict(), indent=indent)
