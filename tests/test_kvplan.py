"""KVPlan: strict files (atomic, truncated, unknown keys, version), bad values one line each,
the shape fingerprint, the table, and the sinks + window rule against its definition."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headwise.errors import CheckpointError
from headwise.kvplan import KVPlan, slot, streaming_allowed


def plan(**kw):
    args = dict(layers=3, groups=2, head_dim=8, sinks=4, window=16,
                streaming=((0,), (0, 1), ()), budget=0.5, scores=((0.9, 0.2),) * 3,
                loss={"full": 2.5, "plan": 2.51}, model="tiny")
    args.update(kw)
    return KVPlan(**args)


def test_a_plan_round_trips_and_prints_a_table(tmp_path):
    p = plan()
    path = p.save(tmp_path / "plan.json")
    assert KVPlan.load(path) == p and KVPlan.load(path).loss == p.loss
    text = p.table()
    assert "SF" in text and "SS" in text and "FF" in text and "streaming=50%" in text
    assert abs(p.fraction - 0.5) < 1e-12 and p.full(0) == (1,) and p.full(2) == (0, 1)


@pytest.mark.parametrize("change, match", [
    (dict(window=0), "window must be an int >= 1"),
    (dict(window=-3), "window must be an int >= 1"),
    (dict(sinks=-1), "sinks must be an int >= 0"),
    (dict(budget=1.5), r"budget must be a fraction in \[0, 1\]"),
    (dict(budget=-0.1), r"budget must be a fraction in \[0, 1\]"),
    (dict(budget=float("nan")), r"budget must be a fraction in \[0, 1\]"),
    (dict(streaming=((0,), (2,), ())), r"distinct indices in 0..1"),
    (dict(streaming=((0,),)), "streaming lists 1 layers, expected 3"),
    (dict(scores=((0.1,),) * 3), "scores must be 3 x 2"),
])
def test_bad_values_are_refused_in_one_line(change, match):
    with pytest.raises(ValueError, match=match) as info:
        plan(**change)
    assert "\n" not in str(info.value)


def test_a_plan_for_another_shape_is_refused():
    with pytest.raises(ValueError, match=r"\(3, 2, 8\).*\(3, 4, 8\)"):
        plan().check((3, 4, 8))
    plan().check((3, 2, 8))


def test_damaged_or_foreign_files_are_refused_and_saving_is_atomic(tmp_path):
    path = plan().save(tmp_path / "p.json")
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        KVPlan.load(path)
    raw = json.loads(text)
    for bad, match in (({**raw, "extra": 1}, r"unknown keys \['extra'\]"),
                       ({**raw, "version": 9}, "version 9"),
                       ({**raw, "format": "x"}, "not a headwise KV plan"),
                       ({**raw, "window": 0}, "window must be")):
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=match) as info:
            KVPlan.load(path)
        assert "\n" not in str(info.value)
    path.write_text(text)
    with pytest.raises(TypeError):  # a failing write leaves the old file whole
        plan().save.__func__(plan(loss={"full": object()}), path)
    assert KVPlan.load(path) == plan() and not [p for p in tmp_path.iterdir() if p.name[0] == "."]


@given(sinks=st.integers(0, 5), window=st.integers(1, 7), n=st.integers(1, 40))
def test_the_ring_holds_exactly_the_positions_the_rule_keeps(sinks, window, n):
    """After ``n`` positions, the slots of positions the newest query may see are distinct and
    within ``S + W``, and they are the last writes to those slots."""
    seen = streaming_allowed(torch.tensor(n - 1), torch.arange(n), sinks, window)
    kept = [j for j in range(n) if seen[j]]
    assert kept == [j for j in range(n) if j < sinks or j > n - 1 - window]
    last = {}
    for j in range(n):
        last[slot(j, sinks, window)] = j
    assert sorted(last.values()) == kept and max(last) < sinks + window
