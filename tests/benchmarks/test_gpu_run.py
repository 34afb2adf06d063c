"""benchmarks/gpu.py, the one GPU run, on stand-in steps: each step's output is kept as it
goes, a failing, an over-time and a missing step are recorded and the next step still runs, and
gpu-section.md holds one RESULTS.md section per step (which ``--merge`` folds into a file)."""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
gpu = importlib.import_module("gpu")
R = importlib.import_module("_results")

PY = sys.executable
TABLE = "print('# a table'); print('| x | y |'); print('|---|---|'); print('| 1 | 2 |')"


def test_every_step_runs_and_is_recorded_whatever_the_others_do(tmp_path, monkeypatch):
    steps = [
        ("tests", 30, [PY, "-c", TABLE]),
        ("attention", 30, [PY, "-c", "import sys; print('partial'); "
                                     "sys.stderr.write('Boom: the reason\\n'); sys.exit(3)"]),
        ("weights", 1, [PY, "-c", "import time; print('started', flush=True); time.sleep(60)"]),
        ("stats", 30, [PY, "benchmarks/no_such_script.py", "{flags}"]),
        ("train", 30, [PY, "-c", "import sys; print(' '.join(sys.argv[1:]))", "{flags}"]),
        ("generate", 30, [PY, "-c", "import sys; sys.exit(5)"]),  # (needs CUDA: skipped)
    ]
    monkeypatch.setattr(gpu, "STEPS", steps)
    monkeypatch.setattr(sys, "argv", ["gpu.py", str(tmp_path), "--plumbing"])
    t0 = time.perf_counter()
    assert gpu.main() == 1  # some steps failed
    assert time.perf_counter() - t0 < 40  # the sleeper was stopped at its limit
    done = {s["name"]: s for s in json.loads((tmp_path / "steps.json").read_text())}
    assert {k: s["exit"] for k, s in done.items()} == {
        "tests": 0, "attention": 3, "weights": 124, "stats": 127, "train": 0, "generate": 0}
    assert "not run with --plumbing" in (tmp_path / "generate.md").read_text()
    assert (tmp_path / "weights.md").read_text().startswith("started")  # kept as it went
    assert "--plumbing --quick" in (tmp_path / "train.md").read_text()
    sections = {s.name: s for s in R.parse((tmp_path / "gpu-section.md").read_text())}
    assert set(sections) == set(done)
    assert "| 1 | 2 |" in sections["tests"].body and "FAILED" not in sections["tests"].body
    assert "FAILED: exit 3" in sections["attention"].body
    assert "Boom: the reason" in sections["attention"].body  # the end of its stderr
    assert "no_such_script.py does not exist" in sections["stats"].body
    # --merge folds the sections into a RESULTS.md beside the CPU ones
    results = tmp_path / "RESULTS.md"
    R.update(results, [R.Section("attention", "AMD EPYC, 2 CPUs", "## cpu\n")], gpu.ORDER)
    monkeypatch.setattr(gpu, "HERE", tmp_path)
    monkeypatch.setattr(sys, "argv", ["gpu.py", str(tmp_path), "--merge"])
    assert gpu.main() == 0
    merged = {(s.name, s.machine) for s in R.parse(results.read_text())}
    assert ("attention", "AMD EPYC, 2 CPUs") in merged
    assert {(name, sections[name].machine) for name in done} <= merged


def test_a_step_left_no_time_is_not_started(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "STEPS", [("tests", 30, [PY, "-c", "print(1)"])])
    monkeypatch.setattr(sys, "argv", ["gpu.py", str(tmp_path), "--budget", "1"])
    assert gpu.main() == 1
    assert json.loads((tmp_path / "steps.json").read_text())[0]["exit"] == 125
