"""One API: every head tool takes a headwise model or a transformers model the same way (the
same call, heads addressed as ``{"layers": {layer: [heads]}}``), and the same TransformerLens
snippet (load, run_with_cache with a filter, read one pattern) runs unchanged on headwise's own
SmolLM2 and on SmolLM2 through transformers."""

from __future__ import annotations

import pytest
import torch

import headwise as hw
from headwise.models import LMConfig, TransformerLM
from tests.hf.tiny import VOCAB, batch, build

HEADS = {"layers": {1: [0, 2]}}


def model_of(kind: str):
    if kind == "headwise":
        torch.manual_seed(0)
        return TransformerLM(LMConfig(vocab_size=VOCAB, d_model=32, num_heads=4, num_layers=2,
                                      d_ff=48, max_len=32, dropout=0.0)).eval()
    return build(kind, "headwise")


def logits_of(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out[0]


@pytest.mark.parametrize("kind", ["headwise", "llama"])
def test_every_head_tool_takes_either_model_the_same_way(kind, tmp_path):
    model, ids = model_of(kind), batch("none")[0]
    plain = logits_of(model(ids))
    with hw.stats.collect(model) as found:
        model(ids)
    assert len(found) == 2
    with hw.ablate(model, HEADS):
        ablated = logits_of(model(ids))
    zero = lambda z, hook: z.index_fill(2, torch.tensor([0, 2]), 0.0)  # noqa: E731
    assert (hw.run_with_hooks(model, ids, [("blocks.1.attn.hook_z", zero)]) - ablated).abs(
        ).max() < 1e-5 and (ablated - plain).abs().max() > 1e-4
    other = ids.roll(1, 0)
    with hw.patch(model, HEADS, source=lambda: model(other)):
        patched = logits_of(model(ids))
    assert (patched - plain).abs().max() > 1e-4
    scores = hw.importance(model, [ids], method="ablation")
    assert next(iter(scores.values())).shape == (2, 4) if hasattr(scores, "values") else scores
    cat = hw.catalogue(model, [ids])
    assert len(cat.heads) == 8 if hasattr(cat, "heads") else cat
    record = hw.trace(model, ids)
    assert "fused" in record.summary()
    _, cache = hw.run_with_cache(model, ids, names="pattern", select={"layers": [1]})
    assert cache["pattern", 1].shape == (2, 4, 9, 9)
    hw.head_view(model, ids, tmp_path / "view.html")
    assert (tmp_path / "view.html").stat().st_size > 1000


def tl_snippet(model, tokens):
    """What a TransformerLens user writes, unchanged for either model."""
    logits, cache = hw.run_with_cache(model, tokens, names=lambda n: n.endswith("hook_pattern"),
                                      select={"layers": [5], "heads": [3]})
    return cache["pattern", 5]


def test_the_transformer_lens_snippet_runs_unchanged_on_smollm2_either_way():
    from headwise.pretrained import gguf
    try:
        gguf.find_smollm2()
    except (FileNotFoundError, ImportError, ValueError) as e:
        pytest.skip(f"SmolLM2's GGUF file is not installed: {e}")
    import headwise.hf
    from headwise.pretrained import load_smollm2
    hf_model, tokenizer = headwise.hf.load("smollm2")
    own = load_smollm2().model.eval()  # headwise's own TransformerLM
    tokens = tokenizer("The cat sat on the mat because it was tired.", return_tensors="pt")[
        "input_ids"]
    a, b = tl_snippet(own, tokens), tl_snippet(hf_model, tokens)
    n = tokens.shape[1]
    assert a.shape == b.shape == (1, 1, n, n)
    assert torch.allclose(a.sum(-1), torch.ones(1, 1, n), atol=1e-5)
    assert (a - b).abs().max() < 1e-3  # one checkpoint, two implementations (float32)
