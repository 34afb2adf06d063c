"""split_heads / merge_heads: inverse, and head x is column block x."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import headwise as hw


def test_split_and_merge_are_inverse_and_named():
    x = torch.randn(2, 5, 12)
    heads = hw.split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    assert torch.equal(heads[:, 1], x[..., 4:8])  # head 1 is column block 1
    assert torch.equal(hw.merge_heads(heads), x)
    with pytest.raises(ValueError, match="divisible"):
        hw.split_heads(x, 5)


@given(b=st.integers(1, 3), g=st.integers(1, 3), r=st.integers(1, 4), j=st.integers(1, 5),
       seed=st.integers(0, 2**31 - 1))
def test_expand_kv_gives_query_head_x_the_kv_head_x_div_r(b, g, r, j, seed):
    from headwise.heads import expand_kv
    x = torch.randn(b, g, j, 3, generator=torch.Generator().manual_seed(seed))
    out = expand_kv(x, g * r)
    assert out.shape == (b, g * r, j, 3)
    for head in range(g * r):
        assert torch.equal(out[:, head], x[:, head // r])
    assert expand_kv(x, g) is x


@given(counts=st.lists(st.integers(1, 6), min_size=1, max_size=4), data=st.data())
def test_check_heads_reads_a_selection_as_the_set_of_heads_it_names(counts, data):
    """Every head tool's selection (headwise.heads.check_heads): negative indices from the end,
    True = all, an int = one head; merged when named twice, refused with once=True."""
    from headwise.heads import check_heads
    n = len(counts)
    layers = data.draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=3, unique=True))
    per_layer, want = {}, {}
    for layer in layers:
        h = counts[layer % n]
        chosen = data.draw(st.one_of(st.just(True), st.integers(-h, h - 1),
                                     st.lists(st.integers(-h, h - 1), max_size=4)))
        per_layer[layer] = chosen
        named = range(h) if chosen is True else [chosen] if isinstance(chosen, int) else chosen
        want.setdefault(layer % n, set()).update(x % h for x in named)
    merged = check_heads({"layers": per_layer}, {"layers": counts}, "t")
    assert merged == {"layers": {layer: sorted(x) for layer, x in want.items()}}
    twice = len({x % n for x in per_layer}) < len(per_layer) or any(
        isinstance(c, list) and len({x % counts[layer % n] for x in c}) < len(c)
        for layer, c in per_layer.items())
    if twice:
        with pytest.raises(ValueError, match="twice"):
            check_heads({"layers": per_layer}, {"layers": counts}, "t", once=True)
    else:
        assert check_heads({"layers": per_layer}, {"layers": counts}, "t", once=True) == merged


@pytest.mark.parametrize("heads, error, match", [
    ({"cross": {0: [1]}}, ValueError, r"t: unknown attention kind 'cross'; this model has "
                                      r"\['decoder_self'\]"),
    ({"decoder_self": {2: [0]}}, ValueError, r"decoder_self layer 2 does not exist \(there are 2"),
    ({"decoder_self": {0: [3]}}, ValueError, "head 3 of decoder_self layer 0 does not exist"),
    ({"decoder_self": {0: "01"}}, TypeError, r"heads\['decoder_self'\]\[0\] must be a head index"),
    ({"decoder_self": [0]}, TypeError, r"heads\['decoder_self'\] must be a dict"),
    ([0], TypeError, r"heads must be a dict \{kind: \{layer: \[heads\]\}\}"),
])
def test_check_heads_names_what_does_not_exist(heads, error, match):
    from headwise.heads import check_heads
    with pytest.raises(error, match=match):
        check_heads(heads, {"decoder_self": [3, 3]}, "t")


def test_layers_names_the_one_kind_of_a_model_that_has_one():
    from headwise.heads import check_heads
    assert check_heads({"layers": {1: [0], -1: True}}, {"decoder_self": [3, 2]}, "t") == {
        "decoder_self": {1: [0, 1]}}
    with pytest.raises(ValueError, match="unknown attention kind 'layers'"):  # several kinds
        check_heads({"layers": {0: [0]}}, {"encoder_self": [2], "cross": [2]}, "t")
