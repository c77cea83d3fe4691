"""The frame every experiment runs on: a run's folder, from its lock to its ``DONE`` marker.

The folder is ``<results_root>/runs/<row>/seed=<s>/`` (:func:`bnrotation.records.run_dir`); its files are
:mod:`bnrotation.records`'. :func:`prepare_run_dir` decides what a new call does with it (skip, refuse, resume or
start anew), from its ``DONE`` marker, its resumable state (:data:`RESUME_FILE`) and the config saved beside them; a
run holds :class:`RunLock` while it decides and trains. :func:`claim` does both and hands over a :class:`RunFolder`,
which writes ``config.yaml`` and ``run.json`` first (:meth:`RunFolder.start`), then the tables, ``run.json`` again and
``DONE`` last (:meth:`RunFolder.finish`), each atomically.

An experiment is a plug-in (:class:`Experiment`): a schema, a train function and a table layout;
:func:`run_in_folder` runs one run of it in its folder. The frozen backbone (:mod:`.frozen`) and the zoo
(:mod:`.zoo`) are such plug-ins; the runner (:mod:`.runner`), which trains several seeds at once and resumes a
stopped run, uses :func:`claim` and :class:`RunFolder` directly.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import platform
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from omegaconf import OmegaConf

from .. import records
from .config import RunConfig, semantic_dict, structured_schema

__all__ = ["RESUME_FILE", "RunExistsError", "RunBusyError", "RunLock", "config_yaml", "prepare_run_dir", "Trained",
           "Experiment", "RunFolder", "claim", "run_in_folder"]

RESUME_FILE = "resume.pt"  # a stopped run's resumable state, inside its folder (runner.RunState.save)


class RunExistsError(RuntimeError):
    """A finished run with a different config sits where this run would write."""


class RunBusyError(RuntimeError):
    """Another process holds the run's lock: it is training that run now."""


def config_yaml(cfg: RunConfig) -> str:
    """The resolved config (a :class:`RunConfig`, or another entry point's dataclass) as the run folder's
    ``config.yaml`` holds it."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def _saved_config(out: Path, schema: type = RunConfig) -> dict:
    """The semantic config of the run in ``out`` (keys added to ``schema`` since count as their defaults).

    Raises:
        RunExistsError: when its config.yaml no longer fits the schema.
    """
    old = yaml.safe_load((out / "config.yaml").read_text()) if (out / "config.yaml").exists() else {}
    try:
        return semantic_dict(OmegaConf.merge(structured_schema(schema), old or {}))
    except Exception as err:  # noqa: BLE001 - a key the schema no longer has, or a wrong type
        raise RunExistsError(f"{out} holds a run whose config.yaml does not fit this suite's schema "
                             f"({str(err).splitlines()[0]}); rerun with force=true to replace it") from err


def prepare_run_dir(cfg: RunConfig, schema: type = RunConfig) -> tuple[Path | None, bool]:
    """Decide what to do with the run's folder: ``(folder, resume)``, or ``(None, False)`` to skip.

    ``cfg`` is an instance of ``schema``: a :class:`RunConfig`, or another entry point's dataclass with
    ``results_root``, ``row``, ``seed`` and ``force`` (the zoo's, :class:`bnrotation.study.zoo.ZooConfig`).

    * ``DONE`` present and the same config (up to keys that do not change
      results): skip, unless ``force``.
    * ``DONE`` present, a different config: refuse, unless ``force``.
    * no ``DONE``, a resumable state (``resume.pt``) and the same config: resume, unless ``force``.
    * otherwise: a crashed or killed run; removed and rerun from scratch.
      A folder that is replaced loses its ``DONE`` before anything else.

    Call it while holding the run's :class:`RunLock`.

    Raises:
        RunExistsError: naming the folder and the keys that differ.
    """
    out = records.run_dir(cfg.results_root, cfg.row, cfg.seed)
    if (out / records.DONE).exists() and not cfg.force:
        old, new = _saved_config(out, schema), semantic_dict(cfg)
        if old == new:
            return None, False
        raise RunExistsError(f"{out} holds a finished run with a different config (keys "
                             f"{sorted(_diff_keys(old, new))}); rerun with force=true to replace it, or give this "
                             "variant its own row=<name>")
    if (out / RESUME_FILE).exists() and not cfg.force and _saved_config(out, schema) == semantic_dict(cfg):
        return out, True
    if out.exists():
        (out / records.DONE).unlink(missing_ok=True)  # first: a kill during the removal leaves a crashed run
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return out, False


def _diff_keys(a: dict, b: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested config dicts."""
    keys = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            keys += _diff_keys(va, vb, f"{prefix}{k}.")
        elif va != vb:
            keys.append(prefix + k)
    return keys


class RunLock:
    """An exclusive lock on one run, ``<results root>/locks/<row>/seed=<s>.lock`` (``fcntl.flock``), outside the
    run's folder, which a rerun removes and makes anew.

    The kernel releases it when the holding process dies, however it dies, so a
    stale lock never blocks a rerun. A second process that asks for a held lock
    is refused at once (:class:`RunBusyError`) with the holder's pid and host.
    """

    def __init__(self, results_root: str | Path, row: str, seed: int):
        self.run_dir = records.run_dir(results_root, row, seed)
        self.path = Path(results_root) / "locks" / row / f"seed={seed}.lock"
        self.fd: int | None = None

    def __enter__(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunBusyError(f"{self.run_dir} is being trained by {holder}; not started here "
                               "(rerun the sweep once it has finished)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {platform.node()} since "
                      f"{dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None


# ----------------------------------------------------------------------------- the frame
@dataclass
class Trained:
    """What an experiment's train function hands the frame: ``tables``, its tables (name -> long-format frame, each
    written as ``<name>.parquet``); ``info``, what ``run.json`` records of the run beside the frame's own keys (the
    built objects read back, timings); ``status``, ``done`` or ``diverged`` (a non-finite loss ended it early)."""

    tables: Mapping[str, pd.DataFrame]
    info: dict = field(default_factory=dict)
    status: str = "done"


def _nothing(cfg: Any) -> dict:
    return {}


@dataclass(frozen=True)
class Experiment:
    """An experiment on the frame (:func:`run_in_folder`).

    * ``schema``: its config dataclass, with ``results_root``, ``row``, ``seed`` and ``force`` (a field or a
      property); the run's ``config.yaml`` is an instance of it, and a finished run is compared with it.
    * ``train(cfg)``: trains one run and returns its :class:`Trained` (or its tables alone).
    * ``tables``: its table layout, each table it may write and the columns that table must have (the run
      reader's ``results.Layout`` holds the same mapping: what is written is what is read).
    * ``set_up(cfg)``: called once the folder is claimed, before ``run.json`` is first written: what the process
      needs set for the run (threads) and what ``run.json`` records at its start (a dict; none by default).
    """

    schema: type
    train: Callable[[Any], Trained | Mapping[str, pd.DataFrame]]
    tables: Mapping[str, tuple[str, ...]]
    set_up: Callable[[Any], dict] = _nothing


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat()


class RunFolder:
    """One run's claimed folder (:func:`claim`): ``path``; ``resume``, whether it holds a resumable state of the same
    config (:func:`prepare_run_dir`); ``info``, its ``run.json`` as written so far; ``started``, when it was claimed
    (seconds since the epoch)."""

    def __init__(self, cfg: Any, path: Path, resume: bool):
        self.cfg, self.path, self.resume = cfg, path, resume
        self.info: dict = {}
        self.started = time.time()

    def start(self, described: Mapping | None = None) -> None:
        """Write ``config.yaml`` (the resolved config) and the first ``run.json``: the schema version, row, seed,
        status ``running``, start time, then ``described`` (what the experiment records at the start)."""
        self.info = {"schema_version": records.SCHEMA_VERSION, "row": self.cfg.row, "seed": self.cfg.seed,
                     "status": "running", "started_at": _iso(self.started), **(described or {})}
        records.atomic_write_text(self.path / "config.yaml", config_yaml(self.cfg))
        records.write_json(self.path / "run.json", self.info)

    def finish(self, trained: Trained, columns: Mapping[str, tuple[str, ...]], wall_before: float = 0.0) -> Path:
        """Write the run's tables, its last ``run.json`` (``trained.info``, its status, end time and wall seconds,
        ``wall_before`` added: an earlier process's time on a resumed run) and ``DONE`` last; the resumable state
        goes. Every table is checked against ``columns`` (the experiment's layout) before any is written.

        Raises:
            ValueError: naming a table that is not in ``columns``, or one that lacks a column it must have.
        """
        if trained.status not in ("done", "diverged"):
            raise ValueError(f"status: expected done or diverged, got {trained.status!r}")
        for name, frame in trained.tables.items():
            if name not in columns:
                raise ValueError(f"table {name!r} is not one of this experiment's tables ({', '.join(columns)})")
            if missing := [c for c in columns[name] if c not in frame.columns]:
                raise ValueError(f"table {name!r} lacks columns {missing}")
        for name, frame in trained.tables.items():
            records.write_table(frame, self.path / f"{name}.parquet", name, columns[name])
        ended = time.time()
        self.info.update(trained.info, status=trained.status, ended_at=_iso(ended),
                         wall_seconds=round(wall_before + ended - self.started, 3))
        records.write_json(self.path / "run.json", self.info)
        (self.path / RESUME_FILE).unlink(missing_ok=True)
        records.mark_done(self.path)
        return self.path

    def fail(self, error: BaseException) -> None:
        """Say in ``run.json`` that the run ended without its tables: status ``interrupted`` (a stop from the
        keyboard) or ``failed`` (an exception), the error's first line, and the end time. No ``DONE``: the next
        call reruns the folder from scratch, and the run reader refuses it meanwhile."""
        if not self.info:
            return  # nothing written yet: the folder holds no run.json to correct
        line = (str(error).splitlines() or [""])[0]
        self.info.update(status="interrupted" if isinstance(error, KeyboardInterrupt) else "failed",
                         error=f"{type(error).__name__}: {line}" if line else type(error).__name__,
                         ended_at=_iso(time.time()))
        records.write_json(self.path / "run.json", self.info)


@contextmanager
def claim(cfgs: Sequence[Any], schema: type = RunConfig) -> Iterator[list[RunFolder | None]]:
    """Hold the lock of every run of ``cfgs`` (instances of ``schema``), all of them before any folder is touched,
    then decide each folder's fate (:func:`prepare_run_dir`): a :class:`RunFolder` per run, in order, or None for
    a run finished already with the same config (skip it). The locks are held until the block ends.

    Raises:
        RunBusyError: another process holds one of the locks (no folder touched).
        RunExistsError: a finished run with another config is in the way (and ``force`` is off).
    """
    with ExitStack() as stack:
        for cfg in cfgs:
            stack.enter_context(RunLock(cfg.results_root, cfg.row, cfg.seed))
        prepared = [prepare_run_dir(cfg, schema) for cfg in cfgs]
        yield [RunFolder(cfg, out, resume) if out is not None else None for cfg, (out, resume) in zip(cfgs, prepared)]


def run_in_folder(cfg: Any, experiment: Experiment) -> Path | None:
    """One run of ``experiment`` in its folder: the lock and the folder's policy (:func:`claim`), the set-up,
    ``config.yaml`` and ``run.json`` (:meth:`RunFolder.start`), the training (``experiment.train``), then the
    tables, ``run.json`` again and ``DONE`` (:meth:`RunFolder.finish`). A crash leaves the folder without ``DONE``
    and without any table, its ``run.json`` saying so (:meth:`RunFolder.fail`), and the next call reruns it from
    scratch.

    Returns:
        The run folder, or None when it was finished already with the same config (skipped).

    Raises:
        RunExistsError: a finished run with another config is in the way (and ``force`` is off).
        RunBusyError: another process is training it now.
        ValueError: a table the experiment's layout does not allow (:meth:`RunFolder.finish`).
    """
    with claim([cfg], experiment.schema) as (folder,):
        if folder is None:
            return None
        folder.start(experiment.set_up(cfg))
        try:
            trained = experiment.train(cfg)
            return folder.finish(trained if isinstance(trained, Trained) else Trained(trained), experiment.tables)
        except BaseException as err:
            folder.fail(err)
            raise
