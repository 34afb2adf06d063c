"""The head view in a real headless Chromium (Debian's /usr/bin/chromium via Playwright).

Without a browser (a user's machine without root) these skip with the reason; under CI=true a
missing browser is a failure. The page is opened from file:// in an offline context and every
request is recorded: the only one allowed is the file itself.
"""

import io
import os
import shutil
import sys
import tempfile

import numpy as np
import pytest
import torch

from headwise.viz import attention_rollout, head_view
from tests.viz.test_head_view import softmaxed

CHROMIUM = os.environ.get("HEADWISE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install 'headwise[browser]')"
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium, or `make browser` as root)"
    return None


@pytest.fixture(scope="module")
def browser_context():
    reason = _unavailable()
    if reason:
        if IN_CI:
            pytest.fail(f"CI=true but the head-view browser tests cannot run: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="headwise-chromium-")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=ARGS, offline=True,
            viewport={"width": 1400, "height": 900},
            # scrollbars take room as in a user's browser (Playwright hides them by default)
            ignore_default_args=["--hide-scrollbars"])
        yield context
        context.close()
    shutil.rmtree(profile, ignore_errors=True)


class Page:
    """One opened head-view page plus everything it logged and requested."""

    def __init__(self, context, path):
        self.page = context.new_page()
        self.console, self.requests = [], []
        self.page.on("console", lambda m: self.console.append((m.type, m.text)))
        self.page.on("pageerror", lambda e: self.console.append(("pageerror", str(e))))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.url = path.resolve().as_uri()
        self.page.goto(self.url)  # waits for "load": every weight block is parsed
        # the page's CSP forbids eval, so poll nothing: await the page's own promise
        assert self.page.evaluate("window.headwise.dataLoaded")
        self.page.evaluate("window.headwise.ready")

    def js(self, expr, arg=None):
        return self.page.evaluate(expr, arg)

    def settle(self):
        """Wait until no redraw is scheduled or running (redraws are rAF-scheduled and may
        await the inflation of a head's weights)."""
        self.page.evaluate("window.headwise.idle()")

    def lines(self):
        return self.js("window.headwise.lastDraw.lines")

    def hover_token(self, side, index):
        pt = self.js(f"window.headwise.tokenPoint('{side}', {index})")
        self.page.mouse.move(pt["x"], pt["y"])
        self.settle()

    def close(self):
        problems = [m for m in self.console if m[0] in ("error", "pageerror", "warning")]
        errors = self.js("window.headwise.errors")
        self.page.close()
        assert problems == [] and errors == []
        assert self.requests == [self.url], f"unexpected requests: {self.requests}"


L, H, B, NS, NT = 3, 4, 2, 9, 7
SRC = [["the", "cat", "sat", "on", "the", "mat", "and", "slept", "."],
       ["a", "dog", "ran", "."]]
TGT = [["<s>", "le", "chat", "s'", "est", "assis", "."], ["<s>", "un", "chien"]]


@pytest.fixture(scope="module")
def seq2seq():
    return {"encoder_self": [softmaxed(B, H, NS, NS, seed=l) for l in range(L)],
            "decoder_self": [softmaxed(B, H, NT, NT, seed=10 + l, causal=True) for l in range(L)],
            "cross": [softmaxed(B, H, NT, NS, seed=20 + l) for l in range(L)]}


@pytest.fixture(scope="module")
def seq2seq_file(seq2seq, tmp_path_factory):
    importance = {"encoder_self": torch.arange(L * H, dtype=torch.float).reshape(L, H) / 10}
    return head_view(seq2seq, {"src": SRC, "tgt": TGT},
                     tmp_path_factory.mktemp("hv") / "view.html", importance=importance,
                     title="test model").path


@pytest.fixture
def page(browser_context, seq2seq_file):
    p = Page(browser_context, seq2seq_file)
    yield p
    p.close()


def test_opens_offline_with_a_full_grid(page):
    assert page.js("document.title") == "test model"
    cells = page.page.locator(".hw-cell:not(.hw-empty)")
    assert cells.count() == L * H
    drawn = page.js("[...document.querySelectorAll('.hw-cell canvas')].filter(c => c.dataset.drawn).length")
    assert drawn == L * H
    grid = page.js("window.headwise.lastDraw.grid")
    assert grid == {"cells": L * H, "layers": L, "heads": H, "scale": "shared", "top": grid["top"],
                    "kvHeads": None}
    # importance scores appear on the grid, all in one format: layer 2 head 3 = 1.1
    assert page.page.locator('.hw-cell[data-layer="2"][data-head="3"] .hw-imp-val').inner_text() == "1.10"
    labels = page.js("[...document.querySelectorAll('.hw-imp-val')].map((e) => e.textContent)")
    assert len(labels) == L * H and {len(t.split(".")[1]) for t in labels} == {2}
    png = page.page.screenshot(full_page=True)
    from PIL import Image
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    assert img.std() > 15 and len(np.unique(img.reshape(-1, 3) // 8, axis=0)) > 200  # not blank


def test_hover_highlights_exactly_the_attended_keys(page, seq2seq):
    page.js("window.headwise.solo(1)")  # one head, so the highlighted edges are its row
    page.settle()
    before = page.js("window.headwise.signature('lines')")
    seen = {}
    for i in (0, 5):
        page.hover_token("q", i)
        drawn = page.lines()
        assert drawn["hover"] == {"side": "q", "index": i} and drawn["heads"] == [1]
        want = seq2seq["encoder_self"][0][0, 1, i].numpy()
        got = np.zeros(NS)
        for e in drawn["highlighted"]:
            assert e["query"] == i and e["head"] == 1
            got[e["key"]] = e["weight"]
        top = np.argsort(-want)[: len(drawn["highlighted"])]
        assert set(top[want[top] > want.max() / 255]) <= {e["key"] for e in drawn["highlighted"]}
        np.testing.assert_allclose(got[top], want[top], atol=want.max() / 510 + 1e-7)
        seen[i] = page.js("window.headwise.signature('lines')")
    assert len({before, seen[0], seen[5]}) == 3  # each hover redraws differently
    # hovering a key shows the queries that attend to it (a column of the matrix)
    page.hover_token("k", 2)
    drawn = page.lines()
    assert drawn["hover"] == {"side": "k", "index": 2}
    col = seq2seq["encoder_self"][0][0, 1, :, 2].numpy()
    for e in drawn["highlighted"]:
        assert e["key"] == 2 and abs(e["weight"] - col[e["query"]]) < 1 / 510 + 1e-7
    assert "query" in page.js("document.getElementById('hw-readout').textContent") or \
        "key" in page.js("document.getElementById('hw-readout').textContent")
    page.page.mouse.move(5, 5)
    page.settle()
    assert page.lines()["hover"] is None


def test_toggling_a_head_changes_the_drawing(page):
    page.page.click('#hw-headmode button[data-all="1"]')  # "all heads": the head chips toggle
    page.settle()
    before = (page.lines()["heads"], page.js("window.headwise.signature('lines')"))
    assert before[0] == list(range(H))
    page.page.locator('#hw-heads .hw-chip[data-head="2"]').click()
    page.settle()
    after = (page.lines()["heads"], page.js("window.headwise.signature('lines')"))
    assert after[0] == [0, 1, 3] and after[1] != before[1]
    assert "hw-off" in page.page.locator('.hw-cell[data-layer="0"][data-head="2"]').get_attribute("class")
    assert page.page.locator('#hw-grid .hw-chip[data-head="2"]').get_attribute("aria-pressed") == "false"
    page.page.locator('#hw-heads .hw-chip[data-head="2"]').click()
    page.settle()
    assert page.lines()["heads"] == list(range(H))
    assert page.js("window.headwise.signature('lines')") == before[1]  # same state, same pixels


def test_switching_kind_and_example(page, seq2seq):
    page.page.click('#hw-kind button[data-kind="cross"]')
    page.settle()
    drawn = page.lines()
    assert drawn["kind"] == "cross"
    assert page.js("window.headwise.state.kind") == "cross"
    assert page.page.locator("#hw-kind button[aria-pressed=true]").inner_text() == "Cross"
    page.hover_token("q", 3)  # a target token attends over source tokens
    drawn = page.lines()
    assert max(e["key"] for e in drawn["highlighted"]) < NS
    e = drawn["highlighted"][0]
    want = seq2seq["cross"][0][0, e["head"], 3, e["key"]].item()
    assert abs(e["weight"] - want) < 1 / 510 + 1e-7
    # example 1 is shorter (padding trimmed): 4 source and 3 target tokens
    page.page.select_option("#hw-example", "1")
    page.settle()
    got = page.js("window.headwise.weights('cross', 1, 2, 0)")
    assert np.array(got).shape == (3, 4)
    np.testing.assert_allclose(got, seq2seq["cross"][2][1, 0, :3, :4].numpy(), atol=1 / 510)
    assert page.lines()["example"] == 1
    # the grid thumbnails changed with the kind/example
    assert page.page.locator(".hw-cell:not(.hw-empty)").count() == L * H


def test_matrix_view_and_select_a_head(page, seq2seq):
    page.page.click('button[data-tab="matrix"]')
    page.page.click('.hw-cell[data-layer="1"][data-head="2"]')
    page.settle()
    m = page.js("window.headwise.lastDraw.matrix")
    assert m["heads"] == [2] and (m["nq"], m["nk"]) == (NS, NS)
    assert abs(m["max"] - seq2seq["encoder_self"][1][0, 2].max().item()) < 1e-3
    assert page.js("document.getElementById('hw-detail-title').textContent") == "Layer 1 · head 2"
    sig = page.js("window.headwise.signature('matrix')")
    page.page.click('#hw-matrix-mode button[data-mode="mean"]')
    page.settle()
    assert page.js("window.headwise.lastDraw.matrix.heads") == list(range(H))
    assert page.js("window.headwise.signature('matrix')") != sig
    # keyboard: Tab to a grid cell, Enter inspects it
    page.page.click('#hw-matrix-mode button[data-mode="head"]')
    page.page.focus('.hw-cell[data-layer="0"][data-head="1"]')
    page.page.keyboard.press("Enter")
    page.settle()
    assert page.js("window.headwise.lastDraw.matrix.heads") == [1]
    assert page.js("document.getElementById('hw-detail-title').textContent") == "Layer 0 · head 1"
    # hovering a cell reports its weight
    box = page.page.locator("#hw-matrix-canvas").bounding_box()
    page.page.mouse.move(box["x"] + box["width"] - 12, box["y"] + box["height"] - 30)
    page.settle()
    assert "weight" in page.page.locator("#hw-tip").inner_text()


def test_rollout_panel(page, seq2seq):
    page.page.click('button[data-tab="rollout"]')
    page.page.click('.hw-cell[data-layer="2"][data-head="0"]')
    page.settle()
    assert page.js("window.headwise.lastDraw.rollout")["layer"] == 2
    got = np.array(page.js("window.headwise.rollout('encoder_self', 0, 2)"))
    want = attention_rollout([w[0] for w in seq2seq["encoder_self"]])[2].numpy()
    assert np.all(np.abs(got - want) <= want.max(1, keepdims=True) / 510 + 1e-6)
    assert page.page.locator("#hw-rollout-canvas").is_visible()
    np.testing.assert_allclose(page.js("window.headwise.rolloutShown()"), got, atol=1e-6)
    # switching a head off (or fusing by max) rolls out in the page, from the stored weights
    page.page.locator('#hw-heads .hw-chip[data-head="1"]').click()
    page.settle()
    subset = [w[0][[0, 2, 3]] for w in seq2seq["encoder_self"]]
    assert page.js("window.headwise.lastDraw.rollout.heads") == [[0, 2, 3]] * 3
    np.testing.assert_allclose(page.js("window.headwise.rolloutShown()"),
                               attention_rollout(subset)[2].numpy(), atol=5e-3)
    page.page.click('#hw-fusion button[data-fusion="max"]')
    page.settle()
    shown = np.array(page.js("window.headwise.rolloutShown()"))
    np.testing.assert_allclose(shown, attention_rollout(subset, head_fusion="max")[2].numpy(),
                               atol=5e-3)
    assert not np.allclose(shown, got, atol=1e-2)
    page.page.click('#hw-kind button[data-kind="cross"]')
    page.settle()
    assert "self-attention" in page.page.locator("#hw-rollout .hw-message").inner_text()
    assert not page.page.locator("#hw-rollout-canvas").is_visible()


def test_long_sequence_stays_responsive(browser_context, tmp_path):
    n = 512
    att = {"decoder_self": [softmaxed(1, 4, n, n, seed=l, scale=3, causal=True) for l in range(2)]}
    path = head_view(att, [f"w{i}" for i in range(n)], tmp_path / "long.html").path
    p = Page(browser_context, path)
    p.hover_token("q", 400)  # scrolls the virtualised lines view there
    drawn = p.lines()
    assert drawn["hover"] == {"side": "q", "index": 400}
    assert all(e["key"] <= 400 for e in drawn["highlighted"])  # causal
    took = p.js("""(async () => { const t = performance.now();
        for (let i = 0; i < 20; i++) window.headwise.setHover('q', 100 + 10 * i);
        return performance.now() - t; })()""")
    assert took < 2000  # 20 full redraws of 4 heads x 512 keys; generous for a loaded CI box
    p.close()


def test_real_tiny_transformer(browser_context, tmp_path):
    from headwise.models import Transformer, TransformerConfig

    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, num_heads=2,
                            num_layers=2, d_ff=32, max_len=16, dropout=0.0)
    model = Transformer(cfg).eval()
    src = torch.randint(1, 20, (2, 6))
    tgt = torch.randint(1, 20, (2, 5))
    with torch.no_grad():
        _, att = model(src, tgt, src_valid_lens=torch.tensor([6, 4]), return_weights=True)
    src_tok = [[f"s{t}" for t in row[:n]] for row, n in zip(src.tolist(), (6, 4), strict=True)]
    tgt_tok = [[f"t{t}" for t in row] for row in tgt.tolist()]
    path = head_view(att, {"src": src_tok, "tgt": tgt_tok}, tmp_path / "real.html").path
    p = Page(browser_context, path)
    assert p.page.locator(".hw-cell:not(.hw-empty)").count() == 2 * 2
    for kind in ("encoder_self", "decoder_self", "cross"):
        p.js(f"window.headwise.setKind('{kind}')")
        p.settle()
        assert p.lines()["kind"] == kind
        got = np.array(p.js(f"window.headwise.weights('{kind}', 1, 1, 1)"))
        n_q = 4 if kind == "encoder_self" else 5
        n_k = 5 if kind == "decoder_self" else 4
        want = att[kind][1][1, 1, :n_q, :n_k].numpy()
        np.testing.assert_allclose(got, want, atol=1 / 510 + 1e-6)
        if kind == "decoder_self":
            assert np.all(np.triu(got, 1) == 0)  # causal, as the model computed it
    p.close()


def test_a_missing_browser_is_named(monkeypatch):
    """The skip (or, under CI=true, failure) message says what is missing and how to get it."""
    me = sys.modules[__name__]
    monkeypatch.setattr(me, "CHROMIUM", "/nonexistent/chromium")
    assert "no Chromium at /nonexistent/chromium" in me._unavailable()
    assert "apt-get install chromium" in me._unavailable()


# ---------------------------------------------------------------- issue 15: a view that pays off

def test_one_head_at_a_time_by_default(page):
    page.settle()
    assert page.lines()["heads"] == [0]  # the selected head alone, not a hairball of all 4
    assert page.page.locator("#hw-headmode button[aria-pressed=true]").inner_text() == "one head"
    assert page.js("document.getElementById('hw-detail-title').textContent") == "Layer 0 · head 0"
    one = page.lines()["edges"]
    page.page.click('#hw-headmode button[data-all="1"]')
    page.settle()
    assert page.lines()["heads"] == list(range(H)) and page.lines()["edges"] > one
    # in one-head mode a head label picks the head shown
    page.page.click('#hw-headmode button[data-all="0"]')
    page.page.locator('#hw-heads .hw-chip[data-head="3"]').click()
    page.settle()
    assert page.lines()["heads"] == [3]


def test_clicking_a_grid_cell_isolates_that_head(page, seq2seq):
    page.page.click('#hw-headmode button[data-all="1"]')
    page.settle()
    assert page.lines()["heads"] == list(range(H))
    before = page.js("window.headwise.signature('lines')")
    page.page.click('.hw-cell[data-layer="1"][data-head="2"]')
    page.settle()
    drawn = page.lines()
    assert (drawn["layer"], drawn["heads"]) == (1, [2])
    assert page.js("window.headwise.signature('lines')") != before
    assert page.page.locator("#hw-headmode button[aria-pressed=true]").inner_text() == "one head"
    # and the lines drawn are that head's: hover a query, read back its row
    page.hover_token("q", 4)
    want = seq2seq["encoder_self"][1][0, 2, 4].numpy()
    for e in page.lines()["highlighted"]:
        assert e["head"] == 2 and abs(e["weight"] - want[e["key"]]) <= want.max() / 510 + 1e-7


def test_the_lines_panel_uses_the_window(page):
    assert page.js("window.innerWidth") == 1400
    page.settle()
    width = page.js("document.getElementById('hw-lines-scroll').getBoundingClientRect().width")
    canvas = page.js("document.getElementById('hw-lines-canvas').getBoundingClientRect().width")
    assert width >= 0.6 * 1400 and canvas >= 0.6 * 1400 - 4, (width, canvas)
    grid = page.page.locator("#hw-grid").bounding_box()
    lines = page.page.locator("#hw-lines-scroll").bounding_box()
    assert grid["x"] + grid["width"] <= lines["x"]  # side by side, not overlapping


def test_thumbnails_share_one_scale_by_default(browser_context, tmp_path):
    """A flat head (max weight 1/9) next to a sharp one (max 1): on the shared scale its
    thumbnail is pale; on its own scale (the labelled option) it is as dark as the sharp one."""
    n = 9
    flat = torch.full((1, 1, n, n), 1 / n)
    sharp = torch.eye(n)[None, None]
    att = {"encoder_self": [torch.cat([flat, sharp], 1)]}
    path = head_view(att, [f"t{i}" for i in range(n)], tmp_path / "scale.html").path
    p = Page(browser_context, path)
    mean = """(h) => { const c = document.querySelector(`.hw-cell[data-layer="0"][data-head="${h}"] canvas`);
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let s = 0;
        for (let i = 0; i < d.length; i += 4) s += d[i]; return s / (d.length / 4); }"""
    assert p.js("window.headwise.lastDraw.grid.scale") == "shared"
    assert "one scale for all heads" in p.page.locator(".hw-model .hw-hint").inner_text()
    shared_flat, sharp_min = p.js(mean, 0), p.js("""() => { const c = document.querySelector('.hw-cell[data-head="1"] canvas');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let m = 255;
        for (let i = 0; i < d.length; i += 4) m = Math.min(m, d[i]); return m; }""")
    assert shared_flat > 190 and sharp_min < 40  # pale vs dark (red channel of the Blues ramp)
    p.page.click('#hw-thumb-scale button[data-scale="own"]')
    p.settle()
    assert p.js("window.headwise.lastDraw.grid.scale") == "own"
    assert p.js(mean, 0) < 40  # the flat head at its own maximum is uniformly dark
    assert "own largest weight" in p.page.locator(".hw-model .hw-hint").inner_text()
    p.close()


def test_importance_labels_fit_their_box(browser_context, tmp_path):
    """Awkward values (6.5e-3, 3.4e-5, 12345.6, -0.25) on a 12-head grid (narrow cells) stay on
    one line inside their cell."""
    heads, n = 12, 6
    att = {"encoder_self": [softmaxed(1, heads, n, n, seed=l) for l in range(2)]}
    values = torch.tensor([6.5e-3, 3.4e-5, 12345.6, -0.25, 1.0, 0.5, 2e-7, 99.99, 0.0, 7.7,
                           1e-3, 0.123])
    imp = {"encoder_self": torch.stack([values, values.flip(0)])}
    path = head_view(att, [f"t{i}" for i in range(n)], tmp_path / "imp.html", importance=imp).path
    p = Page(browser_context, path)
    boxes = p.js("""[...document.querySelectorAll('.hw-imp-val')].map((e) => {
        const r = e.getBoundingClientRect(), c = e.closest('.hw-cell').getBoundingClientRect();
        return {text: e.textContent, sw: e.scrollWidth, cw: e.clientWidth, h: r.height,
                inside: r.left >= c.left - 0.5 && r.right <= c.right + 0.5,
                sh: e.scrollHeight, ch: e.clientHeight, nowrap: getComputedStyle(e).whiteSpace,
                font: parseFloat(getComputedStyle(e).fontSize)}; })""")
    assert len(boxes) == 2 * heads
    for b in boxes:
        assert b["sw"] <= b["cw"] + 0.5 and b["inside"], b  # nothing cut off or spilling over
        assert b["nowrap"] == "nowrap" and b["sh"] <= b["ch"] + 0.5 and b["h"] <= 13, b  # one line
        assert b["font"] >= 7
        assert b["text"] and b["text"] != "…"
    p.close()


def test_the_demo_page_opens_on_cross_attention(browser_context, tmp_path):
    """The head view the demo writes (its own code path, on an untrained demo-sized model)
    opens on cross-attention at the head the demo picked."""
    from headwise.commands.demo import _artefacts, demo_config
    from headwise.data import make_task
    from headwise.models import build
    from headwise.train import build_model_config

    cfg = demo_config(steps=1)
    task = make_task("reverse", min_len=cfg.min_len, max_len=cfg.max_len,
                     num_symbols=cfg.num_symbols)
    torch.manual_seed(0)
    model = build(build_model_config(cfg, task)).eval()
    files, _ = _artefacts(model, task, task.eval_set(64), torch.device("cpu"), tmp_path,
                       mirror=(1, 3))
    p = Page(browser_context, __import__("pathlib").Path(files["head_view"]))
    p.settle()
    assert p.js("window.headwise.state.kind") == "cross"
    assert p.page.locator("#hw-kind button[aria-pressed=true]").inner_text() == "Cross"
    drawn = p.lines()
    assert (drawn["kind"], drawn["layer"], drawn["heads"]) == ("cross", 1, [3])
    assert "hw-selected" in p.page.locator('.hw-cell[data-layer="1"][data-head="3"]').get_attribute("class")
    assert p.js("document.getElementById('hw-detail-title').textContent") == "Layer 1 · head 3"
    p.close()


def test_the_notebook_display_renders_inline_offline(browser_context, seq2seq, tmp_path):
    """What Jupyter shows for a head view (``_repr_html_``): two views in one host page, each in
    its own frame, both drawn, nothing requested but the host page."""
    view = head_view(seq2seq, {"src": SRC, "tgt": TGT}, kind="cross", layer=2, head=1)
    host = tmp_path / "notebook.html"
    host.write_text("<!DOCTYPE html><html><body><h1>cell output</h1>" + view._repr_html_()
                    + view._repr_html_() + "</body></html>", encoding="utf-8")
    page = browser_context.new_page()
    requests, problems = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.goto(host.as_uri())
    frames = [f for f in page.frames if f != page.main_frame]
    assert len(frames) == 2
    for frame in frames:
        # Chromium pauses animation frames in off-screen cross-origin frames (a notebook's
        # view below the fold draws when scrolled to): bring each into view first
        frame.frame_element().scroll_into_view_if_needed()
        frame.evaluate("window.headwise.ready")
        frame.evaluate("window.headwise.idle()")
        assert frame.evaluate("window.headwise.lastDraw.grid.cells") == L * H
        drawn = frame.evaluate("window.headwise.lastDraw.lines")
        assert (drawn["kind"], drawn["layer"], drawn["heads"]) == ("cross", 2, [1])
    assert requests == [host.as_uri()] and problems == []
    page.close()


def test_query_heads_grouped_under_their_kv_heads_and_generated_tokens_marked(browser_context,
                                                                              tmp_path):
    """SmolLM2's layout (9 query heads on 3 key/value heads), prompt + continuation."""
    n, start = 8, 5
    att = {"decoder_self": [softmaxed(1, 9, n, n, seed=l, causal=True) for l in range(2)]}
    tokens = ["The", " capital", " of", " France", " is", " Paris", ".", "<|im_end|>"]
    path = head_view(att, tokens, tmp_path / "gqa.html", kv_heads=3, generated_start=start).path
    p = Page(browser_context, path)
    assert p.js("window.headwise.lastDraw.grid.kvHeads") == 3
    groups = p.page.locator(".hw-grid .hw-group")
    assert groups.count() == 3 and groups.nth(1).inner_text() == "KV1"
    assert "query heads H3–H5 share key/value head 1" in groups.nth(1).get_attribute("title")
    # each header sits over exactly its three query heads' columns, a visible gap between groups
    for k in range(3):
        box = groups.nth(k).bounding_box()
        cells = [p.page.locator(f'.hw-cell[data-layer="0"][data-head="{h}"]').bounding_box()
                 for h in range(3 * k, 3 * k + 3)]
        assert box["width"] > 0 and box["height"] > 0
        assert abs(box["x"] - cells[0]["x"]) < 4
        assert abs(box["x"] + box["width"] - cells[2]["x"] - cells[2]["width"]) < 4
        assert box["y"] < cells[0]["y"]
    assert p.page.locator(".hw-grid .hw-gap").count() == 2 * 4  # KV row, head row, 2 layers
    labels = p.page.locator("#hw-heads .hw-kv-label")
    assert [labels.nth(k).inner_text() for k in range(labels.count())] == ["KV0", "KV1", "KV2"]
    assert "query heads share 3 key/value heads" in p.page.locator(".hw-model .hw-hint").inner_text()
    # the generated part: named in the caption, drawn in the lines view, and on the matrix
    p.settle()
    assert p.lines()["generatedStart"] == start
    assert f"Green tokens (from #{start}" in p.page.locator("#hw-lines .hw-caption").inner_text()
    plain = Page(browser_context, head_view(att, tokens, tmp_path / "plain.html", kv_heads=3).path)
    plain.settle()
    assert plain.lines()["generatedStart"] is None
    assert p.js("window.headwise.signature('lines')") != plain.js("window.headwise.signature('lines')")
    plain.close()
    p.js("window.headwise.setTab('matrix')")
    p.settle()
    assert p.js("window.headwise.lastDraw.matrix.nq") == n
    p.close()


@pytest.mark.parametrize("n", [13, 40])  # explain's 13 tokens fit the lines view; 40 scroll
def test_smollm2_sized_view_shows_every_head_and_row_number_at_1400_px(browser_context,
                                                                        tmp_path, n):
    """SmolLM2's view (30 layers x 9 query heads on 3 key/value heads, two-digit token
    positions) at 1400 x 900: the model view cut off the ninth head (H8), and a vertical
    scrollbar of the lines view (shown even for 13 tokens: the box's height left out its
    border) covered the key side's row numbers. Now every head's column and the whole lines
    canvas lie inside what their panels show, and the lines view scrolls only when it must."""
    att = {"decoder_self": [softmaxed(1, 9, n, n, seed=l, causal=True) for l in range(30)]}
    tokens = [f"t{k}" for k in range(n)]
    p = Page(browser_context, head_view(att, tokens, tmp_path / "smol.html", kv_heads=3,
                                        generated_start=n - 8).path)
    p.settle()
    assert p.js("window.innerWidth") == 1400
    wrap = p.js("(() => { const r = document.getElementById('hw-grid-wrap')"
                ".getBoundingClientRect(); const w = document.getElementById('hw-grid-wrap');"
                " return {left: r.left, right: r.left + w.clientWidth}; })()")
    for h in range(9):
        for where in (f'.hw-cell[data-layer="0"][data-head="{h}"]',
                      f'.hw-grid .hw-chip[data-head="{h}"]'):
            box = p.page.locator(where).first.bounding_box()
            assert box and wrap["left"] <= box["x"] and box["x"] + box["width"] <= wrap["right"], (
                where, box, wrap, p.js("window.headwise.lastDraw.thumb"))
    assert p.js("document.getElementById('hw-grid-wrap').scrollWidth <= "
                "document.getElementById('hw-grid-wrap').clientWidth")
    # the lines canvas fits inside its scrolling box beside the scrollbar
    scroll = p.js("(() => { const s = document.getElementById('hw-lines-scroll');"
                  " return {client: s.clientWidth, offset: s.offsetWidth,"
                  " tall: s.scrollHeight > s.clientHeight}; })()")
    canvas = p.js("document.getElementById('hw-lines-canvas').getBoundingClientRect().width")
    assert scroll["tall"] == (n > 13), scroll  # 13 rows of 20 px fit 640 px
    assert (scroll["offset"] - scroll["client"] > 2) == scroll["tall"], scroll  # its scrollbar
    assert canvas <= scroll["client"], (canvas, scroll)
    assert canvas >= 0.6 * 1400 - 24  # still the window's width, less the scrollbar
    p.close()
