"""The trace's records: named shapes, JSON-ready facts, the weights source read back."""

import enum

import torch
from hypothesis import given
from hypothesis import strategies as st

from headwise.observe import WeightsSource
from headwise.tracing.steps import fact, named_shape, weights_source

AXES = st.sampled_from(["b", "h", "g", "i", "j", "d", "m", "(h d)"])


@given(shape=st.lists(st.integers(0, 9999), max_size=5), axes=st.lists(AXES, max_size=5))
def test_named_shape_pairs_each_axis_with_its_size_or_falls_back(shape, axes):
    text = named_shape(tuple(shape), tuple(axes))
    if len(shape) == len(axes):
        assert text == "(" + ", ".join(f"{a}={s}" for a, s in zip(axes, shape, strict=True)) + ")"
    else:
        assert text == str(tuple(shape))
    assert named_shape(None, tuple(axes)) == "-"


def test_facts_are_json_ready():
    class Colour(enum.Enum):
        RED = "red"

    source = WeightsSource("lse", "flash", 64)
    assert fact(Colour.RED) == "red"
    assert fact(torch.zeros(2, 3)) == "tensor(2, 3)"
    assert fact((1, Colour.RED, (2.5, None))) == [1, "red", [2.5, None]]
    assert fact(source) == source.to_dict()
    assert fact(object) == str(object)


def test_the_weights_source_round_trips_through_its_facts():
    for source in (WeightsSource("lse", "flash", 64), WeightsSource("softmax")):
        assert weights_source({"weights_source": fact(source)}) == source
    assert weights_source({}) is None and weights_source({"weights_source": None}) is None
