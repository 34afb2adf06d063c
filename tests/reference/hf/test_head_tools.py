"""The observer channel on Hugging Face models: per-head outputs edited through
headwise.observe.heads equal the same edit of o_proj's input made by hand, and head statistics
collected on the fused path equal those of HF eager's weights."""

from __future__ import annotations

import pytest
import torch
from einops import rearrange

from tests.hf.tiny import batch, build

hh = pytest.importorskip("headwise.hf", reason="the hf wing needs transformers")
import headwise as hw  # noqa: E402
from headwise import observe  # noqa: E402

LAYER, HEAD = 1, 2


def _o_proj_input_edited(model, edit, proj="o_proj"):
    """A forward pre-hook on layer LAYER's ``proj`` (the output projection) that edits its input
    (b, i, h*d) by hand."""
    layer = hh.attention_layers(model)[LAYER]
    heads = hw.hf.model.head_count(layer)

    def hook(_, args):
        x = rearrange(args[0], "b i (h d) -> b h i d", h=heads)
        return (rearrange(edit(x.clone()), "b h i d -> b i (h d)"),)
    return getattr(layer, proj).register_forward_pre_hook(hook)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt_oss"])
@pytest.mark.parametrize("what", ["zero", "patch"])
def test_editing_a_head_equals_editing_its_slice_of_the_o_proj_input(family, what):
    model = build(family, "headwise")
    ids, mask = batch("left")
    replacement = torch.randn(2, 9, 8, generator=torch.Generator().manual_seed(3))

    def edit(x):  # (b, h, i, d)
        x[:, HEAD] = 0.0 if what == "zero" else replacement
        return x

    target = hh.attention_layers(model)[LAYER]
    observer = observe.Observer(heads=lambda m, out: edit(out.clone()) if m is target else out)
    with torch.no_grad(), observe.observing(observer):
        ours = model(input_ids=ids, attention_mask=mask).logits
    model.set_attn_implementation("eager")
    handle = _o_proj_input_edited(model, edit)
    try:
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask).logits
    finally:
        handle.remove()
    real = mask.bool()
    torch.testing.assert_close(ours[real], want[real], atol=1e-5, rtol=0)
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
    assert (plain[real] - want[real]).abs().max() > 1e-3  # the edit did something


def test_head_statistics_on_the_fused_path_equal_those_of_hf_eagers_weights():
    model = build("llama", "headwise")
    ids, mask = batch("right")
    with hw.stats.collect(model) as found, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    names = [name for name, m in model.named_modules() if m in hh.attention_layers(model)]
    assert sorted(found) == sorted(names)
    for name, weights in zip(names, eager, strict=True):
        stats = found[name][0]
        entropy = -(weights * weights.clamp_min(1e-30).log()).sum(-1)  # (b, h, i)
        torch.testing.assert_close(stats.entropy, entropy, atol=1e-5, rtol=0)
        torch.testing.assert_close(stats.max_weight, weights.amax(-1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2"])
def test_hw_ablate_and_patch_on_an_hf_model_equal_the_hand_edit(family):
    """hw.ablate / hw.patch address an HF model's layers as {"layers": {layer: heads}}."""
    model = build(family, "headwise")
    ids, mask = batch("right")
    clean, _ = batch("none", seed=7)
    with torch.no_grad():
        source = hw.record_heads(model, lambda: model(input_ids=clean, attention_mask=mask))
        with hw.ablate(model, {"layers": {LAYER: [HEAD]}}):
            ablated = model(input_ids=ids, attention_mask=mask).logits
        with hw.patch(model, {"layers": {LAYER: [HEAD]}}, source):
            patched = model(input_ids=ids, attention_mask=mask).logits
    recorded = rearrange(source["layers"][LAYER], "b i h d -> b h i d")
    proj = "c_proj" if family == "gpt2" else "o_proj"
    for got, fill in ((ablated, None), (patched, recorded[:, HEAD])):
        def edit(x, fill=fill):
            x[:, HEAD] = 0.0 if fill is None else fill
            return x
        handle = _o_proj_input_edited(model, edit, proj)
        try:
            with torch.no_grad():
                want = model(input_ids=ids, attention_mask=mask).logits
        finally:
            handle.remove()
        torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=0)


def test_a_bad_head_of_an_hf_model_is_one_readable_error():
    model = build("llama", "headwise")
    with pytest.raises(ValueError, match="head 4 of layer 1 does not exist"):
        with hw.ablate(model, {"layers": {1: [4]}}):
            pass


def test_mean_ablation_on_an_hf_model_puts_the_heads_mean_at_the_o_proj_input():
    model = build("llama", "headwise")
    ids, mask = batch("none")
    runs = [(ids, mask), batch("none", seed=5)]
    means = hw.head_means(model, runs, run=lambda m, b: m(input_ids=b[0], attention_mask=b[1]))
    mean = means["layers"][LAYER][HEAD]  # (d,)
    with torch.no_grad(), hw.ablate(model, {"layers": {LAYER: [HEAD]}}, mode="mean",
                                    means=means):
        got = model(input_ids=ids, attention_mask=mask).logits

    def edit(x):
        x[:, HEAD] = mean
        return x
    handle = _o_proj_input_edited(model, edit)
    try:
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask).logits
    finally:
        handle.remove()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
