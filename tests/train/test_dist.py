"""Precision choice and the distributed helpers of a training run."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from headwise.train import dist
from headwise.train.dist import Dist, any_rank, global_sum, pick_precision


def test_precision_choice_follows_the_bf16_check(monkeypatch):
    """``auto`` picks bf16 exactly when the bf16 check says yes, whatever this CPU is."""
    cpu = torch.device("cpu")
    assert pick_precision("fp32", cpu) == ("fp32", "requested")
    for native, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(dist, "_cpu_has_native_bf16", lambda native=native: native)
        choice, why = pick_precision("auto", cpu)
        assert choice == expected and why


def test_precision_choice_on_this_cpu_asks_onednn():
    """bf16 only where oneDNN itself will run bf16 here: under ``ONEDNN_MAX_CPU_ISA=AVX2`` an
    AVX512-BF16 CPU still lists the flag in /proc/cpuinfo, but oneDNN declines, so fp32."""
    choice, why = pick_precision("auto", torch.device("cpu"))
    onednn = torch.backends.mkldnn.is_available() and bool(
        torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert choice in ("bf16", "fp32") and why
    if not onednn:
        assert choice == "fp32"


@given(value=st.floats(-1e6, 1e6), flag=st.booleans())
def test_alone_the_sums_and_flags_are_this_process_own(value, flag):
    alone = Dist()
    assert alone.main and (alone.rank, alone.world) == (0, 1)
    assert global_sum(torch.tensor(value, dtype=torch.float64), alone) == value
    assert any_rank(flag, alone, torch.device("cpu")) is flag
    assert not Dist(rank=1, world=2).main


def test_requested_precision_is_taken_as_asked():
    assert pick_precision("bf16", torch.device("cpu"))[0] == "bf16"
