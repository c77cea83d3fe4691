"""Shared helpers: compose the real Hydra configs, run rows at smoke scale."""

from __future__ import annotations

import gc
import inspect
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

# Every process the tests start (training runs, the commands, the gloo ranks, submitit's jobs) on one OpenMP thread,
# as this one (torch.set_num_threads below): beside two xdist workers on 2 cores, a child's second thread only
# waits for a core, spinning. A value you set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Fashion-MNIST from the committed sample (tests/data/fashion_mnist_sample: 300 training and 100 test images), so
# that no test needs the data package; conf/task/fashion_mnist.yaml reads the folder from this variable.
FASHION_MNIST_SAMPLE = Path(__file__).resolve().parent / "data" / "fashion_mnist_sample"
os.environ.setdefault("FASHION_MNIST_DIR", str(FASHION_MNIST_SAMPLE))

import pytest  # noqa: E402
import torch  # noqa: E402
from thirdparty import torchvision_shim
from filelock import FileLock
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from bnrotation.study.config import RunConfig, register_configs, to_run_config

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))

# Before anything can import torchvision (timm, Lightning's torchmetrics and transformers do, at any test's first
# use of them, in whichever order pytest or an xdist worker runs the files): see tests/thirdparty.py.
torchvision_shim()
register_configs()
torch.set_num_threads(1)  # tests are many small runs; one thread each is fastest on 2 cores


SHARED_SCOPES = ("class", "module", "package", "session")
GROUPS_FOLDER = "bnrotation_xdist_groups"  # pytest-xdist's workerinput key: where each worker writes its groups


def _defined_here(func: Callable) -> bool:
    """Whether a fixture's function is the suite's (in ``tests/``), not pytest's or a plugin's."""
    try:
        return Path(inspect.getfile(func)).resolve().is_relative_to(ROOT / "tests")
    except TypeError:  # a built-in
        return False


def fixture_group(item: pytest.Item) -> str | None:
    """The group of a test: the name of its own ``xdist_group`` mark (a file whose tests share a module-level
    cache marks them so); else, for a test that shares one of the suite's fixtures of a wider scope than a test (a
    module's trained run, a browser, the reference runs' analysis), the file's name, so that the fixture is built
    once; None for a test that shares none (pytest's own wide fixtures, such as ``tmp_path_factory``, do not
    count)."""
    marked = item.get_closest_marker("xdist_group")
    if marked is not None:
        return str(marked.args[0] if marked.args else marked.kwargs.get("name", "default"))
    defs = getattr(item, "_fixtureinfo", None)
    shared = defs and any(d[-1].scope in SHARED_SCOPES and _defined_here(d[-1].func)
                          for d in defs.name2fixturedefs.values() if d)
    return item.path.stem if shared else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``make test`` (pytest-xdist, ``--dist loadgroup``) each test goes to whichever worker is free, except
    the tests of one file that share a fixture of a wider scope (:func:`fixture_group`): those go to one worker
    together, so that the fixture is built once. A slow test thus no longer waits behind the rest of its file on
    one worker while the other idles. Session fixtures used by several files are built once by :func:`built_once`.

    pytest-xdist 3.8 reads ``xdist_group`` marks through the test ids it rewrites, which pytest 9.2 no longer lets
    it do (pytest-xdist issue 1386): every test would be scheduled alone and each worker would build every module
    fixture again. So each worker also writes the groups it collected into the folder the controller named
    (:func:`pytest_configure_node`), and :func:`pytest_xdist_make_scheduler` schedules by them."""
    groups = {}
    for item in items:
        group = fixture_group(item)
        if group is not None:
            if item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(group))
            groups[item.nodeid] = group
    # Longest units of work first, as in list scheduling: groups (largest first), then the single tests marked slow,
    # then the rest. A long unit left to the end (the zoo's group, alphabetically last; the wheel's install) keeps
    # one worker busy while the other has nothing left. Within a group, and otherwise, collection order is kept.
    size = Counter(groups.values())
    items.sort(key=lambda item: (0, -size[groups[item.nodeid]]) if item.nodeid in groups else
               (1, item.get_closest_marker("slow") is None))
    folder = getattr(config, "workerinput", {}).get(GROUPS_FOLDER)
    if folder:
        target = Path(folder) / f"{config.workerinput['workerid']}.json"
        target.with_suffix(".tmp").write_text(json.dumps(groups))
        target.with_suffix(".tmp").replace(target)  # whole or absent when the controller reads it


def pytest_collection_finish(session: pytest.Session) -> None:
    """Once the test files are imported (torch, pandas, Hydra and the rest with them), move every object alive
    into the collector's permanent generation (``gc.freeze``): they live as long as the process, and a full
    collection no longer walks them. Tests that trigger one (the Hugging Face Trainer calls ``gc.collect()``
    after training, and Python runs its own as objects accumulate) then take milliseconds, not about a second
    each in a worker of this suite."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """(pytest-xdist, in the controller) The folder each worker writes its groups into, one per session."""
    config = node.config
    if not hasattr(config, "_bnrotation_groups"):
        config._bnrotation_groups = tempfile.mkdtemp(prefix="xdist-groups-")
        config.add_cleanup(lambda: shutil.rmtree(config._bnrotation_groups, ignore_errors=True))
    node.workerinput[GROUPS_FOLDER] = config._bnrotation_groups


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """(pytest-xdist, in the controller) Under ``--dist loadgroup``: pytest-xdist's own group scheduling, with
    each test's group read from what the workers wrote (:func:`pytest_collection_modifyitems`); None otherwise."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FixtureGroupScheduling(LoadGroupScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # every worker has collected by the time the controller schedules
                written = sorted(Path(config._bnrotation_groups).glob("*.json"))
                self.groups = json.loads(written[0].read_text()) if written else {}
            group = self.groups.get(nodeid)
            return f"group:{group}" if group else super()._split_scope(nodeid)

    return FixtureGroupScheduling(config, log)


def compose_cfg(overrides: list[str]) -> DictConfig:
    """The config `experiments/train.py <overrides>` would get."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


# The toy size of the tests' runs: 8x8 images, small batches, probe and held-out sets (the model's widths are each
# file's choice: some tests read the study's channel counts).
TOY_SIZE = ["task.image_size=8", "task.batch_size=16", "task.probe_size=16", "scale.heldout_size=32"]


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
    """One finished ``adam`` run at smoke scale on 8x8 images, seed 0, with interventions and checkpoints; do
    not modify it."""
    from bnrotation.study.runner import run
    return built_once(tmp_path_factory, "adam_smoke", lambda root: run(run_cfg(["experiment=adam", *TOY_SIZE], root)))
