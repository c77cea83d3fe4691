"""The training loop: steps, the monitor at log points, accuracy checks, interventions, averaging, records.

One call of :func:`run` trains one row at one seed and writes
``<results_root>/runs/<row>/seed=<s>/`` (see :mod:`records`). What is
measured at a log point comes from :class:`monitor.StalenessMonitor`, the same
monitor a user attaches to their own model; the runner only decides when.

The training step itself does no host synchronisation: the loss is read only
at check steps, and divergence is tracked on the device and read at the steps
that measure something.

A run holds a lock on its folder while it trains, and decides there whether
to skip, refuse, resume or start anew (:mod:`bnrotation.study.rundir`). Threads,
deterministic kernels, the device and compiled evaluation are set before the
first step (:mod:`bnrotation.study.runtime`). On SIGTERM, SIGINT or submitit's
preemption signal it stops at the next step boundary and saves a resumable
state (``resume.pt``, written atomically); the next sweep resumes it from
there, with results identical to an uninterrupted run on the same machine. It also
saves that state every :data:`RESUME_EVERY_S` while it trains, so that a kill
without warning resumes from there too; a run that raises is rerun from scratch.
Several seeds train as one batched model through :mod:`bnrotation.study.ensemble`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from . import ensemble
from .. import records
from ..bnstats import running_stat_layers
from ..checkpoints import checkpoint_path, save_checkpoint
from .config import ConfigError, RunConfig, check_row
from ..evaluation import CompiledEvaluation, compiled_evaluation, eval_chunk
from .interventions import run_interventions
from . import mechanism
from .model import build_network
from ..monitor import StalenessMonitor
from .optim import build_optimizer, build_schedule
from ..probes import accuracy, batch_statistics_pass
from .provenance import compile_cache_per_kernel_path, describe_built
from .rows import ROWS, check_against_row
from .run_averages import AveragesFactory, RunAverages
from .rundir import RESUME_FILE, RunFolder, Trained, claim
from .runtime import (RunInterrupted, evaluation_compiled, pass_on_to_submitit, resolve_device, resolve_threads,
                      set_determinism, stop_signals)
from .task import Task, build_task, generator, heldout_set, memory_format, probe_set, reestimation_batches, run_dtype


# ----------------------------------------------------------------------------- schedule of a run
def log_steps(cfg: RunConfig) -> set[int]:
    """Steps with probes: every ``log_every`` from 0, and the last step."""
    return set(range(0, cfg.scale.steps + 1, cfg.scale.log_every)) | {cfg.scale.steps}


def check_steps(cfg: RunConfig) -> list[int]:
    """Accuracy checks: every ``check_every`` from ``check_start`` to ``steps`` inclusive."""
    s = cfg.scale
    return list(range(s.check_start, s.steps + 1, s.check_every))


def intervention_steps(cfg: RunConfig) -> list[int]:
    """Every ``intervene_every`` steps inside the check window, and the last step."""
    s = cfg.scale
    first = -(-s.check_start // s.intervene_every) * s.intervene_every
    return sorted(set(range(first, s.steps + 1, s.intervene_every)) | {s.steps})


def averaging_steps(cfg: RunConfig) -> list[int]:
    """Steps the averaged models are evaluated at (``averaging.at``); none when averaging is off."""
    if not cfg.averaging.enabled:
        return []
    return {"interventions": intervention_steps(cfg), "checks": check_steps(cfg),
            "last": [cfg.scale.steps]}[cfg.averaging.at]


def dense_steps(cfg: RunConfig) -> set[int]:
    """Every step from each start in ``scale.dense_windows`` to start + ``scale.dense_length`` inclusive."""
    return {w + i for w in cfg.scale.dense_windows for i in range(cfg.scale.dense_length + 1)}


# ----------------------------------------------------------------------------- one run's state
@dataclass
class RunState:
    """Everything the loop changes as it goes, and what a resumable state saves."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler | None
    g_train: torch.Generator
    monitor: StalenessMonitor
    tables: records.TableBuffer
    averages: RunAverages | None
    first_bad: torch.Tensor  # () long on the device: the first step with a non-finite loss, 0 if none
    step: int = 0  # the last completed step
    timings: dict = field(default_factory=lambda: dict.fromkeys(
        ("train", "probes", "checks", "interventions", "averaging", "dense"), 0.0))
    resumes: list = field(default_factory=list)
    wall_before: float = 0.0  # wall seconds of the earlier processes of a resumed run
    step0_measured: bool = False  # the measurements at step 0 (before any step) are in the tables
    losses_pending: list = field(default_factory=list)  # (step, loss) not yet in the losses table (mechanism log)

    def save(self, path: Path, wall_seconds: float = 0.0) -> None:
        """Write the resumable state atomically (a plain dict of tensors, bytes and numbers: it loads with
        ``torch.load(weights_only=True)``); ``wall_seconds``: this process's wall time on the run so far."""
        state = {
            "step": self.step, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict() if self.schedule is not None else None,
            "g_train": self.g_train.get_state(), "torch_rng": torch.get_rng_state(),
            "monitor": self.monitor.state_dict(), "tables": self.tables.to_bytes(),
            "averages": self.averages.state_dict() if self.averages is not None else None,
            "first_bad": self.first_bad.cpu(), "timings": dict(self.timings), "resumes": list(self.resumes),
            "wall_seconds": self.wall_before + wall_seconds, "step0_measured": self.step0_measured,
            "losses_pending": [(int(k), float(v)) for k, v in self.losses_pending],
        }
        buf = io.BytesIO()
        torch.save(state, buf)
        records.atomic_write_bytes(path, buf.getvalue())

    def load(self, path: Path) -> None:
        """Restore :meth:`save`'s state (onto the run's device)."""
        state = torch.load(path, map_location=self.first_bad.device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.schedule is not None:
            self.schedule.load_state_dict(state["schedule"])
        self.g_train.set_state(state["g_train"].to(self.g_train.device) if self.g_train.device.type == "cpu"
                               else state["g_train"])
        torch.set_rng_state(state["torch_rng"].cpu())
        self.monitor.load_state_dict(state["monitor"])
        self.tables.load_bytes(state["tables"])
        if self.averages is not None:
            self.averages.load_state_dict(state["averages"])
        self.first_bad = state["first_bad"].to(self.first_bad.device)
        self.step, self.timings, self.resumes = int(state["step"]), dict(state["timings"]), list(state["resumes"])
        self.wall_before = float(state.get("wall_seconds", 0.0))  # absent from states of older versions,
        self.step0_measured = bool(state.get("step0_measured", True))  # which saved only after step 0
        self.losses_pending = [tuple(x) for x in state.get("losses_pending", [])]


# ----------------------------------------------------------------------------- progress
# A run that shares its terminal with others (a joblib sweep: every worker writes to the same stderr) prints its
# progress as a whole line this often instead of redrawing a bar: bars of several processes, each returning to the
# start of the line, overwrite one another on one line.
PROGRESS_LINE_SECONDS = 30.0
# Wall seconds between the resumable states a training run saves (at a measured step, atomically): a kill
# without warning (SIGKILL, an out-of-memory kill, a job pool torn down) loses at most this much training.
RESUME_EVERY_S = 600.0


class _Lines(io.TextIOBase):
    """A stream for tqdm that turns each redraw of the bar into a line of its own on stderr."""

    def write(self, text: str) -> int:
        text = text.strip("\r\n")
        if text:
            print(text, file=sys.stderr, flush=True)
        return len(text)


def progress_bar(steps: range, start: int, total: int, desc: str, enabled: bool, lines: bool = False) -> tqdm:
    """The progress display over ``steps`` (training steps ``start + 1`` to ``total``): a tqdm bar redrawn in place
    at most once a second, or with ``lines`` one line every :data:`PROGRESS_LINE_SECONDS` (and one at the end),
    never a carriage return; nothing when not ``enabled`` (``progress=false``)."""
    if lines:
        return tqdm(steps, initial=start, total=total, desc=desc, disable=not enabled, file=_Lines(), ncols=80,
                    mininterval=PROGRESS_LINE_SECONDS, maxinterval=PROGRESS_LINE_SECONDS)
    return tqdm(steps, initial=start, total=total, desc=desc, disable=not enabled, dynamic_ncols=True,
                mininterval=1.0)


# ----------------------------------------------------------------------------- the run
def run(cfg: RunConfig, *, averages: AveragesFactory = RunAverages) -> Path | None:
    """Train one run (``seed``) and write its folder; returns the folder, or None if it was skipped.

    With ``batch_seeds`` use :func:`run_seeds`. ``averages`` builds what the run keeps for its ``averaging``
    table when ``averaging.enabled`` (:class:`~bnrotation.study.run_averages.RunAverages`, or a subclass that also
    sees every average it scores, as ``experiments/audit_averaging.py`` passes).

    Raises:
        ConfigError: the config keeps a registered row's name but changes what the row means, or asks
            for ``device=cuda`` where there is none.
        rundir.RunExistsError: a finished run with another config is in the way.
        rundir.RunBusyError: another process is training this run now.
        runtime.RunInterrupted: a stop signal arrived; the resumable state is saved.
    """
    return run_seeds(dataclasses.replace(cfg, batch_seeds=[cfg.seed]), averages=averages)[cfg.seed]


def run_seeds(cfg: RunConfig, progress_lines: bool = False, *,
              averages: AveragesFactory = RunAverages) -> dict[int, Path | None]:
    """Train the seeds ``batch_seeds`` of one row, each into its own folder, as :func:`run` would one by one.

    One seed trains alone. Several train together in this process as one batched model
    (:mod:`bnrotation.study.ensemble`): each keeps its own data, initial weights, running statistics, optimizer
    state and projection, and every measurement runs on a plain copy of that seed's model, so the tables
    equal those of separate runs up to the order of floating-point sums in the grouped kernels. Each seed
    skips, refuses, locks and resumes exactly as a run alone (a batch resumes when its unfinished seeds
    stopped at the same step). ``progress_lines``: the progress display is a line every
    :data:`PROGRESS_LINE_SECONDS` rather than a bar (:func:`progress_bar`; for a process that shares its terminal
    with other runs). ``averages``: as in :func:`run`, called once per seed.

    Returns:
        ``{seed: folder, or None when it was skipped}``.

    Raises:
        as :func:`run`; ConfigError also when the unfinished seeds' resumable states are at different steps.
    """
    check_row(cfg)
    device = resolve_device(cfg.device)
    seeds = list(dict.fromkeys(cfg.batch_seeds))
    cfgs = {s: dataclasses.replace(cfg, seed=s, batch_seeds=[]) for s in seeds}
    built = {s: _build(c, device) for s, c in cfgs.items()}
    with claim([cfgs[s] for s in seeds]) as claimed:
        folders = dict(zip(seeds, claimed))
        todo = [s for s in seeds if folders[s] is not None]
        results: dict[int, Path | None] = {s: None for s in seeds}
        if todo:
            resolve_threads(cfg.threads)
            determinism = set_determinism(cfg.deterministic, device)
            compiled = evaluation_compiled(cfg, device)
            for s in todo:
                built[s].described["eval_backend"] = "compiled" if compiled else "eager"
            # Stop signals are caught from before run.json is written: a stop during the setup (the compile
            # included) or step 0's measurements saves the state at step 0, so that a preempted job resumes.
            with stop_signals() as caught:
                if compiled:  # compiled code cached per CPU kernel path
                    compile_cache_per_kernel_path()
                with compiled_evaluation(compiled) as evaluator:  # passed to every evaluation-mode pass it compiles
                    members = [_member(cfgs[s], built[s], folders[s], device=device, determinism=determinism,
                                       batched_with=todo, averages=averages, compiled=evaluator) for s in todo]
                    try:
                        results.update(_train(members, caught, progress_lines))
                    except Exception:
                        # A crash is rerun from scratch, not from its last periodic state; a stop (RunInterrupted,
                        # or submitit's requeue after a preemption signal) keeps the state it has just saved.
                        if caught["signum"] is None:
                            for m in members:
                                if not m.finished:
                                    (m.out / RESUME_FILE).unlink(missing_ok=True)
                        raise
            if caught["signum"] is not None:
                # It arrived after the last step boundary, so every run finished and is complete. Pass it on to
                # the handler it was meant for, now restored: a sweep stops instead of starting its next run.
                signal.raise_signal(caught["signum"])
        return results


@dataclass
class _Built:
    """A seed's own task, model, optimizer and schedule, and what they are read back as (``run.json``'s
    settings)."""

    task: Task
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler | None
    described: dict


def _build(cfg: RunConfig, device: torch.device) -> _Built:
    """A seed's own task, model, optimizer and schedule; refused before any work when what they are read back as
    contradicts what the row means (what ``make table`` would refuse after the run), or when the task's data
    cannot be read (:class:`~bnrotation.study.fashion_mnist.DataError`)."""
    task = build_task(cfg.task, cfg.seed, device, run_dtype(cfg))
    model = build_network(cfg.model, cfg.task.num_classes, cfg.seed, device, cfg.task.in_channels).to(run_dtype(cfg))
    optimizer = build_optimizer(cfg.optimizer, model)
    schedule = build_schedule(cfg.schedule, optimizer, cfg.scale.steps)
    described = {**describe_built(model, optimizer, schedule, device), "task": task.describe()}
    if cfg.row in ROWS and (problems := check_against_row(described, ROWS[cfg.row])):
        raise ConfigError(f"row: what this config builds contradicts row {cfg.row!r}: {'; '.join(problems)}; "
                          f"give the variant a row name of its own (row=<name>)")
    return _Built(task, model, optimizer, schedule, described)


@dataclass
class _Member:
    """One seed of a (possibly batched) run: its config, folder (with its ``run.json``), data and state."""

    cfg: RunConfig
    folder: RunFolder
    state: RunState
    task: Task
    x_held: torch.Tensor
    y_held: torch.Tensor
    x_probe: torch.Tensor
    finished: bool = False
    compiled: CompiledEvaluation | None = None  # what its evaluation-mode passes run through; None: eagerly

    @property
    def out(self) -> Path:
        return self.folder.path


def _member(cfg: RunConfig, built: _Built, folder: RunFolder, *, device: torch.device, determinism: dict,
            batched_with: list[int], averages: AveragesFactory,
            compiled: CompiledEvaluation | None = None) -> _Member:
    """One seed ready to train in its claimed ``folder``: its data, its state (resumed from the folder when it
    holds a resumable state of the same config), and its ``config.yaml`` and first ``run.json`` written;
    ``batched_with``: the seeds that train with it; ``averages`` builds its averages (:func:`run`); ``compiled``:
    what its evaluation-mode passes run through (None: eagerly)."""
    out = folder.path
    built.described["threads"] = torch.get_num_threads()
    task = built.task
    x_held, y_held = heldout_set(task, cfg)
    x_probe, y_probe = probe_set(task, cfg)
    model = built.model
    has_running = bool(running_stat_layers(model))
    state = RunState(
        model, built.optimizer, built.schedule, generator(cfg.seed, "train", device),
        StalenessMonitor(model, (x_probe, y_probe), warn=False, running_statistics_only=False, compiled=compiled),
        records.TableBuffer(cfg.row, cfg.seed),
        averages(cfg.averaging, model) if cfg.averaging.enabled and has_running else None,
        torch.zeros((), dtype=torch.long, device=device))
    if folder.resume:
        state.load(out / RESUME_FILE)
        state.resumes.append({"at_step": state.step, "at": dt.datetime.now(dt.timezone.utc).isoformat()})
        print(f"resuming {cfg.row} seed={cfg.seed} at step {state.step} of {cfg.scale.steps} "
              f"from {out / RESUME_FILE}", file=sys.stderr, flush=True)
    folder.start({**built.described, "determinism": determinism, "pairing": state.monitor.pairing.describe(),
                  "batched_with_seeds": batched_with if len(batched_with) > 1 else None})
    return _Member(cfg, folder, state, task, x_held, y_held, x_probe, compiled=compiled)


def _train(members: list[_Member], caught: dict, progress_lines: bool = False) -> dict[int, Path]:
    """The training loop, for one seed or a batch of seeds at the same step; ``caught``: :func:`stop_signals`'
    flag, read at each step boundary; ``progress_lines``: :func:`progress_bar`'s."""
    steps_at = {m.state.step for m in members}
    if len(steps_at) > 1:
        raise ConfigError(f"batch_seeds: the unfinished seeds stopped at different steps "
                          f"({', '.join(f'seed {m.cfg.seed} at step {m.state.step}' for m in members)}); resume them "
                          "one batch per step (batch_seeds=[...]) or alone")
    cfg = members[0].cfg
    trainer = _trainer(members)
    has_running = bool(running_stat_layers(members[0].state.model))
    sched = _Schedule(cfg, has_running, members[0].state.averages is not None)
    start = steps_at.pop()
    results: dict[int, Path] = {}
    # The optimizer-state log (scale.mechanism_every): the one seed and its paired weight layers, else None
    mech_layers = None
    if sched.mechanism:
        m0 = members[0]
        names = list(dict.fromkeys(w for p in m0.state.monitor.pairing.pairs for w in p.weights))
        mech_layers = (m0, mechanism.weight_layers(m0.state.model, names))
    seeds = ",".join(str(m.cfg.seed) for m in members)
    if members[0].compiled is not None:  # compile now, in setup, for every chunk size the evaluations will use
        m = members[0]
        accuracy(m.state.model, m.x_held, m.y_held, "eval", eval_chunk(m.x_held.device, len(m.y_held)), m.compiled)
    for m in members:
        if start == 0 and not m.state.step0_measured:
            _measure(m, 0, None, None, sched)
            m.state.step0_measured = True
    bar = progress_bar(range(start + 1, cfg.scale.steps + 1), start, cfg.scale.steps,
                       f"{cfg.row} seed{'s' * (len(members) > 1)}={seeds}", cfg.progress, progress_lines)
    t_mark = time.perf_counter()
    saved_at = time.monotonic()
    for step in bar:
        if caught["signum"] is not None:
            bar.close()
            _stop(members, trainer, caught, t_mark)
        losses = trainer.losses([m.task.at_step(step).sample(m.cfg.task.batch_size, m.state.g_train)
                                 for m in members])
        log_now = step in sched.logs
        w_before = None
        if log_now:
            trainer.sync()
            w_before = [m.state.monitor.snapshot() for m in members]
        if mech_layers:  # one seed: the mechanism log refuses batched seeds (config.check_row)
            mech_layers[0].state.losses_pending.append((step, losses[0].detach()))
            if step in sched.mechanism:
                mech_before = mechanism.snapshot(mech_layers[1])
        trainer.step()
        if mech_layers and step in sched.mechanism:  # timed as its own, not as training
            t_log = time.perf_counter()
            _log_mechanism(mech_layers[0], step, mech_layers[1], mech_before)
            t_mark += time.perf_counter() - t_log
        if members[0].state.averages is not None:  # one EMA update per optimizer step, no host sync
            trainer.sync()
        for m, loss in zip(members, losses):
            if m.state.averages is not None:
                m.state.averages.after_step(m.state.model, step)
            m.state.first_bad = torch.where((m.state.first_bad == 0) & ~torch.isfinite(loss.detach()), step,
                                            m.state.first_bad)
            m.state.step = step
        if not sched.measures(step):
            continue
        train_seconds = time.perf_counter() - t_mark
        trainer.sync(grads=True)
        for i, m in enumerate(members):
            if m.finished:
                continue
            m.state.timings["train"] += train_seconds / len(members)
            if bad := int(m.state.first_bad):
                bar.write(f"{m.cfg.row} seed={m.cfg.seed}: non-finite loss at step {bad}; run ends as diverged")
                results[m.cfg.seed] = _finish(m, diverged_at=bad)
                continue
            _measure(m, step, w_before[i] if w_before else None, losses[i], sched)
        if all(m.finished for m in members):
            break
        if time.monotonic() - saved_at >= RESUME_EVERY_S:  # a kill without warning loses at most this much
            _save_resumable(members, trainer)
            saved_at = time.monotonic()
        t_mark = time.perf_counter()
    bar.close()
    for m in members:
        if not m.finished:
            results[m.cfg.seed] = _finish(m)
    return results


def _trainer(members: list[_Member]) -> ensemble.Trainer:
    """The training step of the seeds: the seed's own model alone, or the seeds batched (:mod:`.ensemble`)."""
    cfg, states = members[0].cfg, [m.state for m in members]
    if len(members) == 1:
        return ensemble.Trainer(states[0].model, states[0].optimizer, states[0].schedule, memory_format(cfg))
    return ensemble.BatchedTrainer([s.model for s in states], [s.optimizer for s in states],
                                   [s.schedule for s in states], cfg.optimizer, cfg.schedule, cfg.scale.steps,
                                   memory_format(cfg), resumed=states[0].step > 0)


@dataclass
class _Schedule:
    """The steps at which a run measures what (sets of steps)."""

    logs: set
    checks: set
    interventions: set
    averaging: set
    dense: set
    mechanism: set

    def __init__(self, cfg: RunConfig, has_running: bool, averaging: bool):
        self.logs, self.checks, self.dense = log_steps(cfg), set(check_steps(cfg)), dense_steps(cfg)
        self.mechanism = mechanism.mechanism_steps(cfg.scale.steps, cfg.scale.mechanism_every)
        self.interventions = set(intervention_steps(cfg)) if cfg.interventions and has_running else set()
        self.averaging = set(averaging_steps(cfg)) if averaging else set()

    def measures(self, step: int) -> bool:
        return any(step in s for s in (self.logs, self.checks, self.interventions, self.averaging, self.dense))


def _finish(m: _Member, diverged_at: int | None = None) -> Path:
    """Write a seed's tables, its final ``run.json`` and ``DONE`` (:meth:`.rundir.RunFolder.finish`); the
    resumable state goes."""
    state = m.state
    _flush_losses(m)
    tables = {name: state.tables.frame(name) for name in records.TABLE_COLUMNS}
    info = {"diverged_at_step": diverged_at,
            "steps_completed": (diverged_at - 1) if diverged_at else m.cfg.scale.steps,
            "timings_s": {k: round(v, 3) for k, v in state.timings.items()}, "resumes": state.resumes}
    out = m.folder.finish(Trained(tables, info, "diverged" if diverged_at else "done"), records.TABLE_COLUMNS,
                          wall_before=state.wall_before)
    m.finished = True
    return out


def _probe_columns(record) -> dict[str, list]:
    """What the monitor computed on its probe batch of training images at a check that is also a log step, as
    ``checks`` columns, the zoo's names (issue 48: the gap the rule ships with, beside the held-out one):
    ``probe_acc_train_mode``, ``probe_acc_eval_mode``, ``mode_agreement``, ``mode_gap`` (fractions), ``probe_size``,
    ``rule_stale`` and ``rule_undetermined`` (its reason, "" when the rule judged); NaN and "" where the check is not
    a log step (a config whose ``scale.check_every`` is not a multiple of ``log_every``)."""
    if record is None:
        return {"probe_acc_train_mode": [np.nan], "probe_acc_eval_mode": [np.nan], "mode_agreement": [np.nan],
                "mode_gap": [np.nan], "probe_size": [0], "rule_stale": [False], "rule_undetermined": ["no log step"]}
    c = record.checks.iloc[0]
    return {"probe_acc_train_mode": [float(c["acc_train_mode"])], "probe_acc_eval_mode": [float(c["acc_eval_mode"])],
            "mode_agreement": [float(c["mode_agreement"])], "mode_gap": [float(c["mode_gap"])],
            "probe_size": [int(c["probe_size"])], "rule_stale": [bool(record.stale)],
            "rule_undetermined": [record.undetermined]}


def _measure(m: _Member, step: int, w_before, loss, sched: _Schedule) -> None:
    """Everything measured at ``step`` on one seed's model, in order: the monitor (log steps), the dense
    statistics, the accuracy check, the interventions and the averaged models. Shares what they have in
    common: the live model's evaluation-mode accuracy, its fresh statistics, and the step's re-estimation
    batches."""
    state, cfg = m.state, m.cfg
    model, timings = state.model, state.timings
    chunk = eval_chunk(m.x_held.device, len(m.y_held))
    t0 = time.perf_counter()
    fresh, record = None, None
    if step in sched.logs:
        record = state.monitor.measure(step, w_before)
        state.tables.add("layers", record.layers)
        state.tables.add("channels", record.channels.drop(columns="rotation_deg_per_100"))
        fresh = state.monitor.last_fresh
    t1 = time.perf_counter()
    if step in sched.dense:
        if fresh is None:
            fresh = batch_statistics_pass(model, m.x_probe)[1]
        state.tables.add("dense", _dense_lines(model, step, fresh))
    t2 = time.perf_counter()
    acc_eval = None
    if step in sched.checks:
        acc_eval = accuracy(model, m.x_held, m.y_held, "eval", chunk, m.compiled)
        acc_train = accuracy(model, m.x_held, m.y_held, "train")
        state.tables.add("checks", pd.DataFrame({
            "step": [step], "lr": [state.optimizer.param_groups[0]["lr"]],
            "loss": [loss.item() if loss is not None else np.nan],
            "acc_train_mode": [acc_train], "acc_eval_mode": [acc_eval], **_probe_columns(record),
            **({"margin_eval_median": [mechanism.margin_median(model, m.x_held, m.y_held, chunk)]}
               if cfg.scale.mechanism_every else {})}))
    t3 = time.perf_counter()
    batches = None
    if step in sched.interventions:
        if cfg.save_checkpoints:
            save_checkpoint(checkpoint_path(m.out, step), model, step=step, row=cfg.row, seed=cfg.seed)
        batches = reestimation_batches(m.task, cfg, m.x_held.device, step)
        df = run_interventions(model, batches, m.x_held, m.y_held, chunk, acc_stored=acc_eval,
                               compiled=m.compiled).table
        state.tables.add("interventions", df.assign(step=step)[["step", *df.columns]])
    t4 = time.perf_counter()
    if step in sched.averaging:
        if batches is None:
            batches = reestimation_batches(m.task, cfg, m.x_held.device, step)
        df = state.averages.evaluate(model, step, m.x_held, m.y_held, m.x_probe, batches, chunk,
                                     live_accuracy=acc_eval, live_fresh=fresh, compiled=m.compiled)
        state.tables.add("averaging", df.assign(step=step)[["step", *df.columns]])
    t5 = time.perf_counter()
    for key, seconds in (("probes", t1 - t0), ("dense", t2 - t1), ("checks", t3 - t2), ("interventions", t4 - t3),
                         ("averaging", t5 - t4)):
        timings[key] += seconds


def _log_mechanism(m: _Member, step: int, layers: dict, before: dict) -> None:
    """The optimizer-state log at ``step`` (:mod:`.mechanism`), and the losses kept since the last one."""
    t0 = time.perf_counter()
    m.state.tables.add("mechanism", mechanism.mechanism_lines(step, layers, before, m.state.optimizer))
    _flush_losses(m)
    m.state.timings["mechanism"] = m.state.timings.get("mechanism", 0.0) + time.perf_counter() - t0


def _flush_losses(m: _Member) -> None:
    """Move the seed's kept per-step losses into its ``losses`` table (one host read for all of them)."""
    pending = m.state.losses_pending
    if pending:
        like = next((v for _, v in pending if isinstance(v, torch.Tensor)), torch.zeros(()))  # resumed: floats
        values = torch.stack([torch.as_tensor(v, dtype=like.dtype, device=like.device).reshape(())
                              for _, v in pending]).tolist()  # on the run's device: one read for all
        m.state.tables.add("losses", pd.DataFrame({"step": [k for k, _ in pending], "loss": values}))
        pending.clear()


def _dense_lines(model: torch.nn.Module, step: int, fresh: dict) -> pd.DataFrame:
    """One line per channel of every norm layer: its fresh statistics on the probe set and its running ones."""
    frames = []
    modules = dict(model.named_modules())
    for name, (mean, var) in fresh.items():
        mod = modules[name]
        c = mean.numel()
        running = getattr(mod, "running_mean", None) is not None
        frames.append(pd.DataFrame({
            "step": np.full(c, step), "norm_layer": [name] * c, "channel": np.arange(c),
            "fresh_mean": mean.cpu().numpy(), "fresh_var": var.cpu().numpy(),
            "running_mean": mod.running_mean.double().cpu().numpy() if running else np.full(c, np.nan),
            "running_var": mod.running_var.double().cpu().numpy() if running else np.full(c, np.nan)}))
    return pd.concat(frames, ignore_index=True)


def _save_resumable(members: list[_Member], trainer: ensemble.Trainer) -> None:
    """Write each unfinished seed's resumable state (``resume.pt``, atomically) as it stands at this step
    boundary: after a stop signal (:func:`_stop`), and every :data:`RESUME_EVERY_S` while training."""
    trainer.sync()
    trainer.sync_optimizer()
    for m in members:
        if not m.finished:
            m.state.save(m.out / RESUME_FILE, time.time() - m.folder.started)


def _stop(members: list[_Member], trainer: ensemble.Trainer, caught: dict, t_mark: float) -> None:
    """Save each seed's resumable state after a stop signal; hand submitit's preemption signal on to submitit
    (which requeues the job and exits), else raise :class:`RunInterrupted`."""
    for m in members:
        if not m.finished:
            m.state.timings["train"] += (time.perf_counter() - t_mark) / len(members)
    _save_resumable(members, trainer)
    for m in members:
        if m.finished:
            continue
        print(f"stopped by {signal.Signals(caught['signum']).name} at step {m.state.step}: {m.cfg.row} "
              f"seed={m.cfg.seed} saved to {m.out / RESUME_FILE}", file=sys.stderr, flush=True)
    pass_on_to_submitit(caught)
    alive = [m for m in members if not m.finished] or members
    raise RunInterrupted(caught["signum"], alive[0].state.step, alive[0].out / RESUME_FILE)
