"""The package's layout: two products, the library (``bnrotation``) and the study (``bnrotation.study``), and the
library never imports the study (read from the source with ``ast``, then in a fresh interpreter); the one-way flow
DESIGN.md draws (the training side never reaches analysis/); every module path the documents name resolves, and
every place docs/extending.md points at exists (import circles: tests/test_imports.py).

The import graph is tests/test_imports.py's, read from the source with ``ast``: every import counts, at the top of a
file, under ``if TYPE_CHECKING:`` or inside a function.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from test_imports import SRC, graph, module_name
from test_imports import package_graph as import_graph

PACKAGE = ROOT / "src" / "bnrotation"
STUDY = "bnrotation.study"


def _in_study(module: str) -> bool:
    return module == STUDY or module.startswith(STUDY + ".")


def library_modules(src: Path = SRC) -> list[str]:
    """The library's modules: every module of the package under ``src`` outside ``bnrotation/study/``."""
    return sorted(m for m in (module_name(p, src) for p in src.rglob("*.py")) if m.startswith("bnrotation")
                  and not _in_study(m))


def _dynamic_imports(path: Path, package: str) -> set[str]:
    """The modules ``path`` imports by name with a constant string (``importlib.import_module("x.y")``,
    ``__import__("x")``), relative names resolved against ``package``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)):
            continue
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if func in ("import_module", "__import__"):
            name = node.args[0].value
            out.add(importlib.util.resolve_name(name, package) if name.startswith(".") else name)
    return out


def study_imports(src: Path = SRC) -> dict[str, set[str]]:
    """Each library module under ``src`` that imports the study → the study modules it imports, directly (a
    relative ``from .study.config import X`` and ``from .. import study`` count, as do imports under
    ``TYPE_CHECKING``, inside functions and by a constant name through ``importlib.import_module``)."""
    g = import_graph() if src == SRC else graph(src)
    out = {}
    for m in library_modules(src):
        path = src.joinpath(*m.split(".")).with_suffix(".py")
        path = path if path.exists() else path.with_suffix("") / "__init__.py"
        package = m if path.name == "__init__.py" else m.rpartition(".")[0]
        found = {n for n in g[m] | _dynamic_imports(path, package) if _in_study(n)}
        if found:
            out[m] = found
    return out


def test_the_library_imports_nothing_of_the_study():
    """The library is what a practitioner installs; the study is built on it, never the other way round
    (docs/extending.md, "Two products")."""
    assert study_imports() == {}


def test_the_public_names_live_in_the_library():
    import bnrotation
    assert bnrotation._PUBLIC and not [m for m in bnrotation._PUBLIC if _in_study(f"bnrotation.{m}")]


def test_an_import_of_the_study_is_found_in_every_form(tmp_path):
    """The failure case: each way a library module can reach the study is reported, and names that only begin
    like it are not."""
    pkg = tmp_path / "bnrotation"
    (pkg / "study").mkdir(parents=True)
    (pkg / "sub").mkdir()
    for f in ("__init__.py", "study/__init__.py", "study/config.py", "study/runner.py", "sub/__init__.py",
              "staleness.py", "studying.py"):
        (pkg / f).write_text("")
    cases = {
        "absolute": "import bnrotation.study.config\n",
        "from_absolute": "from bnrotation.study.runner import run\n",
        "the_package": "from bnrotation import study\n",
        "type_checking": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .study.config import C\n",
        "in_a_function": "def f():\n    from .study import runner\n",
        "by_name": "import importlib\ndef f():\n    return importlib.import_module('.study.config', __name__)\n",
        "clean": "from .staleness import x\nfrom . import studying\nimport bnrotation.studying\n",
    }
    for name, code in cases.items():
        (pkg / f"{name}.py").write_text(code)
    (pkg / "sub" / "deep.py").write_text("from ..study.config import C\n")
    found = study_imports(tmp_path)
    assert found == {"bnrotation.absolute": {"bnrotation.study.config"},
                     "bnrotation.from_absolute": {"bnrotation.study.runner"},
                     "bnrotation.the_package": {"bnrotation.study"},
                     "bnrotation.type_checking": {"bnrotation.study.config"},
                     "bnrotation.in_a_function": {"bnrotation.study.runner"},
                     "bnrotation.by_name": {"bnrotation.study.config"},
                     "bnrotation.sub.deep": {"bnrotation.study.config"}}


@pytest.mark.slow
def test_importing_the_library_loads_no_study_module():
    """In a fresh interpreter: ``import bnrotation``, then each library module in turn (each public name with
    it); after each, no ``bnrotation.study`` module is in ``sys.modules``. The first module that loads one is named,
    with what it loaded."""
    modules = library_modules()
    assert "bnrotation.monitor" in modules and "bnrotation.averaging" in modules
    # Lightning's adapter imports Lightning, which imports torchvision: the shim it needs beside the CPU-only torch
    # (bnrotation.study.thirdparty) is loaded from its file under a name of its own, so that it loads no study module.
    shim = PACKAGE / "study" / "thirdparty.py"
    probe = f"""import importlib, importlib.util, json, sys
spec = importlib.util.spec_from_file_location("_torchvision_shim", {str(shim)!r})
shim = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shim)
shim.torchvision_shim()
import bnrotation
def study():
    return sorted(m for m in sys.modules if m == {STUDY!r} or m.startswith({STUDY + '.'!r}))
first = {{"bnrotation": study()}} if study() else {{}}
for m in {modules!r}:
    if first:
        break
    importlib.import_module(m)
    for name, home in bnrotation._HOME.items():
        if "bnrotation." + home == m:
            getattr(bnrotation, name)
    if study():
        first = {{m: study()}}
print(json.dumps(first))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == {}


ANALYSIS = STUDY + ".analysis"
# The study's commands that read finished runs through the analysis's run reader: above the analysis, not training.
RUN_READERS = (STUDY + ".diagnose",)


def training_modules(src: Path = SRC) -> list[str]:
    """The study's modules outside its analysis and the commands that read runs (:data:`RUN_READERS`): the
    training side (the runner, the experiments on the frame, their configs, rows and shared constants)."""
    return sorted(m for m in (module_name(p, src) for p in (src / "bnrotation" / "study").rglob("*.py"))
                  if not (m == ANALYSIS or m.startswith(ANALYSIS + ".")) and m not in RUN_READERS)


def test_the_training_side_is_every_study_module_but_the_analysis_and_the_run_readers():
    found = training_modules()
    assert {f"{STUDY}.{m}" for m in ("runner", "rundir", "frozen", "zoo", "constants", "rows", "interventions")} \
        <= set(found)
    assert not [m for m in found if "analysis" in m or m in RUN_READERS]


@pytest.mark.parametrize("module", training_modules() + ["bnrotation.evaluation", "bnrotation.probes"])
def test_training_imports_nothing_from_the_analysis(module):
    """Data flows one way (DESIGN.md): config -> runner -> records -> analysis; the training side (every study
    module but the analysis and the commands that read runs) never imports the analysis, directly or through
    another module: what both read (the truth's threshold, the rows) lives below both."""
    graph = import_graph()  # every import, deferred ones too (tests/test_imports.py)
    seen, todo = set(), [module]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    assert not {m for m in seen if m.startswith("bnrotation.study.analysis")}, sorted(seen)


NO_TORCH = """
import importlib, json, pkgutil, sys
import bnrotation.study.analysis as analysis
names = [m.name for m in pkgutil.walk_packages(analysis.__path__, analysis.__name__ + ".")
         if not m.name.endswith(".__main__")]
loaded = {}
for name in names:
    importlib.import_module(name)
    torch = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
    if torch:
        loaded[name] = torch[:3]
        break
print(json.dumps({"modules": len(names), "torch": loaded}))
"""


def test_the_analysis_imports_no_torch():
    """Every module of the analysis (parquet in, never torch: DESIGN.md), imported one after another in a fresh
    interpreter, loads no torch module; the first that does is named."""
    out = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.splitlines()[-1])
    assert found["modules"] > 20 and found["torch"] == {}


def _pointed_at(text: str) -> tuple[list[str], list[str]]:
    """The code a document names in backticks: ``(dotted names under bnrotation, file paths)``;
    ``analysis/table.COLUMNS`` is ``analysis.table.COLUMNS``."""
    modules = {p.stem for d in (PACKAGE, PACKAGE / "study") for p in d.glob("*.py")} | {
        p.name for d in (PACKAGE, PACKAGE / "study") for p in d.iterdir() if p.is_dir()}
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
    roots = (ROOT, PACKAGE, PACKAGE / "study")
    missing = unresolved(names) + [f for f in files if not any((d / f).exists() for d in roots)]
    assert not missing
    assert unresolved(["runner.no_such_function", "rows.check_against_row"]) == ["runner.no_such_function"]
    assert _pointed_at("`runner.no_such_function` and `src/bnrotation/nowhere.py`") == (
        ["runner.no_such_function"], ["src/bnrotation/nowhere.py"])


# ----------------------------------------------------------------------------- module paths in the documents
# A dotted name under bnrotation (``bnrotation.study.zoo.ZOO_ARCHS``, ``bnrotation.check:main``) and a file or folder
# of the package (``src/bnrotation/study/rows.py``, ``bnrotation/averaging.py``, ``src/bnrotation/integrations/``),
# not inside a longer word or path.
DOTTED = re.compile(r"(?<![\w./-])bnrotation(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?")
PACKAGE_PATH = re.compile(r"(?<![\w./-])(?:src/)?bnrotation/[\w./]*")
# Dotted names that are not code, each with where it is defined (checked below, so that an entry cannot outlive it).
NOT_CODE = {"bnrotation.schema_version": ("src/bnrotation/records.py", "the parquet metadata key of the schema")}


def documents() -> dict[str, str]:
    """What a reader or a command is told about the code: README.md, docs/*.md, the Makefile, pyproject.toml, every
    config under conf/, and the docstrings of the scripts in experiments/ (``{path: text}``)."""
    paths = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "conf").rglob("*.yaml"))]
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in paths}
    for script in sorted((ROOT / "experiments").glob("*.py")):
        tree = ast.parse(script.read_text())
        docs = [ast.get_docstring(n) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        texts[str(script.relative_to(ROOT))] = "\n".join(d for d in docs if d)
    return texts


def resolve_dotted(name: str):
    """The object ``name`` names: the longest prefix that is a module (``importlib.util.find_spec``), then
    attributes (``module:attr`` as an entry point writes it).

    Raises:
        LookupError: naming the first part that is not there.
    """
    parts = name.replace(":", ".").split(".")
    for cut in range(len(parts), 0, -1):
        prefix = ".".join(parts[:cut])
        try:
            spec = importlib.util.find_spec(prefix)
        except ModuleNotFoundError:  # a parent is a module, not a package: a shorter prefix
            continue
        if spec is None:
            continue
        obj = importlib.import_module(prefix)
        for i, attr in enumerate(parts[cut:], cut):
            if not hasattr(obj, attr):
                raise LookupError(f"{'.'.join(parts[:i])} has no {attr!r}")
            obj = getattr(obj, attr)
        return obj
    raise LookupError(f"no module {parts[0]!r}")


def broken_paths(texts: dict[str, str]) -> list[str]:
    """``"<document>: <name or path> (<why>)"`` for each dotted name under bnrotation that names no module or
    attribute, and each package path that is not there."""
    broken = []
    for doc, text in texts.items():
        for name in sorted(set(DOTTED.findall(text)) - set(NOT_CODE)):
            try:
                resolve_dotted(name)
            except LookupError as err:
                broken.append(f"{doc}: {name} ({err})")
        for path in sorted({m.rstrip(".") for m in PACKAGE_PATH.findall(text)}):
            where = ROOT / (path if path.startswith("src/") else f"src/{path}")
            if not (where.is_dir() if path.endswith("/") else where.is_file()):
                broken.append(f"{doc}: {path} (no such {'folder' if path.endswith('/') else 'file'})")
    return broken


def test_every_module_path_in_the_documents_resolves():
    """A module that moves (the study under bnrotation.study) leaves no stale name in a document, a command or a
    config: each is listed with its document."""
    texts = documents()
    named = {n for text in texts.values() for n in DOTTED.findall(text)}
    assert {"bnrotation.study.zoo.ZOO_ARCHS", "bnrotation.check:main", "bnrotation.study.cli.SweepSummary"} <= named
    assert not broken_paths(texts)
    for name, (path, what) in NOT_CODE.items():
        assert name.encode() in (ROOT / path).read_bytes(), f"{name}: {what}, no longer in {path}"


def test_a_stale_module_path_is_found():
    """The failure case: a module, an attribute, a file and a folder that are not there, beside ones that are and
    words that only contain the package's name."""
    text = ("`bnrotation.study.runner.run` and `bnrotation.runner.run`, `bnrotation.monitor.NoSuchName`, "
            "`bnrotation.check:main` and `bnrotation.check:nope`; src/bnrotation/study/rows.py, src/bnrotation/rows.py, "
            "bnrotation/averaging.py, src/bnrotation/integrations/, src/bnrotation/nowhere/, /tmp/bnrotation-site, "
            "pip install bnrotation[suite] and the parquet key bnrotation.schema_version.")
    assert broken_paths({"doc.md": text}) == [
        "doc.md: bnrotation.check:nope (bnrotation.check has no 'nope')",
        "doc.md: bnrotation.monitor.NoSuchName (bnrotation.monitor has no 'NoSuchName')",
        "doc.md: bnrotation.runner.run (bnrotation has no 'runner')",
        "doc.md: src/bnrotation/nowhere/ (no such folder)",
        "doc.md: src/bnrotation/rows.py (no such file)"]
