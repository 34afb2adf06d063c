"""Precision choice and the distributed helpers of a training run."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from headwise.train.dist import Dist, any_rank, global_sum, pick_precision


def test_precision_choice():
    cpu = torch.device("cpu")
    assert pick_precision("fp32", cpu) == ("fp32", "requested")
    choice, why = pick_precision("auto", cpu)
    flags = open("/proc/cpuinfo").read()
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    assert choice == ("bf16" if native else "fp32") and why


@given(value=st.floats(-1e6, 1e6), flag=st.booleans())
def test_alone_the_sums_and_flags_are_this_process_own(value, flag):
    alone = Dist()
    assert alone.main and (alone.rank, alone.world) == (0, 1)
    assert global_sum(torch.tensor(value, dtype=torch.float64), alone) == value
    assert any_rank(flag, alone, torch.device("cpu")) is flag
    assert not Dist(rank=1, world=2).main


def test_requested_precision_is_taken_as_asked():
    assert pick_precision("bf16", torch.device("cpu"))[0] == "bf16"
