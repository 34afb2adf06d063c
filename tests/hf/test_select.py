"""Weights only for what was asked: a selection's layers return only their slice, every other
layer none; bad input is one readable error at the boundary."""

from __future__ import annotations

import pytest
import torch

from tests.hf.tiny import batch, build

hh = pytest.importorskip("headwise.hf", reason="the hf wing needs transformers")
from headwise.hf import select  # noqa: E402
from headwise.weights import Selection  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return build("llama", "headwise")


def test_only_the_selected_layers_compute_weights(model, monkeypatch):
    ids, mask = batch("right")
    seen = []
    real = select.deliver
    monkeypatch.setattr(select, "deliver", lambda m, w: (seen.append(w), real(m, w)))
    with hh.weights(model, {"layers": 1, "heads": [2], "rows": slice(-2, None)}) as got, \
            torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    assert [w is None for w in seen] == [True, False]
    assert list(got) == [1] and got[1].shape == (2, 1, 2, 9)


def test_the_context_is_undone_on_exit(model):
    layers = hh.attention_layers(model)
    with hh.weights(model, True):
        assert select.asked(layers[0], False) is not False
    assert select.asked(layers[0], False) is False
    assert select.asked(layers[0], True) is True


def test_inside_the_context_output_attentions_gives_only_the_selection(model):
    layers = hh.attention_layers(model)
    with hh.weights(model, {"layers": [0]}):
        assert select.asked(layers[1], True) is False
        assert isinstance(select.asked(layers[0], False), Selection)


@pytest.mark.parametrize("spec, error, message", [
    ({"layers": [2]}, ValueError, r"layer 2 is out of range: the model has 2 attention layers"),
    ({"layers": [-3]}, ValueError, "layer -3 is out of range"),
    ({"layers": []}, ValueError, "out of range"),
    ({"layers": "0"}, TypeError, "layers must be an int, a sequence of ints or a slice"),
    ({"heads": [4]}, ValueError, r"layer 0 \(LlamaAttention, 4 heads\): .*heads index 4 out "
                                 "of range for 4 heads"),
    ({"head": [0]}, ValueError, r"unknown keys \['head'\]"),
    ("all", TypeError, "spec must be True, a headwise.Selection or a dict"),
])
def test_bad_input_is_one_readable_error(model, spec, error, message):
    with pytest.raises(error, match=message) as info:
        with hh.weights(model, spec):
            pass
    assert "\n" not in str(info.value)


def test_a_bad_row_fails_at_the_first_call(model):
    ids, mask = batch("none")
    with pytest.raises(ValueError, match="rows index 20 out of range for 9 rows"):
        with hh.weights(model, {"rows": [20]}), torch.no_grad():
            model(input_ids=ids, attention_mask=mask)


def test_a_model_on_another_implementation_is_told_to_switch():
    model = build("llama", "sdpa")
    with pytest.raises(ValueError, match=r"runs attn_implementation='sdpa'; call "
                                         r"headwise.hf.use\(model\) first"):
        with hh.weights(model, True):
            pass
