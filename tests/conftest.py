"""Shared helpers: compose the real Hydra configs, run rows at smoke scale."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from thirdparty import torchvision_shim
from filelock import FileLock
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from bnrotation.config import RunConfig, register_configs, to_run_config

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))

# Before anything can import torchvision (timm, Lightning's torchmetrics and transformers do, at any test's first
# use of them, in whichever order pytest or an xdist worker runs the files): see tests/thirdparty.py.
torchvision_shim()
register_configs()
torch.set_num_threads(1)  # tests are many small runs; one thread each is fastest on 2 cores


SHARED_SCOPES = ("class", "module", "package")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the marks (--dist loadgroup)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``make test`` (pytest-xdist, ``--dist loadgroup``) each test goes to whichever worker is free, except
    the tests that share a fixture of a wider scope than a test (a module's trained run, a browser): those of one
    file go to one worker together (``xdist_group`` named after the file), so that the fixture is built once.
    Session fixtures are built once by :func:`built_once`. A slow test thus no longer waits behind the rest of
    its file on one worker while the other idles."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        if defs and any(d[-1].scope in SHARED_SCOPES for d in defs.name2fixturedefs.values() if d):
            item.add_marker(pytest.mark.xdist_group(item.path.stem))


def compose_cfg(overrides: list[str]) -> DictConfig:
    """The config `experiments/train.py <overrides>` would get."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def run_cfg(overrides: list[str], tmp: Path) -> RunConfig:
    return to_run_config(compose_cfg(["scale=smoke", f"results_root={tmp}", "progress=false", *overrides]))


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Path]) -> Path:
    """``make(folder)``'s result, built once per test session: under pytest-xdist, the first worker to ask builds
    it in the session's shared temporary folder while holding a file lock, and the others wait and reuse it (the
    recipe of pytest-xdist's documentation, "Making session-scoped fixtures execute only once")."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent  # one folder for all the workers of this session
    with FileLock(str(shared / f"{name}.lock")):
        folder, built = shared / name, shared / f"{name}.built"
        if not built.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            built.write_text(str(make(folder).relative_to(folder)))
        return folder / built.read_text()


@pytest.fixture(scope="session")
def adam_smoke_run(tmp_path_factory) -> Path:
    """One finished ``adam`` run at smoke scale, seed 0, with interventions and checkpoints; do not modify it."""
    from bnrotation.runner import run
    return built_once(tmp_path_factory, "adam_smoke", lambda root: run(run_cfg(["experiment=adam"], root)))
