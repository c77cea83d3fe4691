"""What the Hydra entry points do with a composed config: validate, run, report; and the sweep's summary.

Kept out of ``experiments/`` so that it can be tested without a subprocess.

A single run exits with its own status. In a multirun (``-m``) every job
runs to its end whatever the others do, records its :class:`Outcome` in its
Hydra job folder (``outcome.json``), and :class:`SweepSummary`, a Hydra
callback that runs in the launching process once every job has returned,
prints one line per run that did not finish and exits non-zero if any
failed: a sweep that lost a run never exits 0.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import os
import socket
import sys
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from .config import ConfigError, RunConfig, check_row, to_run_config

log = logging.getLogger("bnrotation")
OUTCOME_FILE = "outcome.json"
SWEEP_OWNER_FILE = "sweep.json"  # in a sweep's folder: which launching process the job folders beside it belong to

# Outcomes that leave the sweep incomplete: the sweep's exit status is non-zero when any job ends so.
FAILED = ("failed", "bad config", "refused", "busy", "interrupted")


@dataclass
class Outcome:
    """How one job ended.

    Attributes:
        status: ``done``, ``skipped`` (finished before, same config),
            ``diverged`` (non-finite loss: a finished run), ``failed`` (an
            exception), ``bad config`` (rejected before any work),
            ``refused`` (a finished run with another config is in the way),
            ``busy`` (another process is training this run now),
            ``interrupted`` (stopped by a signal at a step boundary; the next sweep resumes it).
        exit_code: the process exit status a single run ends with.
        run: ``<row> seed=<s>`` (``?`` when the config did not validate).
        message: one line for the summary.
    """

    status: str
    exit_code: int
    run: str = "?"
    message: str = ""

    @property
    def failed(self) -> bool:
        return self.status in FAILED


def run_task(cfg: DictConfig) -> Outcome:
    """Validate ``cfg``, train the run, report it on stderr and return its :class:`Outcome`.

    A bad config (a key the schema lacks, a value out of range, a row name
    whose definition the config contradicts, a ``results_root`` that cannot
    be created) is reported as one line naming the key, exit status 2, before
    any work. A run that diverged (non-finite
    loss) is a finished run: ``diverged``, status 0. A crash is reported with
    its exception, status 1; its folder has no ``DONE`` and the next sweep
    reruns it.
    """
    def checked(c: DictConfig) -> RunConfig:
        run_cfg = to_run_config(c)
        check_row(run_cfg)
        return run_cfg

    run_cfg, failure = validated(cfg, checked, lambda r: where_of(r.row, r.batch_seeds or [r.seed]))
    if failure is not None:
        return failure
    seeds = run_cfg.batch_seeds or [run_cfg.seed]
    where = where_of(run_cfg.row, seeds)
    from .runner import run_seeds  # torch only once the config is valid

    outs, failure = attempt(where, lambda: run_seeds(dataclasses.replace(run_cfg, batch_seeds=seeds),
                                                      progress_lines=runs_at_once() > 1))
    if failure is not None:
        return failure
    outcomes = [finished_outcome(run_cfg.row, seed, out) for seed, out in outs.items()]
    if len(outcomes) == 1:
        return outcomes[0]
    statuses = {o.status for o in outcomes}
    status = "diverged" if "diverged" in statuses else "done" if "done" in statuses else "skipped"
    return Outcome(status, 0, where, "; ".join(f"{o.run}: {o.status}" for o in outcomes))


def runs_at_once() -> int:
    """How many runs of this process's sweep train at once beside it, writing to the same terminal: the joblib
    launcher's ``n_jobs`` in a multirun (``-1``: one per core, ``-2``: all but one, as joblib reads it), else 1
    (a single run; a sweep run one job at a time; submitit's launchers, whose jobs each write to files of their
    own). More than 1 makes the run's progress a line at a time (:func:`bnrotation.study.runner.progress_bar`): the bars
    of several worker processes would overwrite one another on one line."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return 1
    launcher = HydraConfig.get().launcher
    if "joblib" not in str(launcher.get("_target_", "")):
        return 1
    n_jobs = int(launcher.get("n_jobs") or 1)
    return n_jobs if n_jobs > 0 else max(1, (os.cpu_count() or 1) + 1 + n_jobs)


def where_of(row: str, seeds: list[int]) -> str:
    """``<row> seed=<s>`` (``seeds=<s,t>`` for several): how a summary names a run."""
    return f"{row} seed{'s' * (len(seeds) > 1)}={','.join(map(str, seeds))}"


def validated(cfg: DictConfig, convert, where) -> tuple[object, Outcome | None]:
    """``(convert(cfg), None)``, or ``(None, outcome)`` with one line on stderr for a config ``convert`` rejects
    (a :class:`ConfigError`) or whose ``results_root`` cannot be created (``bad config``, exit status 2), before
    any work. ``where(converted)`` names the run in the outcome."""
    try:
        converted = convert(cfg)
    except ConfigError as err:
        print(f"error: bad config: {err}", file=sys.stderr)
        return None, Outcome("bad config", 2, message=str(err))
    problem = results_root_problem(converted.results_root)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return None, Outcome("bad config", 2, where(converted), problem)
    return converted, None


def attempt(where: str, train) -> tuple[object, Outcome | None]:
    """Call ``train()`` (a run's training, once its config is valid) and return ``(its result, None)``, or
    ``(None, outcome)`` for how it failed, reported on stderr as every entry point reports it: a config the built
    objects contradict (``bad config``, 2), a finished run with another config in the way (``refused``, 2),
    another process training it (``busy``, 3), a stop signal (``interrupted``, 128 + signal), any other exception
    (``failed``, 1: its folder has no ``DONE`` and the next sweep reruns it). ``where``: ``<row> seed=<s>``."""
    from .rundir import RunBusyError, RunExistsError
    from .runtime import RunInterrupted

    try:
        return train(), None
    except ConfigError as err:  # what the built objects say contradicts the row (runner.run), or the data's size
        print(f"error: bad config: {err}", file=sys.stderr)
        return None, Outcome("bad config", 2, where, str(err))
    except RunExistsError as err:
        print(f"error: {err}", file=sys.stderr)
        return None, Outcome("refused", 2, where, str(err))
    except RunBusyError as err:
        print(f"busy: {err}", file=sys.stderr)
        return None, Outcome("busy", 3, where, str(err))
    except RunInterrupted as err:
        print(f"interrupted: {where} {err}; the next sweep resumes it", file=sys.stderr)
        return None, Outcome("interrupted", 128 + err.signum, where, str(err))
    except Exception as err:  # noqa: BLE001 - a sweep must outlive one crashing run
        print(f"error: run {where} failed: {type(err).__name__}: {err} (its traceback: rerun with "
              "hydra.verbose=true)", file=sys.stderr)
        log.debug("".join(traceback.format_exception(err)))
        return None, Outcome("failed", 1, where, f"{type(err).__name__}: {err}")


def run_one(cfg: DictConfig, convert, train) -> Outcome:
    """What an entry point of one run a config (the zoo's, the frozen backbone's) does with its composed config
    ``cfg``: ``convert(cfg)`` validates it (:func:`validated`: a bad key is one line, exit status 2, before any
    work), ``train(converted)`` trains the run (:func:`attempt`: a crash is ``failed``, status 1, and its folder,
    without ``DONE``, is rerun by the next sweep), then its :class:`Outcome` (:func:`finished_outcome`: a finished
    run with the same config is ``skipped``). The converted config names its run by ``row`` and ``seed``."""
    converted, failure = validated(cfg, convert, lambda c: where_of(c.row, [c.seed]))
    if failure is not None:
        return failure
    out, failure = attempt(where_of(converted.row, [converted.seed]), lambda: train(converted))
    if failure is not None:
        return failure
    return finished_outcome(converted.row, converted.seed, out)


def stop_on_unknown_keys(schema: type, argv: list[str] | None = None, groups: tuple[str, ...] = ()) -> None:
    """Before Hydra composes the config: stop with one line naming it and exit status 2 when a command-line
    override (``key=value``, a sweep's ``key=a,b`` too) names a key ``schema`` lacks, as :func:`validated` reports a
    bad value, where Hydra would print its own five lines and exit 1. Hydra's own keys (``hydra.``, ``hydra/``),
    the choice of a config group in ``groups`` that is not a key (``experiment=adam``: ``conf/experiment/``),
    deletions (``~key``) and arguments it cannot parse are left to it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from .config import check_known_keys

    try:
        overrides = OverridesParser.create().parse_overrides(
            [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")])
    except Exception:  # noqa: BLE001 - Hydra reports what it cannot parse itself
        return
    given: dict = {}
    for o in overrides:
        key = o.key_or_group
        if key in groups and not o.is_delete():
            _stop_on_unknown_choice(key, o.value())
        if o.is_delete() or key.split("/")[0].split(".")[0] == "hydra" or key in groups:
            continue
        *parents, leaf = key.split(".")
        node = given
        for part in parents:  # a group's choice (scale=smoke) and a key under it (scale.steps=3) together
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node.setdefault(leaf, None)
    try:
        check_known_keys(given, schema)
    except ConfigError as err:
        print(f"error: bad config: {err}", file=sys.stderr)
        sys.exit(2)


CONF = Path(__file__).resolve().parents[3] / "conf"  # the checkout's Hydra configs (absent from a wheel)


def _stop_on_unknown_choice(group: str, value, conf: Path = CONF) -> None:
    """One line and exit status 2 when ``group=value`` (a sweep's ``a,b`` too) names no ``conf/<group>/<value>.yaml``,
    with the nearest names (``experiment=adma``: did you mean adam?), where Hydra would print the whole list; nothing
    where the folder is not there (an installed package) or the value is not a plain name."""
    folder = conf / group
    if not folder.is_dir():
        return
    names = getattr(value, "list", [value])  # a ChoiceSweep's values, or the one value
    known = sorted(p.stem for p in folder.glob("*.yaml"))
    for name in names:
        if isinstance(name, str) and name not in known:
            near = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(near)}?" if near else f"; expected one of {', '.join(known)}"
            print(f"error: {group}={name}: no conf/{group}/{name}.yaml{hint}", file=sys.stderr)
            sys.exit(2)


def finish_job(outcome: Outcome) -> None:
    """What a Hydra entry point does with its job's outcome. In a multirun (``-m``) a job does not exit: the sweep
    runs every job, then :class:`SweepSummary` reports and sets the exit status; it records the outcome in its job
    folder (:func:`record_outcome`), and a stop signal stops the sweep too. A single run exits with the outcome's
    status; one that did nothing (a bad config, a refused folder) first removes its empty Hydra run folder."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        record_outcome(outcome, hc.runtime.output_dir)
        if outcome.status == "interrupted":
            sys.exit(outcome.exit_code)
    elif outcome.exit_code:
        if outcome.status in ("bad config", "refused"):  # nothing ran: no empty hydra/runs/<time>/ left behind
            remove_unused_run_dir(hc.runtime.output_dir, hc.job.name)
        sys.exit(outcome.exit_code)


def finished_outcome(row: str, seed: int, out: Path | None) -> Outcome:
    """Report one finished (or skipped) run on stderr and return its outcome."""
    where = f"{row} seed={seed}"
    if out is None:
        print(f"skip: {where} is finished with the same config (force=true reruns it)", file=sys.stderr)
        return Outcome("skipped", 0, where)
    if (step := json.loads((out / "run.json").read_text()).get("diverged_at_step")) is not None:
        print(f"diverged: {where} at step {step} (non-finite loss); the rows logged before it are kept -> {out}",
              file=sys.stderr)
        return Outcome("diverged", 0, where, f"non-finite loss at step {step}")
    print(f"done: {where} -> {out}", file=sys.stderr)
    return Outcome("done", 0, where, str(out))


def results_root_problem(results_root: str | Path) -> str | None:
    """``results_root=<path>: cannot be created: <why>`` when the results root cannot be created and written
    to (:func:`records.folder_problem`), else None."""
    from ..records import folder_problem  # no torch

    why = folder_problem(results_root)
    return f"results_root={results_root}: cannot be created: {why}" if why else None


# Results roots that did not exist when this process started its run (CheckResultsRoot): Hydra creates them with
# its run folder, and a rejected config removes them again when they hold nothing else (remove_unused_run_dir).
_CREATED_ROOTS: set[Path] = set()


class CheckResultsRoot(Callback):
    """Hydra callback (``hydra.callbacks.check_results_root``): before Hydra makes its run or sweep folder
    under ``results_root`` (``hydra/runs/<time>``, ``hydra/multirun/<time>``), stop with one line and exit
    status 2 when ``results_root`` cannot be created (``/proc/x``, a path through a regular file), instead of
    Hydra's traceback from ``mkdir``."""

    def _check(self, config: DictConfig) -> None:
        problem = results_root_problem(config.results_root)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            sys.exit(2)

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        self._check(config)
        if not Path(config.results_root).exists():
            _CREATED_ROOTS.add(Path(config.results_root).resolve())

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self._check(config)


# What Hydra writes into a single run's folder (hydra/runs/<time>/) before the task runs.
HYDRA_OWN = (".hydra",)


def remove_unused_run_dir(run_dir: str | Path, job_name: str) -> bool:
    """Remove a single run's Hydra folder (``<results_root>/hydra/runs/<time>/``) after its config was rejected,
    when it holds only Hydra's own files (``.hydra/`` and ``<job_name>.log``); then ``runs/`` and ``hydra/``
    above it if that left them empty, and the results root if this command created it and it is now empty.
    Hydra makes the folder before the task function runs, so without this every rejected command would leave
    one behind.

    Returns:
        Whether the folder was removed (False when it holds anything else, or is gone).
    """
    import shutil

    run_dir = Path(run_dir)
    if not run_dir.is_dir() or any(p.name not in (*HYDRA_OWN, f"{job_name}.log") for p in run_dir.iterdir()):
        return False
    shutil.rmtree(run_dir)
    for parent, name in ((run_dir.parent, "runs"), (run_dir.parent.parent, "hydra")):
        if parent.name != name or any(parent.iterdir()):
            break
        parent.rmdir()
    else:
        root = run_dir.parent.parent.parent
        if root.resolve() in _CREATED_ROOTS and not any(root.iterdir()):
            root.rmdir()
    return True

def record_outcome(outcome: Outcome, job_dir: str | Path) -> None:
    """Write ``outcome.json`` into a multirun job's Hydra folder, for :class:`SweepSummary`."""
    from ..records import write_json  # no torch

    write_json(Path(job_dir) / OUTCOME_FILE, asdict(outcome))


def summarise_sweep(sweep_dir: str | Path) -> tuple[str, bool]:
    """The summary of a finished multirun from its jobs' ``outcome.json``; and whether any job failed.

    A job folder without an outcome (its process died before it could write
    one) counts as failed.
    """
    sweep_dir = Path(sweep_dir)
    jobs = sorted((p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)) \
        if sweep_dir.is_dir() else []
    outcomes = []
    for job in jobs:
        try:
            outcomes.append(Outcome(**json.loads((job / OUTCOME_FILE).read_text())))
        except (OSError, ValueError, TypeError):
            outcomes.append(Outcome("failed", 1, f"job {job.name}", f"no {OUTCOME_FILE}: the job's process died "
                                                                    f"(see {job})"))
    counts = {s: sum(o.status == s for o in outcomes) for s in dict.fromkeys(o.status for o in outcomes)}
    bad = [o for o in outcomes if o.failed]
    head = (f"sweep: {len(outcomes)} run{'s' * (len(outcomes) != 1)}: "
            + ", ".join(f"{n} {s}" for s, n in counts.items()) if outcomes else "sweep: no job ran")
    lines = [head] + [f"  {o.status}: {o.run}: {o.message}" for o in bad]
    if bad:
        lines.append(f"sweep FAILED: {len(bad)} of {len(outcomes)} runs did not finish; rerun the same command "
                     "to retry them (finished runs are skipped)")
    return "\n".join(lines), bool(bad) or not outcomes


def claim_sweep_dir(sweep_dir: str | Path, argv: list[str] | None = None) -> str | None:
    """Make ``sweep_dir`` this sweep's own before any job runs: create it and, atomically (``O_EXCL``), its
    ``sweep.json`` (the launching process's pid, host, start time and command line).

    :func:`summarise_sweep` reads every numbered job folder it finds, so a folder shared by two sweeps (two
    commands started in the same instant, or one ``hydra.sweep.dir`` given twice) would mix their outcomes:
    one sweep would report the other's running jobs as dead, or a job of its own that failed as the other's
    finished one. The default folder is named to the microsecond (``conf/config.yaml``); this refuses the rest.

    Returns:
        None when the folder is now this sweep's; otherwise one line naming the folder, who holds it and what
        to do.
    """
    from datetime import datetime, timezone

    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    jobs = sorted(p.name for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit())
    owner = sweep_dir / SWEEP_OWNER_FILE
    advice = ("two sweeps in one folder would mix their jobs' outcomes. Give this sweep its own hydra.sweep.dir, "
              "or leave it at its default (a new folder per command)")
    try:
        fd = os.open(owner, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        try:
            held = json.loads(owner.read_text())
            who = f"started {held['started_at']} by pid {held['pid']} on {held['host']}"
        except (OSError, ValueError, KeyError, TypeError):
            who = f"its {SWEEP_OWNER_FILE} is unreadable"
        return f"hydra.sweep.dir {sweep_dir} already belongs to another sweep ({who}); {advice}"
    if jobs:  # an earlier sweep's folder, from before sweep.json was written
        os.close(fd)
        owner.unlink()
        listed = ", ".join(jobs[:5]) + (", …" if len(jobs) > 5 else "")
        return f"hydra.sweep.dir {sweep_dir} already holds the job folders of an earlier sweep ({listed}); {advice}"
    with os.fdopen(fd, "w") as f:
        json.dump({"pid": os.getpid(), "host": socket.gethostname(),
                   "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   "argv": list(sys.argv if argv is None else argv)}, f, indent=1)
    return None


class SweepSummary(Callback):
    """Hydra callback (``hydra.callbacks.sweep_summary``): before a multirun, claim its sweep folder
    (:func:`claim_sweep_dir`; one line and exit status 2 if another sweep holds it); after it, one line per
    run that did not finish, and exit status 1 if any did not (a failed sweep never exits 0)."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        problem = claim_sweep_dir(config.hydra.sweep.dir)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        text, failed = summarise_sweep(config.hydra.sweep.dir)
        print(text, file=sys.stderr)
        if failed:
            sys.exit(1)
