"""hw.head_view takes a headwise language model or a transformers decoder the same way, and
draws every layer's pattern with the tokens it is given."""

from __future__ import annotations

import pytest
import torch

import headwise as hw
from headwise.models import LMConfig, TransformerLM
from tests.hf.tiny import VOCAB, batch, build


def model_of(kind: str):
    if kind == "headwise":
        torch.manual_seed(0)
        return TransformerLM(LMConfig(vocab_size=VOCAB, d_model=16, num_heads=4, num_layers=2,
                                      d_ff=24, max_len=32, dropout=0.0)).eval()
    return build(kind, "headwise")


@pytest.mark.parametrize("kind", ["headwise", "llama"])
def test_the_head_view_of_either_model_is_one_call(kind, tmp_path):
    model = model_of(kind)
    ids, mask = batch("right")
    inputs = {"input_ids": ids, "attention_mask": mask} if kind == "llama" else ids
    page = hw.head_view(model, inputs, tmp_path / "view.html",
                        tokens=[[f"t{i}" for i in row] for row in ids.tolist()])
    html = (tmp_path / "view.html").read_text()
    assert page.html == html and f"t{ids[1, -1].item()}" in html and type(model).__name__ in html
    if kind == "llama":  # grouped-query: 4 query heads under 2 key/value heads
        assert "kv" in html.lower()
    view = hw.head_view(model, inputs)  # no path: nothing written, the page in memory
    assert view.html and not (tmp_path / "other.html").exists()


def test_the_ids_stand_in_for_tokens_when_none_are_given():
    from headwise.lens.view import _tokens
    ids = torch.tensor([[5, 6, 7], [8, 9, 0]])
    assert _tokens(None, ids, [3, 2]) == [["5", "6", "7"], ["8", "9"]]
    assert _tokens(["a", "b", "c"], ids[:1], [3]) == [["a", "b", "c"]]
