"""The package's layout: the one-way flow DESIGN.md draws (the training side never reaches analysis/), and every pointer
of docs/extending.md resolves (import circles: tests/test_imports.py).

Read from the source with ``ast`` (nothing is imported): an edge is an import a module runs when it is
imported (module level and class bodies, not function bodies, not ``if TYPE_CHECKING:`` blocks); importing
``a.b.c`` also runs ``a`` and ``a.b``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "src" / "bnrotation"


def module_name(path: Path, root: Path) -> str:
    """``bnrotation.analysis.results`` for ``<root>/bnrotation/analysis/results.py`` (a package: its name)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_time_nodes(body: list[ast.stmt]):
    """The statements of ``body`` that run at import time, recursively (not function bodies, not
    ``if TYPE_CHECKING:`` blocks)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            yield from _import_time_nodes(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody"):  # of a class, an if, a try, a with, a loop
            yield from _import_time_nodes(getattr(node, field, []))
        for handler in getattr(node, "handlers", []):
            yield from _import_time_nodes(handler.body)


def import_graph(package: Path) -> dict[str, set[str]]:
    """``{module: the package's modules it imports at import time}`` for every ``.py`` under ``package``."""
    root = package.parent
    files = {module_name(p, root): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        here = name if is_package else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _import_time_nodes(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")[:len(here.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}
        edges = set()
        for target in targets:
            parts = target.split(".")
            edges |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & files.keys()
        graph[name] = edges - {name}
    return graph


@pytest.mark.parametrize("module", ["bnrotation.runner", "bnrotation.rows", "bnrotation.rundir", "bnrotation.runtime",
                                    "bnrotation.ensemble", "bnrotation.evaluation", "bnrotation.probes"])
def test_training_imports_nothing_from_the_analysis(module):
    """Data flows one way (DESIGN.md): config -> runner -> records -> analysis; the runner's side never imports
    the analysis, directly or through another module."""
    graph = import_graph(PACKAGE)
    seen, todo = set(), [module]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    assert not {m for m in seen if m.startswith("bnrotation.analysis")}, sorted(seen)


def _pointed_at(text: str) -> tuple[list[str], list[str]]:
    """The code a document names in backticks: ``(dotted names under bnrotation, file paths)``;
    ``analysis/table.COLUMNS`` is ``analysis.table.COLUMNS``."""
    modules = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    analysis = {p.stem for p in (PACKAGE / "analysis").glob("*.py")}
    names, files = [], []
    for tick in re.findall(r"`([^`\n]+)`", text):
        first = re.split(r"[./]", tick)[0]
        if re.fullmatch(r"[\w./-]+\.(?:py|toml|yaml|md)", tick):
            if "/" in tick or tick.endswith(".py"):
                files.append(tick)
        elif re.fullmatch(r"[a-z_]+(?:[./][A-Za-z_]\w*)+", tick) and first in modules | analysis:
            names.append(("" if first in modules else "analysis.") + tick.replace("/", "."))
    return names, files


def test_every_place_extending_md_points_at_exists():
    """docs/extending.md tells where a row, claim, figure, column, monitor signal and adapter go: each module,
    function and file it names is there (a renamed module fails here, naming the stale pointer)."""
    from test_docs import unresolved

    names, files = _pointed_at((ROOT / "docs" / "extending.md").read_text())
    assert len(names) > 15 and "rows.check_against_row" in names and "batches.split_batch" in names
    missing = unresolved(names) + [f for f in files if not (ROOT / f).exists() and not (PACKAGE / f).exists()]
    assert not missing
    assert unresolved(["runner.no_such_function", "rows.check_against_row"]) == ["runner.no_such_function"]
    assert _pointed_at("`runner.no_such_function` and `src/bnrotation/nowhere.py`") == (
        ["runner.no_such_function"], ["src/bnrotation/nowhere.py"])
