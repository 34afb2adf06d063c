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
    scores = [s for row in plan.scores for s in row]  # the profile's streaming mass per group
    assert all(0 < s <= 1 + 1e-6 for s in scores) and len(set(scores)) > 1
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


def smollm2_profile(path, layers=30):
    """A saved LongProfile of SmolLM2's shape (30 layers x 9 query heads, 3 groups) whose
    streaming scores are random (the rest random too: kvplan reads only the group scores)."""
    import torch

    from headwise.long import LongProfile

    g = torch.Generator().manual_seed(2)
    rand = lambda *s: torch.rand(*s, generator=g)  # noqa: E731
    l, h, n = layers, 9, 16
    streaming = rand(l, h)
    LongProfile(n=n, block=8, layers=list(range(l)), heads=list(range(h)), heads_per_layer=h,
                groups_per_layer=3, sinks=4, window=8, maps=rand(l, h, 2, 2),
                distance=rand(l, h, 5), distance_edges=torch.tensor([0, 1, 2, 4, 8, n]),
                sink=rand(l, h), local=rand(l, h), received=rand(l, h, n),
                topk_keys=torch.randint(0, n, (l, h, 2, 2), generator=g),
                topk_mass=rand(l, h, 2, 2), scores={"streaming": streaming}).save(path)
    return streaming.view(l, 3, 3).amin(-1)


def test_kvplan_ranks_by_a_saved_long_profile(smollm2_path, calib, tmp_path, capsys):
    group = smollm2_profile(tmp_path / "long.safetensors")
    out = tmp_path / "plan.json"
    assert main(["kvplan", "--file", str(calib), "--tokens", "48", "--window", "8",
                 "--budget", "0.2", "--profile", str(tmp_path / "long.safetensors"),
                 "--out", str(out)]) == 0
    plan = KVPlan.load(out)
    chosen = [group[i, c].item() for i in range(30) for c in plan.streaming[i]]
    rest = [group[i, c].item() for i in range(30) for c in plan.full(i)]
    assert len(chosen) == 18 and min(chosen) >= max(rest)
    assert "held-out loss over 48 tokens" in capsys.readouterr().out
    smollm2_profile(tmp_path / "short.safetensors", layers=29)
    assert main(["kvplan", "--file", str(calib), "--tokens", "48", "--profile",
                 str(tmp_path / "short.safetensors")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "covers layers" in err[0] and "30 x 3" in err[0]
