"""The package: its public names, an import graph without cycles, and the size and test-mirror
rules of the tree (what each wing may import, and the private-name rules: tests/test_wings.py).

The graph counts every ``import`` of a headwise module anywhere in a file, including imports
inside functions, and the packages Python initialises on the way to that module: if the graph
with those edges is acyclic, no function-level import exists to dodge a cycle (each one could
move to the top of its file without creating one)."""

from __future__ import annotations

import ast
import importlib
import re
import types
from pathlib import Path

import pytest

import headwise
import headwise.decoding
import headwise.per_head

SRC = Path(headwise.__file__).resolve().parent


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources(root: Path) -> dict[str, tuple[str, ast.Module]]:
    """``{module: (its package, its parsed source)}`` for every ``.py`` file under ``root``; a
    package is its own package (``from . import x`` in an ``__init__.py`` reads from it)."""
    found = {}
    for path in root.rglob("*.py"):
        name = _module_name(path, root)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found[name] = package, ast.parse(path.read_text(), filename=str(path))
    return found


def _packages_run(target: str, package: str) -> set[str]:
    """What importing ``target`` runs, seen from a module in ``package``: ``target`` and every
    package above it, less ``package`` and its own ancestors (those are being initialised
    already, which is why ``from . import x`` inside a package never waits on the package)."""
    parts = target.split(".")
    prefixes = {".".join(parts[:n]) for n in range(1, len(parts))}
    parts = package.split(".")
    mine = {".".join(parts[:n]) for n in range(1, len(parts) + 1)}
    return {target} | (prefixes - mine)


def from_base(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from`` import reads from: a relative one climbs ``node.level - 1``
    packages from ``package``, the package of the importing file."""
    if not node.level:
        return node.module or ""
    up = package.split(".")[:len(package.split(".")) - node.level + 1]
    return ".".join(up + ([node.module] if node.module else []))


def _imported(node: ast.Import | ast.ImportFrom, package: str, files) -> set[str]:
    """The modules one import statement names: ``import a.b.c`` names ``a.b.c``;
    ``from p import m`` names ``p.m`` when that is a module, else ``p`` (``m`` is a name in it)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = from_base(node, package)
    return {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}


def import_graph(root: Path = SRC) -> dict[str, set[str]]:
    """``{module: {headwise modules whose code importing it runs}}`` over every ``.py`` file
    under ``root``: each module it imports and the packages above that module which Python
    initialises first (``from headwise.models.heads import x`` in ``headwise.analysis.prune``
    runs ``headwise/models/__init__.py`` before ``heads.py``)."""
    files = sources(root)
    graph: dict[str, set[str]] = {}
    for name, (package, tree) in files.items():
        targets: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _imported(node, package, files):
                    targets |= _packages_run(target, package)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None (depth-first search)."""
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_import_graph_of_headwise_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 30 and "headwise.layers" in graph["headwise.per_head"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_cycle(tmp_path):
    """The checker itself can fail: a function-level import that closes a loop is reported."""
    pkg = tmp_path / "headwise"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("from . import lm\n")
    (pkg / "models" / "lm.py").write_text("from headwise import layers\n")
    (pkg / "layers.py").write_text("def f():\n    from headwise.models.lm import X\n")
    graph = import_graph(pkg)
    assert graph["headwise.models"] == {"headwise.models.lm"}
    assert find_cycle(graph) == ["headwise.layers", "headwise.models", "headwise.models.lm",
                                 "headwise.layers"]
    (pkg / "layers.py").write_text("def f():\n    return 1\n")
    assert find_cycle(import_graph(pkg)) is None


@pytest.mark.parametrize("statement, runs", [
    ("from headwise.models._heads import X", {"headwise.models", "headwise.models._heads"}),
    ("import headwise.models._heads", {"headwise.models", "headwise.models._heads"}),
    ("from .models import _heads", {"headwise.models", "headwise.models._heads"}),
    ("from .models._heads import X", {"headwise.models", "headwise.models._heads"}),
    ("from headwise.models import X", {"headwise.models"}),  # a name: the package alone
])
def test_an_import_runs_the_packages_above_the_module_it_names(tmp_path, statement, runs):
    """The cycle of 98de0c0, planted: ``prune`` imports ``models._heads`` inside a function,
    which runs ``models/__init__.py`` first, which imports ``models.lm``, which imports
    ``prune``. A module's own packages are no edge (they are being initialised already)."""
    pkg = tmp_path / "headwise"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("from headwise.models import lm\nX = 1\n")
    (pkg / "models" / "_heads.py").write_text("X = 1\n")
    (pkg / "models" / "lm.py").write_text("from headwise import prune\n"
                                          "from headwise.models import _heads\n")
    (pkg / "prune.py").write_text(f"def f():\n    {statement}\n")
    graph = import_graph(pkg)
    assert graph["headwise.prune"] == runs
    assert graph["headwise.models.lm"] == {"headwise.prune", "headwise.models._heads"}
    assert find_cycle(graph) == ["headwise.models", "headwise.models.lm", "headwise.prune",
                                 "headwise.models"]
    (pkg / "models" / "lm.py").write_text("from headwise.models import _heads\n")
    assert find_cycle(import_graph(pkg)) is None  # the rule moved: prune no longer imported


def test_public_functions_shadow_no_module():
    """``headwise.generate`` is the function, its module is ``headwise.decoding``; the per-head
    form lives in ``headwise.per_head`` and ``headwise.heads`` imports no model code."""
    assert headwise.generate is headwise.decoding.generate
    assert isinstance(headwise.generate, types.FunctionType)
    assert not (SRC / "generate.py").exists()
    assert headwise.PerHeadAttention is headwise.per_head.PerHeadAttention
    assert headwise.fuse is headwise.per_head.fuse and headwise.unfuse is headwise.per_head.unfuse
    assert import_graph()["headwise.heads"] == set()
    for name in headwise.__all__:
        assert hasattr(headwise, name), name


def test_no_public_name_is_both_a_function_and_a_submodule():
    """Every public name that is not itself a submodule comes from a module of another name, so
    importing a submodule never rebinds a public function (``headwise.attention`` is the
    function from ``headwise.attend``, ``trace`` from ``headwise.tracing``)."""
    submodules = ({p.stem for p in SRC.glob("*.py")}
                  | {p.parent.name for p in SRC.glob("*/__init__.py")})
    for name, module in headwise._EXPORTS.items():
        if module is None:
            assert name in submodules, name
        else:
            assert name not in submodules, f"headwise.{name} names a function and a module"
    importlib.import_module("headwise.attend")  # binding the submodule leaves the function alone
    assert isinstance(headwise.attention, types.FunctionType)
    assert headwise.attention is headwise.attend.attention


# A module over the limit becomes a package (a folder of modules, each named for what it
# holds), not a sibling ``_x.py`` beside it; and it never loses its explanation (docstrings,
# comments saying why) to fit.
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60  # from the `def` line to the last line of the body, docstring included


def oversized(root: Path = SRC) -> list[str]:
    """Every module over :data:`MAX_MODULE_LINES` and every function (methods and nested ones
    included) over :data:`MAX_FUNCTION_LINES` under ``root``, as ``path: what (n lines)``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(root).as_posix()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found.append(f"{where}: module ({len(text.splitlines())} lines)")
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    found.append(f"{where}: {node.name} ({n} lines)")
    return found


def test_no_module_over_400_lines_and_no_function_over_60():
    assert oversized() == []


def test_the_size_check_finds_a_long_module_and_a_long_method(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "a.py").write_text(f"class A:\n    def long(self):\n{body}")
    (tmp_path / "b.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "c.py").write_text("def short():\n" + "    x = 1\n" * (MAX_FUNCTION_LINES - 1))
    assert oversized(tmp_path) == [f"a.py: long ({MAX_FUNCTION_LINES + 1} lines)",
                                   f"b.py: module ({MAX_MODULE_LINES + 1} lines)"]


TESTS = Path(__file__).resolve().parent


def mirrors(path: Path, root: Path = SRC) -> tuple[Path, Path]:
    """The test files of a source file: ``headwise/P/X.py`` -> ``tests/P/test_X.py``, or its
    float64/torch/HF comparison ``tests/reference/P/test_X.py``; a package's ``P/__init__.py``
    -> ``tests/P/test_init.py`` (``headwise/__init__.py`` -> this file)."""
    rel = path.relative_to(root)
    name = f"test_{'init' if rel.name == '__init__.py' else rel.stem}.py"
    return TESTS / rel.parent / name, TESTS / "reference" / rel.parent / name


def unmirrored(root: Path = SRC) -> list[str]:
    """Source files that define a function or class but have no test file of their own
    (``__main__.py`` and re-export-only ``__init__.py`` files define none: nothing of their own
    to test, and ``python -m`` runs are covered end to end)."""
    missing = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        defines = any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      for node in ast.walk(tree))
        own = mirrors(path, root)
        if defines and not any(p.exists() for p in own):
            missing.append(own[0].relative_to(TESTS).as_posix())
    return missing


def test_every_source_file_has_its_mirrored_test_file():
    assert unmirrored() == []


def test_the_mirror_check_names_a_planted_module_without_tests(tmp_path):
    pkg = tmp_path / "headwise_never_tested"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""only a docstring"""\n')
    (pkg / "sub" / "__init__.py").write_text("from os import path\n")
    (pkg / "sub" / "_private.py").write_text("def f():\n    return 1\n")
    assert unmirrored(pkg) == ["sub/test__private.py"]


DOCS = (TESTS.parent / "README.md", *sorted((TESTS.parent / "docs").glob("*.md")))


def documented_paths() -> list[str]:
    """Every dotted ``headwise.X.Y`` the README and docs/*.md name (module or attribute)."""
    found = set()
    for doc in DOCS:
        found.update(re.findall(r"\bheadwise(?:\.[A-Za-z_]\w*)+", doc.read_text()))
    return sorted(found)


def resolves(path: str) -> bool:
    """Whether ``path`` imports: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def test_every_public_name_and_documented_path_still_imports():
    """The regrouping into wings moved files, not the public surface: each name in
    ``headwise.__all__`` and each ``headwise.X`` path the README and docs name resolves, and
    the documented set is not empty (the scan itself works)."""
    for name in headwise.__all__:
        assert getattr(headwise, name) is not None, name
    paths = documented_paths()
    assert {"headwise.viz.heatmaps", "headwise.train", "headwise.step.DecodeStep"} <= set(paths)
    assert [p for p in paths if not resolves(p)] == []
    assert not resolves("headwise.prune.restructure") and not resolves("headwise._rows")
