"""TrainConfig: options checked once, old runs still load, estimates."""

import re

import pytest

from headwise.train import train
from headwise.train.config import TrainConfig, format_seconds


def test_runs_saved_with_model_fields_at_the_top_level_still_load():
    old = {"task": "reverse", "d_model": 64, "num_heads": 4, "num_layers": 2, "d_ff": 256,
           "dropout": 0.0, "positional": "sinusoidal", "activation": "relu",
           "norm_first": True, "steps": 1000, "batch_size": 64, "lr": 0.003, "warmup": 100,
           "context": 256, "betas": [0.9, 0.98], "eval_every": 200, "checkpoint_every": 0}
    cfg = TrainConfig.from_dict(old).resolved()
    assert cfg.model == {"d_model": 64, "num_heads": 4, "num_layers": 2, "d_ff": 256,
                         "dropout": 0.0, "positional": "sinusoidal", "activation": "relu",
                         "norm_first": True}
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(bogus=1), TypeError, "unknown training option(s) ['bogus']"),
    (dict(seed=2**70), ValueError, "seed must be in [0, 9,223,372,036,854,775,807]"),
    (dict(seed=1.5), TypeError, "seed must be an int"),
    (dict(steps="10"), TypeError, "steps must be an int"),
    (dict(warmup=10, steps=10), ValueError, "warmup=10 must be smaller than steps=10"),
    (dict(num_decoder_layers=2), ValueError, "do not apply to task 'induction'"),
    (dict(betas=(0.9, 1.5)), ValueError, "betas must be two numbers in [0, 1)"),
    (dict(size="large"), ValueError, "its sizes are small"),
])
def test_bad_options_are_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=re.escape(match)):
        train(TrainConfig(task="induction"), progress=False, **kwargs)


def test_threads_are_bounded_by_the_machine():
    from headwise import limits
    with pytest.raises(ValueError, match=rf"threads must be an int in \[1, {limits.cpu_count()}\]"):
        TrainConfig(threads=limits.cpu_count() + 1).resolved()


@pytest.mark.parametrize("seconds, text", [(0, "0 s"), (89, "89 s"), (90, "2 min"),
                                           (89 * 60, "89 min"), (90 * 60, "1.5 h"),
                                           (36000, "10.0 h")])
def test_format_seconds_picks_the_readable_unit(seconds, text):
    assert format_seconds(seconds) == text
