"""Head classes: the needle prompt, the retrieval score (a user reduction) against the model's
own weights, the classes' rules, and the sinks + window restriction against an explicit mask."""

from __future__ import annotations

import pytest
import torch

from headwise.long import LongProfile, SpanMass, classes, needle_prompt, profile, restrict
from tests.long.test_run import lm


class Chars:
    """A tokenizer of characters (ids = code points), enough for the needle prompt."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 50 for c in text]}


def test_needle_prompt_puts_the_key_where_it_says():
    needle = needle_prompt(Chars(), 600, depth=0.25, seed=3)
    ids = needle.ids[0].tolist()
    a, b = needle.key
    assert len(ids) == 600 and ids[a:b] == [ord(c) % 50 for c in " " + needle.passkey]
    assert 0.2 * 600 < a < 0.35 * 600
    assert ids[needle.rows[0] + 1:] == needle.answer and len(needle.rows) == len(needle.answer)
    with pytest.raises(ValueError, match="no room"):
        needle_prompt(Chars(), 100)


def test_span_mass_equals_the_weights_it_sums():
    model = lm()
    needle = needle_prompt(Chars(), 400, seed=1)
    span = SpanMass(needle.rows, needle.key)
    prof = profile(model, needle.ids, reductions=[span], block=32, progress=False,
                   dtype=torch.float64)
    with torch.no_grad():
        w = model(needle.ids, return_weights=True)[1]["decoder_self"]
    a, b = needle.key
    for layer in range(2):
        want = w[layer][0][:, needle.rows, a:b].double().sum(-1).mean(-1)
        assert torch.allclose(prof.scores["retrieval"][layer].double(), want, atol=1e-6)
    assert prof.group_scores["retrieval"].shape == (2, 2)


def test_classes_rules_and_groups():
    s = torch.tensor([[0.95, 0.99, 0.5, 0.97]])
    r = torch.tensor([[0.0, 0.0, 0.0, 0.3]])
    assert classes(s, r).tolist() == [[1, 1, 0, 2]]
    from tests.long.test_profile import made

    p: LongProfile = made(l=1, h=4)
    p.scores["streaming"] = s
    got = p.classes(r)
    assert got["heads"].tolist() == [[1, 1, 0, 2]]
    assert got["groups"].tolist() == [[1, 2]]  # group 0: both streaming; group 1: one retrieves
    with pytest.raises(ValueError, match="retrieval has shape"):
        p.classes(torch.zeros(2, 4))


def test_restrict_is_the_sinks_and_window_mask_on_those_heads_only():
    model = lm()
    ids = torch.randint(0, 50, (1, 200), generator=torch.Generator().manual_seed(0))
    with restrict(model, {1: [2]}, sinks=3, window=10):
        prof = profile(model, ids, block=20, sinks=3, window=10, far=50, progress=False,
                       dtype=torch.float64)
        with torch.no_grad():
            w = model(ids, return_weights=True)[1]["decoder_self"][1][0]
    stream = prof.scores["streaming"]
    assert abs(stream[1, 2].item() - 1.0) < 1e-9 and stream[1, [0, 1, 3]].max() < 0.99
    i, j = torch.arange(200)[:, None], torch.arange(200)[None, :]
    outside = (j <= i) & ~((j < 3) | (i - j < 10))
    assert w[2][outside].abs().max() == 0 and w[1][outside].sum() > 1
    free = profile(model, ids, block=20, sinks=3, window=10, progress=False)
    assert torch.allclose(free.scores["streaming"][0], prof.scores["streaming"][0].float())
