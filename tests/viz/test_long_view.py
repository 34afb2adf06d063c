"""The long-document view's page from Python: what the header and blocks hold, the size budget,
escaping, the inline notebook form and one-line errors. The page in a browser:
tests/e2e/test_long_browser.py.

``reference_profile`` builds a LongProfile-shaped input from dense float64 weights, so the page
can be checked against the numbers it was made from.
"""

from __future__ import annotations

import base64
import json
import math
import re
import zlib
from dataclasses import dataclass

import numpy as np
import pytest

from headwise.viz import _long_store as store
from headwise.viz import long_view

HOSTILE = '<img src=x onerror="window.__pwned=1">'


@dataclass
class Profile:
    """The fields of headwise.long.LongProfile the view reads."""

    n: int
    block: int
    layers: list
    maps: np.ndarray
    distance: np.ndarray
    distance_edges: np.ndarray
    sink: np.ndarray
    local: np.ndarray
    received: np.ndarray
    topk_keys: np.ndarray
    topk_mass: np.ndarray
    scores: dict
    tokens: list


def dense_attention(layers: int, heads: int, n: int, seed: int = 0) -> np.ndarray:
    """(l, h, i, j) causal softmax weights with a sink, a local band and random far keys."""
    g = np.random.default_rng(seed)
    x = g.normal(size=(layers, heads, n, n)) * 3
    x[..., 0] += 4 * g.random((layers, heads, 1))
    x += np.tril(np.triu(np.ones((n, n)), -3)) * 3 * g.random((layers, heads, 1, 1))
    x[..., np.triu(np.ones((n, n), bool), 1)] = -np.inf
    w = np.exp(x - x.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True)


def reference_profile(w: np.ndarray, block: int, tokens: list[str], k: int = 4) -> Profile:
    l, h, n, _ = w.shape
    nb = math.ceil(n / block)
    maps = np.zeros((l, h, nb, nb))
    for i in range(nb):
        for j in range(nb):
            maps[..., i, j] = w[..., i * block:(i + 1) * block, j * block:(j + 1) * block] \
                .sum(-1).mean(-1)
    edges = np.array([0, 1] + [2 ** t for t in range(1, int(math.log2(n)) + 1)] + [n])
    dist = np.subtract.outer(np.arange(n), np.arange(n))
    distance = np.stack([(w * ((dist >= a) & (dist < b))).sum((-1, -2)) / n
                         for a, b in zip(edges[:-1], edges[1:], strict=True)], -1)
    keys = np.zeros((l, h, nb, k), np.int64)
    mass = np.zeros((l, h, nb, k))
    for i in range(nb):
        col = w[..., i * block:(i + 1) * block, :].mean(-2)
        keys[..., i, :] = np.argsort(-col, -1, kind="stable")[..., :k]
        mass[..., i, :] = np.take_along_axis(col, keys[..., i, :], -1)
    sink = w[..., :1].sum(-1).mean(-1)
    local = (w * ((dist >= 0) & (dist < 4))).sum(-1).mean(-1)
    return Profile(n, block, list(range(l)), maps, distance, edges, sink, local, w.sum(-2),
                   keys, mass, {"far": 1 - sink - local, "streaming": sink + local}, tokens)


def tokens_of(n: int) -> list[str]:
    toks = [f" w{i}" for i in range(n)]
    toks[3] = HOSTILE
    toks[4] = "</script><script>window.__pwned=2</script>"
    return toks


@pytest.fixture(scope="module")
def small():
    n = 40
    w = dense_attention(2, 3, n)
    return w, reference_profile(w, 8, tokens_of(n))


def header(page: str) -> dict:
    return json.loads(page.split('id="hl-meta">', 1)[1].split("</script>", 1)[0])


def stored(page: str, key: str) -> bytes:
    text = page.split(f'data-key="{key}">', 1)[1].split("</script>", 1)[0]
    return zlib.decompress(base64.b64decode(text))


def test_header_and_blocks_hold_the_profile(small, tmp_path):
    w, p = small
    rows = [36, 37, 38, 39]
    view = long_view(p, tmp_path / "long.html", tiles={"last 4": (rows, [a[:, rows] for a in w])})
    page = (tmp_path / "long.html").read_text(encoding="utf-8")
    meta = header(page)
    assert (meta["n"], meta["blocks"], meta["heads"], meta["layers"]) == (40, 5, 3, [0, 1])
    assert meta["tokens"] == p.tokens and set(meta["scores"]) == {"far", "streaming", "sink",
                                                                    "local"}
    np.testing.assert_allclose(meta["scores"]["sink"], p.sink, atol=1e-12)
    np.testing.assert_allclose(meta["distance"], p.distance, atol=1e-6)
    assert not meta["budget"]["coarsened"] and view.path == tmp_path / "long.html"
    raw = stored(page, "m/1/2")
    nm = 25
    qm = np.frombuffer(raw[:nm], np.uint8).reshape(5, 5)
    got = store.log_value(qm, meta["mapTop"])
    want = p.maps[1, 2]
    bound = 10 ** (store.DECADES / 508) - 1
    shown = want >= meta["mapTop"] * 10 ** -store.DECADES
    np.testing.assert_array_less(np.abs(got - want)[shown], (bound * want)[shown] + 1e-15)
    assert (got[~shown] == 0).all()
    off = nm + 40 + (-(nm + 40)) % 4
    keys = np.frombuffer(raw[off:off + 5 * 4 * 4], np.int32).reshape(5, 4)
    assert (keys == p.topk_keys[1, 2]).all()


def test_tokens_never_reach_the_markup_unescaped(small):
    _, p = small
    page = long_view(p).html
    assert HOSTILE not in page and "onerror" in page  # present only inside the JSON, escaped
    assert "</script><script>window.__pwned" not in page
    assert "<\\/script>" not in page and "\\u003c/script>" in page
    assert "textContent = display(t)" in page and "innerHTML" not in page


def test_budget_coarsens_then_says_so(tmp_path):
    n = 300
    w = dense_attention(2, 4, n, seed=1)
    p = reference_profile(w, 4, [f"t{i}" for i in range(n)])
    rows = list(range(n - 64, n))
    tiles = {"last 64": (rows, [a[:, rows] for a in w])}
    free = long_view(p, tiles=tiles, max_mb=None).html
    size = len(free.encode()) / 1e6
    tight = long_view(p, tiles=tiles, max_mb=size * 0.6).html
    meta = header(tight)
    assert meta["budget"]["coarsened"] and len(tight.encode()) <= size * 0.6 * 1e6
    assert (meta["budget"]["cap"], meta["budget"]["factor"]) != (256, 1)
    assert meta["mapBlocks"] == math.ceil(meta["blocks"] / meta["budget"]["factor"])
    # the page's own words say it was coarsened (set by the page script from the header)
    assert "was coarsened to fit its" in tight
    impossible = header(long_view(p, tiles=tiles, max_mb=0.001).html)
    assert impossible["budget"]["over"] and impossible["budget"]["cap"] == 4


def test_notebook_form_is_one_sandboxed_frame(small):
    _, p = small
    view = long_view(p)
    frame = view._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts"' in frame
    assert "<script" not in frame  # the page is in the attribute, escaped


@pytest.mark.parametrize("change, message", [
    (lambda p: setattr(p, "tokens", p.tokens[:-1]), "but 39 tokens"),
    (lambda p: setattr(p, "maps", p.maps[..., :4]), "needs (2, 3, 5, 5)"),
    (lambda p: setattr(p, "received", -p.received), "finite, non-negative"),
    (lambda p: p.scores.__setitem__("bad", np.zeros((3, 2))), "expected (2, 3)"),
    (lambda p: delattr(p, "topk_mass"), "has no 'topk_mass'"),
])
def test_bad_profiles_fail_in_one_line(small, change, message):
    w, good = small
    p = reference_profile(w, 8, list(good.tokens))
    change(p)
    with pytest.raises((ValueError, TypeError), match=re.escape(message)) as e:
        long_view(p)
    assert "\n" not in str(e.value)


def test_bad_tiles_path_and_options_fail_in_one_line(small, tmp_path):
    w, p = small
    with pytest.raises(ValueError, match=r"expected \(3, 2, 40\)"):
        long_view(p, tiles={"x": ([38, 39], [a[:, 30:] for a in w])})
    with pytest.raises(ValueError, match="rows must be positions in 0..39"):
        long_view(p, tiles={"x": ([40], [a[:, :1] for a in w])})
    with pytest.raises(ValueError, match="one \\(h, r, j\\) array per profiled layer"):
        long_view(p, tiles={"x": ([39], [w[0][:, 39:]])})
    with pytest.raises(ValueError, match="must end in .html"):
        long_view(p, tmp_path / "x.png")
    with pytest.raises(ValueError, match="choose one of"):
        long_view(p, sort="nope")
    with pytest.raises(ValueError, match="outside the profile's 2 layers x 3"):
        long_view(p, layer=2, head=0)
    assert not (tmp_path / "x.png").exists()


def test_a_real_long_profile_makes_the_page(tmp_path):
    """headwise.long.profile's LongProfile, not the stand-in: the header holds its scores and
    the stored map of a head decodes to its block map within the log scale's bound."""
    import torch

    from headwise.layers import AttentionConfig
    from headwise.long import profile
    from headwise.models import LMConfig, TransformerLM

    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=30, d_model=32, num_heads=4, num_layers=2,
                                   d_ff=32, max_len=128, positional="rope", norm="rms",
                                   attention=AttentionConfig(num_kv_heads=2))).eval()
    n = 100
    ids = torch.randint(0, 30, (1, n), generator=torch.Generator().manual_seed(0))
    p = profile(model, ids, block=16, tokens=tokens_of(n), progress=False)
    rows = [96, 97, 98, 99]
    with torch.no_grad():
        w = model(ids, return_weights={"decoder_self": {"rows": rows}})[1]["decoder_self"]
    page_path = tmp_path / "real.html"
    long_view(p, page_path, tiles={"last 4": (rows, [x[0].numpy() for x in w])})
    page = page_path.read_text(encoding="utf-8")
    meta = header(page)
    assert (meta["n"], meta["blocks"], meta["heads"], meta["layers"]) == (n, 7, 4, [0, 1])
    np.testing.assert_allclose(meta["scores"]["streaming"], p.scores["streaming"].numpy(),
                               atol=1e-6)
    got = store.log_value(np.frombuffer(stored(page, "m/1/2")[:49], np.uint8).reshape(7, 7),
                          meta["mapTop"])
    want = p.maps[1, 2].double().numpy()
    shown = want >= meta["mapTop"] * 10 ** -store.DECADES
    bound = 10 ** (store.DECADES / 508) - 1
    np.testing.assert_array_less(np.abs(got - want)[shown], (bound * want)[shown] + 1e-12)
    assert HOSTILE not in page
