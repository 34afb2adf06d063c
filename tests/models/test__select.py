"""The forms return_weights takes on a model, normalised to kind -> per layer choice."""

import pytest

from headwise.models._select import select
from headwise.weights import Selection

LAYERS = {"encoder_self": 2, "decoder_self": 3, "cross": 3}


def test_every_form_normalises_to_per_layer_choices():
    assert select(False, LAYERS) is None and select(None, LAYERS) is None
    assert select(True, LAYERS) == {k: [True] * n for k, n in LAYERS.items()}
    assert select("cross", LAYERS) == {"encoder_self": [False] * 2, "decoder_self": [False] * 3,
                                       "cross": [True] * 3}
    assert select({"cross": [-1, 0]}, LAYERS)["cross"] == [True, False, True]
    assert select({"decoder_self": 1}, LAYERS)["decoder_self"] == [False, True, False]
    heads = Selection(heads=[1])
    assert select(heads, LAYERS)["encoder_self"] == [heads, heads]
    got = select({"cross": {"layers": [2], "heads": [0, 1]}}, LAYERS)["cross"]
    assert got[:2] == [False, False] and got[2] == Selection(heads=[0, 1])


@pytest.mark.parametrize("value, error, match", [
    (3.5, TypeError, "must be a bool, a kind"),
    ({"bogus": True}, ValueError, "unknown kind 'bogus'"),
    ({"cross": [3]}, ValueError, "layer index 3 out of range for 3 layers"),
    ({"cross": [True]}, ValueError, "layer index True out of range"),
    ({"cross": "0"}, TypeError, "must be True, layer indices"),
    ({"cross": {"layer": [0]}}, ValueError, "unknown keys \\['layer'\\]"),
])
def test_bad_forms_are_clear_errors(value, error, match):
    with pytest.raises(error, match=match):
        select(value, LAYERS)
