"""head_view(): the written file is self-contained and its stored weights decode back to the
input (checked in Python here; tests/e2e/test_browser.py checks the page itself)."""

import base64
import json
import re
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import headwise.viz
from headwise.viz import attention_rollout, head_view
from headwise.viz.display import HeadView
from headwise.viz.head_view import score_labels


def softmaxed(*shape, seed=0, scale=2.0, causal=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * scale
    if causal:
        n = shape[-1]
        x = x.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return x.softmax(-1)


def seq2seq(b=2, h=3, layers=2, n_src=6, n_tgt=5, seed=0):
    return {
        "encoder_self": [softmaxed(b, h, n_src, n_src, seed=seed + l) for l in range(layers)],
        "decoder_self": [softmaxed(b, h, n_tgt, n_tgt, seed=seed + 10 + l, causal=True)
                         for l in range(layers)],
        "cross": [softmaxed(b, h, n_tgt, n_src, seed=seed + 20 + l) for l in range(layers)],
    }


def read_page(path):
    text = path.html if isinstance(path, HeadView) else path.read_text(encoding="utf-8")
    meta = json.loads(re.search(r'<script type="application/json" id="hw-meta">(.*?)</script>',
                                text, re.S).group(1))
    blocks = dict(re.findall(r'<script type="application/octet-stream" data-key="([^"]+)">'
                             r"([A-Za-z0-9+/=]*)</script>", text))
    return text, meta, blocks


def decode(block, n_q, n_k, levels):
    raw = zlib.decompress(base64.b64decode(block))
    assert len(raw) == 4 * n_q + n_q * n_k
    rowmax = np.frombuffer(raw[:4 * n_q], dtype=np.float32)
    q = np.frombuffer(raw[4 * n_q:], dtype=np.uint8).reshape(n_q, n_k)
    return q / levels * rowmax[:, None], rowmax


def test_page_is_self_contained(tmp_path):
    path = head_view(seq2seq(), {"src": list("abcdef"), "tgt": list("vwxyz")},
                     tmp_path / "view.html", title="<b>T</b>")
    text, meta, blocks = read_page(path)
    # nothing that could fetch: no src=/href= attributes, no URLs, no imports, a CSP that forbids
    assert not re.search(r"\s(src|href)\s*=", text)
    assert not re.search(r"https?://|//cdn|import\(|fetch\(|XMLHttpRequest|WebSocket", text)
    assert "default-src 'none'" in text
    assert "<title>&lt;b&gt;T&lt;/b&gt;</title>" in text  # title escaped
    assert meta["examples"] == 2 and set(meta["kinds"]) == {"encoder_self", "decoder_self", "cross"}
    assert len(blocks) == 3 * 2 * 2 * 3 + 2 * 2 * 2  # heads + rollouts of the two self kinds
    assert meta["kinds"]["cross"]["rollout"] is None


def test_stored_weights_decode_to_the_input_within_quantisation(tmp_path):
    att = seq2seq(b=2, h=3, layers=2, n_src=7, n_tgt=4, seed=3)
    tokens = {"src": [list("abcdefg"), list("hijk")], "tgt": [list("ABCD"), list("EFG")]}
    path = head_view(att, tokens, tmp_path / "v.html")
    _, meta, blocks = read_page(path)
    levels = meta["levels"]
    assert levels == 255
    for kind, layers in att.items():
        q_side, k_side = {"encoder_self": ("src", "src"), "decoder_self": ("tgt", "tgt"),
                          "cross": ("tgt", "src")}[kind]
        for b in range(2):
            n_q, n_k = len(tokens[q_side][b]), len(tokens[k_side][b])  # padding trimmed
            for l, w in enumerate(layers):
                for h in range(3):
                    got, rowmax = decode(blocks[f"w/{kind}/{b}/{l}/{h}"], n_q, n_k, levels)
                    want = w[b, h, :n_q, :n_k].double().numpy()
                    np.testing.assert_allclose(rowmax, want.max(1), rtol=1e-6)
                    assert np.all(np.abs(got - want) <= want.max(1, keepdims=True) / (2 * levels) + 1e-7)
        if kind != "cross":
            for b in range(2):
                n = len(tokens[q_side][b])
                ref = attention_rollout([w[b, :, :n, :n] for w in layers]).numpy()
                for l in range(2):
                    got, _ = decode(blocks[f"r/{kind}/{b}/{l}"], n, n, levels)
                    assert np.all(np.abs(got - ref[l]) <= ref[l].max(1, keepdims=True) / 510 + 1e-6)


def test_thumbnails_are_max_pooled(tmp_path):
    w = torch.zeros(1, 1, 100, 100)
    w[0, 0, :, 0] = 1.0
    w[0, 0, 73, 0], w[0, 0, 73, 91] = 0.5, 0.5
    path = head_view({"encoder_self": [w]}, [f"t{i}" for i in range(100)], tmp_path / "t.html",
                     thumbnail=20)
    _, meta, _ = read_page(path)
    spec = meta["kinds"]["encoder_self"]["thumbs"][0][0][0]
    size, top, data = spec.split(":")
    assert size == "20x20" and float(top) == 1.0  # the page rescales by top / shared max
    thumb = np.frombuffer(base64.b64decode(data), dtype=np.uint8).reshape(20, 20)
    assert thumb[:, 0].min() == 255  # the first-key column survives
    assert thumb[73 * 20 // 100, 91 * 20 // 100] == 128  # an isolated peak survives pooling
    assert thumb.sum() == 255 * 20 + 128


def test_budget_lowers_precision_and_says_so(tmp_path):
    att = {"encoder_self": [softmaxed(1, 2, 64, 64, scale=0.5, seed=s) for s in range(2)]}
    full = head_view(att, [str(i) for i in range(64)], tmp_path / "a.html", max_mb=None)
    small = head_view(att, [str(i) for i in range(64)], tmp_path / "b.html", max_mb=0.02)
    _, meta, blocks = read_page(small)
    assert read_page(full)[1]["levels"] == 255 and meta["levels"] in (63, 15)
    assert small.path.stat().st_size < full.path.stat().st_size
    got, _ = decode(blocks["w/encoder_self/0/1/1"], 64, 64, meta["levels"])
    want = att["encoder_self"][1][0, 1].double().numpy()
    assert np.all(np.abs(got - want) <= want.max(1, keepdims=True) / (2 * meta["levels"]) + 1e-7)


def test_unrecorded_and_pruned_layers(tmp_path):
    att = {"decoder_self": [softmaxed(1, 4, 5, 5), None, softmaxed(1, 2, 5, 5, seed=1)]}
    path = head_view(att, list("abcde"), tmp_path / "p.html")
    _, meta, blocks = read_page(path)
    km = meta["kinds"]["decoder_self"]
    assert km["heads"] == [4, None, 2]
    assert "not recorded" in km["rollout"]["error"]
    assert sorted(blocks) == sorted([f"w/decoder_self/0/0/{h}" for h in range(4)]
                                    + [f"w/decoder_self/0/2/{h}" for h in range(2)])


def test_tokens_may_contain_markup(tmp_path):
    evil = ["</script><script>alert(1)</script>", "<!--", "a&b", "\n", " "]
    path = head_view({"encoder_self": [softmaxed(1, 1, 5, 5)]}, evil, tmp_path / "x.html")
    text, meta, _ = read_page(path)
    assert meta["tokens"]["src"][0] == evil
    assert text.count("</script>") == text.count("<script")  # no token closes a script early


@pytest.mark.parametrize("attentions, tokens, error, match", [
    ([torch.rand(1, 2, 3, 3)], ["a"] * 3, TypeError, "dict kind"),
    ({}, ["a"], ValueError, "empty"),
    ({"self": [torch.rand(1, 1, 3, 3)]}, ["a"] * 3, ValueError, "unknown attention kinds"),
    ({"encoder_self": [torch.rand(2, 3, 3)]}, ["a"] * 3, ValueError, "add the batch axis"),
    ({"encoder_self": [None]}, ["a"] * 3, ValueError, "all None"),
    ({"encoder_self": [torch.rand(1, 1, 3, 4)]}, ["a"] * 3, ValueError, "i must equal j"),
    ({"encoder_self": [torch.rand(1, 1, 3, 3), torch.rand(2, 1, 3, 3)]}, ["a"] * 3, ValueError,
     "disagree"),
    ({"encoder_self": [-torch.rand(1, 1, 3, 3)]}, ["a"] * 3, ValueError, "non-negative"),
    ({"encoder_self": [torch.rand(1, 1, 3, 3)]}, ["a"] * 4, ValueError, "only 3 positions"),
    ({"encoder_self": [torch.rand(1, 1, 3, 3)], "cross": [torch.rand(1, 1, 2, 3)]}, ["a"] * 3,
     ValueError, "ambiguous"),
    ({"cross": [torch.rand(1, 1, 2, 3)]}, {"src": ["a"] * 3}, ValueError, "no 'tgt' entry"),
    ({"encoder_self": [torch.rand(2, 1, 3, 3)]}, [["a"] * 3], ValueError, "one per example"),
    ({"encoder_self": [torch.rand(1, 1, 3, 3)]}, "abc", TypeError, "list of strings"),
])
def test_bad_input(tmp_path, attentions, tokens, error, match):
    with pytest.raises(error, match=match):
        head_view(attentions, tokens, tmp_path / "x.html")
    assert not list(tmp_path.iterdir())


def test_bad_importance_and_path(tmp_path):
    att = {"encoder_self": [torch.rand(1, 2, 3, 3).softmax(-1)] * 2}
    with pytest.raises(ValueError, match=r"\(layers, heads\) = \(2, 2\)"):
        head_view(att, list("abc"), tmp_path / "x.html", importance={"encoder_self": torch.rand(3, 2)})
    with pytest.raises(ValueError, match="this model has"):
        head_view(att, list("abc"), tmp_path / "x.html", importance={"cross": torch.rand(2, 2)})
    with pytest.raises(ValueError, match=".html"):
        head_view(att, list("abc"), tmp_path / "x.png")


def test_grouped_query_heads_and_generated_tokens_reach_the_page(tmp_path):
    att = {"decoder_self": [softmaxed(2, 6, 5, 5, seed=l, causal=True) for l in range(2)]}
    tokens = [list("abcde"), list("vwxyz")]
    path = head_view(att, tokens, tmp_path / "g.html", kv_heads=3, generated_start=[3, 5])
    _, meta, _ = read_page(path)
    assert meta["kinds"]["decoder_self"]["kvHeads"] == 3
    assert meta["generatedStart"] == [3, 5]
    plain = read_page(head_view(att, tokens))[1]  # nothing asked: nothing marked or grouped
    assert plain["kinds"]["decoder_self"]["kvHeads"] is None and plain["generatedStart"] is None
    both = read_page(head_view(seq2seq(h=4), {"src": list("abcdef"), "tgt": list("abcde")},
                               kv_heads={"cross": 2}, generated_start=2))[1]
    assert [both["kinds"][k]["kvHeads"] for k in ("encoder_self", "decoder_self", "cross")] \
        == [None, None, 2]
    assert both["generatedStart"] == [2, 2]


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(kv_heads=4), ValueError, r"kv_heads=4 does not divide .* query heads \[6\]"),
    (dict(kv_heads=0), TypeError, "kv_heads must be an int >= 1"),
    (dict(kv_heads=2.0), TypeError, "kv_heads must be an int >= 1"),
    (dict(generated_start=0), ValueError, "expected 1..5"),
    (dict(generated_start=6), ValueError, "expected 1..5"),
    (dict(generated_start=[1, 2]), TypeError, "1 ints"),
])
def test_bad_grouping_or_generated_start(tmp_path, kwargs, error, match):
    att = {"decoder_self": [softmaxed(1, 6, 5, 5, causal=True)]}
    with pytest.raises(error, match=match):
        head_view(att, list("abcde"), tmp_path / "x.html", **kwargs)


def test_generated_start_needs_a_decoder_side():
    with pytest.raises(ValueError, match="no decoder side"):
        head_view({"encoder_self": [softmaxed(1, 2, 3, 3)]}, list("abc"), generated_start=1)


def test_importance_bars_are_labelled_with_how_they_were_made(tmp_path):
    """A HeadScores says its method and data on the page; a bare table is marked unrecorded."""
    from headwise import HeadScores
    att = {"encoder_self": [softmaxed(1, 2, 3, 3, seed=l) for l in range(2)]}
    scores = HeadScores("greedy", {"encoder_self": torch.rand(2, 2)}, {"ablation": "zero"},
                        examples=64)
    meta = read_page(head_view(att, list("abc"), tmp_path / "a.html", importance=scores))[1]
    assert meta["importanceMethod"] == scores.describe()
    assert meta["importanceMethod"].startswith("greedy (zero) on 64 examples; measured")
    bare = read_page(head_view(att, list("abc"), importance={"encoder_self": torch.rand(2, 2)}))[1]
    assert bare["importanceMethod"] is None
    js = (Path(headwise.viz.__file__).parent / "assets" / "head_view.js").read_text()
    assert "META.importanceMethod" in js


def test_the_bar_labels_of_a_grid_of_ranks_are_whole_numbers_on_the_page(tmp_path):
    """Greedy ranks 21, 23 and 9 once read `21.0`, `23.0`, `9.000`."""
    att = {"encoder_self": [softmaxed(1, 3, 3, 3, seed=l) for l in range(2)]}
    ranks = torch.tensor([[21.0, 23.0, 9.0], [1.0, 2.0, float("nan")]])
    meta = read_page(head_view(att, list("abc"), importance={"encoder_self": ranks}))[1]
    assert meta["kinds"]["encoder_self"]["importanceLabels"] == [["21", "23", "9"],
                                                                  ["1", "2", None]]
    js = (Path(headwise.viz.__file__).parent / "assets" / "head_view.js").read_text()
    assert "km.importanceLabels[l][h]" in js  # the page writes these, not its own format


def _decimals(label: str) -> int:
    mantissa = label.split("e")[0]
    return len(mantissa.split(".")[1]) if "." in mantissa else 0


scores = st.floats(-1e7, 1e7, allow_nan=False, allow_subnormal=False)


@given(st.lists(st.lists(st.one_of(st.none(), scores), min_size=1, max_size=6), min_size=1,
                max_size=4))
def test_every_label_of_a_grid_has_one_format_and_reads_back_its_value(rows):
    labels = score_labels(rows)
    flat = [(v, t) for row, out in zip(rows, labels, strict=True)
            for v, t in zip(row, out, strict=True)]
    assert all((v is None) == (t is None) for v, t in flat)
    shown = [(v, t) for v, t in flat if v is not None]
    assert len({("e" in t, _decimals(t)) for _, t in shown}) <= 1  # one format for the grid
    top = max((abs(v) for v, _ in shown), default=0.0)
    for v, t in shown:
        assert not t.startswith("-") or float(t) != 0  # never "-0.00"
        if "e" in t:  # two significant digits of each value
            assert abs(float(t) - v) <= 0.051 * abs(v) + 1e-300
        else:  # three significant digits of the largest (a unit of the last place, rounded)
            assert abs(float(t) - v) <= 0.5 * 10 ** -_decimals(t) + 1e-9 * top
    if shown and all(float(v).is_integer() for v, _ in shown) and top < 1e5:
        assert all(t == str(int(v)) for v, t in shown)
