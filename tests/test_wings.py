"""The wings of headwise and what each may import: one table, :data:`WINGS`, checked against
every import of every module under ``src/headwise`` (module level and inside functions, ``from
. import x``, relative imports resolved) and against each wing package's docstring.

A *wing* is a subpackage of ``headwise`` (``fast``, ``models``, ...) or a top-level module
(``stats``, ``masks``, ...); ``headwise`` is the package's own ``__init__``. A row may also name
one module of a wing (``hf.tools``): its imports are allowed by its own row and its wing's.
Imports within a wing are free. Besides :data:`WINGS`, two rules on private names: no module
imports another module's private name (``from x import _name``, ``x._name``), and a private
module (``models._checks``) is imported only from inside the package that holds it, unless
:data:`EXEMPTIONS` lists the import with the reason.

Not seen: imports by a computed name (``importlib.import_module(f"headwise.{name}")``: the
package's lazy exports, the command discovery of :mod:`headwise.cli` and ``commands.heads``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.test_init import SRC, from_base, sources

ANYTHING = "anything"  # a `may` entry: every module of headwise


@dataclass(frozen=True)
class Rule:
    """What one wing (or one module of it, when its key is dotted) may import besides
    :data:`LEAVES`. ``may``: wings or modules (``train.evaluate``: that module and any module
    under it); ``never``: modules under ``may`` it still may not import; ``leaf``: it imports
    nothing of headwise, the leaves included."""

    holds: str
    may: frozenset[str] = frozenset()
    never: frozenset[str] = frozenset()
    leaf: bool = False


def rule(holds: str, *may: str, never: tuple[str, ...] = ()) -> Rule:
    return Rule(holds, frozenset(may), frozenset(never))


def leaf(holds: str) -> Rule:
    return Rule(holds, leaf=True)


# The decoding kernels: only the decode wing (and the speed layer itself) calls them.
DECODING_KERNELS = ("fast.rows", "fast.native")

# Imported by every wing; they import nothing of headwise.
LEAVES = frozenset({"errors", "limits", "kinds", "finders", "_device", "_io", "_lazy",
                    "_progress"})

# The one table of the wings' import rules. The wing packages' docstrings say the same in their
# "May import" sentence (checked below: test_each_wing_docstring_says_what_its_row_says).
WINGS: dict[str, Rule] = {
    # the leaves and the other modules that import nothing of headwise
    "errors": leaf("the exception types and the user-error rule"),
    "limits": leaf("sizes, memory and thread policy from a config alone; torch-free"),
    "kinds": leaf("the attention-kinds table; torch-free"),
    "finders": leaf("the registry of other libraries' attention-layer finders"),
    "_device": leaf("device parsing and tensor-device checks"),
    "_io": leaf("atomic file writes"),
    "_lazy": leaf("public names a package loads on first use"),
    "_progress": leaf("the one progress bar (rich)"),
    "heads": leaf("split/merge patterns, head selections, the pruning plan"),
    "observe": leaf("the observer channel and its step table"),
    "strict": leaf("strict mode"),
    # the attention core, bottom up
    "_swap": rule("swapping a file into place"),
    "masks": rule("mask builders and the mask rules"),
    "fast": rule("the speed layer: C kernels, layouts, huge pages; changes no value",
                 "masks", "heads", "observe"),
    "weights": rule("exact per-head weights from the log-sum-exp", "masks", "fast"),
    "attend": rule("the attention function and its backends",
                   "masks", "heads", "weights", "strict", "observe", "fast"),
    "rope": rule("rotary position embedding", "fast"),
    "cache": rule("the KV cache", "fast"),
    "kvplan": rule("the head-wise KV plan: which groups stream, the sinks + window rule"),
    "stats": rule("per-head statistics of attention calls",
                  "masks", "observe", "weights", "fast"),
    "layers": rule("MultiHeadAttention, its options and its checks",
                   "masks", "heads", "attend", "cache", "rope", "observe", "stats", "fast",
                   never=DECODING_KERNELS),
    "per_head": rule("the literal per-head form of a layer", "attend", "layers"),
    # models and what runs them
    "models": rule("the transformer models on headwise's attention",
                   "masks", "heads", "attend", "weights", "observe", "rope", "cache", "layers",
                   "fast", never=DECODING_KERNELS),
    "decode": rule("the one-row forms, the step, generate, the cache's NaN vouching",
                   "models", "layers", "attend", "fast", "cache", "rope", "observe", "kvplan"),
    "step": rule("headwise.step for users: re-exports the decode wing's step", "decode"),
    "decoding": rule("headwise.decoding for users: re-exports generate", "decode"),
    "installed": rule("the table of real models the packages install; torch-free"),
    "checkpoint": rule("saving and loading a model with its tokenizer",
                       "_swap", "models", "data"),
    "data": rule("training data: tasks, tokenizers, corpora"),
    "pretrained": rule("real checkpoints on headwise attention: BERT, GGUF",
                       "models", "fast", "data", "decode", "installed"),
    "train": rule("the trainer", "models", "data", "checkpoint", "decode", "fast"),
    "train.__main__": rule("python -m headwise.train", "commands.train"),
    # the tools, the views, other libraries, the command line
    "tracing": rule("the named-axis shape trace", "observe", "layers"),
    "viz": rule("heatmaps, the head view, the catalogue page, rollout",
                "masks", "heads", "observe", "attend", "weights", "layers", "models"),
    "hf": rule("headwise as a transformers attention implementation",
               "attend", "weights", "heads", "observe", "installed", "kvplan", "decode.ragged"),
    "hf.tools": rule("the head view, trace and loss of a transformers model", "tracing", "viz"),
    "analysis": rule("the head tools: ablation, importance, pruning, the catalogue",
                     "masks", "heads", "attend", "weights", "observe", "stats", "layers", "fast",
                     "models", "data", "train.evaluate", "hf", "kvplan", "decode.ragged"),
    "lens": rule("TransformerLens' activation cache and hooks on the fused path",
                 "masks", "observe", "weights", "layers", "models", "analysis", "hf", "viz"),
    "analysis.catalogue": rule("the head catalogue (its page: viz)", "viz.catalogue"),
    "long": rule("per-head long-context statistics in one streaming pass",
                 "masks", "heads", "attend", "weights", "observe", "stats", "layers", "fast",
                 "data", "hf", "kvplan"),
    "commands": rule("one module per subcommand", ANYTHING),
    "cli": rule("the command line", "commands", "headwise"),
    "__main__": rule("python -m headwise", "cli"),
    "headwise": rule("the public names (imported by name on first use)"),
}

# (importer, private module or name it imports) -> why; each one is still used (tested)
EXEMPTIONS: dict[tuple[str, str], str] = {
    ("decode.generation", "models._checks"): "generate checks its prompt with the models' own "
                                             "boundary checks (ids within the vocabulary)",
}


def short(module: str) -> str:
    """``headwise.fast.roof`` -> ``fast.roof``; the package itself stays ``headwise``."""
    return module.partition(".")[2] if "." in module else module


def under(module: str, entry: str) -> bool:
    return module == entry or module.startswith(entry + ".")


def rows_of(module: str, wings: dict[str, Rule]) -> list[Rule]:
    """The rows that govern ``module`` (short name): its wing's and any of a module over it."""
    return [r for key, r in wings.items() if under(module, key) and (key == module.split(".")[0]
                                                                   or "." in key)]


def allowed(importer: str, target: str, wings: dict[str, Rule]) -> bool:
    """Whether short-named ``importer`` may import short-named ``target`` by ``wings``."""
    if target.split(".")[0] == importer.split(".")[0] and target != "headwise":
        return True  # within a wing
    rows = rows_of(importer, wings)
    if any(r.leaf for r in rows):
        return False
    may = set(LEAVES).union(*(r.may for r in rows))
    never = set().union(*(r.never for r in rows))
    return (ANYTHING in may or any(under(target, e) for e in may)) and not any(
        under(target, e) for e in never)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _named(node: ast.Import | ast.ImportFrom, package: str, files) -> list[tuple[str, str]]:
    """``(module named, name imported from it or "")`` for each alias of one import statement:
    ``from p import m`` names module ``p.m`` when that is a module, else ``p`` (``m`` a name)."""
    if isinstance(node, ast.Import):
        return [(a.name, "") for a in node.names]
    base = from_base(node, package)
    return [(f"{base}.{a.name}", "") if f"{base}.{a.name}" in files else (base, a.name)
            for a in node.names]


def _private_module_use(importer: str, module: str) -> str | None:
    """The first private module of ``module``'s path that ``importer`` is outside of."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        package = ".".join(parts[:i])
        if _is_private(part) and not under(importer, package):
            return ".".join(parts[:i + 1])
    return None


@dataclass
class Check:
    """What :func:`check` found: broken rules as ``importer -> target (why)`` lines, and the
    exemptions that excused an import."""

    broken: list[str] = field(default_factory=list)
    exempted: set[tuple[str, str]] = field(default_factory=set)


def check(root: Path = SRC, wings: dict[str, Rule] = WINGS,
          exemptions: dict[tuple[str, str], str] = EXEMPTIONS) -> Check:
    """Every import under ``root`` (a ``headwise`` package folder) against ``wings`` and the
    private-name rules."""
    files = sources(root)
    out = Check()
    for name, (package, tree) in sorted(files.items()):
        me = short(name)
        if not rows_of(me, wings):
            out.broken.append(f"{me}: wing {me.split('.')[0]!r} has no row in WINGS; add one")
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for module, attr in _named(node, package, files):
                if module.split(".")[0] != "headwise":
                    continue
                target = short(module)
                problems = [] if allowed(me, target, wings) else ["not in its row of WINGS"]
                private = None
                if (owner := _private_module_use(name, module)) is not None:
                    private, why = short(owner), f"private module {short(owner)}"
                elif attr and _is_private(attr) and module != name:
                    private, why = f"{target}.{attr}", f"private name {attr}"
                    target = private
                if private is not None and (me, private) in exemptions:
                    out.exempted.add((me, private))
                elif private is not None:
                    problems.append(why)
                out.broken += [f"{me} -> {target} (line {node.lineno}: {p})" for p in problems]
    out.broken = sorted(set(out.broken))
    return out


def test_every_import_keeps_to_the_wing_table():
    found = check()
    assert found.broken == [], "broken wing rules:\n" + "\n".join(found.broken)


def test_every_exemption_is_still_needed():
    """An exemption whose import went away (or moved: the decode/ wing) is stale: remove or
    move it, so that the table never excuses what no module does."""
    assert check().exempted == set(EXEMPTIONS)


def test_the_table_names_only_real_wings_and_modules():
    modules = {short(n) for n in sources(SRC)}
    wings = {m.split(".")[0] for m in modules}
    named = set(WINGS) | {e for r in WINGS.values() for e in r.may | r.never} | LEAVES
    assert sorted(e for e in named - {ANYTHING} if e not in modules) == []
    assert sorted(wings - set(WINGS)) == []  # (check() also reports a wing with no row)


def _plant(tmp_path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "headwise"
    for rel, text in {"__init__.py": "", **files}.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


TOY = {"errors": leaf("errors"), "heads": leaf("patterns"),
       "fast": rule("speed", "heads"), "models": rule("models", "fast", never=("fast.rows",)),
       "train": rule("trainer", "models"), "train.__main__": rule("main", "commands"),
       "commands": rule("commands", ANYTHING), "headwise": rule("root")}


@pytest.mark.parametrize("source, broken", [
    ("from headwise import models\n", ["fast.roof -> models (line 1: not in its row of WINGS)"]),
    ("def f():\n    from ..models import lm\n",  # function level, relative
     ["fast.roof -> models.lm (line 2: not in its row of WINGS)"]),
    ("import headwise.train.loop\n", ["fast.roof -> train.loop (line 1: not in its row of WINGS)"]),
    ("from headwise import MultiHeadAttention\n",  # a lazy public name hides its module
     ["fast.roof -> headwise (line 1: not in its row of WINGS)"]),
    ("from headwise.heads import split, _merge\n",
     ["fast.roof -> heads._merge (line 1: private name _merge)"]),
    ("from . import rows\nfrom .rows import x\nfrom headwise import errors, heads\n", []),
])
def test_the_checker_finds_a_planted_import_that_breaks_a_rule(tmp_path, source, broken):
    """The checker itself can fail: each planted import in ``fast/roof.py`` of a toy package
    breaks one rule (a model, a tool, the package's lazy names, a private name); the last
    imports only what ``fast`` may."""
    pkg = _plant(tmp_path, {"fast/__init__.py": "", "fast/roof.py": source, "fast/rows.py": "",
                            "models/__init__.py": "", "models/lm.py": "", "heads.py": "",
                            "errors.py": "", "train/__init__.py": "", "train/loop.py": ""})
    assert check(pkg, TOY, {}).broken == broken


def test_the_checker_knows_leaves_never_module_rows_and_private_modules(tmp_path):
    pkg = _plant(tmp_path, {
        "errors.py": "from headwise import heads\n",  # a leaf imports nothing
        "heads.py": "", "fast/__init__.py": "", "fast/rows.py": "", "fast/_kernels.py": "",
        "fast/plan.py": "from headwise.fast import _kernels\n",  # inside its package: fine
        "models/__init__.py": "from headwise.fast import rows, plan\n",  # rows: never
        "models/lm.py": "import headwise.fast._kernels\n",  # another package's private module
        "train/__init__.py": "", "train/loop.py": "from headwise.commands import run\n",
        "train/__main__.py": "from headwise.commands import run\n",  # its own row allows it
        "commands/__init__.py": "", "commands/run.py": "from headwise import train, heads\n",
        "stats.py": "from headwise import heads\n"})  # a wing with no row
    assert check(pkg, TOY, {}).broken == [
        "errors -> heads (line 1: not in its row of WINGS)",
        "models -> fast.rows (line 1: not in its row of WINGS)",
        "models.lm -> fast._kernels (line 1: private module fast._kernels)",
        "stats: wing 'stats' has no row in WINGS; add one",
        "train.loop -> commands.run (line 1: not in its row of WINGS)"]
    excused = check(pkg, TOY, {("models.lm", "fast._kernels"): "why"})
    assert "models.lm -> fast._kernels (line 1: private module fast._kernels)" not in \
        excused.broken and excused.exempted == {("models.lm", "fast._kernels")}


# ----------------------------------------------------------------------------- private names

def _module_of(expr: ast.expr, modules: dict[str, str], files) -> str | None:
    """The headwise module ``expr`` names (``h`` or ``headwise.models.heads``), or None."""
    if isinstance(expr, ast.Name):
        return modules.get(expr.id)
    if isinstance(expr, ast.Attribute) and (parent := _module_of(expr.value, modules, files)):
        return f"{parent}.{expr.attr}" if f"{parent}.{expr.attr}" in files else None
    return None


def private_attributes(root: Path = SRC) -> list[str]:
    """Every ``x._name`` under ``root`` where ``x`` is another headwise module bound by an import
    and ``_name`` is not itself a module, as ``importer -> owner._name`` (the import forms
    ``from x import _name`` are :func:`check`'s)."""
    files = sources(root)
    found = set()
    for name, (package, tree) in files.items():
        modules: dict[str, str] = {}  # local name -> the headwise module an import binds to it
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    modules[a.asname or a.name.partition(".")[0]] = (
                        a.name if a.asname else a.name.partition(".")[0])
            elif isinstance(node, ast.ImportFrom):
                base = from_base(node, package)
                for a in node.names:
                    if f"{base}.{a.name}" in files:
                        modules[a.asname or a.name] = f"{base}.{a.name}"
        modules = {k: v for k, v in modules.items() if v in files}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                owner = _module_of(node.value, modules, files)
                if owner not in (None, name) and f"{owner}.{node.attr}" not in files:
                    found.add(f"{name} -> {owner}.{node.attr}")
    return sorted(found)


def test_no_module_reads_another_modules_private_attribute():
    """A name another module needs is public, or the rule it holds moves to where it belongs."""
    assert private_attributes() == []


def test_the_private_attribute_check_finds_a_planted_one(tmp_path):
    pkg = _plant(tmp_path, {
        "models/__init__.py": "", "models/heads.py": "def layers(): ...\n",
        "stats.py": ("import headwise.weights\n"
                     "from headwise import weights as _weights\n"
                     "from headwise.models import heads\n"
                     "def f():\n"
                     "    heads.layers(), _weights.__name__, headwise.models\n"  # fine
                     "    return _weights._mask_scores(), headwise.weights._mask4\n"),
        "weights.py": "def _mask4(): ...\ndef _mask_scores(): ...\ndef f():\n    return _mask4()\n"})
    assert private_attributes(pkg) == ["headwise.stats -> headwise.weights._mask4",
                                       "headwise.stats -> headwise.weights._mask_scores"]


# ----------------------------------------------------------------------------- docstrings

def may_import_clause(doc: str) -> str | None:
    """The text of a docstring's "May import" sentence up to its first ``;`` or full stop."""
    found = re.search(r"May import:?\s(.*?)(?:;|\.\s|\.$)", doc, re.S)
    return found.group(1) if found else None


def named_in(clause: str, known: set[str]) -> set[str]:
    """The wings and modules of ``known`` that ``clause`` names (``headwise.`` dropped)."""
    words = {w.removeprefix("headwise.").rstrip(".") for w in re.findall(r"[A-Za-z_][\w.]*",
                                                                           clause)}
    return words & known


def docstring_names(wing: str, wings: dict[str, Rule] = WINGS) -> set[str]:
    """What a wing's docstring must name: its row's ``may`` and every dotted row under it with
    that row's ``may`` (the leaves may be named or not)."""
    sub = {k: r for k, r in wings.items() if k.startswith(wing + ".")}
    return (set(wings[wing].may) | set(sub) | set().union(*(r.may for r in sub.values()))) \
        - LEAVES


def test_each_wing_docstring_says_what_its_row_says():
    """Each wing package's ``__init__`` docstring has a "May import" sentence naming exactly
    its row (the leaves aside): the prose and the table cannot drift apart."""
    import headwise

    known = (set(WINGS) | {e for r in WINGS.values() for e in r.may} | {ANYTHING}) - LEAVES
    packages = sorted(p.parent.name for p in SRC.glob("*/__init__.py"))
    assert len(packages) > 10
    wrong = {}
    for wing in packages:
        doc = ast.get_docstring(ast.parse((SRC / wing / "__init__.py").read_text())) or ""
        clause = may_import_clause(doc)
        said = named_in(clause, known) if clause is not None else None
        if said != docstring_names(wing):
            wrong[wing] = (sorted(said) if said is not None else "no 'May import' sentence",
                           sorted(docstring_names(wing)))
    assert wrong == {}, "docstring (said, row):\n" + "\n".join(f"{k}: {v}" for k, v in
                                                                wrong.items())
    assert headwise.__file__  # (the package under test is the one in SRC)


def test_the_docstring_reader_reads_a_sentence_and_stops_at_its_end():
    known = {"masks", "heads", "models", "observe", "train.evaluate"}
    doc = ("Holds things.\n\nMay import: :mod:`headwise.masks`, ``heads`` and\n"
           ":mod:`headwise.train.evaluate`; never a model. The models import it.")
    assert named_in(may_import_clause(doc), known) == {"masks", "heads", "train.evaluate"}
    assert may_import_clause("Imports nothing.") is None
    toy = {"hf": rule("hf", "heads"), "hf.tools": rule("tools", "viz", "errors")}
    assert docstring_names("hf", toy) == {"heads", "hf.tools", "viz"}
