"""How fast the command line answers ``--help`` (issue 15: under one second here).

    .venv/bin/python benchmarks/cli_startup.py [--rounds 7]

Runs, in interleaved rounds, fresh processes of ``headwise --help``, ``headwise COMMAND --help``
for every command, and two anchors: a bare interpreter (``python -c pass``, the floor) and
``python -c "import torch"`` (what every ``--help`` cost when torch was imported eagerly).
Prints medians, the ratio to the torch-import anchor, and whether each is under 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).with_name("headwise")
GOAL_S = 1.0


def _cases() -> dict[str, list[str]]:
    from headwise.cli import command_names

    cases = {"python -c pass": [sys.executable, "-c", "pass"],
             "python -c 'import torch'": [sys.executable, "-c", "import torch"],
             "headwise --help": [str(BIN), "--help"]}
    for name in command_names():
        cases[f"headwise {name} --help"] = [str(BIN), name, "--help"]
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    cases = _cases()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):  # interleaved: load on the box hits every case alike
        for name, cmd in cases.items():
            t = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - t)
    anchor = statistics.median(times["python -c 'import torch'"])
    print(f"{'command':<32} {'median s':>9} {'min s':>7} {'vs import torch':>16}  < {GOAL_S:g} s")
    for name, ts in times.items():
        med = statistics.median(ts)
        goal = "" if name.startswith("python") else ("yes" if med < GOAL_S else "NO")
        print(f"{name:<32} {med:>9.3f} {min(ts):>7.3f} {med / anchor:>15.2f}x  {goal}")
    print(f"({args.rounds} interleaved rounds; fresh process each; {sys.platform}, "
          f"{subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores)")


if __name__ == "__main__":
    main()
