"""The long-document view in a real headless Chromium (Debian's, via Playwright, offline):
no console error, no request but the file itself, hostile tokens shown as text, and what the
page draws equals the numbers it was made from. Each safety check has a positive control: the
same page altered so the check must fire, to show the check can fail."""

from __future__ import annotations

import numpy as np
import pytest

from headwise.viz import _long_store as store
from headwise.viz import long_view
from tests.e2e.test_browser import browser_context  # noqa: F401  (fixture)
from tests.viz.test_long_view import HOSTILE, dense_attention, reference_profile, tokens_of

N, BLOCK, ROWS = 96, 8, list(range(88, 96))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    w = dense_attention(3, 4, N, seed=2)
    p = reference_profile(w, BLOCK, tokens_of(N))
    path = tmp_path_factory.mktemp("long") / "long.html"
    long_view(p, path, tiles={"last 8": (ROWS, [a[:, ROWS] for a in w])}, title="long test")
    return w, p, path


class Opened:
    """One page, with everything it logged and requested."""

    def __init__(self, context, path):
        self.page = context.new_page()
        self.console, self.requests = [], []
        self.page.on("console", lambda m: self.console.append((m.type, m.text)))
        self.page.on("pageerror", lambda e: self.console.append(("pageerror", str(e))))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.url = path.resolve().as_uri()
        self.page.goto(self.url)
        self.ready = self.page.evaluate("window.headwiseLong.ready")

    def js(self, expr, arg=None):
        return self.page.evaluate(expr, arg)

    def problems(self):
        return ([m for m in self.console if m[0] in ("error", "pageerror", "warning")]
                + self.js("window.headwiseLong.errors"))


def test_loads_offline_with_no_error_or_request(browser_context, made):  # noqa: F811
    _, p, path = made
    o = Opened(browser_context, path)
    assert o.ready is True and o.js("document.title") == "long test"
    assert o.page.locator(".hl-cell").count() == 12
    assert o.js("window.headwiseLong.lastDraw.head.colour") == "received"
    assert o.problems() == [] and o.requests == [o.url]
    o.page.close()


def test_a_request_would_be_seen(browser_context, made, tmp_path):  # noqa: F811
    """Positive control: the same page plus one image from a server is caught."""
    _, _, path = made
    page = path.read_text(encoding="utf-8").replace(
        "</body>", '<img src="http://127.0.0.1:9/beacon.png"></body>')
    page = page.replace("img-src data: blob:", "img-src data: blob: http:")
    bad = tmp_path / "calls_out.html"
    bad.write_text(page, encoding="utf-8")
    o = Opened(browser_context, bad)
    assert any(u.startswith("http://127.0.0.1:9/") for u in o.requests)
    o.page.close()


def test_hostile_tokens_are_text(browser_context, made, tmp_path):  # noqa: F811
    _, p, path = made
    o = Opened(browser_context, path)
    assert o.js("window.__pwned") is None
    assert o.js("window.headwiseLong.textOf(3)") == HOSTILE
    assert o.js("document.querySelectorAll('.hl-text img').length") == 0
    assert o.requests == [o.url]
    o.page.close()
    # positive control: the same page setting the token as markup runs its handler
    page = path.read_text(encoding="utf-8").replace("textContent = display(t)",
                                                    "innerHTML = display(t)")
    bad = tmp_path / "as_markup.html"
    bad.write_text(page, encoding="utf-8")
    o = Opened(browser_context, bad)
    for _ in range(100):  # the image's error event comes after load; the CSP forbids eval polling
        if o.js("window.__pwned") == 1:
            break
        o.page.wait_for_timeout(50)
    assert o.js("window.__pwned") == 1
    assert o.js("document.querySelectorAll('.hl-text img').length") == 1
    o.page.close()


def test_sorting_ranks_heads_by_any_score(browser_context, made):  # noqa: F811
    _, p, path = made
    o = Opened(browser_context, path)
    for name, desc in (("far", True), ("sink", False)):
        got = o.js(f"window.headwiseLong.sortBy('{name}', {str(desc).lower()})")
        s = np.asarray(p.scores[name] if name in p.scores else getattr(p, name))
        want = sorted(((l, h) for l in range(3) for h in range(4)), key=lambda c: s[c],
                      reverse=desc)
        assert got == [f"L{l} H{h}" for l, h in want]
        assert o.js("[...document.querySelectorAll('.hl-cell')].map(c => "
                    "`L${c.dataset.layer} H${c.dataset.head}`)") == got
    assert o.js("window.headwiseLong.sortBy(null)")[:2] == ["L0 H0", "L0 H1"]
    assert o.problems() == []
    o.page.close()


def test_an_opened_head_shows_its_numbers(browser_context, made):  # noqa: F811
    w, p, path = made
    o = Opened(browser_context, path)
    o.js("window.headwiseLong.open(2, 1)")
    o.js("window.headwiseLong.idle()")
    got = np.array(o.js("window.headwiseLong.received(2, 1)"))
    want = p.received[2, 1]
    top = p.received.max()
    shown = want >= top * 10 ** -store.DECADES
    np.testing.assert_allclose(got[shown], want[shown], rtol=10 ** (store.DECADES / 508) - 1)
    # a query block's top keys are the ones outlined in the text
    o.js("window.headwiseLong.setQueryBlock(5)")
    o.js("window.headwiseLong.idle()")
    assert sorted(o.js("window.headwiseLong.highlighted()")) == sorted(p.topk_keys[2, 1, 5])
    assert o.js("window.headwiseLong.lastDraw.head") == {
        "layer": 2, "head": 1, "qblock": 5, "colour": "topk",
        "top": p.topk_keys[2, 1, 5].tolist()}
    # the exact rows, as the page reads them back, are the weights on every key
    for row in (0, 7):
        tile = np.array(o.js(f"window.headwiseLong.tileRow(2, 1, 0, {row})"))
        exact = w[2, 1, ROWS[row]]
        kept = tile > 0
        np.testing.assert_allclose(tile[kept], exact[kept], atol=exact.max() / 131070 + 1e-7)
        assert exact[~kept].sum() <= 1e-3 + 1e-9  # what is left out is the rows' last 0.1%
    o.js("window.headwiseLong.setTile(0, 7)")
    o.js("window.headwiseLong.idle()")
    assert o.js("window.headwiseLong.lastDraw.colour") == "tile"
    assert o.problems() == [] and o.requests == [o.url]
    png = o.page.screenshot(full_page=True)
    o.page.close()
    import io

    from PIL import Image
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    assert img.std() > 15 and len(np.unique(img.reshape(-1, 3) // 8, axis=0)) > 100


def test_a_coarsened_page_says_so_in_the_browser(browser_context, tmp_path):  # noqa: F811
    n = 300
    w = dense_attention(2, 2, n, seed=3)
    p = reference_profile(w, 4, [f"t{i}" for i in range(n)])
    rows = list(range(n - 32, n))
    tiles = {"last": (rows, [a[:, rows] for a in w])}
    free = len(long_view(p, tiles=tiles, max_mb=None).html.encode()) / 1e6
    path = long_view(p, tmp_path / "small.html", tiles=tiles, max_mb=free * 0.6).path
    o = Opened(browser_context, path)
    note = o.page.locator(".hl-budget").inner_text()
    assert "coarsened to fit its" in note and "blocks of" in note
    assert o.problems() == [] and o.requests == [o.url]
    o.page.close()


def test_the_notebook_display_renders_inline_offline(browser_context, made, tmp_path):  # noqa: F811
    _, p, _ = made
    host = tmp_path / "notebook.html"
    host.write_text("<!DOCTYPE html><html><body>" + long_view(p)._repr_html_()
                    + "</body></html>", encoding="utf-8")
    page = browser_context.new_page()
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(host.as_uri())
    frame = next(f for f in page.frames if f != page.main_frame)
    frame.frame_element().scroll_into_view_if_needed()
    assert frame.evaluate("window.headwiseLong.ready") is True
    assert frame.evaluate("window.headwiseLong.lastDraw.grid.cells") == 12
    assert requests == [host.as_uri()]
    page.close()
