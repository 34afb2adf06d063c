"""The step table and the structured facts producers record: one line per step, axes from the
table, the weights source able to say how weights were recomputed."""

from __future__ import annotations

from headwise.observe import StepKind, WeightsSource, record, recording


def test_weights_source_says_how_weights_were_produced():
    assert WeightsSource("lse", "flash", 256).describe() == \
        "recomputed from the flash LSE, 256-row chunks"
    assert WeightsSource("softmax").describe() == "softmax of the materialised scores"
    assert WeightsSource("lse", "flash", 256).to_dict() == {
        "method": "lse", "kernel": "flash", "chunk_rows": 256,
        "description": "recomputed from the flash LSE, 256-row chunks"}


def test_table_members_carry_key_axes_and_merged_axes():
    assert StepKind.SPLIT_Q == "split heads q" and StepKind.SPLIT_Q.axes == ("b", "h", "i", "d")
    assert StepKind.K_PROJECTION.axes == ("b", "j", "(g d)")
    assert StepKind.OUTPUT_PROJECTION.axes == ("b", "i", "out")


def test_record_passes_the_member_and_facts_only_while_recording():
    seen = []
    record(StepKind.SCORES, None, scale=0.5)  # no recorder: nothing happens
    with recording(lambda step, tensor, **facts: seen.append((step, facts))):
        record(StepKind.SCORES, None, scale=0.5)
    record(StepKind.SCORES, None, scale=0.25)
    assert seen == [(StepKind.SCORES, {"scale": 0.5})]
