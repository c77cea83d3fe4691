"""``make test-compat``: the library's tests beside the oldest torch the package admits and the newest one on the
registry, each in a scratch venv; and beside the release just below the bound, which shows why the bound is there.

    .venv/bin/python tests/test_compat.py     # writes results/compat/report.md; deletes its scratch venvs

Each environment is a fresh venv made by uv (the lock's) with torch, numpy and pandas from the registry, pytest at
the lock's version, and the wheel built from this checkout (:func:`test_wheel.build_wheel`) installed with
``--no-deps``. The registry's Linux torch wheels pull their CUDA libraries (``nvidia-*``, a few GB), which torch
needs to import at all, even on a CPU; each venv downloads them into a cache of its own, so that the install time
reported is a cold one. In each venv run the library's test files (:data:`LIBRARY_TESTS`), without the suite's
``tests/conftest.py`` (it composes Hydra configs): they import only the library, torch, numpy, pandas and pytest,
which :func:`test_the_library_tests_import_only_the_library` checks here on every ``make test``.

The environments (:func:`environments`): ``oldest``, torch, numpy and pandas each at the lower bound
``pyproject.toml`` declares (the oldest corner of what the package admits); ``newest``, the newest of each on the
registry; ``below``, the newest torch release older than the bound, beside the same numpy and pandas: its
failures, listed in the report, are what breaks below the bound (it may fail; the other two must pass).

Not part of ``make test`` or CI (GBs of downloads per environment): run it once per change that touches the
library, and commit the report. The tests below, which ``make test`` runs, read the committed report: the declared
bound must be the oldest torch it ran, with every test passing.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from test_wheel import CORE, ROOT, SUITE_MODULES, build_wheel, lower_bounds

# The test files that need only the library: the checkpoint check and its formats, gated re-estimation, the
# BatchNorm lint and the averaged-model audit, and rank agreement (each also drives the monitor and its pairing).
# The monitor's, re-estimation's and averaging's own files import the suite's network (bnrotation.study.model, whose
# config needs Hydra) at the top, so they cannot run there.
LIBRARY_TESTS = ("test_check.py", "test_checkpoint_formats.py", "test_reestimate_gated.py", "test_lint.py",
                 "test_audit.py", "test_distributed.py")
# What a library test may import besides the standard library and the library: its test runner and helpers.
TEST_IMPORTS = CORE | {"pytest", "thirdparty"}
REPORT = ROOT / "results" / "compat" / "report.md"
LOCK = ROOT / "requirements" / "lock.txt"
STEP_TIMEOUT_S = 1800  # a generous bound on one step (a GB-sized install, the tests), not a timing claim
MUST_PASS = ("oldest", "newest")


# ----------------------------------------------------------------------------- what the library tests import
def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function (``from a.b import c``: ``a.b``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


POISONED = """
import json, sys
for name in {suite!r}:
    sys.modules[name] = None  # importing it now raises ImportError
needs = {{}}
for name in {modules!r}:
    try:
        __import__(name)
    except ImportError as err:
        needs[name] = str(err)
print(json.dumps(needs))
"""


def needing_the_suite(modules: list[str]) -> dict[str, str]:
    """Each of the package's ``modules`` that cannot be imported with the suite's stack
    (:data:`test_wheel.SUITE_MODULES`) made unimportable, → the error (from the sources, in a process of its own)."""
    done = subprocess.run([sys.executable, "-c", POISONED.format(suite=SUITE_MODULES, modules=sorted(modules))],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"importing {sorted(modules)}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def library_test_problems(paths: list[Path]) -> list[str]:
    """What the test files ``paths`` import that a venv with only the library, torch, numpy, pandas and pytest
    lacks: a module of the package that needs the suite's stack (:func:`needing_the_suite`), a third-party module
    outside :data:`TEST_IMPORTS`, the suite's ``conftest`` or another test module."""
    problems, package = [], {}
    for path in paths:
        for name in sorted(_imports(path)):
            top = name.split(".")[0]
            if top == "bnrotation":
                package.setdefault(name, path.name)
            elif top == "conftest" or top.startswith("test_"):
                problems.append(f"{path.name} imports {name} (the suite's conftest.py is not loaded there)")
            elif top not in TEST_IMPORTS and top not in sys.stdlib_module_names:
                problems.append(f"{path.name} imports {name}, which the compatibility venvs do not install")
    needs = needing_the_suite(list(package))
    return problems + [f"{package[name]} imports {name}, which needs the suite's stack ({why})"
                       for name, why in sorted(needs.items())]


def test_the_library_tests_import_only_the_library():
    assert library_test_problems([ROOT / "tests" / name for name in LIBRARY_TESTS]) == []


def test_a_library_test_that_imports_the_suite_is_caught(tmp_path):
    """The failure case: the suite's network (its config needs Hydra), the conftest, another test file and a
    package the venvs lack."""
    bad = tmp_path / "test_bad.py"
    bad.write_text("import torch\nfrom bnrotation.study.model import build_network\n\n\ndef test():\n"
                   "    from conftest import TOY_SIZE\n    import test_probes\n    import timm\n")
    problems = library_test_problems([bad])
    assert len(problems) == 4 and re.search(r"test_bad.py imports bnrotation.study.model, which needs the suite's "
                                            r"stack \(.*hydra", problems[-1]), problems


# ----------------------------------------------------------------------------- the committed report
ROW = re.compile(r"^\| `(?P<env>[a-z]+)` \| (?P<torch>\S+) \| (?P<numpy>\S+) \| (?P<pandas>\S+) \| "
                 r"(?P<tests>\d+) \| (?P<passed>\d+) \| (?P<failed>\d+) \| (?P<skipped>\d+) \|", re.M)


def report_rows(text: str) -> dict[str, dict[str, str]]:
    """The environments' lines of the report's table, by environment name."""
    return {m["env"]: m.groupdict() for m in ROW.finditer(text)}


def test_the_declared_bound_is_the_oldest_torch_the_committed_report_ran_and_passed():
    rows = report_rows(REPORT.read_text())
    bounds = lower_bounds()
    assert set(MUST_PASS) <= set(rows), f"{REPORT}: environments {sorted(rows)}"
    for name in CORE:  # the oldest environment is the bounds themselves (2.4.0+cu121 is torch 2.4)
        assert Version(Version(rows["oldest"][name]).base_version) == Version(bounds[name]), (name, rows["oldest"])
    for env in MUST_PASS:
        row = rows[env]
        assert int(row["failed"]) == 0 and int(row["passed"]) > 0, row
    assert Version(rows["newest"]["torch"]) > Version(rows["oldest"]["torch"])
    if "below" in rows:  # what the report says breaks below the bound did break there
        assert Version(rows["below"]["torch"]) < Version(bounds["torch"]) and int(rows["below"]["failed"]) > 0


def test_the_docs_state_the_declared_bounds():
    bounds = lower_bounds()
    stated = f"torch >= {bounds['torch']}, numpy >= {bounds['numpy']}, pandas >= {bounds['pandas']}"
    assert stated in (ROOT / "docs" / "monitor.md").read_text()
    assert f"torch >= {bounds['torch']} only" in (ROOT / "docs" / "troubleshooting.md").read_text()


# ----------------------------------------------------------------------------- the run
@dataclass
class Env:
    """One scratch environment: its name, what it installs beside the wheel and pytest, and why it is there."""

    name: str
    requirements: list[str]
    why: str
    result: dict = field(default_factory=dict)


def registry_versions(package: str) -> list[Version]:
    """The releases of ``package`` on the registry, newest first (``pip index versions``; local builds such as
    ``+cpu`` left out)."""
    done = subprocess.run([sys.executable, "-m", "pip", "index", "versions", package], capture_output=True,
                          text=True, timeout=300)
    found = re.search(r"^Available versions: (.*)$", done.stdout, re.M)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"pip index versions {package} failed: {(done.stderr or done.stdout)[-500:]}")
    return [v for v in map(Version, found.group(1).split(", ")) if not v.local and not v.is_prerelease]


def environments(bounds: dict[str, str], torch_releases: list[Version]) -> list[Env]:
    """:data:`MUST_PASS` and ``below`` (when the registry has a torch older than the bound), as the module's
    docstring describes them."""
    at_bounds = [f"{name}=={bounds[name]}" for name in ("numpy", "pandas")]
    newest = max(torch_releases)
    envs = [Env("oldest", [f"torch=={bounds['torch']}", *at_bounds], "every lower bound pyproject.toml declares"),
            Env("newest", [f"torch=={newest}", "numpy", "pandas"], "the newest release of each on the registry")]
    older = [v for v in torch_releases if v < Version(bounds["torch"])]
    if older:
        envs.append(Env("below", [f"torch=={max(older)}", *at_bounds],
                        "the newest torch older than the bound: what breaks there"))
    return envs


def lock_version(package: str) -> str:
    """``package``'s version in ``requirements/lock.txt``."""
    found = re.search(rf"^{re.escape(package)}==(\S+)", LOCK.read_text(), re.M)
    if not found:
        raise ValueError(f"{LOCK}: no line {package}==<version>")
    return found.group(1)


def _run(cmd: list, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(kw.pop("env", {}))
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=STEP_TIMEOUT_S, env=env,
                          **kw)


def _checked(done: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {(done.stderr or done.stdout)[-3000:]}")
    return done


def _size_gb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink()) / 1e9


VERSIONS = """
import json, sys, numpy, pandas, torch, bnrotation
print(json.dumps({"torch": torch.__version__, "numpy": numpy.__version__, "pandas": pandas.__version__,
                  "python": sys.version.split()[0], "bnrotation": bnrotation.__file__}))
"""


def junit_counts(path: Path) -> dict:
    """Tests, passed, failed (failures and errors), skipped, and each failing test's id with the first line of its
    message, from pytest's JUnit XML."""
    cases = ET.parse(path).getroot().iter("testcase")
    out = {"tests": 0, "passed": 0, "failed": 0, "skipped": 0, "failures": []}
    for case in cases:
        out["tests"] += 1
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            out["failed"] += 1
            first = (bad.get("message") or bad.text or "").strip().splitlines()
            out["failures"].append((f"{case.get('classname')}::{case.get('name')}", first[0][:240] if first else ""))
        elif case.find("skipped") is not None:
            out["skipped"] += 1
        else:
            out["passed"] += 1
    return out


def run_env(env: Env, wheel: Path, scratch: Path, uv: Path) -> dict:
    """Make ``env``'s venv under ``scratch``, install, run :data:`LIBRARY_TESTS` there; what it measured."""
    folder = scratch / env.name
    venv, cache = folder / "venv", folder / "uv-cache"
    python = venv / "bin" / "python"
    base = getattr(sys, "_base_executable", sys.executable)
    _checked(_run([uv, "venv", "--quiet", "--python", base, venv]), f"{env.name}: uv venv")
    start = time.monotonic()
    _checked(_run([uv, "pip", "install", "--quiet", "--python", python, "--cache-dir", cache, *env.requirements,
                   f"pytest=={lock_version('pytest')}"]), f"{env.name}: uv pip install {' '.join(env.requirements)}")
    install_s = time.monotonic() - start
    _checked(_run([uv, "pip", "install", "--quiet", "--python", python, "--no-deps", "--cache-dir", cache, wheel]),
             f"{env.name}: uv pip install --no-deps {wheel.name}")
    versions = json.loads(_checked(_run([python, "-c", VERSIONS], cwd=folder), f"{env.name}: import").stdout)
    if not Path(versions["bnrotation"]).is_relative_to(venv):
        raise RuntimeError(f"{env.name}: bnrotation imported from {versions['bnrotation']}, not the wheel in {venv}")
    junit = folder / "junit.xml"
    start = time.monotonic()
    done = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", f"--junitxml={junit}",
                 *[f"tests/{name}" for name in LIBRARY_TESTS]], cwd=ROOT, env={"OMP_NUM_THREADS": "1"})
    test_s = time.monotonic() - start
    if not junit.is_file():
        raise RuntimeError(f"{env.name}: pytest wrote no report (exit {done.returncode}): {done.stdout[-3000:]}")
    summary = next((ln for ln in reversed(done.stdout.splitlines()) if re.search(r"\d+ (passed|failed)", ln)), "")
    return {**versions, **junit_counts(junit), "install_s": install_s, "test_s": test_s,
            "venv_gb": _size_gb(venv), "download_gb": _size_gb(cache), "summary": summary.strip("= ")}


def git_describe() -> str:
    done = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=ROOT, capture_output=True,
                          text=True, timeout=30)
    return done.stdout.strip() or "unknown"


def to_markdown(envs: list[Env], newest_on_registry: Version, uv_version: str, load: tuple[str, str],
                commit: str) -> str:
    """The report: one line per environment, then each one's failures, grouped by their message (``commit``: the
    checkout the wheel was built from)."""
    head = ("| environment | torch | numpy | pandas | tests | passed | failed | skipped | install (s) | "
            "installed (GB) | downloaded (GB) | tests (s) | why |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [f"| `{e.name}` | {e.result['torch']} | {e.result['numpy']} | {e.result['pandas']} | "
             f"{e.result['tests']} | {e.result['passed']} | {e.result['failed']} | {e.result['skipped']} | "
             f"{e.result['install_s']:.0f} | {e.result['venv_gb']:.1f} | {e.result['download_gb']:.1f} | "
             f"{e.result['test_s']:.0f} | {e.why} |" for e in envs]
    out = ["# The library beside other torch versions", "",
           "Written by `make test-compat` (`tests/test_compat.py`, whose docstring says how) from the wheel of "
           f"commit `{commit}`, on {os.cpu_count()} cores (load average {load[0]} at the start, {load[1]} at the "
           f"end), Python {envs[0].result['python']}, uv {uv_version}. The newest torch on the registry: "
           f"{newest_on_registry}. Each environment: a scratch venv (deleted afterwards) with torch, numpy and "
           f"pandas from the registry and pytest {lock_version('pytest')}, then the wheel of this checkout with "
           "`--no-deps`. Install: torch, numpy, pandas and pytest with their requirements (torch's `nvidia-*` CUDA "
           "libraries among them) from a cold cache, download included. Tests: "
           + ", ".join(f"`tests/{n}`" for n in LIBRARY_TESTS) + ", without `tests/conftest.py`; the skipped tests "
           "need packages these venvs leave out (timm, Lightning, safetensors).", "", head, *lines]
    for e in envs:
        if e.result["failures"]:
            out += ["", f"## `{e.name}`: what fails with torch {e.result['torch']} ({e.result['failed']} of "
                    f"{e.result['tests']})", ""]
            by_message: dict[str, list[str]] = {}
            for test, message in e.result["failures"]:
                by_message.setdefault(message.replace("|", "/"), []).append(test.removeprefix("tests."))
            for message, tests in sorted(by_message.items(), key=lambda kv: -len(kv[1])):
                out.append(f"- {count_tests(len(tests))}: `{message}`")
                out.append(f"  <details><summary>which</summary>{', '.join(tests)}</details>")
    return "\n".join(out) + "\n"


def count_tests(n: int) -> str:
    return f"{n} test" + ("" if n == 1 else "s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPORT, help="the report [results/compat/report.md]")
    p.add_argument("--only", nargs="*", default=None, help="run only these environments (oldest, newest, below)")
    p.add_argument("--keep", action="store_true", help="keep the scratch venvs (GBs) and print where they are")
    args = p.parse_args(argv)
    uv = Path(sys.executable).parent / "uv"
    if not uv.is_file():
        print(f"error: {uv}: not found; make install puts uv (the lock's) into .venv", file=sys.stderr)
        return 2
    uv_version = _checked(_run([uv, "--version"]), "uv --version").stdout.split()[1]
    releases = registry_versions("torch")
    envs = [e for e in environments(lower_bounds(), releases) if args.only is None or e.name in args.only]
    load_start, commit = f"{os.getloadavg()[0]:.1f}", git_describe()  # the wheel is built from the tree as it is now
    scratch = Path(tempfile.mkdtemp(prefix="bnrotation-compat-"))
    try:
        wheel = build_wheel(scratch)
        for env in envs:
            print(f"make test-compat: {env.name}: {' '.join(env.requirements)}", file=sys.stderr, flush=True)
            env.result = run_env(env, wheel, scratch, uv)
            print(f"  torch {env.result['torch']}: {env.result['summary']}; install {env.result['install_s']:.0f} s, "
                  f"tests {env.result['test_s']:.0f} s", file=sys.stderr, flush=True)
            if not args.keep:
                shutil.rmtree(scratch / env.name)  # GBs each: gone before the next one is made
    finally:
        if args.keep:
            print(f"kept {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(to_markdown(envs, max(releases), uv_version, (load_start, f"{os.getloadavg()[0]:.1f}"),
                                     commit))
    print(f"wrote {args.out}", file=sys.stderr)
    failed = [e.name for e in envs if e.name in MUST_PASS and (e.result["failed"] or not e.result["passed"])]
    if failed:
        print(f"make test-compat: the library's tests fail in {', '.join(failed)} (see {args.out})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
