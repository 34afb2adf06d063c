"""benchmarks/RESULTS.md as the current truth: one section per (benchmark, machine), each the
latest run of that benchmark on that machine. A run replaces only its own sections; the others
stay, so results of an Intel Xeon and an AMD EPYC can both be current. History is git's.

Each section starts with a marker line the parser keys on (``<!-- result: NAME | MACHINE -->``),
then its heading, one line naming the command, CPU, threads, torch, date, load and commit, and the
benchmark's own output. The file is written to a temporary file beside it and renamed into place,
so a reader (or a crash) never sees half a file.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

MARKER = re.compile(r"^<!-- result: (?P<name>[^|]+?) \| (?P<machine>.+?) -->$", re.M)
HEAD = """# Benchmark results

The current result of each benchmark on each machine, one section per (benchmark, machine),
written by `python benchmarks/run_all.py [--quick] [--only NAME ...]` (and, for a GPU,
`benchmarks/gpu.py --merge`): a run replaces the sections of the benchmarks it ran on its
machine and keeps every other section. Older results, the A/B comparisons between commits
included, are in git history (`git log -p benchmarks/RESULTS.md`; the last file that held them
is the one at {journal}). The box these ran on may be shared: read the ratios (each against an
anchor measured interleaved in the same process), not the milliseconds.
"""
JOURNAL = "commit 9ae4871"
# The file's order of benchmarks, one for every writer (run_all.py and gpu.py --merge), so a run
# on one machine never reorders the sections another wrote; a name not here sorts after them.
ORDER = ["ceilings", "attention", "weights", "generate", "train", "bert", "head_view",
         "cli_startup", "llama_decode", "prune", "busy", "importance", "hf", "gguf_load", "stats",
         "peers", "long", "kv", "tests"]


@dataclass(frozen=True)
class Section:
    """One benchmark's current result on one machine; ``body`` is everything after the marker."""

    name: str
    machine: str
    body: str

    @property
    def key(self) -> tuple[str, str]:
        return self.name, self.machine

    def render(self) -> str:
        return f"<!-- result: {self.name} | {self.machine} -->\n{self.body.strip()}\n"


def machine(cpu_model: str, cpus: int) -> str:
    """The machine key: the CPU model and how many CPUs this process may use."""
    return f"{cpu_model}, {cpus} CPUs"


def make(name: str, machine_key: str, *, command: str, threads: int, torch_version: str,
         date: str, load: float, commit: str, seconds: float, output: str) -> Section:
    """A section from one run of ``command`` and its printed ``output``."""
    header = (f"## {name} — {machine_key}\n\n`{command}`: {date}, torch {torch_version}, "
              f"{threads} threads, load average {load:.1f} at the start, commit {commit}, "
              f"{seconds:.0f} s\n")
    return Section(name, machine_key, f"{header}\n{as_markdown(output.strip())}")


def as_markdown(text: str) -> str:
    """A script's output under the section: its ``#`` headings two levels down; output with no
    markdown table (a fixed-width text table) in a code block, so its columns stay aligned."""
    lines = text.splitlines()
    if not any(line.startswith("|") for line in lines):
        return "```\n" + text.replace("```", "` ` `") + "\n```"
    return "\n".join("##" + line if line.startswith("#") else line for line in lines)


def parse(text: str) -> list[Section]:
    """The sections of a RESULTS.md (text before the first marker is the file's head)."""
    found = list(MARKER.finditer(text))
    return [Section(m["name"], m["machine"],
                    text[m.end():found[k + 1].start() if k + 1 < len(found) else len(text)])
            for k, m in enumerate(found)]


def merge(old: list[Section], new: list[Section], order: list[str]) -> list[Section]:
    """``old`` with every section of the same (name, machine) as one in ``new`` replaced, the new
    ones added; sorted by benchmark (``order``; names not in it last, by name), then machine."""
    by_key = {s.key: s for s in old}
    by_key.update({s.key: s for s in new})
    rank = {name: k for k, name in enumerate(order)}
    return sorted(by_key.values(),
                  key=lambda s: (rank.get(s.name, len(rank)), s.name, s.machine))


def render(sections: list[Section]) -> str:
    return HEAD.format(journal=JOURNAL) + "".join("\n" + s.render() for s in sections)


def update(path: Path, new: list[Section], order: list[str]) -> None:
    """Merge ``new`` into the file at ``path`` (created if missing) and write it atomically."""
    old = parse(path.read_text(encoding="utf-8")) if path.exists() else []
    write_atomic(path, render(merge(old, new, order)))


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file in the same folder and one rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def commit(repo: Path) -> str:
    """The checked-out commit (short), ``+changes`` when the tree differs from it; ``unknown``
    outside git."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=30, check=True).stdout
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.strip() + ("+changes" if dirty.strip() else "")
