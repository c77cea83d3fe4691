"""Offline diagnosis of a run: how stale its running statistics are, and which fix brings the accuracy back.

    python experiments/diagnose.py run=results/runs/adam/seed=0 step=4500
    python experiments/diagnose.py run=results/runs/adam/seed=0            # the logged interventions

With ``step`` (a step number, ``last`` or ``worst``) the network is rebuilt
from the run's ``config.yaml``, the checkpoint ``checkpoints/step=<n>.pt`` is
loaded (weights only, :func:`checkpoints.load_checkpoint`), and the run's own
interventions are rerun on it (:func:`interventions.run_interventions`, with the same
re-estimation batches, :func:`task.reestimation_batches`, and the same
held-out set): the report gives per BatchNorm layer the lag of the stored
running mean behind the fresh (re-estimated) one, ``(stored - fresh) /
sqrt(fresh var + eps)`` in sigma with the layer's eps, as the monitor measures
it (median |lag| and the worst channel), the evaluation-mode accuracy after
each intervention, and the smallest number k of top-|lag|
channels whose fresh statistics bring the accuracy to 90%, found on the grid
0, 1, 2, 4, ... and then by bisection between grid points. Without ``step`` it
reads the run's ``interventions.parquet`` (no checkpoint needed) and reports
every logged step and, at the worst one, each layer's swap and the k needed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import yaml

from .. import records
from .analysis.measures import intervention_log as logged
from .analysis.results import BadRunError, load_run, read_table
from ..checkpoints import checkpoint_path, load_checkpoint
from .config import ConfigError, RunConfig, to_run_config
from ..evaluation import eval_chunk
from .interventions import Interventions, layer_lags, run_interventions, top_k_accuracy
from .model import build_network
from .runtime import resolve_device
from .task import build_task, heldout_set, reestimation_batches

KEYS = {"run": "run folder, runs/<row>/seed=<s> (required)",
        "step": "a checkpoint step, last or worst; without it: the logged interventions",
        "device": "auto | cpu | cuda (default auto)",
        "threshold": "accuracy to recover, a fraction (default 0.9)",
        "out": "also write the report to this file"}


# ----------------------------------------------------------------------------- a run's checkpoints
def load_run_config(run_dir: str | Path) -> RunConfig:
    """The validated config a run was trained with, from its ``config.yaml``.

    Raises:
        FileNotFoundError: if the folder or its ``config.yaml`` is missing.
        ValueError: naming the file, for a config that does not validate.
    """
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing; run= must be a run folder, runs/<row>/seed=<s>")
    try:
        return to_run_config(yaml.safe_load(path.read_text()))
    except (ConfigError, yaml.YAMLError) as err:
        raise ValueError(f"{path}: not a valid run config ({err})") from err


def checkpoint_steps(run_dir: str | Path) -> list[int]:
    """Steps with a checkpoint in ``<run_dir>/checkpoints/``, ascending."""
    files = Path(run_dir, "checkpoints").glob("step=*.pt")
    return sorted(int(f.stem.split("=", 1)[1]) for f in files if f.stem.split("=", 1)[1].isdigit())


def missing_checkpoints(run_dir: str | Path, step: str | int = "worst") -> str:
    """Why ``run_dir`` holds no checkpoint, read from its ``config.yaml`` and where it lies, and the commands
    that make one: for the committed reference runs (``results/reference``, committed without checkpoints),
    rerunning the row into ``results/``; for a run made with ``save_checkpoints=false`` or
    ``interventions=false``, rerunning it with them on."""
    run_dir = Path(run_dir)
    from .analysis.results import REFERENCE_ROOT

    try:
        cfg = load_run_config(run_dir)
    except (FileNotFoundError, ValueError):
        return f"{run_dir}/checkpoints: no checkpoint, and no readable config.yaml to say why"
    scale = "" if cfg.scale.name == "full" else f" SCALE={cfg.scale.name}"
    row = f"ROW={cfg.row} SEED={cfg.seed}{scale}"
    if not (cfg.save_checkpoints and cfg.interventions):
        off = "save_checkpoints=false" if not cfg.save_checkpoints else "interventions=false"
        root = run_dir.parents[2] if len(run_dir.parents) > 2 else run_dir
        return (f"{run_dir}: made with {off} (its config.yaml), so it saved no checkpoint; rerun it with checkpoints: "
                f"make row {row} RESULTS={root} FORCE=1, then make diagnose RUN={run_dir} STEP={step}")
    if run_dir.resolve().is_relative_to(REFERENCE_ROOT.resolve()):
        why = (f"{run_dir}: checkpoints are not committed with the reference runs (git ignores "
               f"{REFERENCE_ROOT}/**/checkpoints/)")
    else:
        why = f"{run_dir}/checkpoints: missing, although the run saved checkpoints (deleted, or copied without them)"
    return (f"{why}; rerun the row to make them: make row {row} (into results/runs/{cfg.row}/seed={cfg.seed}/), "
            f"then make diagnose RUN=results/runs/{cfg.row}/seed={cfg.seed} STEP={step} (without STEP it reads the "
            "logged interventions, which need no checkpoint)")


def resolve_step(run_dir: str | Path, step: str | int) -> int:
    """A step number from ``step``: an integer, ``last`` (latest checkpoint) or ``worst`` (the logged
    intervention step with the lowest stored-statistics accuracy).

    Raises:
        FileNotFoundError: when the run has no checkpoint at all, saying why and how to make them
            (:func:`missing_checkpoints`); naming the steps that have one, when ``step`` has none.
        ValueError: for a ``step`` that is none of these.
    """
    have = checkpoint_steps(run_dir)
    if step not in ("last", "worst"):
        try:
            step = int(step)
        except ValueError:
            raise ValueError(f"step: expected a step number, last or worst, got {step!r}") from None
    if not have:
        raise FileNotFoundError(missing_checkpoints(run_dir, step))
    if step == "last":
        return have[-1]
    n = logged.worst_step(read_table(Path(run_dir) / "interventions.parquet", "interventions")) \
        if step == "worst" else step
    if n not in have:
        raise FileNotFoundError(f"{checkpoint_path(run_dir, n)}: no checkpoint at step {n}; "
                                f"steps with one: {', '.join(map(str, have))}")
    return n


# ----------------------------------------------------------------------------- diagnosis of one checkpoint
@dataclass
class CheckpointDiagnosis:
    """What :func:`diagnose_checkpoint` found.

    Attributes:
        lags: one line per BatchNorm layer (:func:`interventions.layer_lags`): ``norm_layer``, ``channels``,
            ``lag_median_abs_sigma``, ``worst_channel``, ``worst_lag_sigma``
            (signed), ``median_var_ratio`` (stored / fresh running variance).
        k_refined: smallest k reaching ``threshold`` by bisection between the
            grid points around it (None if even k = all does not).
        logged: the run's logged interventions at this step, if any.
    """

    run_dir: Path
    cfg: RunConfig
    step: int
    device: str
    result: Interventions
    lags: pd.DataFrame
    threshold: float
    k_refined: int | None
    logged: pd.DataFrame | None


def refine_k(model: torch.nn.Module, result: Interventions, x: torch.Tensor, y: torch.Tensor,
             threshold: float) -> int | None:
    """The smallest k reaching ``threshold``, by bisection between the grid points around it.

    Assumes the accuracy does not fall as k grows between two grid points
    (it is only checked at the grid points); returns None if no grid point
    reaches ``threshold``.
    """
    curve = logged.top_k_curve(result.table)
    hi = logged.smallest_k(curve, threshold)
    if hi is None or hi == 0:
        return hi
    lo = int(curve.index[curve.index < hi].max())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        acc = top_k_accuracy(model, result.fresh, result.lag_sigma, mid, x, y, eval_chunk(x.device, len(y)))
        lo, hi = (lo, mid) if acc >= threshold else (mid, hi)
    return hi


def diagnose_checkpoint(run_dir: str | Path, step: str | int, device: str = "auto",
                        threshold: float = logged.RECOVERY_THRESHOLD) -> CheckpointDiagnosis:
    """Rebuild the run's network at ``step`` from its checkpoint and rerun its interventions.

    The held-out set and the re-estimation batches are the run's own (same
    seeded streams, drawn on the CPU), so on the run's device the accuracies
    equal the logged ones.

    Raises:
        FileNotFoundError: no config or no checkpoint at that step (naming the steps that have one).
        ValueError: a checkpoint that belongs to another row, seed or step; a model without BatchNorm.
        checkpoints.UnsafeCheckpointError: a checkpoint that needs arbitrary code to load.
    """
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    if cfg.model.norm != "batch":
        raise ValueError(f"{run_dir}: model.norm={cfg.model.norm} keeps no running statistics; nothing to diagnose")
    n = resolve_step(run_dir, step)
    dev = resolve_device(device)
    path = checkpoint_path(run_dir, n)
    ckpt = load_checkpoint(path, map_location=dev)
    found = {k: ckpt.get(k) for k in ("row", "seed", "step")}
    if found != {"row": cfg.row, "seed": cfg.seed, "step": n}:
        raise ValueError(f"{path}: holds {found}, but the folder is row {cfg.row!r} seed {cfg.seed} step {n}")
    model = build_network(cfg.model, cfg.task.num_classes, cfg.seed, dev, cfg.task.in_channels)
    model.load_state_dict(ckpt["model"])
    task = build_task(cfg.task, cfg.seed, dev)
    x, y = heldout_set(task, cfg)
    result = run_interventions(model, reestimation_batches(task, cfg, dev, n), x, y, eval_chunk(dev, len(y)))
    file = run_dir / "interventions.parquet"
    logged_here = None
    if file.exists():
        iv = read_table(file, "interventions")
        logged_here = iv[iv["step"] == n] if (iv["step"] == n).any() else None
    return CheckpointDiagnosis(run_dir, cfg, n, str(dev), result, layer_lags(result), threshold,
                               refine_k(model, result, x, y, threshold), logged_here)


def _agreement(d: CheckpointDiagnosis) -> str:
    if d.logged is None:
        return "nothing logged at this step to compare with"
    keys = ["intervention", "k", "norm_layer"]
    both = d.result.table.merge(d.logged[keys + ["acc_eval_mode"]], on=keys, suffixes=("", "_logged"))
    if len(both) != len(d.result.table):
        return "the logged interventions at this step are not the same set; not compared"
    diff = float((both["acc_eval_mode"] - both["acc_eval_mode_logged"]).abs().max())
    return ("every accuracy identical to the logged one" if diff == 0 else
            f"differs from the logged ones by up to {100 * diff:.2f} points (another device or library version?)")


def format_checkpoint_report(d: CheckpointDiagnosis) -> str:
    """The printed report of one checkpoint's diagnosis."""
    r = d.result.reestimation
    out = [f"{d.cfg.row} seed={d.cfg.seed} step={d.step}: {checkpoint_path(d.run_dir, d.step)} (on {d.device})",
           f"Re-estimation: {r.batches} batches, {r.samples:,} samples from the run's own re-estimation stream, "
           f"{len(r.layers)} layers, weights {r.weights_fingerprint}.",
           "",
           "Stored versus fresh running statistics; lag = (stored - fresh mean) / sqrt(fresh var + the layer's eps), "
           "in sigma:",
           "| norm layer | channels | median abs lag (σ) | worst channel | its lag (σ) | median var stored/fresh |",
           "|---|---:|---:|---:|---:|---:|"]
    for _, s in d.lags.iterrows():
        out.append(f"| {s['norm_layer']} | {s['channels']} | {s['lag_median_abs_sigma']:.3f} | {s['worst_channel']} | "
                   f"{s['worst_lag_sigma']:+.3f} | {s['median_var_ratio']:.3f} |")
    out += ["", f"Evaluation-mode accuracy on the {d.cfg.scale.heldout_size:,} held-out samples:"]
    out += logged.describe_step(d.result.table, d.threshold)
    if d.k_refined is not None:
        out.append(f"  {'smallest k by bisection':<28}{d.k_refined} (assuming accuracy does not fall with k "
                   "between grid points)")
    out.append(f"Check against the run's log: {_agreement(d)}.")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- the command line
def parse_args(argv: list[str]) -> dict[str, str]:
    """``key=value`` arguments, as Hydra takes them.

    Raises:
        ValueError: naming an unknown key, a malformed argument, or a missing ``run``.
    """
    args = {}
    for a in argv:
        key, sep, value = a.partition("=")
        if not sep or key not in KEYS:
            raise ValueError(f"{a!r}: expected key=value with key one of {', '.join(KEYS)}")
        args[key] = value
    if "run" not in args:
        raise ValueError("run=<folder> is required, e.g. run=results/runs/adam/seed=0")
    return args


def usage() -> str:
    return __doc__ + "\nKeys:\n" + "".join(f"  {k:<10} {v}\n" for k, v in KEYS.items())


def main(argv: list[str] | None = None) -> int:
    """Print (and with ``out=``, write) the report; exit status 2 with one line naming the problem."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help", "help") for a in argv):
        print(usage())
        return 0
    try:
        args = parse_args(argv)
        threshold = float(args.get("threshold", logged.RECOVERY_THRESHOLD))
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold: expected a fraction in (0, 1], got {threshold}")
        if "step" in args:
            report = format_checkpoint_report(diagnose_checkpoint(args["run"], args["step"],
                                                                  args.get("device", "auto"), threshold))
        else:
            run = load_run(args["run"], tables=("checks", "interventions"))
            report = logged.logged_report(run, threshold)
    except (BadRunError, FileNotFoundError, ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report, end="")
    if "out" in args:
        records.atomic_write_text(args["out"], report)
        print(f"wrote {args['out']}", file=sys.stderr)
    return 0
