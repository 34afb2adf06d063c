"""heatmaps(): the PNG really holds layers x heads panels, the SVG their L{l} H{h} titles."""

import re

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import ndimage

from headwise.viz import heatmaps


def random_weights(layers, heads, i, j, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(layers, heads, i, j, generator=g) * 2).softmax(-1)


def panels(png_path):
    """Large connected non-white regions of the image: the heatmap panels (each a coloured
    square inside its frame). Text, ticks and the thin colour bar are too small to count."""
    img = np.asarray(Image.open(png_path).convert("RGB")).astype(int)
    mask = (img < 250).any(-1)
    labels, n = ndimage.label(mask)
    boxes = ndimage.find_objects(labels)
    big = [b for b in boxes if b[0].stop - b[0].start >= 60 and b[1].stop - b[1].start >= 60]
    return img, big


@pytest.mark.parametrize("layers, heads, n_i, n_j", [(2, 3, 7, 7), (3, 4, 5, 9), (1, 1, 30, 30)])
def test_png_has_one_panel_per_layer_and_head(tmp_path, layers, heads, n_i, n_j):
    w = random_weights(layers, heads, n_i, n_j, seed=layers)
    q = [f"q{i}" for i in range(n_i)]
    k = [f"key{j}" for j in range(n_j)]
    out = heatmaps(w, query_tokens=q, key_tokens=k, path=tmp_path / "heads.png")
    assert out.path == tmp_path / "heads.png"
    img, big = panels(out)
    assert len(big) == layers * heads
    assert img.std() > 20 and len(np.unique(img.reshape(-1, 3), axis=0)) > 50  # not blank
    # panels form a grid: `heads` distinct columns and `layers` distinct rows
    tops = sorted({b[0].start // 10 for b in big})
    lefts = sorted({b[1].start // 10 for b in big})
    assert len(tops) == layers and len(lefts) == heads


def test_darkest_cell_is_where_the_largest_weight_is(tmp_path):
    w = torch.full((1, 1, 4, 4), 0.01)
    w[0, 0, 2, 1] = 0.97  # one dominant weight
    out = heatmaps(w, query_tokens=list("abcd"), key_tokens=list("wxyz"), path=tmp_path / "a.png")
    img, (box,) = panels(out)
    crop = img[box]  # the framed panel (ticks are 2 px)
    dark_blue = (crop[..., 2] - crop[..., 0] > 60)  # only the dominant cell is that saturated
    rows, cols = np.nonzero(dark_blue)
    h, wd = dark_blue.shape
    # the dark blob sits at cell (2, 1) of the 4 x 4 panel: centre (2.5/4, 1.5/4)
    assert abs(rows.mean() / h - 2.5 / 4) < 0.05 and abs(cols.mean() / wd - 1.5 / 4) < 0.05
    assert 0.15 < np.ptp(rows) / h < 0.3 and 0.15 < np.ptp(cols) / wd < 0.3  # one cell big


def test_svg_titles_and_subset_selection(tmp_path):
    w = [torch.rand(4, 6, 6).softmax(-1) for _ in range(3)]
    out = heatmaps(w, query_tokens=list("abcdef"), key_tokens=list("uvwxyz"),
                   path=tmp_path / "h.svg", layers=[2, 0], heads=[1, 3], title="subset")
    text = out.path.read_text()
    titles = re.findall(r"<!-- (L\d+ H\d+) -->", text)
    assert sorted(titles) == ["L0 H1", "L0 H3", "L2 H1", "L2 H3"]
    assert text.lstrip().startswith("<?xml")


def test_none_layers_are_skipped_and_long_sequences_use_positions(tmp_path):
    w = [None, torch.rand(2, 80, 80).softmax(-1)]
    out = heatmaps(w, query_tokens=[str(i) for i in range(80)], key_tokens=None,
                   path=tmp_path / "long.png")
    _, big = panels(out)
    assert len(big) == 2


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(path="x.jpg"), ValueError, "extension"),
    (dict(query_tokens=["a"]), ValueError, "1 labels but the weights have 3"),
    (dict(query_tokens="abc"), TypeError, "list of 3 strings"),
    (dict(layers=[5]), ValueError, "subset"),
    (dict(heads=[2]), ValueError, "subset"),
    (dict(weights=torch.rand(1, 2, 2, 3, 3)), ValueError, "pick one example"),
    (dict(weights=[torch.rand(1, 2, 3, 3)]), ValueError, "pick one example"),
    (dict(weights=[torch.full((2, 3, 3), float("nan"))]), ValueError, "NaN"),
    (dict(weights=[None]), ValueError, "nothing to draw"),
    (dict(weights="w"), TypeError, "tensor"),
])
def test_bad_input(tmp_path, kwargs, error, match):
    args = dict(weights=torch.rand(2, 2, 3, 3), query_tokens=list("abc"), key_tokens=list("xyz"),
                path=tmp_path / "x.png")
    args.update(kwargs)
    if not str(args["path"]).startswith(str(tmp_path)):
        args["path"] = tmp_path / args["path"]
    weights = args.pop("weights")
    with pytest.raises(error, match=match):
        heatmaps(weights, **args)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_long_sequences_keep_isolated_peaks(tmp_path):
    """1000 positions on a ~400 px panel: max-pooling keeps a single strong weight visible."""
    w = torch.full((1, 1, 1000, 1000), 1e-4)
    w[0, 0, 500, 700] = 1.0
    out = heatmaps(w, query_tokens=None, key_tokens=None, path=tmp_path / "peak.png")
    img, (box,) = panels(out)
    crop = img[box]
    rows, cols = np.nonzero(crop[..., 2] - crop[..., 0] > 60)
    assert len(rows) > 0
    h, wd = crop.shape[:2]
    assert abs(rows.mean() / h - 0.5) < 0.02 and abs(cols.mean() / wd - 0.7) < 0.02
