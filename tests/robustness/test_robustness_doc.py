"""``docs/robustness.md`` is this test's output: every probe runs, ends in a clear error or its
documented correct result (never a traceback, a hang or a crash), within the time limit, and
the committed table equals what the run produced. ``HEADWISE_WRITE_DOCS=1`` rewrites it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.robustness.probes import probes
from tests.robustness.runner import LIMIT_S, render, run

DOC = Path(__file__).resolve().parents[2] / "docs" / "robustness.md"


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probes")
    return [run(p, str(tmp)) for p in probes(tmp)], str(tmp)


def test_every_row_is_a_clear_error_or_its_documented_result(outcomes):
    rows, _ = outcomes
    assert len(rows) >= 150
    wrong = [f"{o.probe.call}: expected {o.probe.expect}, got {o.kind}: {o.text}"
             for o in rows if o.kind != o.probe.expect]
    assert not wrong, "\n".join(wrong)
    slow = [f"{o.probe.call}: {o.seconds:.1f} s" for o in rows if o.seconds >= LIMIT_S]
    assert not slow, slow


def test_user_errors_name_the_problem_in_one_line(outcomes):
    rows, _ = outcomes
    for o in rows:
        if o.kind == "error":
            assert len(o.text) > 25 and "\n" not in o.text, o.probe.call


def test_the_committed_doc_is_what_the_probes_produce(outcomes):
    rows, tmp = outcomes
    text = render(rows, tmp)
    if os.environ.get("HEADWISE_WRITE_DOCS"):
        DOC.write_text(text, encoding="utf-8")
    if torch.cuda.is_available():
        pytest.skip("the committed table is the CPU-only machine's (device rows differ)")
    assert DOC.is_file(), "run HEADWISE_WRITE_DOCS=1 pytest tests/robustness to write it"
    assert DOC.read_text(encoding="utf-8") == text, (
        "docs/robustness.md is stale: rerun with HEADWISE_WRITE_DOCS=1 and review the diff")
