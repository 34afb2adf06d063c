"""Importing headwise.hf registers attn_implementation="headwise" with both transformers
interfaces (the function alone would get attention_mask=None and lose causality and padding),
and a model saved and loaded with it keeps it."""

from __future__ import annotations

import pytest
import torch

from tests.hf.tiny import batch, build

hh = pytest.importorskip("headwise.hf", reason="the hf wing needs transformers")


def test_the_function_and_its_mask_are_registered_under_one_name():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert hh.NAME == "headwise"
    assert ALL_ATTENTION_FUNCTIONS["headwise"] is hh.attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["headwise"] is sdpa_mask


def test_from_pretrained_with_attn_implementation_headwise(tmp_path, transformers):
    model = build("qwen3")
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation="headwise").eval()
    assert loaded.config._attn_implementation == "headwise"
    ids, mask = batch("left")
    with torch.no_grad():
        a = loaded(input_ids=ids, attention_mask=mask).logits[mask.bool()]
        b = model(input_ids=ids, attention_mask=mask).logits[mask.bool()]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
