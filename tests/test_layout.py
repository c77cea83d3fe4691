"""The package's layout: the one-way flow DESIGN.md draws (the training side never reaches analysis/), and every pointer
of docs/extending.md resolves (import circles: tests/test_imports.py).

The import graph is tests/test_imports.py's, read from the source with ``ast``.
"""

from __future__ import annotations

import re

import pytest

from conftest import ROOT
from test_imports import package_graph as import_graph

PACKAGE = ROOT / "src" / "bnrotation"


@pytest.mark.parametrize("module", ["bnrotation.study.runner", "bnrotation.study.rows", "bnrotation.study.rundir", "bnrotation.study.runtime",
                                    "bnrotation.study.ensemble", "bnrotation.evaluation", "bnrotation.probes"])
def test_training_imports_nothing_from_the_analysis(module):
    """Data flows one way (DESIGN.md): config -> runner -> records -> analysis; the runner's side never imports
    the analysis, directly or through another module."""
    graph = import_graph()  # every import, deferred ones too (tests/test_imports.py)
    seen, todo = set(), [module]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    assert not {m for m in seen if m.startswith("bnrotation.study.analysis")}, sorted(seen)


def _pointed_at(text: str) -> tuple[list[str], list[str]]:
    """The code a document names in backticks: ``(dotted names under bnrotation, file paths)``;
    ``analysis/table.COLUMNS`` is ``analysis.table.COLUMNS``."""
    modules = {p.stem for folder in (PACKAGE, PACKAGE / "study") for p in folder.glob("*.py")} | {
        p.name for folder in (PACKAGE, PACKAGE / "study") for p in folder.iterdir() if p.is_dir()}
    analysis = {p.stem for p in (PACKAGE / "study" / "analysis").glob("*.py")}
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
    missing = unresolved(names) + [f for f in files if not any((where / f).exists() for where in (ROOT, PACKAGE, PACKAGE / "study"))]
    assert not missing
    assert unresolved(["runner.no_such_function", "rows.check_against_row"]) == ["runner.no_such_function"]
    assert _pointed_at("`runner.no_such_function` and `src/bnrotation/nowhere.py`") == (
        ["runner.no_such_function"], ["src/bnrotation/nowhere.py"])
