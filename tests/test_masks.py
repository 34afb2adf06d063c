import math
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise import limits, masks


def test_causal_alignments_differ_when_lengths_differ():
    br = masks.causal(2, 4)
    tl = masks.causal(2, 4, align="top_left")
    # bottom-right: the last query sees every key; top-left: query i sees keys <= i
    assert br.tolist() == [[True, True, True, False], [True, True, True, True]]
    assert tl.tolist() == [[True, False, False, False], [True, True, False, False]]
    assert torch.equal(masks.causal(5), masks.causal(5, align="top_left"))
    assert torch.equal(masks.causal(5), torch.ones(5, 5, dtype=torch.bool).tril())


def test_from_valid_lens_shapes_and_values():
    lens = torch.tensor([1, 3])
    m = masks.from_valid_lens(lens, 4)
    assert m.shape == (2, 1, 1, 4)
    assert m[0, 0, 0].tolist() == [True, False, False, False]
    assert m[1, 0, 0].tolist() == [True, True, True, False]
    per_query = masks.from_valid_lens(torch.tensor([[1, 2], [4, 0]]), 4, nq=2)
    assert per_query.shape == (2, 1, 2, 4)
    assert per_query[0, 0, 1].tolist() == [True, True, False, False]
    assert not per_query[1, 0, 1].any()


def test_padding_and_combine():
    tokens = torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0]])
    pad = masks.padding(tokens, pad_id=0)
    assert pad.shape == (2, 1, 1, 4)
    both = masks.combine(pad, masks.causal(4))
    assert both.shape == (2, 1, 4, 4)
    assert both[0, 0, 3].tolist() == [True, True, False, False]
    assert masks.combine(None, None) is None
    bias = torch.randn(1, 1, 4, 4)
    mixed = masks.combine(pad, bias)
    assert mixed.dtype == torch.float32
    assert torch.isneginf(mixed[0, 0, :, 2:]).all()
    assert torch.allclose(mixed[0, 0, :, :2], bias[0, 0, :, :2])


def test_mask_errors_are_readable():
    with pytest.raises(ValueError, match="align"):
        masks.causal(3, align="left")
    with pytest.raises(TypeError, match="integer"):
        masks.from_valid_lens(torch.tensor([1.5]), 3)
    with pytest.raises(TypeError, match="bool"):
        masks.check(torch.ones(2, 3, dtype=torch.int64), "x")
    with pytest.raises(ValueError, match="does not broadcast"):
        masks.check(torch.ones(2, 1, 1, 5, dtype=torch.bool), "x", (2, 4, 3, 4))


def test_sliding_window_band_bottom_right():
    from headwise.masks import causal, sliding_window
    # 3 newest queries of 6 keys, window 2: query i at position i + 3 sees keys i + 2 .. (i + 3)
    band = sliding_window(3, 6, 2)
    assert band.int().tolist() == [[0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1]]
    assert (band & causal(3, 6)).int().tolist() == [[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0],
                                                    [0, 0, 0, 0, 1, 1]]
    both = sliding_window(4, 4, 2, causal=False)
    assert both.int().tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    assert sliding_window(2, 2, 9).all()
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        sliding_window(2, 2, 0)


def test_form_names_how_the_mask_enters_the_scores():
    assert masks.form(torch.ones(1, 1, 1, 3, dtype=torch.bool)) == "bool"
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert masks.form(torch.zeros(2, 3, dtype=dtype)) == "float (additive)"


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 12), st.data())
def test_causal_block_is_the_causal_rule_for_any_block(nq, nk, data):
    """The chunked passes' block form and the whole mask are one rule (bottom-right)."""
    rows = torch.tensor(sorted(data.draw(st.sets(st.integers(0, nq - 1), min_size=1))))
    keys = torch.tensor(sorted(data.draw(st.sets(st.integers(0, nk - 1), min_size=1))))
    whole = masks.causal(nq, nk)
    assert torch.equal(masks.causal_block(rows, keys, nq, nk), whole[rows][:, keys])


def test_fill_is_the_one_way_a_mask_enters_scores():
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 4, 5)
    allowed = torch.rand(2, 1, 4, 5) > 0.4
    bias = torch.randn(1, 1, 4, 5, dtype=torch.float64)
    got = masks.fill(scores, allowed)
    assert torch.equal(got.isneginf(), ~allowed.expand_as(scores))
    assert torch.equal(got[allowed.expand_as(scores)], scores[allowed.expand_as(scores)])
    torch.testing.assert_close(masks.fill(scores, bias), scores + bias.float(), rtol=0, atol=0)
    s = scores.clone()
    assert masks.fill(s, allowed, inplace=True) is s and torch.equal(s, got)
    assert masks.as_4d(torch.ones(5, dtype=torch.bool)).shape == (1, 1, 1, 5)
    assert masks.as_4d(None) is None


@settings(max_examples=20, deadline=None)
@given(memory=st.integers(10**4, 10**9), excess=st.integers(1, 1000), square=st.booleans())
def test_a_mask_too_large_for_memory_is_refused_before_allocation(memory, excess, square):
    """causal(10**6) was within the position limit but a 1 TB tensor (a raw allocator error);
    each length may pass the limits while their product does not fit."""
    nq = math.isqrt(memory) + excess
    nk = nq if square else memory // nq + excess
    with mock.patch.object(limits, "machine_memory", lambda: memory):
        for build in (lambda: masks.causal(nq, nk), lambda: masks.sliding_window(nq, nk, 3)):
            with pytest.raises(ValueError, match=r"bool mask would need about .* more than "
                                                 r"this machine's .*; (pass causal=True|build)"):
                build()
        assert masks.causal(3, 1000).shape == (3, 1000)  # 3,000 bytes: built


@given(a=st.lists(st.integers(1, 5), min_size=1, max_size=4),
       b=st.lists(st.integers(1, 5), min_size=1, max_size=4), float_b=st.booleans())
def test_combine_of_masks_that_do_not_broadcast_is_a_value_error(a, b, float_b):
    """combine((2, 3), (4, 5)) raised torch's raw size RuntimeError; masks that broadcast
    still combine to the broadcast shape."""
    first = torch.ones(a, dtype=torch.bool)
    second = torch.zeros(b) if float_b else torch.ones(b, dtype=torch.bool)
    try:
        shape = torch.broadcast_shapes(first.shape, second.shape)
    except RuntimeError:
        with pytest.raises(ValueError, match=r"combine: masks of shapes .* do not broadcast"):
            masks.combine(first, second)
    else:
        assert masks.combine(first, second).shape == shape


@given(lens=st.lists(st.one_of(st.integers(0, 5), st.text(max_size=2), st.none(),
                               st.lists(st.integers(0, 3), max_size=2)), min_size=1, max_size=4))
def test_from_valid_lens_of_what_is_not_lengths_is_a_clear_type_error(lens):
    """[2, 'a'] raised torch's 'new(): invalid data type' from inside as_tensor."""
    try:
        want = masks.from_valid_lens(torch.tensor(lens), 6)
    except (TypeError, ValueError, RuntimeError):
        with pytest.raises((TypeError, ValueError), match=r"valid_lens (must|has)"):
            masks.from_valid_lens(lens, 6)
    else:
        assert torch.equal(masks.from_valid_lens(lens, 6), want)


def test_neutral_zeroes_bad_values_and_marks_only_the_rows_that_may_attend_them():
    """The masked-NaN rule's one helper: NaN/inf put to 0 where a mask is given; weights' rows
    from a bad query or key, the output's from a bad value too; a float mask excludes at -inf
    and at the dtype's lowest value (transformers' additive padding)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=g) for _ in range(3))
    k[0, 0, 2, 1], v[0, 1, 0, 3], q[0, 1, 1, 0] = float("nan"), float("inf"), float("-inf")
    lowest = torch.finfo(torch.float32).min
    for mask in (torch.tensor([True, True, False]), torch.tensor([0.0, 0.0, lowest])):
        k2, v2, bad_w, bad_out = masks.neutral(q, k, v, mask, False)
        assert torch.isfinite(k2).all() and torch.isfinite(v2).all()
        assert k2[0, 0, 2, 1] == 0 and torch.equal(k2[0, 1], k[0, 1])
        # key 2 is masked for every row; value 0 is seen by every row of head 1
        assert bad_w[..., 0].tolist() == [[[False, False, False], [False, True, False]]]
        assert bad_out[..., 0].tolist() == [[[False, False, False], [True, True, True]]]
    _, _, bad_w, _ = masks.neutral(q, k, None, None, True)  # causal: rows 2 on see key 2
    assert bad_w[..., 0].tolist() == [[[False, False, True], [False, True, False]]]
    k3, _, bad_w, _ = masks.neutral(q, k, None, None, False)  # no mask: the whole head
    assert k3 is k and bad_w[..., 0].tolist() == [[[True, True, True], [False, True, False]]]
