"""Text for a trace: the indented listing, the attention summary and the Markdown table.

Labels and notes come from the step table's display strings (:mod:`headwise.observe`) filled
with each step's structured facts; nothing here is read back into the trace."""

from __future__ import annotations

import re
from typing import Any

from headwise.observe import WEIGHTS_AT_V, StepKind, describe
from headwise.tracing.steps import AttentionRun, Node, Step, weights_source

__all__ = ["listing", "markdown", "step_label", "step_notes", "summary"]


def _kind(step: Step) -> StepKind | None:
    try:
        return StepKind(step.name)
    except ValueError:  # a step the trace itself saw (module output, argument)
        return None


def step_label(step: Step) -> str:
    kind = _kind(step)
    label = kind.label if kind is not None else step.name
    return label if step.materialised else f"{label} (not materialised)"


def step_notes(step: Step) -> str:
    """The display note of a step: the table's note filled with the step's facts."""
    facts: dict[str, Any] = dict(step.info)
    if not step.materialised:  # the logical scores of a fused kernel
        ran = f"{facts.get('backend')}[{facts['kernel']}]" if facts.get("kernel") \
            else str(facts.get("backend"))
        where = (f"computed block by block inside {ran}, never stored"
                 if facts.get("memory") == "O(n)" else
                 f"built inside {ran} and discarded, not returned")
        return f"logical shape of q k^T; {where}"
    if "weights_source" in facts:
        facts["weights_source"] = weights_source(step.info)
    grouped = ""
    if "kv_heads" in facts:  # grouped-query attention: the split is g ways
        h, g = facts["query_heads"], facts["kv_heads"]
        if "pattern" in facts:
            facts["pattern"] = str(facts["pattern"]).replace("h", "g")
        grouped = (f"1 key/value head shared by all {h} query heads (multi-query)" if g == 1
                   else f"{g} key/value heads, each shared by {h // g} query heads")
    kind = _kind(step)
    text = describe(kind, facts) if kind is not None else ""
    return "; ".join(part for part in (text, grouped) if part)


def listing(root: Node, full: bool) -> str:
    """The indented listing; ``full`` shows repeated identical blocks instead of one line."""
    rows: list[tuple[str, str, str]] = []
    _render_node(root, 0, rows, full)
    label_w = min(max(len(r[0]) for r in rows), 72)
    shape_w = min(max(len(r[1]) for r in rows), 40)
    lines = []
    for label, shape, notes in rows:
        if not shape and not notes:
            lines.append(label)
            continue
        lines.append(f"{label:<{label_w}}  {shape:<{shape_w}}  {notes}".rstrip())
    return "\n".join(lines)


def summary(runs: list[AttentionRun], root: str) -> str:
    """Which attention calls ran a fused kernel and which fell back, and why: one line per
    group of calls that differ only in their layer number (``blocks.0-29.self_attn``, 30 calls
    that ran alike, instead of 30 lines)."""
    head = _summary_head(runs)
    groups: dict[tuple, list[int | None]] = {}
    for r in runs:
        template, layer = _layer_of(r.path or root)
        groups.setdefault((template, r.kind, r.ran, r.memory, r.verdict), []).append(layer)
    rows = [(_layers_label(key[0], layers), *key[1:]) for key, layers in groups.items()]
    path_w, ran_w = max(len(r[0]) for r in rows), max(len(r[2]) for r in rows)
    lines = [head]
    for path, kind, ran, memory, verdict in rows:
        lines.append(f"  {path:<{path_w}}  {kind:<5}  {ran:<{ran_w}}  {memory:<6}  {verdict}")
    return "\n".join(lines)


def _summary_head(runs: list[AttentionRun]) -> str:
    """``attention: 6 calls, 6 fused ...``: how many calls ran each way. The weights a user
    asks for cost O(n^2) only in what was asked (those heads, those layers); the output of a
    fused call stays O(n) whatever was asked, and only a fallback materialises every head's
    ``(b, h, i, j)`` scores."""
    fused = [r for r in runs if r.fused]
    with_weights = sum(r.weights is not None for r in fused)
    reused = sum(r.kernel == WEIGHTS_AT_V for r in runs)
    fell = len(runs) - len(fused) - reused
    parts = [f"attention: {len(runs)} call{'s' * (len(runs) != 1)}", f"{len(fused)} fused"]
    if fused:
        parts[-1] += (" (output on the fused kernel, O(n) memory" + (
            f"; {with_weights} of them also computed the weights for the heads asked, O(n^2) "
            "in what you asked for" if with_weights else "") + ")")
    if reused:
        parts.append(f"{reused} computed the weights asked for and took the output from them "
                     f"({WEIGHTS_AT_V}: O(n^2) in what you asked for)")
    if fell:
        parts.append(f"{fell} unfused: every head's (b, h, i, j) scores materialised "
                     "(eager math or a fallback, O(n^2))")
    return ", ".join(parts)


def _layer_of(path: str) -> tuple[str, int | None]:
    """``("blocks.{}.self_attn", 3)`` for a module path with one numeric part (a layer's
    index in its ``nn.ModuleList``); ``(path, None)`` for any other."""
    parts = path.split(".")
    numbers = [n for n, part in enumerate(parts) if part.isdigit()]
    if len(numbers) != 1:
        return path.replace("{", "{{").replace("}", "}}"), None
    n = numbers[0]
    return ".".join([*parts[:n], "{}", *parts[n + 1:]]), int(parts[n])


def _layers_label(template: str, layers: list[int | None]) -> str:
    """``blocks.0-29.self_attn (30 calls)``: the layers as ranges, and the count of calls."""
    if layers == [None] * len(layers):
        return template.format() + (f" ({len(layers)} calls)" if len(layers) > 1 else "")
    spans: list[list[int]] = []
    for n in sorted(set(layers)):  # type: ignore[type-var]
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return template.format(text) + (f" ({len(layers)} calls)" if len(layers) > 1 else "")


def markdown(steps: list[Step], runs: list[AttentionRun], root: str) -> str:
    """A Markdown table of every step, then the attention summary as a list."""
    out = [f"### Trace of `{root}`", "",
           "| # | module | step | shape | named axes | notes |",
           "|---|---|---|---|---|---|"]
    for n, s in enumerate(steps):
        shape = "-" if s.shape is None else str(tuple(s.shape))
        notes = step_notes(s).replace("|", "\\|")
        out.append(f"| {n} | `{s.path or '(root)'}` {s.module} | {step_label(s)} | {shape} | "
                   f"`{s.named_shape}` | {notes} |")
    if runs:
        out += ["", "**Attention backends**", ""]
        for r in runs:
            out.append(f"- `{r.path or '(root)'}` ({r.kind}): {r.ran}, {r.memory} memory "
                       f"— {r.verdict}")
    return "\n".join(out) + "\n"


def _render_node(node: Node, depth: int, rows: list, full: bool) -> None:
    shape = node.output.named_shape if node.output is not None else ""
    rows.append(("  " * depth + node.label, shape, node.notes))
    children = node.children
    n = 0
    while n < len(children):
        child = children[n]
        if isinstance(child, Step):
            rows.append(("  " * (depth + 1) + step_label(child), child.named_shape,
                         step_notes(child)))
            n += 1
            continue
        _render_node(child, depth + 1, rows, full)
        run = 1
        if not full:
            sig = _signature(child)
            while (n + run < len(children) and isinstance(children[n + run], Node)
                   and _signature(children[n + run]) == sig):
                run += 1
        if run > 1:
            last = children[n + run - 1]
            span = _short(last) if run == 2 else f"{_short(children[n + 1])} … {_short(last)}"
            rows.append(("  " * (depth + 1) + span,
                         "", f"{run - 1} more {child.module}, same steps and shapes as "
                             f"{_short(child)}"))
        n += run


def _short(node: Node) -> str:
    return node.label.split(":", 1)[0]


def _signature(node: Node) -> tuple:
    """What a block looks like with its own index removed: equal signatures render once."""
    parts = []
    for c in node.children:
        if isinstance(c, Step):
            parts.append((c.name, c.shape, c.axes, repr(sorted(c.info.items())),
                          c.materialised))
        else:
            parts.append(_signature(c))
    out = node.output.shape if node.output is not None else None
    return (node.module, re.sub(r"^[^:]*:", "", node.label), node.notes, out, tuple(parts))
