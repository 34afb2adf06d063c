"""The one GPU run of issue #28: the CUDA test module and every ``--device cuda`` table, in
under 7 minutes, written to a folder as it goes.

    PYTHONPATH=src python benchmarks/gpu.py OUTDIR            # on the GPU machine
    PYTHONPATH=src python benchmarks/gpu.py OUTDIR --plumbing # here: tiny sizes, no GPU needed
    python benchmarks/gpu.py --merge OUTDIR                   # later: OUTDIR's sections into
                                                              # benchmarks/RESULTS.md

Installs nothing (the GPU machine has torch, triton, transformers, einops, rich, matplotlib,
safetensors, pytest; headwise runs from ``src`` on PYTHONPATH). Each step runs in its own
process group under its own time limit (and the run's overall ``--budget``), its output
streamed line by line into ``OUTDIR/<step>.md``; a step that fails or times out is recorded and
the next one runs. After every step ``OUTDIR/gpu-section.md`` is rewritten: the card, torch and
CUDA line and one RESULTS.md section per finished step (the format of :mod:`_results`, keyed
by the card), so a run cut short keeps what finished. ``OUTDIR/steps.json`` lists each step's
command, exit status and seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import _results as R  # noqa: E402

PY = sys.executable
# (step, time limit in seconds, command); "{flags}" is "--device cuda --quick" (or, with
# --plumbing, "--plumbing --quick"). Order: what the issue must show first.
# The GPU test modules run side by side (their time is mostly Triton compiling, on the host's
# cores); each module's verdict (pytest's last line, and the name of any test that failed) is
# printed as one table row as soon as it ends, so a step cut at its limit keeps the modules that
# finished. RESULTS.md keeps these rows, not pytest's log. Exit 1 if any failed.
TESTS = r"""
import pathlib, subprocess, sys, time
cmd = [sys.executable, '-m', 'pytest', '-q', '--tb=no', '-rfE', '-p', 'no:cacheprovider']
procs = {str(f): subprocess.Popen(cmd + [str(f)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
         for f in sorted(pathlib.Path('tests/gpu').glob('test_*.py'))}
failed = []
print('| module | exit | result | failed tests |', flush=True)
print('|---|---|---|---|', flush=True)
while procs:
    for name, p in list(procs.items()):
        if p.poll() is not None:
            lines = p.stdout.read().strip().splitlines() or ['(no output)']
            bad = [ln.split()[1].split('::')[-1] for ln in lines
                   if ln.startswith(('FAILED ', 'ERROR ')) and len(ln.split()) > 1]
            verdict = lines[-1].strip('= ').split(' in ')[0]
            print(f'| {name} | {p.returncode} | {verdict} | {", ".join(bad) or "-"} |',
                  flush=True)
            failed += [name] if p.returncode else []
            del procs[name]
    time.sleep(0.2)
print('\ngoal every tests/gpu module passes: ' + ('FAIL (' + ', '.join(failed) + ')'
                                                    if failed else 'PASS'))
sys.exit(1 if failed else 0)
"""
STEPS = [
    ("tests", 150, [PY, "-c", TESTS]),
    ("attention", 55, [PY, "benchmarks/attention.py", "{flags}"]),
    ("weights", 95, [PY, "benchmarks/weights.py", "{flags}"]),
    ("train", 55, [PY, "benchmarks/train.py", "{flags}"]),
    ("stats", 50, [PY, "benchmarks/stats.py", "{flags}"]),
    ("generate", 170, [PY, "benchmarks/generate.py", "{flags}"]),
]
# steps whose --device cuda tables have no tiny form on a CPU: --plumbing skips them
NO_PLUMBING = ("stats", "generate")
ORDER = R.ORDER  # the file's one order (a merge keeps the CPU sections where they are)
CARD = (
    "import torch\n"
    "if torch.cuda.is_available():\n"
    "    p = torch.cuda.get_device_properties(0)\n"
    "    print(f'{p.name}|{p.name} ({p.total_memory / 2**30:.0f} GiB, "
    "{p.multi_processor_count} SMs), torch {torch.__version__}, CUDA {torch.version.cuda}, "
    "cuDNN {torch.backends.cudnn.version()}|{torch.get_num_threads()}')\n"
    "else:\n"
    "    print(f'no GPU|no GPU (plumbing run), torch {torch.__version__}|"
    "{torch.get_num_threads()}')\n"
)


def run_step(cmd: list[str], limit: float, out: Path, env: dict) -> tuple[int, float]:
    """``cmd`` in its own process group, its stdout (the tables) streamed into ``out`` and
    echoed, its stderr (progress, warnings, tracebacks) into ``out`` with suffix ``.log``;
    killed with its children after ``limit`` seconds (exit 124, as ``timeout`` does)."""
    start, killed = time.perf_counter(), []
    with open(out, "w", encoding="utf-8") as f, \
            open(out.with_suffix(".log"), "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log,
                                text=True, bufsize=1, start_new_session=True)

        def kill():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        def over_limit():
            killed.append(limit)
            kill()
        timer = threading.Timer(limit, over_limit)
        timer.start()
        try:
            for line in proc.stdout:
                f.write(line)
                f.flush()
                sys.stdout.write(line)
            code = proc.wait()
        finally:
            timer.cancel()
            kill()  # whatever the step left running in its group
    if killed:
        with open(out, "a", encoding="utf-8") as f:
            f.write(f"\n(stopped after its limit of {limit:.0f} s)\n")
        code = 124
    return code, time.perf_counter() - start


def card(env: dict) -> tuple[str, str, int]:
    """``(card name, card / torch / CUDA line, torch threads)`` from a child process."""
    try:
        line = subprocess.run([PY, "-c", CARD], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=60).stdout.strip().splitlines()[-1]
        name, text, threads = line.split("|")
        return name, text, int(threads)
    except (subprocess.SubprocessError, IndexError, ValueError):
        return "unknown card", "unknown card (the torch probe failed)", 0


def section(name: str, step: dict, machine: str, commit: str, threads: int) -> R.Section:
    out = Path(step["output"])
    text = out.read_text(encoding="utf-8", errors="replace").strip()
    if step["exit"]:
        log = out.with_suffix(".log")
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:] if log.exists() else ""
        text = (f"# FAILED: exit {step['exit']} (124: over its time limit; 127: no such "
                f"script); the output so far, then the end of its stderr\n\n{text}\n\n"
                + "\n".join("    " + line for line in tail.splitlines()))
    return R.make(name, machine, command=step["command"], threads=threads,
                  torch_version=step["torch"], date=step["date"], load=step["load"],
                  commit=commit, seconds=step["seconds"], output=text or "(no output)")


def write_section(outdir: Path, header: str, done: list[dict], machine: str, commit: str,
                  threads: int) -> None:
    sections = [section(s["name"], s, machine, commit, threads) for s in done]
    body = "".join("\n" + s.render() for s in R.merge([], sections, ORDER))
    R.write_atomic(outdir / "gpu-section.md", f"<!-- gpu run: {header} -->\n{body}")
    R.write_atomic(outdir / "steps.json", json.dumps(done, indent=2) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--plumbing", action="store_true",
                    help="tiny sizes on any device: checks this script's plumbing")
    ap.add_argument("--budget", type=float, default=420.0,
                    help="seconds for the whole run (each step gets at most what is left)")
    ap.add_argument("--only", nargs="+", choices=[s[0] for s in STEPS])
    ap.add_argument("--limit", nargs="+", default=[], metavar="STEP=SECONDS",
                    help="change steps' time limits, e.g. --limit tests=120 generate=100")
    ap.add_argument("--merge", action="store_true",
                    help="merge OUTDIR/gpu-section.md into benchmarks/RESULTS.md and stop")
    args = ap.parse_args()
    if args.merge:
        text = (args.outdir / "gpu-section.md").read_text(encoding="utf-8")
        R.update(HERE / "RESULTS.md", R.parse(text), ORDER)
        print(f"merged {len(R.parse(text))} sections into {HERE / 'RESULTS.md'}")
        return 0
    args.outdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    start = time.perf_counter()
    machine, header, threads = card(env)
    torch_version = header.split("torch ")[1].split(",")[0] if "torch " in header else "?"
    print(f"# {header}", flush=True)
    (args.outdir / "card.txt").write_text(header + "\n", encoding="utf-8")
    flags = ["--plumbing", "--quick"] if args.plumbing else ["--device", "cuda", "--quick"]
    commit = R.commit(ROOT)
    done: list[dict] = []
    limits = {k: float(v) for k, v in (item.split("=") for item in args.limit)}
    for name, limit, template in STEPS:
        if args.only and name not in args.only:
            continue
        limit = limits.get(name, limit)
        cmd = [part for p in template for part in (flags if p == "{flags}" else [p])]
        left = args.budget - (time.perf_counter() - start)
        script = next((Path(ROOT, p) for p in cmd if p.endswith(".py")), None)
        shown = (["-c", '"$TESTS"', "(pytest on each tests/gpu module, side by side)"]
                 if cmd[1] == "-c" else cmd[1:])
        step = {"name": name, "command": " ".join(["python", *shown]), "torch": torch_version,
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "load": os.getloadavg()[0], "output": str(args.outdir / f"{name}.md")}
        if script is not None and not script.exists():
            Path(step["output"]).write_text(f"{script.relative_to(ROOT)} does not exist in "
                                            f"this tree: not run\n", encoding="utf-8")
            code, seconds = 127, 0.0
        elif args.plumbing and name in NO_PLUMBING:
            Path(step["output"]).write_text("not run with --plumbing: its tables need a CUDA "
                                            "device\n", encoding="utf-8")
            code, seconds = 0, 0.0
        elif left < 15:
            Path(step["output"]).write_text(f"not run: {left:.0f} s left of the run's "
                                            f"{args.budget:.0f} s\n", encoding="utf-8")
            code, seconds = 125, 0.0
        else:
            print(f"\n## {name}: {step['command']} (limit {min(limit, left):.0f} s)", flush=True)
            code, seconds = run_step(cmd, min(limit, left), Path(step["output"]), env)
        step.update(exit=code, seconds=seconds)
        done.append(step)
        write_section(args.outdir, header, done, machine, commit, threads)
        print(f"## {name}: exit {code}, {seconds:.0f} s", flush=True)
    print("\n## summary: each step's exit status and seconds, then every goal line")
    for s in done:
        goals = [line.strip() for line in Path(s["output"]).read_text(errors="replace")
                 .splitlines() if line.lower().startswith("goal")]
        print(f"{s['name']}: exit {s['exit']}, {s['seconds']:.0f} s"
              + "".join(f"\n    {g}" for g in goals))
    failed = [s["name"] for s in done if s["exit"]]
    print(f"\nwrote {args.outdir / 'gpu-section.md'} in {time.perf_counter() - start:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
