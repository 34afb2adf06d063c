"""The one progress bar: a label, the bar, done/total, any extra columns, elapsed time and an
ETA (rich). ``enabled=False`` gives the same object, drawing nothing, so callers keep one code
path."""

from __future__ import annotations


def bar(label: str, *columns: str, enabled: bool = True, transient: bool = False):
    """A :class:`rich.progress.Progress` to use as a context manager; ``columns`` are
    ``TextColumn`` templates (e.g. ``"loss {task.fields[loss]:.4f}"``) set after done/total."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    return Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(),
                    *(TextColumn(c) for c in columns), TimeElapsedColumn(), TextColumn("ETA"),
                    TimeRemainingColumn(), disable=not enabled, transient=transient)
