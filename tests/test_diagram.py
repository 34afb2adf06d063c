"""The split/merge diagram: a real, non-blank picture with each head's colour in it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.colors import to_rgb
from matplotlib.image import imread

import headwise as hw
from headwise.cli import main
from headwise.diagram import draw, head_colors


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


def test_bad_diagram_requests(tmp_path, capsys):
    mha = hw.MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="unsupported file type"):
        draw(mha, torch.randn(1, 3, 8), path=tmp_path / "x.gif")
    assert main(["trace", "lm", "--png", str(tmp_path / "x.png")]) == 2
    assert "--svg/--png draw the split/merge diagram of `trace mha`" in capsys.readouterr().err
