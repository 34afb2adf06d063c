"""The catalogue's result: JSON round trip, ranking, per-kind tables, importance as a column."""

import torch

import headwise as hw
from headwise.analysis.catalogue import catalogue
from tests.analysis.catalogue.test_init import _seq2seq


def test_json_round_trip_and_ranking(tmp_path):
    model, task = _seq2seq(3)
    cat = catalogue(model, task.eval_set(8), importance={"cross": torch.arange(4.).reshape(2, 2)})
    path = tmp_path / "c.json"
    cat.to_json(path)
    back = hw.Catalogue.from_json(path.read_text())
    assert back.heads == cat.heads and back.meta == cat.meta
    top = cat.ranked("importance")
    assert (top[0]["kind"], top[0]["layer"], top[0]["head"]) == ("cross", 1, 1)
    assert len(top) == 4  # the other kinds have no importance
    table = cat.table("entropy")
    assert set(table) == {"encoder_self", "decoder_self", "cross"}
    assert table["cross"].shape == (2, 2) and not table["cross"].isnan().any()
    assert cat.table("prev_token")["cross"].isnan().all()
