"""How the trace names modules, axes and masks."""

import pytest
import torch
from torch import nn

import headwise as hw
from headwise.tracing.naming import (
    argument_axes,
    describe,
    first_tensor,
    mask_description,
    module_axes,
)


def test_module_axes_call_g_h_without_grouping_and_out_m_when_it_is_the_model_dim():
    mha, gqa = hw.MultiHeadAttention(8, 4), hw.MultiHeadAttention(8, 4, num_kv_heads=2)
    wide = hw.MultiHeadAttention(8, 4, out_dim=6)
    assert module_axes(("b", "g", "j", "d", "(g d)", "out"), mha) == (
        "b", "h", "j", "d", "(h d)", "m")
    assert module_axes(("b", "g", "out"), gqa) == ("b", "g", "m")
    assert module_axes(("out",), wide) == ("out",)


def test_first_tensor_looks_through_containers_and_output_objects():
    t = torch.zeros(1)

    class Output:
        logits = t

    assert first_tensor((None, [{"x": t}])) is t and first_tensor(Output()) is t
    assert first_tensor((None, "text")) is None


@pytest.mark.parametrize("name, shape, axes", [
    ("attention_mask", (2, 5), ("b", "n")),
    ("mask", (2, 1, 1, 5), ("b", "h", "i", "j")),
    ("query", (2, 5, 8), ("b", "i", "m")),
    ("key", (2, 6, 3), ("b", "j", "kdim")),
    ("value", (2, 6, 8), ("b", "j", "m")),
    ("", (2, 5, 32), ("b", "n", "ff")),
    ("", (2, 5, 7), ("b", "n", "f")),
])
def test_argument_axes_by_role_and_size(name, shape, axes):
    features = {8: "m", 32: "ff"}
    dtype = torch.bool if "mask" in name else torch.float32
    assert argument_axes(name, torch.zeros(shape, dtype=dtype), features) == axes
    assert argument_axes("ids", torch.zeros(2, 5, dtype=torch.long), features) == ("b", "n")


def test_masks_are_described_by_form_shape_and_kind():
    assert mask_description(hw.masks.causal(4)) == "bool (i=4, j=4) = causal"
    pad = hw.masks.from_valid_lens(torch.tensor([3, 1]), 4)
    assert mask_description(pad) == "bool (b=2, h=1, i=1, j=4) = key padding"
    assert mask_description(torch.zeros(4, 4)) == "float (i=4, j=4)"


def test_describe_gives_constructor_like_labels():
    assert describe(nn.Linear(3, 4)) == "Linear(3, 4)"
    assert describe(nn.Embedding(10, 4)) == "Embedding(10, 4)"
    assert describe(nn.LayerNorm(4)) == "LayerNorm(4)"
    assert describe(nn.Dropout(0.1)) == "Dropout(p=0.1)"
    assert describe(hw.MultiHeadAttention(8, 4, num_kv_heads=2, kdim=3)) == (
        "MultiHeadAttention(m=8, h=4, g=2, d=2, kdim=3, backend=auto)")
    lm = hw.models.build(hw.models.LMConfig(vocab_size=10, d_model=8, num_heads=2, num_layers=1,
                                            d_ff=16, max_len=8))
    assert describe(lm).startswith("TransformerLM(vocab=10, m=8, h=2,")
