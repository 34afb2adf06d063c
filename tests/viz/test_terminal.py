"""One head's attention as shaded cells in the terminal."""

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from headwise.viz.terminal import _BLOCKS, _BLUES, _shade, terminal_heatmap


@settings(max_examples=20, deadline=None)
@given(nq=st.integers(1, 6), nk=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
def test_each_cell_shade_follows_its_weight(nq, nk, seed):
    w = torch.rand(nq, nk, generator=torch.Generator().manual_seed(seed))
    group = terminal_heatmap(w, [f"q{i}" for i in range(nq)], [f"k{j}" for j in range(nk)],
                             title="L0 H1")
    title, table, caption = group.renderables
    assert title.plain == "L0 H1" and f"{float(w.max()):.2f} (dark)" in caption.plain
    top = float(w.max())
    labels, *columns = table.columns
    assert [c.plain for c in labels._cells] == [f"q{i} " for i in range(nq)]
    for j, column in enumerate(columns):
        assert column.header.plain == f"k{j}"
        for i, cell in enumerate(column._cells):
            level = float(w[i, j]) / top
            assert cell.plain == _BLOCKS[round(level * (len(_BLOCKS) - 1))] * 2
            assert str(cell.style) == _shade(level)
    i, j = divmod(int(w.argmax()), nk)
    assert columns[j]._cells[i].plain == "██"
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(group)  # renders without error
    assert "L0 H1" in out.getvalue()


def test_the_colour_ramp_runs_from_white_to_dark_blue():
    assert _shade(0.0) == "#{:02x}{:02x}{:02x}".format(*_BLUES[0])
    assert _shade(1.0) == "#{:02x}{:02x}{:02x}".format(*_BLUES[-1])
    assert _shade(2.0) == _shade(1.0) and _shade(-1.0) == _shade(0.0)


def test_wrong_shapes_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="one head's \\(i, j\\) matrix"):
        terminal_heatmap(torch.rand(2, 3, 4), ["a"] * 3, ["b"] * 4)
    with pytest.raises(ValueError, match="one token per row and per column"):
        terminal_heatmap(torch.rand(3, 4), ["a"] * 3, ["b"] * 5)
