"""No private name crosses a module of the package: a helper two modules share is public where it belongs.

An AST scan over ``src/bnrotation/**.py``. It fails, listing each one, on

* ``from <bnrotation module> import _name`` (relative or absolute), and
* ``<module>._name`` where ``<module>`` is a name the file bound to a bnrotation module by an import,

``_name`` not a dunder (``__version__``, ``__all__``). Private names of other packages (``torch``'s ``_BatchNorm``,
which every BatchNorm subclass derives from) are theirs to keep stable and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "bnrotation"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _resolve(path: Path, node: ast.ImportFrom) -> str | None:
    """The absolute module an ``ImportFrom`` reads from; None outside bnrotation."""
    if node.level:
        base = _module_name(path).split(".")
        keep = len(base) - node.level + (1 if _is_package(path) else 0)
        target = ".".join(base[:keep] + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return target if target == "bnrotation" or target.startswith("bnrotation.") else None


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (SRC / rel).with_suffix(".py").is_file() or (SRC / rel / "__init__.py").is_file()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def crossings(path: Path, source: str | None = None) -> list[str]:
    """``file:line: what`` for each private name of another bnrotation module that ``path`` (or ``source``, read
    as if it were the file ``path``) uses."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    here = _module_name(path)
    modules: set[str] = set()  # local names bound to bnrotation modules
    found = []
    where = path.relative_to(SRC.parent)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _resolve(path, node)
            if source is None:
                continue
            for alias in node.names:
                if _is_module(f"{source}.{alias.name}"):
                    modules.add(alias.asname or alias.name)
                elif _private(alias.name) and source != here:
                    found.append(f"{where}:{node.lineno}: from {source} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("bnrotation"):
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            dotted = []
            while isinstance(base, ast.Attribute):
                dotted.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                found.append(f"{where}:{node.lineno}: {'.'.join([base.id, *reversed(dotted), node.attr])}")
    return found


def test_no_private_name_crosses_a_module():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20  # the scan reads the package, not an empty folder
    found = [line for f in files for line in crossings(f)]
    assert not found, "private names used across modules (make the helper public where it belongs):\n" + "\n".join(
        found)


@pytest.mark.parametrize("source, expected", [
    ("from .pairing import _examples\n", ["from bnrotation.pairing import _examples"]),
    ("from bnrotation.check import _one_line as one_line\n", ["from bnrotation.check import _one_line"]),
    ("from . import pairing\npairing._call(None, None)\n", ["pairing._call"]),
    ("import bnrotation.pairing\nbnrotation.pairing._call(None, None)\n", ["bnrotation.pairing._call"]),
    ("from .pairing import examples, __all__\nfrom torch.nn.modules.batchnorm import _BatchNorm\n", []),
    ("def _mine():\n    pass\nclass A:\n    def f(self):\n        return self._x, _mine()\n", []),
])
def test_the_scan_finds_each_kind_of_crossing_and_nothing_else(source, expected):
    """The scan on a source read as a module beside the package's others (its relative imports resolve there)."""
    found = [line.split(": ", 1)[1] for line in crossings(PACKAGE / "scan_probe.py", source)]
    assert found == expected
