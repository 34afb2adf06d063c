"""The split/merge diagram: a real, non-blank picture with each head's colour in it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.colors import to_rgb
from matplotlib.image import imread

import headwise as hw
from headwise.cli import main
from headwise.viz.diagram import draw, head_colors


def _has_colour(img, hex_color, tol=0.06):
    rgb = np.array(to_rgb(hex_color))
    return bool((np.abs(img[..., :3] - rgb).max(axis=-1) < tol).any())


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_png_is_large_non_blank_and_coloured_per_head(tmp_path, kv_heads):
    torch.manual_seed(0)
    mha = hw.MultiHeadAttention(16, 4, num_kv_heads=kv_heads)
    path = draw(mha, torch.randn(1, 6, 16), path=tmp_path / "d.png", causal=True, dpi=80)
    img = imread(path)
    assert img.shape[0] > 400 and img.shape[1] > 1000
    ink = (img[..., :3] < 0.95).any(axis=-1).mean()
    assert 0.05 < ink < 0.8, ink
    for color in head_colors(4):
        assert _has_colour(img, color), color


@pytest.mark.parametrize("heads, kv_heads", [(4, None), (6, 2)])
def test_q_and_k_arrows_go_into_every_head(tmp_path, monkeypatch, heads, kv_heads):
    from matplotlib.figure import Figure
    from matplotlib.text import Annotation

    drawn = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig),
                                                                 save(fig, *a, **k)))
    mha = hw.MultiHeadAttention(24, heads, num_kv_heads=kv_heads)
    draw(mha, torch.randn(1, 4, 24), path=tmp_path / "d.png", dpi=40)
    [ax] = drawn[0].axes
    arrows = [a for a in ax.texts if isinstance(a, Annotation) and a.arrow_patch is not None]
    for color in head_colors(heads):  # one q arrow and one k arrow in each head's colour
        ends = [a.xy for a in arrows if to_rgb(a.arrow_patch.get_edgecolor()) == to_rgb(color)]
        assert len(ends) == 2 and ends[0][0] == ends[1][0], (color, ends)


def test_bad_diagram_requests(tmp_path, capsys):
    mha = hw.MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="unsupported file type"):
        draw(mha, torch.randn(1, 3, 8), path=tmp_path / "x.gif")
    assert main(["trace", "lm", "--png", str(tmp_path / "x.png")]) == 2
    assert "--svg/--png draw the split/merge diagram of `trace mha`" in capsys.readouterr().err


def test_the_merged_heads_drawn_are_out_projs_input():
    """The picture's merged block is what the forward hands the out-projection (read from the
    per-head outputs that :mod:`headwise.observe` reports before the merge)."""
    from headwise.viz.diagram import _run

    torch.manual_seed(2)
    mha = hw.MultiHeadAttention(12, 3, num_kv_heads=1)
    x = torch.randn(2, 5, 12)
    seen = {}
    handle = mha.out_proj.register_forward_pre_hook(lambda _m, args: seen.update(x=args[0]))
    try:
        run = _run(mha, x, x, x, None, None, True, 1)
    finally:
        handle.remove()
    np.testing.assert_array_equal(run["merged"], seen["x"][1].numpy())
