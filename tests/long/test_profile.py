"""LongProfile: save/load round trip, strict loading, group scores, the table."""

from __future__ import annotations

import math

import pytest
import torch

from headwise.errors import CheckpointError
from headwise.long import LongProfile, group_scores


def made(l: int = 2, h: int = 4, n: int = 50, block: int = 16, seed: int = 0) -> LongProfile:
    g = torch.Generator().manual_seed(seed)
    nb = math.ceil(n / block)
    r = lambda *s: torch.rand(*s, generator=g)  # noqa: E731
    scores = {"streaming": r(l, h), "far": r(l, h), "mean_distance": r(l, h) * 10}
    return LongProfile(n=n, block=block, layers=list(range(l)), heads=list(range(h)),
                       heads_per_layer=h, groups_per_layer=2, sinks=4, window=8,
                       maps=r(l, h, nb, nb), distance=r(l, h, 7), distance_edges=torch.arange(8.),
                       sink=r(l, h), local=r(l, h), received=r(l, h, n),
                       topk_keys=torch.randint(0, n, (l, h, nb, 3), generator=g),
                       topk_mass=r(l, h, nb, 3), scores=scores,
                       reduced={"max_logit": r(l, h)}, tokens=[f"t{x}<" for x in range(n)])


def test_save_load_round_trip(tmp_path):
    p = made()
    back = LongProfile.load(p.save(tmp_path / "p.safetensors"))
    for name in ("maps", "distance", "received", "topk_keys", "topk_mass", "sink", "local"):
        assert torch.equal(getattr(back, name), getattr(p, name)), name
    assert back.tokens == p.tokens and back.layers == p.layers and back.window == 8
    assert set(back.scores) == set(p.scores) and torch.equal(back.reduced["max_logit"],
                                                             p.reduced["max_logit"])
    assert torch.equal(back.group_scores["far"], p.group_scores["far"])


def test_group_scores_min_for_streaming_max_otherwise():
    s = {"streaming": torch.tensor([[0.9, 0.2, 0.7, 0.8]]), "far": torch.tensor([[0.1, 0.5,
                                                                                  0.3, 0.2]])}
    g = group_scores(s, [0, 1, 2, 3], 4, 2)
    assert g["streaming"][0].tolist() == pytest.approx([0.2, 0.7])
    assert g["far"][0].tolist() == pytest.approx([0.5, 0.3])
    part = group_scores(s, [0, 1, 2, 3], 8, 4)  # heads 0-3 of 8: groups 2 and 3 unprofiled
    assert torch.isnan(part["far"][0, 2:]).all() and not torch.isnan(part["far"][0, :2]).any()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "shape"])
def test_damaged_file_is_one_checkpoint_error(tmp_path, damage):
    path = made().save(tmp_path / "p.safetensors")
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-40])
    elif damage == "garbage":
        path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    else:
        bad = made()
        bad.received = bad.received[..., :-1]
        bad.save(path)
    with pytest.raises(CheckpointError) as e:
        LongProfile.load(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_save_wants_safetensors_and_leaves_no_half_file(tmp_path):
    with pytest.raises(ValueError, match=r"\.safetensors"):
        made().save(tmp_path / "p.pt")
    assert list(tmp_path.iterdir()) == []


def test_repr_is_a_table_per_head():
    text = repr(made())
    lines = text.splitlines()
    assert lines[0].startswith("LongProfile n=50 block=16 layers=2 heads=4")
    assert len(lines) == 2 + 2 * 4 and "streaming" in lines[1] and lines[2].lstrip().startswith("0.0")
