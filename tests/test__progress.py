"""headwise._progress: one bar for training and the long-context pass."""

import io

from rich.console import Console

from headwise import _progress


def test_the_bar_counts_shows_extra_columns_and_draws_nothing_when_disabled():
    out = io.StringIO()
    bar = _progress.bar("work", "loss {task.fields[loss]:.2f}", enabled=True)
    bar.live.console = Console(file=out, force_terminal=False, width=120)
    with bar:
        task = bar.add_task("work", total=3, loss=1.25)
        for _ in range(3):
            bar.advance(task)
    assert bar.tasks[0].completed == 3
    assert "loss 1.25" in out.getvalue() and "3/3" in out.getvalue()
    quiet = _progress.bar("work", enabled=False)
    quiet.live.console = Console(file=(silent := io.StringIO()), force_terminal=False)
    with quiet:
        task = quiet.add_task("work", total=2)
        quiet.advance(task)
    assert quiet.tasks[0].completed == 1 and silent.getvalue() == ""
