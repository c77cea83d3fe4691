"""No import circles in the package, and the analysis's layers import only downwards (read from the source with
``ast``; nothing is imported).

Every ``import`` and ``from ... import`` of a ``bnrotation`` module counts, at the top of a file or inside a
function (an import deferred into a function to get round a circle is still a circle). A module's package
``__init__`` is not counted as a dependency of the module (importing ``a.b.c`` runs ``a.b``'s ``__init__``,
but that is the package's choice, not the module's).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
# The analysis's layers, bottom up: a module may import its own layer and those below it, never one above.
LAYERS = ("formatting", "report", "stats", "results", "measures", "tables", "claims", "webpage")


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, src: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports (submodules named in ``from pkg import sub`` included)."""
    name = module_name(path, src)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            subs = {f"{base}.{a.name}" for a in node.names} & modules
            out |= subs | ({base} if len(subs) < len(node.names) else set())  # the package only for its own names
    return {m for m in out if m in modules and m != name}


def graph(src: Path = SRC) -> dict[str, set[str]]:
    """Each module under ``src`` → the modules under ``src`` it imports."""
    paths = sorted(src.rglob("*.py"))
    modules = {module_name(p, src) for p in paths}
    return {module_name(p, src): imports(p, src, modules) for p in paths}


@functools.cache
def package_graph() -> dict[str, set[str]]:
    """:func:`graph` of the package, read once per process (its callers only read it)."""
    return graph(SRC)


def cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``g`` (module → modules it imports), as a path that ends where it starts; None if
    there is none. Depth-first search with the three colours of Cormen et al., "Introduction to Algorithms"
    §22.3."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(g.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state and (found := visit(m)):
            return found
    return None


ANALYSIS = ["bnrotation", "study", "analysis"]


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[:3] != ANALYSIS or len(parts) < 4:
        return None
    return LAYERS.index(parts[3])


def test_the_package_has_no_import_circle():
    found = cycle(package_graph())
    assert found is None, " → ".join(found)


def test_the_analysis_layers_import_only_downwards():
    upward = [f"{m} imports {n}" for m, deps in package_graph().items() if layer_of(m) is not None
              for n in deps if layer_of(n) is not None and layer_of(n) > layer_of(m)]
    assert not upward


def test_every_analysis_module_belongs_to_a_layer():
    analysis = [m for m in package_graph() if m.startswith("bnrotation.study.analysis.")]
    assert analysis and all(m.split(".")[len(ANALYSIS)] in LAYERS for m in analysis)


def test_a_circle_is_found(tmp_path):
    """The failure case: a ↔ b through a deferred import, and a longer a → b → c → a, are both reported."""
    pkg = tmp_path / "bnrotation"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import g\n")
    assert cycle(graph(tmp_path)) == ["bnrotation.a", "bnrotation.b", "bnrotation.a"]
    (pkg / "b.py").write_text("import bnrotation.c\n")
    (pkg / "c.py").write_text("from bnrotation.a import x\n")
    assert cycle(graph(tmp_path)) == ["bnrotation.a", "bnrotation.b", "bnrotation.c", "bnrotation.a"]
    (pkg / "c.py").write_text("x = 1\n")
    assert cycle(graph(tmp_path)) is None


@pytest.mark.parametrize("module, layer", [("bnrotation.study.analysis.measures.lag", 4), ("bnrotation.study.analysis.claims", 6),
                                           ("bnrotation.monitor", None)])
def test_a_module_s_layer_is_its_folder(module, layer):
    assert layer_of(module) == layer
