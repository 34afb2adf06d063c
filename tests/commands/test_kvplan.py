"""headwise kvplan on SmolLM2 (a short calibration text): prints the plan and its measured
loss, writes it atomically; chat reads it back and refuses a plan of another shape."""

from __future__ import annotations

import json

import pytest

from headwise.cli import main
from headwise.kvplan import KVPlan


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    path = tmp_path_factory.mktemp("kv") / "calib.txt"
    path.write_text("It is a truth universally acknowledged, that a single man in possession "
                    "of a good fortune, must be in want of a wife. " * 30)
    return path


def test_kvplan_prints_the_plan_and_its_loss_and_chat_reads_it(smollm2_path, calib, tmp_path,
                                                               capsys):
    out = tmp_path / "plan.json"
    assert main(["kvplan", "--file", str(calib), "--tokens", "48", "--window", "8",
                 "--budget", "0.2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    plan = KVPlan.load(out)
    assert plan.shape == (30, 3, 64) and round(plan.fraction * 90) == 18
    assert "layers=30 groups=3" in text and "held-out loss over 48 tokens" in text
    assert f"plan {plan.loss['plan']:.4f}" in text
    assert main(["chat", "Hi", "--max-new-tokens", "3", "--kv-plan", str(out)]) == 0
    raw = json.loads(out.read_text())
    raw["head_dim"] = 32
    out.write_text(json.dumps(raw))
    assert main(["chat", "Hi", "--max-new-tokens", "3", "--kv-plan", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "(30, 3, 32)" in err and "(30, 3, 64)" in err
    raw["head_dim"] = 64
    for text, message in ((json.dumps({**raw, "extra": 1}), "unknown keys ['extra']"),
                          (json.dumps(raw)[:200], "truncated"),
                          (json.dumps({**raw, "window": 0}), "window must be an int >= 1")):
        out.write_text(text)
        assert main(["chat", "Hi", "--max-new-tokens", "3", "--kv-plan", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0] and "Traceback" not in err[0]


@pytest.mark.parametrize("argv, message", [
    (["--budget", "1.5"], "--budget must be in [0, 1]"),
    (["--window", "0"], "--window must be >= 1"),
    (["--budget", "0.5", "--tolerance", "0.1"], "not allowed with"),
])
def test_bad_flags_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        assert main(["kvplan", *argv]) == 2
        raise SystemExit(2)
    assert info.value.code == 2
    assert message in capsys.readouterr().err
