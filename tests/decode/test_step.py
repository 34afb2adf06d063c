"""headwise.decode.step.choose: the one place that picks the step's form (growing cache, bound C
plan, fixed shapes, CUDA graph) and its weight copies, and the step runs the form it says."""

import pytest
import torch

from headwise.decode import step as _step
from headwise.decode.step import DecodeStep, Form, choose
from headwise.fast import native
from tests.test_step import _lm


def _model_and_cache(rows=1, **kw):
    model = _lm(norm="rms", ffn="glu", activation="silu", positional="rope", **kw)
    cache = model.new_cache(rows, 16)
    with torch.inference_mode():
        model(torch.randint(0, 37, (rows, 4)), cache=cache)
    return model, cache


def test_the_choice_follows_the_device_rule_the_thresholds_and_the_budget(monkeypatch):
    model, cache = _model_and_cache()
    for steps, transpose in ((None, True), (_step.TRANSPOSE_STEPS, True),
                             (_step.TRANSPOSE_STEPS - 1, False)):
        c = choose(model, cache, steps=steps)
        assert c.form is Form.BOUND and c.transpose is transpose and c.fuse and not c.lay_out
        assert c.onednn_off
    assert choose(model, cache, static=True).form is Form.FIXED
    with pytest.raises(ValueError, match="graph=True replays a fixed-shape step as a CUDA graph; "
                                         "the model is on cpu"):
        choose(model, cache, graph=True)
    monkeypatch.setattr(_step, "COPY_BUDGET", 0)  # a larger model: its own weights, laid out
    for steps, lay_out in ((None, True), (_step.LAY_OUT_STEPS, True),
                           (_step.LAY_OUT_STEPS - 1, False)):
        c = choose(model, cache, steps=steps)
        assert not c.transpose and not c.fuse and c.lay_out is lay_out
    _, four = _model_and_cache(rows=4)
    assert choose(model, four, steps=1).lay_out  # 2 rows and more: laid out at any length
    bf16 = _lm(norm="rms", ffn="glu", activation="silu").to(torch.bfloat16)
    c = choose(bf16, bf16.new_cache(1, 8))
    assert c.form is Form.BOUND and not c.onednn_off


def test_the_step_runs_the_form_chosen():
    model, cache = _model_and_cache()
    with torch.inference_mode():
        step = DecodeStep(model, cache)
        bound = native.status() == "ready"
        assert step.form is (Form.BOUND if bound else Form.GROWING)
        assert (step.plan is not None) is bound
        fixed = DecodeStep(model, model.new_cache(1, 8), static=True)
        assert fixed.form is Form.FIXED and fixed.static and fixed.plan is None
    layer_norm, cache = _lm(), None  # a LayerNorm does not bind: the bound form falls back
    cache = layer_norm.new_cache(1, 8)
    with torch.inference_mode():
        layer_norm(torch.randint(0, 37, (1, 3)), cache=cache)
        step = DecodeStep(layer_norm, cache)
    assert step.form is Form.GROWING and step.plan is None
