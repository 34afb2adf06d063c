"""The reduction protocol: distance bins, the dry-run shape check, name clashes; the built-ins'
numbers are checked against the dense reference in test_tiles.py."""

from __future__ import annotations

import pytest
import torch

from headwise.long import MaxLogit, profile
from headwise.long.reductions import check_reduction, distance_edges
from headwise.long.tiles import Call
from tests.long.test_run import lm


def test_distance_edges_are_log_spaced_and_end_at_n():
    assert distance_edges(1).tolist() == [0, 1]
    assert distance_edges(2).tolist() == [0, 1, 2]
    assert distance_edges(9).tolist() == [0, 1, 2, 4, 8, 9]
    assert distance_edges(8192).tolist()[-3:] == [2048, 4096, 8192]


CALL = Call(1, 2, 13, 13, 4, 2, 3, torch.float64, torch.device("cpu"), 5)


def test_a_reduction_lacking_methods_is_one_line():
    class Half:
        name = "half"

        def init(self, call):
            pass

    with pytest.raises(ValueError, match=r"lacks \['shape', 'update', 'finish'\]"):
        check_reduction(Half(), CALL)


def test_a_correct_user_reduction_passes_the_dry_run():
    check_reduction(MaxLogit(), CALL)


def test_a_reduction_sees_every_row_exactly_once():
    class Rows:
        name = "rows"

        def shape(self, call):
            return (call.h, call.nq)

        def init(self, call):
            self.seen = torch.zeros(call.h, call.nq)

        def update(self, tile):
            self.seen[:, tile.r0:tile.r1] += tile.probs.sum(-1)[0] + 1

        def finish(self):
            return self.seen

    p = profile(lm(), torch.randint(0, 50, (1, 150)), block=16, reductions=[Rows()],
                progress=False, budget=1)
    assert torch.allclose(p.reduced["rows"], torch.full((2, 4, 150), 2.0))


@pytest.mark.parametrize("name", ["maps", "row_masses"])
def test_a_name_taken_by_a_built_in_is_refused(name):
    r = MaxLogit()
    r.name = name
    with pytest.raises(ValueError, match=f"reduction name '{name}' is taken"):
        profile(lm(), torch.zeros(1, 8, dtype=torch.long), reductions=[r], progress=False)
