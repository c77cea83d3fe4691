"""A run's folder: whether to skip, refuse, resume or start it anew, and the lock that keeps it to one process.

The folder is ``<results_root>/runs/<row>/seed=<s>/`` (:func:`bnrotation.records.run_dir`); its files are
:mod:`bnrotation.records`'. :func:`prepare_run_dir` decides what a new call of the runner does with it, from
its ``DONE`` marker, its resumable state (:data:`RESUME_FILE`) and the config saved beside them; a run holds
:class:`RunLock` while it decides and trains.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import platform
import shutil
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from .. import records
from .config import RunConfig, semantic_dict, structured_schema

__all__ = ["RESUME_FILE", "RunExistsError", "RunBusyError", "RunLock", "config_yaml", "prepare_run_dir"]

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
