"""The hook names and the filter: every form picks what it names, in forward order, and a wrong
name, a layer out of range or a filter of nothing is one readable line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headwise.lens import names as N


@given(layer=st.integers(0, 40), short=st.sampled_from(N.ORDER))
def test_a_full_name_parses_back_to_its_layer_and_short_name(layer, short):
    name = N.full(short, layer)
    assert N.parse(name) == (layer, short)
    assert name.startswith(f"blocks.{layer}.attn.hook_" if short in N.ATTN
                           else f"blocks.{layer}.hook_")


def test_the_names_are_transformer_lens_own():
    assert N.all_names(1) == [
        "blocks.0.hook_resid_pre", "blocks.0.attn.hook_q", "blocks.0.attn.hook_k",
        "blocks.0.attn.hook_v", "blocks.0.attn.hook_attn_scores", "blocks.0.attn.hook_pattern",
        "blocks.0.attn.hook_z", "blocks.0.attn.hook_result", "blocks.0.hook_attn_out",
        "blocks.0.hook_resid_mid", "blocks.0.hook_mlp_out", "blocks.0.hook_resid_post"]
    assert N.parse("blocks.0.hook_pattern") is None  # pattern is an attention hook
    assert N.parse("blocks.0.attn.hook_resid_pre") is None


def test_each_filter_form_picks_what_it_names_in_forward_order():
    assert N.choose(None, 2) == N.all_names(2)
    assert N.choose("pattern", 3) == [N.full("pattern", l) for l in range(3)]
    assert N.choose(["blocks.1.hook_resid_post", "blocks.-1.attn.hook_z"], 3) == [
        "blocks.1.hook_resid_post", "blocks.2.attn.hook_z"]
    assert N.choose(lambda n: n.endswith("hook_q") and ".0." in n, 3) == ["blocks.0.attn.hook_q"]
    assert N.choose(["z", "blocks.0.attn.hook_z"], 1) == ["blocks.0.attn.hook_z"]  # once


@pytest.mark.parametrize("names,says", [
    ("blocks.1.attn.hook_patern", "did you mean 'blocks.1.attn.hook_pattern'?"),
    ("patern", "did you mean 'pattern'?"),
    ("blocks.4.hook_resid_post", "names layer 4, out of range: the model has 3 layers"),
    (lambda n: False, "selects no hook"),
    (3, "names must be None, a hook name"),
])
def test_a_bad_filter_is_one_readable_line(names, says):
    with pytest.raises((ValueError, TypeError)) as e:
        N.choose(names, 3, "run_with_cache")
    assert says in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("run_with_cache: ")
