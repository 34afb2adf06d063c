"""benchmarks/RESULTS.md as the current truth: sections keyed by (benchmark, machine) survive a
round trip, a run replaces only its own sections, the file is written through a temporary file
and one rename, and run_all.py merges fake benchmark outputs without running any benchmark."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
R = importlib.import_module("_results")

ORDER = ["ceilings", "attention", "weights", "generate"]
names = st.sampled_from(["attention", "weights", "generate", "someday"])
machines = st.sampled_from(["AMD EPYC, 2 CPUs", "Intel(R) Xeon(R) Platinum 8481C, 8 CPUs"])
# benchmark output: headings, tables, prose; never a marker line of its own
line = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=40).filter(
    lambda s: not s.startswith("<!--"))
outputs = st.lists(st.one_of(line, line.map(lambda s: "# " + s), st.just("| a | b |\n|---|---|")),
                   min_size=1, max_size=6).map("\n".join)


def section(name, machine, output="| x |\n|---|\n| 1 |", date="2026-11-26 21:00 UTC"):
    return R.make(name, machine, command=f"python benchmarks/{name}.py", threads=2,
                  torch_version="2.13.0+cpu", date=date, load=1.25, commit="abc1234",
                  seconds=12.0, output=output)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(names, machines, outputs), max_size=6, unique_by=lambda t: t[:2]))
def test_sections_survive_a_round_trip_through_the_file(runs):
    sections = [section(n, m, out) for n, m, out in runs]
    text = R.render(R.merge([], sections, ORDER))
    back = R.parse(text)
    assert {s.key: s.body.strip() for s in back} == {s.key: s.body.strip() for s in sections}
    assert text.startswith(R.HEAD.format(journal=R.JOURNAL))


@settings(max_examples=50, deadline=None)
@given(old=st.lists(st.tuples(names, machines, outputs), max_size=6, unique_by=lambda t: t[:2]),
       new=st.lists(st.tuples(names, machines, outputs), min_size=1, max_size=3,
                    unique_by=lambda t: t[:2]))
def test_a_run_replaces_only_its_own_sections(old, new):
    before = [section(n, m, out, date="old") for n, m, out in old]
    after = [section(n, m, out, date="new") for n, m, out in new]
    merged = {s.key: s for s in R.parse(R.render(R.merge(before, after, ORDER)))}
    assert set(merged) == {s.key for s in before} | {s.key for s in after}
    for s in after:
        assert merged[s.key].body.strip() == s.body.strip()
    for s in before:
        if s.key not in {a.key for a in after}:
            assert merged[s.key].body.strip() == s.body.strip()


def test_sections_are_ordered_by_benchmark_then_machine():
    got = R.merge([section("generate", "B"), section("someday", "A"), section("attention", "B")],
                  [section("attention", "A"), section("ceilings", "A")], ORDER)
    assert [s.key for s in got] == [("ceilings", "A"), ("attention", "A"), ("attention", "B"),
                                    ("generate", "B"), ("someday", "A")]


def test_the_header_names_the_machine_command_threads_torch_date_load_and_commit():
    s = section("attention", "AMD EPYC, 2 CPUs", output="## Time\n| a |")
    head = s.body.splitlines()
    assert head[0] == "## attention — AMD EPYC, 2 CPUs"
    for part in ("`python benchmarks/attention.py`", "2026-11-26 21:00 UTC", "torch 2.13.0+cpu",
                 "2 threads", "load average 1.2", "commit abc1234"):
        assert part in head[2]
    assert "#### Time" in s.body  # the script's own headings sit under the section


def test_output_without_a_markdown_table_is_kept_in_a_code_block():
    text = "command      median s\npython -c pass  0.016\n# not a heading here"
    body = section("cli_startup", "A", output=text).body
    assert f"```\n{text}\n```" in body
    back = R.parse(R.render([section("cli_startup", "A", output=text)]))
    assert back[0].body.strip() == body.strip()


def test_update_keeps_other_machines_and_writes_through_a_renamed_temporary_file(tmp_path,
                                                                                monkeypatch):
    path = tmp_path / "RESULTS.md"
    xeon, epyc = "Intel Xeon, 8 CPUs", "AMD EPYC, 2 CPUs"
    R.update(path, [section("attention", xeon, "xeon old"), section("attention", epyc, "epyc old"),
                    section("weights", epyc, "weights old")], ORDER)
    before = path.read_text()
    renames = []
    real_replace = os.replace

    def spy(src, dst):
        assert Path(dst) == path and Path(src).parent == path.parent
        assert path.read_text() == before  # nothing written in place before the rename
        assert "epyc new" in Path(src).read_text()
        renames.append(src)
        real_replace(src, dst)

    monkeypatch.setattr(R.os, "replace", spy)
    R.update(path, [section("attention", epyc, "epyc new")], ORDER)
    assert len(renames) == 1
    got = {s.key: s.body for s in R.parse(path.read_text())}
    assert "epyc new" in got[("attention", epyc)]
    assert "xeon old" in got[("attention", xeon)] and "weights old" in got[("weights", epyc)]
    assert list(tmp_path.iterdir()) == [path]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "RESULTS.md"
    R.update(path, [section("attention", "A", "kept")], ORDER)
    before = path.read_text()

    def full_disk(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(R.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        R.update(path, [section("attention", "A", "lost")], ORDER)
    assert path.read_text() == before
    assert list(tmp_path.iterdir()) == [path]


def test_run_all_merges_fake_outputs_into_this_machines_sections(tmp_path, monkeypatch):
    """run_all.py end to end with the benchmarks and the ceilings faked: --only attention
    replaces attention's section for this machine, keeps another machine's and another
    benchmark's, and a failing benchmark keeps its old section and exits 1."""
    run_all = importlib.import_module("run_all")
    from headwise import limits
    here = R.machine(limits.cpu_model(), limits.cpu_count())
    path = tmp_path / "RESULTS.md"
    R.update(path, [section("attention", here, "old attention"),
                    section("attention", "Other CPU, 64 CPUs", "other machine"),
                    section("weights", here, "old weights")], run_all.BENCHMARKS)
    fake = {"attention": ("## Time\n| n | ratio |\n|---|---|\n| 512 | 0.98 |", 0),
            "weights": ("Traceback: boom", 1)}
    monkeypatch.setattr(run_all, "measure_ceilings", lambda: {"gflops": 123.0, "gbps": 4.5})
    monkeypatch.setattr(run_all, "run", lambda name, argv, env: (*fake[name][:1], 3.0,
                                                                   fake[name][1]))
    for only, code in ((["attention"], 0), (["weights"], 1)):
        monkeypatch.setattr(sys, "argv", ["run_all.py", "--quick", "--only", *only,
                                          "--out", str(path)])
        assert run_all.main() == code
    got = {s.key: s.body for s in R.parse(path.read_text())}
    assert "| 512 | 0.98 |" in got[("attention", here)]
    assert "old attention" not in got[("attention", here)]
    assert "--seqs 512 1024" in got[("attention", here)]  # the exact --quick command
    assert "other machine" in got[("attention", "Other CPU, 64 CPUs")]
    assert "old weights" in got[("weights", here)]  # the failed run kept the last good one
    assert "| 123 | 4.5 |" in got[("ceilings", here)]


def test_the_committed_file_is_current_only():
    """The committed RESULTS.md is what its head says: one section per (benchmark, machine), no
    test log (a GPU run's tests are one row per module), short goal lines, under 500 lines."""
    text = (BENCH / "RESULTS.md").read_text(encoding="utf-8")
    sections = R.parse(text)
    keys = [s.key for s in sections]
    assert len(keys) == len(set(keys)) >= 10, keys
    assert text.startswith(R.HEAD.format(journal=R.JOURNAL))
    assert len(text.splitlines()) <= 500
    for log_line in ("test session starts", "PASSED", "rootdir:", "platform linux"):
        assert log_line not in text, log_line
    goals = [ln for ln in text.splitlines() if ln.startswith("goal ")]
    assert goals and all(ln.rstrip().endswith(("PASS", "FAIL")) or " PASS " in ln
                         or " FAIL " in ln for ln in goals), goals
    assert all(len(ln) <= 140 for ln in goals), max(goals, key=len)


def test_every_writer_keeps_the_files_one_order():
    """run_all.py and gpu.py write in _results.ORDER, which names every benchmark either runs,
    and the committed file is in that order (so no run reorders another machine's sections)."""
    run_all, gpu = importlib.import_module("run_all"), importlib.import_module("gpu")
    assert {"ceilings", *run_all.BENCHMARKS, *(s[0] for s in gpu.STEPS)} <= set(R.ORDER)
    assert gpu.ORDER == R.ORDER
    sections = R.parse((BENCH / "RESULTS.md").read_text(encoding="utf-8"))
    assert sections == R.merge([], sections, R.ORDER)
