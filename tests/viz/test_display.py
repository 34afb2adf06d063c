"""Notebook display: head views, heatmaps and traces show inline and offline, tested by calling
the ``_repr_*_`` methods Jupyter calls; Hugging Face ``output_attentions`` works as input."""

import html
import io
import json
import re

import numpy as np
import pytest
import torch

import headwise as hw
from headwise.viz import head_view, heatmaps
from headwise.viz.display import HeadView, Heatmaps, asset


def softmaxed(*shape, seed=0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2).softmax(-1)


def _srcdoc(frame_html: str) -> str:
    return html.unescape(re.fullmatch(r'<iframe srcdoc="([^"]*)" .*</iframe>', frame_html,
                                      re.S).group(1))


def test_head_view_repr_html_is_the_whole_page_in_an_offline_iframe(tmp_path):
    att = {"encoder_self": [softmaxed(1, 2, 5, 5, seed=l) for l in range(2)]}
    view = head_view(att, list("abcde"))  # no path: nothing written
    assert isinstance(view, HeadView) and view.path is None and not list(tmp_path.iterdir())
    frame = view._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts"' in frame
    page = _srcdoc(frame)
    assert page == view.html  # the iframe holds the exact self-contained page
    assert not re.search(r"https?://|\ssrc\s*=|\shref\s*=", page)  # nothing to fetch
    assert "default-src 'none'" in page
    saved = view.save(tmp_path / "v.html")
    assert saved.path.read_text(encoding="utf-8") == view.html and open(saved).read() == view.html
    with pytest.raises(TypeError, match="not written to a file"):
        open(view)  # noqa: SIM115


def test_heatmaps_repr_png_draws_the_grid(tmp_path):
    from PIL import Image

    w = [softmaxed(3, 4, 4, seed=l) for l in range(2)]
    grid = heatmaps(w, query_tokens=list("abcd"), key_tokens=list("wxyz"))
    assert isinstance(grid, Heatmaps) and grid.path is None
    png = grid._repr_png_()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    assert img.shape[1] > img.shape[0] and img.std() > 20  # 2 rows x 3 heads, not blank
    saved = grid.save(tmp_path / "g.png")
    assert saved.path.read_bytes()[:8] == png[:8]
    assert np.array_equal(np.asarray(Image.open(saved).convert("RGB")), img)


def test_trace_repr_html_is_the_listing(tmp_path):
    mha = hw.MultiHeadAttention(8, 2)
    x = torch.randn(1, 3, 8)
    tr = hw.trace(mha, x, x, x)
    out = tr._repr_html_()
    assert out.startswith("<pre") and out.endswith("</pre>")
    assert html.unescape(re.sub(r"^<pre[^>]*>|</pre>$", "", out)) == tr.render()
    assert "<script" not in out


def test_head_view_takes_hugging_face_output_attentions(minilm_folder):
    """Any model: a Hugging Face BERT's ``output_attentions`` (a tuple of (b, h, i, j) per
    layer) goes in as one attention kind; the page stores exactly those weights."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(minilm_folder))
    model = transformers.AutoModel.from_pretrained(str(minilm_folder),
                                                   attn_implementation="eager").eval()
    batch = tok(["The cat sat on the mat."], return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
    assert isinstance(out.attentions, tuple) and out.attentions[0].shape[:2] == (1, 12)
    tokens = tok.convert_ids_to_tokens(batch["input_ids"][0])
    view = head_view({"encoder_self": out.attentions}, tokens, title="MiniLM via HF")
    meta = json.loads(re.search(r'id="hw-meta">(.*?)</script>', view.html, re.S).group(1))
    assert meta["kinds"]["encoder_self"]["heads"] == [12] * 6
    assert meta["tokens"]["src"] == [tokens]
    # the stored weights decode back to HF's (uint8 per row: error <= row max / 510)
    from tests.viz.test_head_view import decode, read_page

    _, meta, blocks = read_page(view)
    n = len(tokens)
    for layer, head in ((0, 0), (5, 11), (3, 7)):
        got, _ = decode(blocks[f"w/encoder_self/0/{layer}/{head}"], n, n, meta["levels"])
        want = out.attentions[layer][0, head].numpy()
        assert np.all(np.abs(got - want) <= want.max(1, keepdims=True) / 510 + 1e-6)
    assert view._repr_html_().startswith("<iframe srcdoc=")


def test_asset_is_the_script_or_style_a_page_inlines_verbatim():
    page = head_view({"encoder_self": [softmaxed(1, 2, 3, 3)]}, list("abc")).html
    for name in ("head_view.js", "head_view.css"):
        assert asset(name) and asset(name) in page
