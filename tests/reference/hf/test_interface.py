"""attn_implementation="headwise" against Hugging Face's own eager and sdpa attention on tiny
random-weight models of every family that goes through the attention interface: logits,
every layer's weights, selections and greedy generation, on padded batches (left and right).

Positions that are padding are compared nowhere: their query rows are fully masked under left
padding, where HF eager averages the padding uniformly and headwise (like torch's fused SDPA)
gives zeros; no real position ever reads them."""

from __future__ import annotations

import pytest
import torch

from tests.hf.tiny import ENCODERS, FAMILIES, batch, build

hh = pytest.importorskip("headwise.hf", reason="the hf wing needs transformers")

PADDINGS = ["left", "right"]


def _run(model, implementation, ids, mask, **kwargs):
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, **kwargs)


def _sdpa_serves(model) -> bool:
    """HF's sdpa refuses soft-capping (Gemma 2) and gpt-oss does not support it."""
    return model._supports_sdpa and getattr(model.config, "attn_logit_softcapping", None) is None


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_hf_eager_and_sdpa(family, padding):
    model = build(family)
    ids, mask = batch(padding)
    real = mask.bool()
    ours = _run(model, "headwise", ids, mask).logits[real]
    eager = _run(model, "eager", ids, mask).logits[real]
    torch.testing.assert_close(ours, eager, atol=1e-5, rtol=0)
    if _sdpa_serves(model):
        sdpa = _run(model, "sdpa", ids, mask).logits[real]
        torch.testing.assert_close(ours, sdpa, atol=1e-5, rtol=0)


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_layers_weights_equal_hf_eager(family, padding):
    model = build(family)
    ids, mask = batch(padding)
    real = mask.bool()
    ours = _run(model, "headwise", ids, mask, output_attentions=True).attentions
    eager = _run(model, "eager", ids, mask, output_attentions=True).attentions
    assert len(ours) == len(eager) == len(hh.attention_layers(model))
    for a, b in zip(ours, eager, strict=True):
        assert a.shape == b.shape
        # (b, h, i, j) -> the real query rows (r, h, j)
        torch.testing.assert_close(a.transpose(1, 2)[real], b.transpose(1, 2)[real],
                                   atol=1e-6, rtol=0)


@pytest.mark.parametrize("spec", [
    {"layers": [-1], "heads": [3], "rows": slice(-4, None)},
    {"layers": [0], "heads": [0, 2], "rows": [1, 5, 8], "keys": slice(2, 7)},
    {"heads": 1, "keys": [0, 4]},
])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_selection_equals_the_same_slice_of_hf_eager(family, spec):
    model = build(family)
    ids, mask = batch("left")
    eager = _run(model, "eager", ids, mask, output_attentions=True).attentions
    model.set_attn_implementation("headwise")
    with hh.weights(model, spec) as got, torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    layers = [x % len(eager) for x in spec.get("layers", range(len(eager)))]
    assert sorted(got) == sorted(layers)
    for n in layers:
        want = eager[n]
        for dim, index in ((1, spec.get("heads")), (2, spec.get("rows")), (3, spec.get("keys"))):
            if index is not None:
                want = want[(slice(None),) * dim + ([index] if isinstance(index, int)
                                                    else index,)]
        real = mask.bool()[:, spec["rows"]] if "rows" in spec else mask.bool()
        torch.testing.assert_close(got[n].transpose(1, 2)[real], want.transpose(1, 2)[real],
                                   atol=1e-6, rtol=0)
    torch.testing.assert_close(logits, _run(model, "headwise", ids, mask).logits, atol=0, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_with_the_cache_gives_eagers_tokens(family):
    if family in ENCODERS:
        pytest.skip("encoders do not generate")
    model = build(family)
    ids, mask = batch("left")
    model.generation_config.pad_token_id = 0
    tokens = {}
    for implementation in ("eager", "headwise"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            tokens[implementation] = model.generate(input_ids=ids, attention_mask=mask,
                                                    max_new_tokens=6, do_sample=False)
    assert tokens["headwise"].shape[1] == ids.shape[1] + 6
    assert torch.equal(tokens["headwise"], tokens["eager"])


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_generation_with_a_static_cache_gives_eagers_tokens(family):
    """A static cache's prefill has unwritten slots after the prompt (HF then gives no mask)."""
    model = build(family)
    ids, _ = batch("none", b=1)
    tokens = {}
    for implementation in ("eager", "headwise"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            tokens[implementation] = model.generate(
                input_ids=ids, max_new_tokens=5, do_sample=False, pad_token_id=0,
                cache_implementation="static")
    assert torch.equal(tokens["headwise"], tokens["eager"])
