"""The package as a practitioner installs it beside their own stack: the wheel declares lower bounds on torch,
numpy and pandas only, and the monitor and the check run with nothing else installed.

The wheel is built from a copy of the sources (``pip wheel --no-deps --no-build-isolation``: no download) and
installed with ``--no-deps`` into a fresh venv that sees, through a ``.pth`` file, only torch, numpy, pandas and
what they require, linked from this test's environment. Hydra, pyarrow and the rest of the suite's stack are
absent there, so an import of them fails the run.
"""

from __future__ import annotations

import email
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
CORE = {"torch", "numpy", "pandas"}  # what the monitor and the check import
# The suite's own stack (the `suite` extra): none of it may be imported by the monitor, the checkpoints or the check.
SUITE_MODULES = ("hydra", "omegaconf", "pyarrow", "scipy", "matplotlib", "seaborn", "submitit", "tqdm", "yaml",
                 "joblib")
LIBRARY_MODULES = ("bnrotation.monitor", "bnrotation.checkpoints", "bnrotation.check")
TIMEOUT_S = 120  # a generous bound on one step (a venv, a build, an install), not a timing claim


def lower_bounds(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """The lower bound (``>=``) that ``pyproject.toml`` declares on each of torch, numpy and pandas, as written
    (``{"torch": "2.4", ...}``).

    Raises:
        ValueError: naming the package whose requirement has no ``>=`` bound, or is missing.
    """
    requires = {r.name.lower(): r for r in map(Requirement, tomllib.loads(pyproject.read_text())["project"]
                                               ["dependencies"])}
    out = {}
    for name in sorted(CORE):
        bound = [s.version for s in getattr(requires.get(name), "specifier", ()) if s.operator == ">="]
        if not bound:
            raise ValueError(f"{pyproject}: project.dependencies: expected {name}>=<version>, got "
                             f"{requires.get(name)}")
        out[name] = bound[0]
    return out


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(kw.pop("env", {}))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, **kw)


# ----------------------------------------------------------------------------- imports
POISONED = """
import runpy, sys
for name in {modules!r}:
    sys.modules[name] = None  # importing it now raises ImportError
for name in {imports!r}:
    __import__(name)
sys.argv = ["bnrotation-check", "--help"]
try:
    runpy.run_module("bnrotation.check", run_name="__main__")
except SystemExit as done:
    assert done.code == 0, done.code
print("imported without", len({modules!r}), "modules")
"""


def test_the_monitor_and_the_check_import_none_of_the_suites_stack():
    """With Hydra, pyarrow, ... made unimportable, the monitor, the checkpoints and ``python -m bnrotation.check
    --help`` still import and run; the suite's config module (which needs Hydra) must fail there, or the poisoning
    proves nothing."""
    code = POISONED.format(modules=SUITE_MODULES, imports=LIBRARY_MODULES)
    done = _run([sys.executable, "-c", code], env={"PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0 and "imported without" in done.stdout, done.stderr[-2000:]
    assert "usage: bnrotation-check" in done.stdout
    failing = _run([sys.executable, "-c", POISONED.format(modules=SUITE_MODULES, imports=("bnrotation.study.config",))],
                   env={"PYTHONPATH": str(ROOT / "src")})
    assert failing.returncode != 0 and re.search(r"(ModuleNotFound|Import)Error: .*'hydra", failing.stderr), \
        failing.stderr[-2000:]


# ----------------------------------------------------------------------------- the wheel
def build_wheel(tmp: Path) -> Path:
    """The wheel, built in ``tmp`` from a copy of pyproject.toml, README.md and src/ (the worktree stays clean),
    with this interpreter's pip and setuptools and nothing downloaded.

    Raises:
        RuntimeError: with the end of pip's output, when the build fails.
    """
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    done = _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                 "-w", str(tmp / "dist"), str(src)])
    if done.returncode != 0:
        raise RuntimeError(f"pip wheel failed: {done.stderr[-3000:]}")
    (built,) = (tmp / "dist").glob("bnrotation-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel (:func:`build_wheel`)."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def _metadata(wheel: Path) -> tuple[email.message.Message, str]:
    with zipfile.ZipFile(wheel) as z:
        info = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        entry_points = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
        return email.message_from_string(z.read(info).decode()), z.read(entry_points).decode()


def test_the_wheel_declares_lower_bounds_on_what_the_monitor_imports_and_the_console_script(wheel):
    meta, entry_points = _metadata(wheel)
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    assert not [str(r) for r in requires if "==" in str(r.specifier) or "===" in str(r.specifier)]
    core = {r.name.lower(): r for r in requires if r.marker is None}
    assert set(core) == CORE, sorted(core)  # everything else sits behind an extra
    torch_bound = [s for s in core["torch"].specifier if s.operator == ">="]
    # the bound pyproject.toml declares, which make test-compat tests (test_compat.py checks its committed report)
    assert torch_bound and torch_bound[0].version == lower_bounds()["torch"], core["torch"]
    assert all(any(s.operator == ">=" for s in r.specifier) for r in core.values()), core
    extras = set(meta.get_all("Provides-Extra"))
    assert {"suite", "lightning", "transformers", "test"} <= extras, extras
    hydra = [r for r in requires if r.name == "hydra-core"]
    assert hydra and Marker('extra == "suite"') == hydra[0].marker  # the suite's stack is the `suite` extra
    assert re.search(r"^\[console_scripts\]\s*\nbnrotation-check = bnrotation\.check:main$", entry_points, re.M)


def _closure(names: set[str]) -> list[md.Distribution]:
    """The installed distributions ``names`` need, their requirements' requirements included (extras left out)."""
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # a requirement for another platform or Python
        seen[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def _link_only(dists: list[md.Distribution], folder: Path) -> None:
    """Symbolic links in ``folder`` to the top-level packages, modules and metadata of ``dists``, nothing else."""
    folder.mkdir()
    for dist in dists:
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            target = Path(dist.locate_file(top))
            if target.exists() and not (folder / top).exists():
                (folder / top).symlink_to(target)


USER_CODE = """
import sys
import torch
import torch.nn as nn
from bnrotation.monitor import StalenessMonitor

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 3))
model.train()(torch.randn(16, 3, 8, 8))  # one training-mode pass: the running statistics move
record = StalenessMonitor(model, (torch.randn(8, 3, 8, 8), torch.arange(8) % 3), warn=False)(0)
assert list(record.layers["norm_layer"]) == ["1"], record.layers
suite = sorted(m for m in sys.modules if m.split(".")[0] in {suite!r})
assert not suite, suite
import bnrotation
print("monitor ran from", bnrotation.__file__)
"""

FACTORY = """
import torch
import torch.nn as nn


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8, bias=False), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
"""


@pytest.mark.slow
def test_the_wheel_installs_without_dependencies_beside_torch_numpy_pandas_and_runs(wheel, tmp_path):
    """A fresh venv that sees only torch, numpy, pandas and their requirements: ``pip install --no-deps`` of the
    wheel, ``pip check`` (nothing missing), the monitor on a small model, and ``bnrotation-check`` both asked for
    its help and run on a checkpoint whose running means sit 10σ off (exit 1, STALE)."""
    venv = tmp_path / "venv"
    done = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert done.returncode == 0, done.stderr
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    _link_only(_closure(CORE), tmp_path / "core")
    (site / "core.pth").write_text(str(tmp_path / "core") + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    done = _run([*pip, "install", "--quiet", "--no-deps", "--no-index", str(wheel)])
    assert done.returncode == 0, done.stderr[-3000:]
    done = _run([*pip, "check"])
    assert done.returncode == 0 and "No broken requirements" in done.stdout, done.stdout + done.stderr
    hydra = _run([str(python), "-c", "import hydra"])
    assert hydra.returncode != 0  # the venv does not see the suite's stack

    done = _run([str(python), "-c", USER_CODE.format(suite=SUITE_MODULES)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"monitor ran from {site}" in done.stdout, done.stdout  # the installed wheel, not the sources

    script = venv / "bin" / "bnrotation-check"
    done = _run([str(script), "--help"])
    assert done.returncode == 0 and done.stdout.startswith("usage: bnrotation-check"), done.stderr[-2000:]

    (tmp_path / "user_nets.py").write_text(textwrap.dedent(FACTORY))
    make = _run([str(python), "-c", textwrap.dedent("""
        import torch
        from user_nets import make
        model = make()
        model[1].running_mean += 10.0  # 10σ off: the running variance is 1
        torch.save(model.state_dict(), "w.pt")
        g = torch.Generator().manual_seed(1)
        torch.save([torch.randn(32, 4, generator=g) for _ in range(2)], "batches.pt")
        """)], cwd=tmp_path)
    assert make.returncode == 0, make.stderr[-2000:]
    done = _run([str(script), "--model", "user_nets:make", "--weights", "w.pt", "--batches", "batches.pt"],
                cwd=tmp_path)
    assert done.returncode == 1 and "STALE" in done.stdout, done.stdout + done.stderr[-2000:]
