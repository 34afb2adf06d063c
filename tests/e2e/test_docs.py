"""docs/*.md, page by page: each page's Python snippets run in order, as written, in one namespace
(their `assert` lines are the page's claims); the numbers a page quotes are the code's; every link
between pages lands on a page and a heading that exist; sentences stay under 60 words; and the
NaN policy is stated once, with a link to it wherever else NaN comes up."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.test_readme import README, guide_counts

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# the pages whose snippets run here (questions.md and robustness.md have tests of their own:
# tests/e2e/test_questions_doc.py and tests/robustness/test_robustness_doc.py)
PAGES = ["design.md", "heads.md", "decoding.md", "training.md", "hf.md", "long.md", "cache.md"]


def snippets(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S)


def _hf_setup(tmp_path) -> dict:
    """What hf.md says its snippets are given: ``path``, a local model folder, and ``batch``."""
    pytest.importorskip("transformers")
    from tests.hf import tiny
    tiny.build("llama").save_pretrained(tmp_path / "tiny")
    ids, mask = tiny.batch("left", b=2, n=20)
    return {"path": str(tmp_path / "tiny"), "batch": {"input_ids": ids, "attention_mask": mask}}


@pytest.mark.parametrize("page", PAGES)
def test_each_pages_snippets_run_in_order(page, tmp_path, monkeypatch, capsys):
    blocks = snippets(page)
    assert blocks, f"{page} has no python snippet"
    assert sum(line.lstrip().startswith("assert ") for b in blocks for line in b.splitlines()) \
        >= len(blocks), f"{page}: a snippet without a claim to check"
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HEADWISE_STRICT", raising=False)
    namespace = _hf_setup(tmp_path) if page == "hf.md" else {}
    for block in blocks:
        exec(block, namespace)  # noqa: S102  (the page's own code)
    if page == "hf.md":  # the strict-mode snippet printed the one line naming the eager backend
        (line,) = capsys.readouterr().out.strip().splitlines()
        assert "eager" in line


def test_strict_mode_does_what_hf_md_says(monkeypatch):
    """Strict mode raises off the fused kernel and on the eager backend, returns weights asked
    for, and raises on all-heads weights only above the budget the page quotes."""
    import torch

    import headwise as hw
    from headwise import strict
    text = " ".join((DOCS / "hf.md").read_text().split())
    (mib,) = re.findall(r"all heads' weights that would pass (\d+) MiB "
                        r"\(`HEADWISE_WEIGHTS_BUDGET_MB`\)", text)
    monkeypatch.delenv("HEADWISE_WEIGHTS_BUDGET_MB", raising=False)
    assert strict.weights_budget() == int(mib) * 2**20
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    out, w = hw.attention(q, k, v, return_weights=True, strict=True)
    assert w.shape == (1, 2, 8, 8) and torch.allclose(w.sum(-1), torch.ones(1, 2, 8))
    with pytest.raises(strict.StrictError, match="eager"):
        hw.attention(q, k, v, backend="eager", strict=True)
    monkeypatch.setenv("HEADWISE_WEIGHTS_BUDGET_MB", str(2 * 8 * 8 * 4 / 2**20 / 2))  # half
    with pytest.raises(strict.StrictError, match="exceed the budget"):
        hw.attention(q, k, v, return_weights=True, strict=True)
    hw.attention(q, k, v, return_weights=True)  # not strict: no budget


def _headings(text: str) -> set[str]:
    """GitHub's anchors of a page's headings."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), re.M)}


def test_every_link_between_the_pages_lands():
    found = 0
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target, anchor in re.findall(r"\]\(([\w./-]+\.md)(?:#([\w-]+))?\)", page.read_text()):
            found += 1
            linked = (page.parent / target).resolve()
            assert linked.is_file(), (page.name, target)
            if anchor:
                assert anchor in _headings(linked.read_text()), (page.name, target, anchor)
    assert found >= 20


@pytest.mark.parametrize("page", [*PAGES, "questions.md"])
def test_no_sentence_runs_over_60_words(page):
    assert guide_counts((DOCS / page).read_text())["long sentences"] == []


def test_the_nan_policy_is_stated_once_and_linked_from_elsewhere():
    """design.md states it; any other page that speaks of NaN links there rather than saying it
    again (the policy's defining phrase appears on one page only)."""
    pages = {"README.md": README, **{p.name: p.read_text() for p in DOCS.glob("*.md")}}
    defining = "makes NaN every row that may attend its position"
    assert [n for n, text in pages.items() if defining in " ".join(text.split())] == ["design.md"]
    for name, text in pages.items():
        prose = re.sub(r"```.*?```|^\|.*$", "", text, flags=re.S | re.M)
        if name != "design.md" and re.search(r"\bNaN", prose):
            assert "design.md#the-nan-policy" in text, name
