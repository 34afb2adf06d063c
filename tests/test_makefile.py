"""The Makefile names only paths that exist: a test file that moved (``tests/test_weights.py``
went to ``tests/weights/``) once made ``make test-cpus`` run nothing, pytest stopping at "file or
directory not found"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAKEFILE = ROOT / "Makefile"
# Words that are paths inside the repository's own folders (variables and the venv are not).
PATH = re.compile(r"(?<![\w$./-])(?:tests|src|scripts|benchmarks)/[\w./-]*")


def named_paths(text: str) -> list[str]:
    """Every path-like word under ``tests/``, ``src/``, ``scripts/`` or ``benchmarks/`` in a
    Makefile's text (recipes, variables and comments alike, continued lines joined), in order,
    each once."""
    joined = text.replace("\\\n", " ")
    return list(dict.fromkeys(m.rstrip("/.") for m in PATH.findall(joined)))


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    return [p for p in named_paths(text) if not (root / p).exists()]


def test_every_path_the_makefile_names_exists():
    text = MAKEFILE.read_text()
    assert "tests/weights" in named_paths(text)  # the parser sees CPU_TESTS' continued line
    assert missing_paths(text) == []


def test_a_planted_stale_path_is_reported():
    text = MAKEFILE.read_text().replace("tests/weights", "tests/test_weights.py", 1)
    assert missing_paths(text) == ["tests/test_weights.py"]


def test_the_parser_reads_continued_lines_and_skips_variables_and_other_folders():
    text = ("# uses tests/in_a_comment.py\n"
            "CPU_TESTS ?= tests/attend tests/x.py \\\n"
            "\ttests/more/test_y.py\n"
            "lint:\n\t$(VENV)/bin/ruff check src tests benchmarks/ a/tests/not_ours.py\n"
            "bench:\n\t$(PY) benchmarks/attention.py --out=corpora/x scripts/fetch.sh;\n"
            "x:\n\tcp src/headwise/viz/assets/*.js build/\n")
    assert named_paths(text) == ["tests/in_a_comment.py", "tests/attend", "tests/x.py",
                                 "tests/more/test_y.py", "benchmarks", "benchmarks/attention.py",
                                 "scripts/fetch.sh", "src/headwise/viz/assets"]


@pytest.mark.parametrize("planted", ["tests/nowhere", "src/headwise/gone.py", "scripts/old.sh"])
def test_missing_paths_names_exactly_the_planted_one(tmp_path, planted):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "here.py").write_text("")
    text = f"t:\n\tpytest tests/here.py {planted}\n"
    assert missing_paths(text, tmp_path) == [planted]
