"""HeadScores: ranking helpers agree with a sort of the table, NaN is never ranked, JSON
round-trips (NaN as null), the plot is a real image of the grid, bad tables are refused."""

from __future__ import annotations

import json
import math

import matplotlib.image
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import headwise as hw
from headwise import HeadScores
from headwise.analysis.head_scores import spearman


@st.composite
def tables(draw):
    kinds = draw(st.lists(st.sampled_from(["encoder_self", "decoder_self", "cross"]),
                          min_size=1, max_size=3, unique=True))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for kind in kinds:
        t = torch.randn(draw(st.integers(1, 4)), draw(st.integers(1, 6)), generator=gen,
                        dtype=torch.float64)
        t[torch.rand(t.shape, generator=gen) < 0.2] = float("nan")
        out[kind] = t
    return out


@given(scores=tables(), k=st.integers(0, 30))
def test_ranking_helpers(scores, k):
    s = HeadScores("gradient", scores)
    flat = [(kind, l, h, float(v)) for kind, t in scores.items() for l in range(t.shape[0])
            for h in range(t.shape[1]) if not math.isnan(v := t[l, h])]
    ranked = s.ranked()
    assert sorted(ranked, key=lambda r: r[3]) == sorted(flat, key=lambda r: r[3])
    assert [r[3] for r in ranked] == sorted((r[3] for r in flat), reverse=True)
    least, most = s.least(k), s.most(k)
    lowest = {(kind, l, h) for kind, l, h, _ in s.ranked(descending=False)[:k]}
    assert {(kind, l, h) for kind, per in least.items() for l, hs in per.items()
            for h in hs} == lowest
    assert sum(len(hs) for per in most.values() for hs in per.values()) == min(k, len(flat))
    for per in least.values():
        assert all(hs == sorted(hs) for hs in per.values())


@given(scores=tables())
def test_json_round_trip(scores, tmp_path_factory):
    s = HeadScores("ablation", scores, {"baseline_loss": 1.5})
    path = tmp_path_factory.mktemp("scores") / "s.json"
    text = s.to_json(path)
    assert path.read_text() == text and "NaN" not in text
    back = HeadScores.from_json(text)
    assert back.method == "ablation" and back.details == {"baseline_loss": 1.5}
    for kind, t in scores.items():
        torch.testing.assert_close(back[kind], t, equal_nan=True)
    assert json.loads(text)["scores"][next(iter(scores))] is not None


def test_plot_draws_the_grid(tmp_path):
    s = HeadScores("gradient", {"cross": torch.arange(8.0).reshape(2, 4),
                                "decoder_self": torch.ones(2, 4)})
    path = s.plot(tmp_path / "sub" / "importance.png")
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 200
    assert image[..., :3].std() > 0.05  # not blank


@settings(max_examples=10, deadline=None)
@given(scores=tables())
def test_every_panel_shares_one_colour_scale_and_one_colour_bar(scores):
    """One global rank orders the heads of every kind: one colour is one score in each panel."""
    import matplotlib.pyplot as plt

    fig = HeadScores("ablation", scores).figure()
    try:
        images = [ax.images[0] for ax in fig.axes if ax.images]
        assert len(images) == len(scores)
        assert len({id(im.norm) for im in images}) == 1  # one Normalize, not one per panel
        finite = torch.cat([t[~t.isnan()] for t in scores.values()])
        if finite.numel() and finite.max() > finite.min():
            assert images[0].norm.vmin == float(finite.min())
            assert images[0].norm.vmax == float(finite.max())
        assert len(fig.axes) == len(scores) + 1  # the panels and one colour bar
    finally:
        plt.close(fig)


def test_a_score_has_one_colour_in_every_panel():
    import matplotlib.pyplot as plt

    fig = HeadScores("gradient", {"encoder_self": torch.tensor([[0.0, 2.0]]),
                                  "cross": torch.tensor([[2.0, 4.0]])}).figure()
    try:
        (a, b) = [ax.images[0] for ax in fig.axes if ax.images]
        # 2.0 is the right cell of one panel and the left of the other: the same colour
        assert (a.to_rgba(a.get_array())[0, 1] == b.to_rgba(b.get_array())[0, 0]).all()
        assert not (a.to_rgba(a.get_array())[0, 0] == b.to_rgba(b.get_array())[0, 1]).all()
    finally:
        plt.close(fig)


def test_bad_tables_and_lookups():
    with pytest.raises(ValueError, match="non-empty dict"):
        HeadScores("gradient", {})
    with pytest.raises(ValueError, match=r"must be \(layers, heads\)"):
        HeadScores("gradient", {"cross": torch.ones(3)})
    s = HeadScores("gradient", {"cross": torch.ones(1, 2)})
    with pytest.raises(KeyError, match="no scores for kind 'encoder_self'"):
        s["encoder_self"]
    with pytest.raises(ValueError, match="k must be an int >= 0"):
        s.least(-1)


def test_method_examples_and_agreement_travel_with_the_scores(tmp_path):
    """A table says how it was made: method, examples, agreement with ablation; JSON keeps
    them; describe() says them in one line."""
    from tests.analysis.test_scoring import lm, lm_batches
    model, batches = lm(5), lm_batches(5)
    reference = hw.importance(model, batches, method="ablation")
    got = hw.importance(model, batches, method="gradient").with_agreement(reference)
    assert got.examples == 6 and got.agreement == pytest.approx(got.spearman(reference))
    back = HeadScores.from_json(got.to_json(tmp_path / "s.json"))
    assert (back.method, back.examples, back.agreement) == ("gradient", 6, got.agreement)
    assert f"zero ablation: Spearman {got.agreement:.2f}" in got.describe()
    assert "gradient on 6 examples" in got.describe()
    assert "not computed" in hw.importance(model, batches, method="gradient").describe()
    assert "measured" in reference.describe()
    assert hw.importance(model, batches).describe().startswith("greedy (zero) on 6 examples")


@settings(max_examples=20)
@given(seed=st.integers(0, 2**16), n=st.integers(2, 40))
def test_spearman_is_pearson_of_ranks(seed, n):
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randn(n, generator=gen, dtype=torch.float64), \
        torch.randn(n, generator=gen, dtype=torch.float64)
    assert spearman(a, a.exp()) == pytest.approx(1, abs=1e-12)
    ranks = torch.stack([a.argsort().argsort(), b.argsort().argsort()]).double()
    assert spearman(a, b) == pytest.approx(float(torch.corrcoef(ranks)[0, 1]), abs=1e-9)
