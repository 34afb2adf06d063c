"""A Trace: its steps, lookup by name and path, and renderings that hold the same facts."""

import json

import torch

import headwise as hw


def test_a_trace_finds_steps_and_renders_the_same_record_every_way():
    torch.manual_seed(0)
    mha = hw.MultiHeadAttention(8, 2)
    x = torch.randn(1, 5, 8)
    trace = hw.trace(mha, x, causal=True)
    assert torch.equal(trace.output[0], mha(x, causal=True)[0])  # tracing changes nothing
    assert len(trace) == len(list(trace)) == len(trace.steps) > 0
    assert len(trace.attention) == 1
    names = [s.name for s in trace]
    for name in set(names):
        assert len(trace.find(name)) == names.count(name)
    assert trace.find(names[0], path="no.such.module") == []
    record = trace.to_dict()
    assert json.loads(trace.to_json()) == json.loads(json.dumps(record))
    assert [s["name"] for s in record["steps"]] == names
    assert str(trace) == trace.render() and trace.summary() in trace.render()
    assert trace.summary() not in trace.render(summary=False)
    assert trace._repr_html_().startswith("<pre") and "&lt;" not in trace.summary()
    assert f"{len(trace.steps)} steps, 1 attention calls" in repr(trace)
    assert trace.to_markdown().count("\n|") >= len(trace.steps)
