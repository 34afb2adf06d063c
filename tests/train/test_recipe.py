"""The training recipe: schedule, model config from the options, resume checks."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headwise.data import make_task
from headwise.train.config import TrainConfig
from headwise.train.recipe import build_model_config, lr_at, step_seed


def test_warmup_then_cosine_to_the_floor():
    cfg = TrainConfig(task="reverse", steps=100, warmup=10, lr=1e-3, min_lr_ratio=0.1).resolved()
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:10], strict=False))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    assert lrs[55] == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(100, cfg) == pytest.approx(1e-4)


def test_a_model_option_reaches_the_model_config():
    # one row of the CLI table: --kv-heads -> TrainConfig.model["num_kv_heads"] -> the config
    from headwise.cli import build_parser
    from headwise.commands.train import config_from_args
    args = build_parser().parse_args(["train", "induction", "--kv-heads", "1", "--d-model", "32",
                                      "--heads", "4"])
    config, given = config_from_args(args)
    cfg = config.updated(**given).resolved()
    assert cfg.model["num_kv_heads"] == 1 and cfg.model["d_model"] == 32
    task = make_task("induction")
    mc = build_model_config(cfg, task)
    assert (mc.attention.num_kv_heads, mc.d_model, mc.num_heads, mc.num_layers) == (1, 32, 4, 2)


@given(seed=st.integers(0, 2**31), step=st.integers(0, 10**6), rank=st.integers(0, 64))
def test_step_seeds_are_reproducible_and_differ_by_step_and_rank(seed, step, rank):
    s = step_seed(seed, step, rank)
    assert s == step_seed(seed, step, rank) and 0 <= s < 2**32
    assert s != step_seed(seed, step + 1, rank) or s != step_seed(seed, step, rank + 1)
