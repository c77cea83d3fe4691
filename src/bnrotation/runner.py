"""The training loop: steps, probes at log points, accuracy checks, interventions, records.

One call of :func:`run` trains one row at one seed and writes
``<results_root>/runs/<row>/seed=<s>/`` (see :mod:`records`). The training
step itself does no host synchronisation: the loss is only read at check
steps, and divergence is tracked on the device and read at log points.
"""

from __future__ import annotations

import copy
import datetime as dt
import importlib.metadata
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml
from omegaconf import OmegaConf
from torch.nn.modules.batchnorm import _BatchNorm
from tqdm.auto import tqdm

from . import records
from .averaging import RunAverages
from .bnstats import (ReestimationReport, reestimate, running_stat_layers, running_stats, swapped_statistics,
                      top_k_channel_masks)
from .checkpoints import checkpoint_path, save_checkpoint
from .analysis.results import check_against_row
from .config import ConfigError, RunConfig, check_row, semantic_dict
from .model import ConvNet, build_model
from .optim import build_optimizer, build_schedule
from .rows import ROWS
from .probes import (accuracy, channel_cosines, channel_norms, cosine, drift_sigma_per_step, fresh_statistics,
                     lag_sigma, predicted_lag_sigma, rotation_deg)
from .task import NoisyTemplates, generator

PACKAGES = ("torch", "numpy", "pandas", "pyarrow", "hydra-core", "omegaconf", "bnrotation")


class RunExistsError(RuntimeError):
    """A finished run with a different config sits where this run would write."""


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


# ----------------------------------------------------------------------------- provenance
def _git_state() -> dict:
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"commit": commit, "dirty": dirty}


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def describe_built(model: ConvNet, optimizer: torch.optim.Optimizer, schedule, device: torch.device) -> dict:
    """What actually runs, read back from the built objects (not from the config)."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = []
    for g in optimizer.param_groups:
        settings = {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()
                    if k not in ("params", "param_names")}
        settings["lr"] = g.get("initial_lr", g["lr"])
        settings["params"] = [names[id(p)] for p in g["params"]]
        groups.append(settings)
    dims = {n: p.dim() for n, p in model.named_parameters()}
    # ProjectedAdam never projects a parameter of fewer than 2 dims (norm affine, biases)
    projected = [n for g in groups if g.get("projection") in ("always", "adamp") for n in g["params"] if dims[n] >= 2]
    norms = {}
    for name, m in model.named_modules():
        if isinstance(m, _BatchNorm):
            norms[name] = {"class": type(m).__name__, "momentum": m.momentum, "eps": m.eps,
                           "track_running_stats": m.track_running_stats}
        elif isinstance(m, torch.nn.GroupNorm):
            norms[name] = {"class": type(m).__name__, "num_groups": m.num_groups, "eps": m.eps}
    weight = model.conv1.weight
    return {
        "optimizer": {"class": type(optimizer).__name__, "param_groups": groups},
        "projection": {"on": bool(projected), "params": projected,
                       "mode": sorted({g.get("projection") for g in groups if g.get("projection")})},
        "schedule": None if schedule is None else {"class": type(schedule).__name__,
                                                    **{k: v for k, v in vars(schedule).items()
                                                       if k in ("T_max", "eta_min")}},
        "norm_layers": norms,
        "device": str(device),
        "dtype": str(weight.dtype).replace("torch.", ""),
        "memory_format": "channels_last" if weight.is_contiguous(memory_format=torch.channels_last)
        and not weight.is_contiguous() else "contiguous",
        "threads": torch.get_num_threads(),
        "versions": _versions(),
        "git": _git_state(),
        "host": platform.node(),
    }


# ----------------------------------------------------------------------------- the run folder
def config_yaml(cfg: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def prepare_run_dir(cfg: RunConfig) -> Path | None:
    """Decide what to do with the run's folder; returns it, or None to skip.

    * ``DONE`` present and the same config (up to keys that do not change
      results): skip, unless ``force``.
    * ``DONE`` present, a different config: refuse, unless ``force``.
    * no ``DONE``: a crashed or killed run; removed and rerun from scratch.
      A folder that is replaced loses its ``DONE`` before anything else.

    Raises:
        RunExistsError: naming the folder and the keys that differ.
    """
    out = records.run_dir(cfg.results_root, cfg.row, cfg.seed)
    if (out / records.DONE).exists() and not cfg.force:
        old = yaml.safe_load((out / "config.yaml").read_text()) if (out / "config.yaml").exists() else {}
        # Keys added to the schema since the run was made count as their defaults.
        try:
            old = semantic_dict(OmegaConf.merge(OmegaConf.structured(RunConfig), old or {}))
        except Exception as err:  # noqa: BLE001 - a key the schema no longer has, or a wrong type
            raise RunExistsError(f"{out} holds a finished run whose config.yaml does not fit this suite's schema "
                                 f"({str(err).splitlines()[0]}); rerun with force=true to replace it") from err
        new = semantic_dict(cfg)
        if old == new:
            return None
        diff = sorted(_diff_keys(old, new))
        raise RunExistsError(f"{out} holds a finished run with a different config (keys {diff}); "
                             f"rerun with force=true to replace it, or give this variant its own row=<name>")
    if out.exists():
        (out / records.DONE).unlink(missing_ok=True)  # first: a kill during the removal leaves a crashed run
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return out


def _diff_keys(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            keys += _diff_keys(va, vb, f"{prefix}{k}.")
        elif va != vb:
            keys.append(prefix + k)
    return keys


def resolve_threads(threads: int) -> int:
    """Set torch's intra-op threads for a run and return how many it uses.

    ``threads > 0`` is taken as is. ``0`` means: what the launcher gave the
    job, i.e. ``SLURM_CPUS_PER_TASK`` under SLURM, else torch's default, which
    follows ``OMP_NUM_THREADS`` (joblib's workers get cores // n_jobs).
    """
    if threads == 0 and os.environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        threads = int(os.environ["SLURM_CPUS_PER_TASK"])
    if threads > 0:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def set_determinism(on: bool, device: torch.device) -> dict:
    """Switch deterministic kernels on or off for this process; returns the flags now in force.

    ``on``: ``torch.use_deterministic_algorithms(True)`` (an op without a
    deterministic kernel raises), cuDNN deterministic with autotuning off, and
    on CUDA ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` unless already set (cuBLAS
    needs it to be deterministic). CPU kernels here are deterministic either
    way; on a GPU the switch trades speed for bitwise-repeatable runs.
    """
    if on and device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(on)
    torch.backends.cudnn.deterministic = on
    torch.backends.cudnn.benchmark = False
    return {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: expected auto or cpu on this machine, got 'cuda': torch sees no CUDA device")
    return torch.device(name)


# ----------------------------------------------------------------------------- probes at a log point
class _Tables:
    """Rows of each long-format table, kept as column dicts until the run ends."""

    def __init__(self, row: str, seed: int):
        self.row, self.seed = row, seed
        self.frames: dict[str, list[pd.DataFrame]] = {k: [] for k in records.TABLE_COLUMNS}

    def add(self, table: str, **cols) -> None:
        n = max((len(v) for v in cols.values() if isinstance(v, (list, np.ndarray))), default=1)
        df = pd.DataFrame({"row": [self.row] * n, "seed": np.full(n, self.seed, dtype=np.int64), **cols})
        self.frames[table].append(df)

    def frame(self, table: str) -> pd.DataFrame:
        frames = self.frames[table]
        if not frames:
            return pd.DataFrame({c: pd.Series(dtype="float64") for c in records.TABLE_COLUMNS[table]})
        return pd.concat(frames, ignore_index=True)


class _Prober:
    """Computes the ``layers`` and ``channels`` rows at each log point."""

    def __init__(self, model: ConvNet, probe_x: torch.Tensor, interval: int):
        self.model, self.probe_x, self.interval = model, probe_x, interval
        self.prev_w: dict[str, torch.Tensor] = {}
        self.prev_fresh: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, tables: _Tables, step: int, w_before_step: dict[str, torch.Tensor] | None) -> None:
        fresh = fresh_statistics(self.model, self.probe_x)
        for conv_name, conv, norm_name, norm in self.model.blocks():
            w = conv.weight.detach()
            c = w.shape[0]
            nan = torch.full((c,), float("nan"), dtype=torch.float64)
            wb = None if w_before_step is None else w_before_step[conv_name]
            grad = conv.weight.grad
            tables.add("layers", step=[step], layer=[conv_name],
                       weight_norm=[float(w.double().norm())],
                       update_cos=[cosine(w - wb, wb) if wb is not None else float("nan")],
                       grad_cos=[cosine(grad, wb) if wb is not None and grad is not None else float("nan")])
            f_mean, f_var = (t.cpu() for t in fresh[norm_name])
            has_running = isinstance(norm, _BatchNorm) and norm.running_mean is not None
            r_mean = norm.running_mean.detach().double().cpu() if has_running else nan
            r_var = norm.running_var.detach().double().cpu() if has_running else nan
            prev = self.prev_fresh.get(norm_name)
            drift = drift_sigma_per_step(f_mean, prev[0], f_var, self.interval) if prev is not None else nan
            momentum = norm.momentum if has_running and norm.momentum is not None else float("nan")
            tables.add(
                "channels", step=np.full(c, step), layer=[conv_name] * c, norm_layer=[norm_name] * c,
                channel=np.arange(c),
                rotation_deg=(rotation_deg(self.prev_w[conv_name], w).cpu() if conv_name in self.prev_w
                              else nan).numpy(),
                weight_norm=channel_norms(w).cpu().numpy(),
                update_cos=(channel_cosines(w - wb, wb).cpu() if wb is not None else nan).numpy(),
                running_mean=r_mean.numpy(), running_var=r_var.numpy(),
                fresh_mean=f_mean.numpy(), fresh_var=f_var.numpy(),
                lag_sigma=lag_sigma(r_mean, f_mean, f_var).numpy(),
                drift_sigma_per_step=drift.numpy(),
                predicted_lag_sigma=predicted_lag_sigma(drift, momentum).numpy(),
                abs_mean_over_std=(f_mean.abs() / f_var.sqrt()).numpy(),
            )
            self.prev_w[conv_name] = w.clone()
        self.prev_fresh = {k: (m.cpu(), v.cpu()) for k, (m, v) in fresh.items()}


# ----------------------------------------------------------------------------- interventions
# Held-out samples per evaluation-mode forward pass on a CPU (checks and interventions): one training
# batch's worth keeps the activations in cache, where 1,000 at a time does not (make bench measures it:
# results/bench.md, "chunk size"). On a GPU the whole set goes in one pass.
EVAL_CHUNK = 128


def eval_chunk(device: torch.device, n: int) -> int:
    """Samples per evaluation-mode forward pass: ``EVAL_CHUNK`` on a CPU, all ``n`` at once on a GPU.

    Evaluation-mode outputs are per sample, so the accuracy does not depend on it.
    """
    return n if device.type == "cuda" else min(EVAL_CHUNK, n)


def heldout_set(task: NoisyTemplates, cfg: RunConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The run's held-out set, ``x`` (heldout_size, 3, S, S) in the model's memory format, ``y`` (heldout_size,)."""
    x, y = task.fixed_set(cfg.scale.heldout_size, cfg.seed, "heldout")
    return x.contiguous(memory_format=torch.channels_last if cfg.model.channels_last else torch.contiguous_format), y


def reestimation_batches(task: NoisyTemplates, cfg: RunConfig, device: torch.device, step: int):
    """``scale.reestimate_batches`` fresh training batches from the run's own ``reestimate`` stream.

    The stream is reseeded from (seed, step) and drawn on the CPU, then moved
    to ``device``, so the batches at a step are the same in the runner and in
    offline diagnosis on any device, and the training stream is never touched.

    Yields:
        (batch_size, 3, S, S) float32 inputs on ``device``.
    """
    g = generator(cfg.seed * 1_000_003 + step, "reestimate")
    cpu_task = NoisyTemplates(task.cfg, task.templates.cpu())
    memory_format = torch.channels_last if cfg.model.channels_last else torch.contiguous_format
    for _ in range(cfg.scale.reestimate_batches):
        x, _y = cpu_task.sample(cfg.task.batch_size, g)
        yield x.to(device).contiguous(memory_format=memory_format)


def top_k_grid(total: int) -> list[int]:
    """0, 1, 2, 4, ... up to ``total`` channels (``total`` itself included)."""
    ks = [0] + [2 ** i for i in range(total.bit_length()) if 2 ** i < total]
    return ks + [total]


def top_k_accuracy(model: nn.Module, fresh: dict[str, tuple[torch.Tensor, torch.Tensor]],
                   lag: dict[str, torch.Tensor], k: int, x: torch.Tensor, y: torch.Tensor, chunk: int) -> float:
    """Evaluation-mode accuracy with fresh statistics in the ``k`` channels of largest |lag| network-wide.

    Args:
        fresh: ``{norm layer: (mean (C,), var (C,))}``; lag: ``{norm layer: (C,)}`` in sigma.
    """
    with swapped_statistics(model, fresh, channels=top_k_channel_masks(lag, k)):
        return accuracy(model, x, y, "eval", chunk)


@dataclass
class Interventions:
    """What :func:`run_interventions` measured at one checkpoint.

    Attributes:
        table: one line per intervention: ``intervention`` (none | reestimate |
            layer | top_k), ``k`` (-1 where it does not apply), ``layer`` (""
            where it does not apply), ``acc_eval_mode`` (fraction).
        stored, fresh: ``{norm layer: (running_mean (C,), running_var (C,))}``,
            the checkpoint's statistics and the re-estimated ones.
        lag_sigma: ``{norm layer: (C,)}`` float64, ``(stored - fresh) mean /
            fresh std``, the ranking of the top-k curve.
        reestimation: provenance of the re-estimation pass.
    """

    table: pd.DataFrame
    stored: dict[str, tuple[torch.Tensor, torch.Tensor]]
    fresh: dict[str, tuple[torch.Tensor, torch.Tensor]]
    lag_sigma: dict[str, torch.Tensor]
    reestimation: ReestimationReport


def run_interventions(model: nn.Module, batches, x: torch.Tensor, y: torch.Tensor, chunk: int,
                      acc_stored: float | None = None) -> Interventions:
    """Evaluation-mode accuracy on (x, y) after each intervention on the running statistics.

    ``none`` (stored statistics), ``reestimate`` (every layer fresh), ``layer``
    (one layer fresh, the stored ones elsewhere) and ``top_k`` (the k channels
    of largest |lag| across the network fresh, k on :func:`top_k_grid`; k = 0
    is the stored model and k = all the re-estimated one). Fresh statistics
    come from one :func:`bnstats.reestimate` pass on a copy; the model itself
    is left unchanged. The runner and offline diagnosis
    (:mod:`bnrotation.diagnose`) both call this.

    The two ends of the top-k curve are exact identities and are not evaluated
    again (k = 0 swaps nothing, k = all swaps everything); ``acc_stored``, the
    evaluation-mode accuracy already measured on (x, y) at this step (the
    runner's check), is reused for ``none``.

    Raises:
        ValueError: if the model has no layer with running statistics, or ``batches`` is empty.
    """
    fresh_model = copy.deepcopy(model)
    report = reestimate(fresh_model, batches)
    stored, fresh = running_stats(model), running_stats(fresh_model)
    acc_none = accuracy(model, x, y, "eval", chunk) if acc_stored is None else acc_stored
    acc_fresh = accuracy(fresh_model, x, y, "eval", chunk)
    rows = [("none", -1, "", acc_none), ("reestimate", -1, "", acc_fresh)]
    for name in fresh:
        with swapped_statistics(model, {name: fresh[name]}):
            rows.append(("layer", -1, name, accuracy(model, x, y, "eval", chunk)))
    lag = {n: lag_sigma(stored[n][0], fresh[n][0].double(), fresh[n][1].double()) for n in fresh}
    total = sum(v.numel() for v in lag.values())
    for k in top_k_grid(total):
        acc = {0: acc_none, total: acc_fresh}.get(k)
        rows.append(("top_k", k, "", acc if acc is not None else top_k_accuracy(model, fresh, lag, k, x, y, chunk)))
    table = pd.DataFrame(rows, columns=["intervention", "k", "layer", "acc_eval_mode"])
    return Interventions(table, stored, fresh, lag, report)


# ----------------------------------------------------------------------------- the run
def run(cfg: RunConfig) -> Path | None:
    """Train one run and write its folder; returns the folder, or None if it was skipped.

    Raises:
        ConfigError: the config keeps a registered row's name but changes what the row means.
        RunExistsError: a finished run with another config is in the way.
        ConfigError: also for ``device=cuda`` without CUDA.
    """
    check_row(cfg)
    device = resolve_device(cfg.device)
    started = time.time()
    timings = {"train": 0.0, "probes": 0.0, "checks": 0.0, "interventions": 0.0, "averaging": 0.0}

    task = NoisyTemplates.build(cfg.task, cfg.seed, device)
    model = build_model(cfg.model, cfg.task.num_classes, cfg.seed, device)
    optimizer = build_optimizer(cfg.optimizer, model)
    schedule = build_schedule(cfg.schedule, optimizer, cfg.scale.steps)
    built = describe_built(model, optimizer, schedule, device)
    if cfg.row in ROWS and (problems := check_against_row(built, ROWS[cfg.row])):
        # what make table would refuse after the run is refused before it (the row's meaning, read back)
        raise ConfigError(f"row: what this config builds contradicts row {cfg.row!r}: {'; '.join(problems)}; "
                          f"give the variant a row name of its own (row=<name>)")
    out = prepare_run_dir(cfg)
    if out is None:
        return None
    resolve_threads(cfg.threads)
    determinism = set_determinism(cfg.deterministic, device)
    cl = torch.channels_last if cfg.model.channels_last else torch.contiguous_format
    x_held, y_held = heldout_set(task, cfg)
    x_probe, _ = task.fixed_set(cfg.task.probe_size, cfg.seed, "probe")
    x_probe = x_probe.contiguous(memory_format=cl)
    g_train = generator(cfg.seed, "train", device)
    built["threads"] = torch.get_num_threads()
    info = {"schema_version": records.SCHEMA_VERSION, "row": cfg.row, "seed": cfg.seed, "status": "running",
            "started_at": dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(), **built,
            "determinism": determinism}
    records.atomic_write_text(out / "config.yaml", config_yaml(cfg))
    records.write_json(out / "run.json", info)

    tables = _Tables(cfg.row, cfg.seed)
    prober = _Prober(model, x_probe, cfg.scale.log_every)
    logs, checks = log_steps(cfg), set(check_steps(cfg))
    interventions = set(intervention_steps(cfg)) if cfg.interventions and running_stat_layers(model) else set()
    chunk = eval_chunk(device, len(y_held))
    # --- averaging (issue 4): EMA and tail average of the weights, under each BatchNorm buffer policy
    averages = RunAverages(cfg.averaging, model) if cfg.averaging.enabled and running_stat_layers(model) else None
    averaging_at = set(averaging_steps(cfg)) if averages is not None else set()
    # ---
    first_bad = torch.zeros((), dtype=torch.long, device=device)  # first non-finite step, 0 if none
    diverged_at = None

    t0 = time.perf_counter()
    prober(tables, 0, None)
    timings["probes"] += time.perf_counter() - t0
    bar = tqdm(range(1, cfg.scale.steps + 1), desc=f"{cfg.row} seed={cfg.seed}", disable=not cfg.progress,
               dynamic_ncols=True, mininterval=1.0)
    t_mark = time.perf_counter()
    for step in bar:
        x, y = task.sample(cfg.task.batch_size, g_train)
        loss = F.cross_entropy(model(x.contiguous(memory_format=cl)), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        log_now = step in logs
        w_before = {n: c.weight.detach().clone() for n, c, _, _ in model.blocks()} if log_now else None
        optimizer.step()
        if schedule is not None:
            schedule.step()
        if averages is not None:  # averaging (issue 4): one EMA update per optimizer step, no host sync
            averages.after_step(model, step)
        first_bad = torch.where((first_bad == 0) & ~torch.isfinite(loss.detach()), step, first_bad)
        if not (log_now or step in checks or step in interventions or step in averaging_at):
            continue
        timings["train"] += time.perf_counter() - t_mark
        bad = int(first_bad)
        if bad:
            diverged_at = bad
            bar.write(f"{cfg.row} seed={cfg.seed}: non-finite loss at step {bad}; run ends as diverged")
            break
        t0 = time.perf_counter()
        if log_now:
            prober(tables, step, w_before)
        t1 = time.perf_counter()
        if step in checks:
            acc_eval = accuracy(model, x_held, y_held, "eval", chunk)
            acc_train = accuracy(model, x_held, y_held, "train")
            tables.add("checks", step=[step], lr=[optimizer.param_groups[0]["lr"]], loss=[loss.item()],
                       acc_train_mode=[acc_train], acc_eval_mode=[acc_eval])
            bar.set_postfix(eval=f"{acc_eval:.3f}", train=f"{acc_train:.3f}", refresh=False)
        t2 = time.perf_counter()
        if step in interventions:
            if cfg.save_checkpoints:
                save_checkpoint(checkpoint_path(out, step), model, step=step, row=cfg.row, seed=cfg.seed)
            df = run_interventions(model, reestimation_batches(task, cfg, device, step), x_held, y_held, chunk,
                                   acc_stored=acc_eval if step in checks else None).table
            tables.add("interventions", step=np.full(len(df), step), **{c: df[c].to_numpy() for c in df})
        t3 = time.perf_counter()
        if step in averaging_at:  # averaging (issue 4)
            df = averages.evaluate(model, step, x_held, y_held, x_probe,
                                   lambda: reestimation_batches(task, cfg, device, step), chunk)
            tables.add("averaging", step=np.full(len(df), step), **{c: df[c].to_numpy() for c in df})
        t4 = time.perf_counter()
        timings["probes"] += t1 - t0
        timings["checks"] += t2 - t1
        timings["interventions"] += t3 - t2
        timings["averaging"] += t4 - t3
        t_mark = time.perf_counter()
    bar.close()

    for name in records.TABLE_COLUMNS:
        records.write_table(tables.frame(name), out / f"{name}.parquet", name)
    ended = time.time()
    info.update(status="diverged" if diverged_at else "done", diverged_at_step=diverged_at,
                steps_completed=(diverged_at - 1) if diverged_at else cfg.scale.steps,
                ended_at=dt.datetime.fromtimestamp(ended, dt.timezone.utc).isoformat(),
                wall_seconds=round(ended - started, 3), timings_s={k: round(v, 3) for k, v in timings.items()})
    records.write_json(out / "run.json", info)
    records.mark_done(out)
    return out
