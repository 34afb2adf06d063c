"""Thread settings on a busy CPU: ``chat``, ``train austen`` and generation, each run with a busy
loop on every core beside it, at the default settings and at ``--threads 1``.

Why: torch's OpenMP runtime (libgomp) lets a thread that waits at the end of a parallel region
spin for ~300,000 iterations before it sleeps. When every core also runs another process, the
thread the region waits for is often descheduled, and the spinning threads burn the time slices
it needs: `chat` once fell from 12-18 to ~1 token/s at 2 threads. headwise therefore asks
libgomp to sleep at once (``OMP_WAIT_POLICY=PASSIVE``, see :func:`headwise.limits.wait_policy`)
unless the user chose a policy; the "libgomp spin" row puts libgomp's own default back
(``GOMP_SPINCOUNT=300000``, its value when no policy is set) to show what the policy saves.

Each candidate runs in a fresh process (the policy is read once, when torch loads libgomp), the
candidates interleaved round by round; the table gives medians. ``chat``: the decode rate it
prints (tokens/s after the first token). ``train austen``: the run-time estimate it prints
before the first step, against the time the whole run would take at the step rate of its first
``--train-seconds`` (steps after the third, read from the progress bar through a pseudo-
terminal). ``generate``: ``headwise.generate`` of benchmarks/generate.py's toy model (4.7M
parameters), batch 1, tokens/s of a cached run. The busy loops (``python -c 'while True:
pass'``, one per CPU unless ``--busy N``) are killed in a ``finally``, and die with this process
even if it is killed (``PR_SET_PDEATHSIG``).

Settings (``--settings``): ``default``, ``threads1`` (``--threads 1``), ``spin`` (libgomp's
default spin), ``passive`` (the policy set by hand) and ``spin10k`` (``GOMP_SPINCOUNT=10000``,
a shorter spin: measured 4.9 tokens/s in chat against 17.7 passive, so not the policy).

    python benchmarks/busy.py [--only chat train generate] [--rounds 2] [--busy N]
        [--settings default threads1 spin] [--train-seconds 40]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import pty
import re
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(SRC))
import _common as C  # noqa: E402
from headwise import limits  # noqa: E402  (torch-free)

# name -> (label, extra command-line arguments, extra environment)
SETTINGS = {
    "default": ("default", [], {}),
    "threads1": ("--threads 1", ["--threads", "1"], {}),
    "spin": ("libgomp spin (before)", [], {"GOMP_SPINCOUNT": "300000"}),
    "passive": ("OMP_WAIT_POLICY=PASSIVE", [], {"OMP_WAIT_POLICY": "PASSIVE"}),
    "spin10k": ("GOMP_SPINCOUNT=10000", [], {"GOMP_SPINCOUNT": "10000"}),
}
CHAT_PROMPT = "Count from 1 to 100 in words, separated by commas."
GENERATE = """
import sys, time
import headwise  # first, as a headwise user's script would: its thread policy applies
import torch
sys.path.insert(0, {here!r})
from generate import build_model
if {threads}:
    torch.set_num_threads({threads})
model = build_model()
prompt = torch.randint(0, 4096, (1, 16), generator=torch.Generator().manual_seed(1))
with torch.inference_mode():
    headwise.generate(model, prompt, max_new_tokens=16)
    t = time.perf_counter()
    headwise.generate(model, prompt, max_new_tokens={new})
    print({new} / (time.perf_counter() - t), torch.get_num_threads())
"""


def _die_with_parent() -> None:
    """In a child, before exec: SIGKILL it when the parent dies (Linux prctl PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


@contextlib.contextmanager
def busy_loops(n: int):
    """``n`` processes spinning ``while True: pass``, killed (and reaped) on the way out."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                          preexec_fn=_die_with_parent))
        time.sleep(0.5)
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _env(extra: dict) -> dict:
    """This environment without any OpenMP wait setting of the caller's, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    return dict(env, **extra)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "headwise", *args]


def run_chat(args: list[str], env: dict, new: int) -> dict:
    proc = subprocess.run(_cli("chat", CHAT_PROMPT, "--max-new-tokens", str(new), *args),
                          capture_output=True, text=True, env=env, timeout=1800,
                          preexec_fn=_die_with_parent)
    found = re.search(r"(\d+) new tokens.*then ([\d.]+) tok/s; .*, (\d+) threads", proc.stderr)
    if proc.returncode or not found:
        raise RuntimeError(f"chat failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {"tok/s": float(found[2]), "tokens": int(found[1]), "threads": int(found[3])}


_UNITS = {"s": 1, "min": 60, "h": 3600}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_train(args: list[str], env: dict, seconds: float) -> dict:
    """``train austen`` under a pseudo-terminal (so the progress bar renders) for ``seconds``
    after its first step; then killed with its process group."""
    master, slave = pty.openpty()
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.Popen(_cli("train", "austen", "--out", out, *args), stdin=slave,
                                stdout=slave, stderr=slave, env=dict(env, COLUMNS="200"),
                                start_new_session=True, preexec_fn=_die_with_parent)
        os.close(slave)
        text, steps, deadline, timed_from = "", [], time.monotonic() + 900, None
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                ready, _, _ = select.select([master], [], [], 0.2)
                if ready:
                    try:
                        text += ANSI.sub("", os.read(master, 65536).decode(errors="replace"))
                    except OSError:
                        break
                done = re.findall(r"(\d+)/(\d+) loss", text[-2000:])
                now = time.monotonic()
                if done and (not steps or int(done[-1][0]) != steps[-1][1]):
                    steps.append((now, int(done[-1][0]), int(done[-1][1])))
                    if timed_from is None and steps[-1][1] >= 3:
                        timed_from = now
                if timed_from is not None and now - timed_from >= seconds:
                    break
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            os.close(master)
    est = re.search(r"estimate about ([\d.]+) (s|min|h) for steps (\d+)-(\d+)", text)
    late = [s for s in steps if s[1] >= 3]
    if not est or len(late) < 2:
        raise RuntimeError(f"train printed no estimate or too few steps:\n{text[-3000:]}")
    (t0, k0, total), (t1, k1, _) = late[0], late[-1]
    step_s = (t1 - t0) / (k1 - k0)
    estimate = float(est[1]) * _UNITS[est[2]]
    eta = re.findall(r"ETA\s+(\d+):(\d\d):(\d\d)", text)
    shown = (int(eta[-1][0]) * 3600 + int(eta[-1][1]) * 60 + int(eta[-1][2])) if eta else None
    return {"estimate s": estimate, "projected s": step_s * total, "s/step": step_s,
            "steps timed": k1 - k0, "bar ETA s": shown}


def run_generate(args: list[str], env: dict, new: int) -> dict:
    threads = int(args[args.index("--threads") + 1]) if "--threads" in args else 0
    code = GENERATE.format(here=str(HERE), threads=threads, new=new)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=1800, preexec_fn=_die_with_parent)
    if proc.returncode:
        raise RuntimeError(f"generate failed: {proc.stderr[-2000:]}")
    rate, threads = proc.stdout.split()[-2:]
    return {"tok/s": float(rate), "threads": int(threads)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=("chat", "train", "generate"),
                    default=["chat", "train", "generate"])
    ap.add_argument("--settings", nargs="+", choices=sorted(SETTINGS),
                    default=["default", "threads1", "spin"])
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds per tool")
    ap.add_argument("--busy", type=int, default=limits.cpu_count(),
                    help="busy loops beside each run (default: one per CPU; 0 for an idle run)")
    ap.add_argument("--chat-tokens", type=int, default=48)
    ap.add_argument("--generate-tokens", type=int, default=256)
    ap.add_argument("--train-seconds", type=float, default=40.0)
    args = ap.parse_args()
    import torch
    load = os.getloadavg()
    print(f"# {limits.cpu_model()}, {limits.cpu_count()} CPUs, torch {torch.__version__}; "
          f"{args.busy} busy loops; load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
          f"(1 / 5 / 15 min) before they start; {args.rounds} rounds, medians\n", flush=True)
    rows = []
    with busy_loops(args.busy):
        for tool in args.only:
            results: dict[str, list[dict]] = {s: [] for s in args.settings}
            for r in range(args.rounds):
                order = args.settings[r % len(args.settings):] + args.settings[:r % len(args.settings)]
                for s in order:
                    label, extra, env = SETTINGS[s]
                    env = _env(env)
                    if tool == "chat":
                        res = run_chat(extra, env, args.chat_tokens)
                    elif tool == "train":
                        res = run_train(extra, env, args.train_seconds)
                    else:
                        res = run_generate(extra, env, args.generate_tokens)
                    results[s].append(res)
                    print(f"  {tool} {label}: {res}", file=sys.stderr, flush=True)
            rows += _rows(tool, results)
    cols = ["tool", "setting", "threads", "tokens/s", "printed estimate", "projected run",
            "projected / estimate", "time vs --threads 1"]
    print(f"\n## Beside {args.busy} busy loops ({limits.cpu_count()} CPUs)\n")
    print(C.table(rows, cols))
    return 0


def _rows(tool: str, results: dict[str, list[dict]]) -> list[dict]:
    def med(s, key):
        vals = [r[key] for r in results[s] if r.get(key) is not None]
        return statistics.median(vals) if vals else None
    rows = []
    base = "threads1" if "threads1" in results else None
    for s in results:
        label = SETTINGS[s][0]
        threads = results[s][0].get("threads") or ("1" if s == "threads1" else "torch's")
        row = {"tool": tool, "setting": label, "threads": threads}
        if tool == "train":
            est, proj = med(s, "estimate s"), med(s, "projected s")
            row.update({"printed estimate": _fmt_s(est), "projected run": _fmt_s(proj),
                        "projected / estimate": proj / est})
            if base:
                row["time vs --threads 1"] = proj / med(base, "projected s")  # > 1: slower
        else:
            rate = med(s, "tok/s")
            row["tokens/s"] = rate
            if base:
                row["time vs --threads 1"] = med(base, "tok/s") / rate  # > 1: slower
        rows.append(row)
    return rows


def _fmt_s(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min"


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    sys.exit(main())
