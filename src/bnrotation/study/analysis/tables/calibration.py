"""``calibration.md``: the monitor's signals and rule scored against an intervention, in sample and out of sample
(no torch).

**The truth** (fixed before any data was looked at): at an intervention point of a run (the runner's
``interventions`` table, every ``scale.intervene_every`` steps in the check window), the statistics are *stale*
when re-estimating them on training data (``reestimate``) recovers at least :data:`STALE_RECOVERY` (5 points)
of evaluation-mode accuracy on the held-out set over the stored statistics (``none``). An intervention, not the
symptom the monitor reads.

**The signals**, at every log step (:func:`log_signals`), recomputed from the ``channels`` table's running and
fresh means and variances with each layer's ``eps`` read back from ``run.json`` (:func:`bnrotation.staleness.
channel_signals`, the monitor's own arithmetic), so that runs written before the monitor recorded E are read as
the new ones:

* ``mode_gap``: the monitor's gap on its probe batch of training images, what it computes in a user's loop
  (the ``checks`` table's ``mode_gap``, which the zoo logs and the runner logs since issue 48; NaN in runs that
  logged none, which every line that needs it leaves out);
* ``heldout_mode_gap``: training- minus evaluation-mode accuracy on the held-out set the truth is measured on:
  the truth's own gap, kept as a labelled reference line (:data:`HELDOUT_GAP`), never a score of the monitor
  (logged from ``scale.check_start`` on, NaN before);
* ``lag_sigma``: the worst layer's median |mean lag| (the rule's signal before E), in fresh σ (with eps);
* ``eval_error_median_sigma`` and ``eval_error_max_sigma``: the worst layer's median and maximum over channels
  of E, in running σ;
* ``log_std_ratio_median_abs``: the worst layer's median |log s|, the variance part alone.

A signal *warns* at a log step when it is at or above its threshold and the step is past the monitor's warm-up
(:func:`bnrotation.staleness.warmup_steps` of the run's BatchNorm momenta); the rule warns as
:meth:`bnrotation.staleness.Thresholds.warns` decides.

**The method** (:func:`choose_threshold`, fixed before any out-of-sample run): for each signal alone, on the
in-sample intervention points, the threshold with the lowest false-alarm rate among those whose recall is at
least :data:`TARGET_RECALL`, the most sensitive of them on a tie, rounded down to two significant figures. A
missed stale state costs an evaluation that is wrong by at least 5 points; a false alarm costs one
re-estimation (seconds): so recall is fixed and false alarms minimised, rather than the two weighed equally
(Youden's J). The target sits above the out-of-sample claim (recall >= 0.8) to leave room for the shift. The
rule combines the thresholds so chosen.

**The samples** (:data:`SAMPLES`): the synthetic runs, where the thresholds were chosen (:func:`in_sample`: the
run's ``config.yaml`` ``task``, plus a row name that does not start with ``fmnist``); the runs of other tasks
looked at since issue 38 (the Fashion-MNIST rows and the first zoo), where the forecasters' thresholds are chosen;
and the second zoo, which none of it was chosen on. Every sample is scored with the thresholds as committed
(``Thresholds()``), never re-chosen. **Forecasters** (:data:`FORECASTERS`): candidate early warnings, scored by
:func:`early_warning` at the threshold :func:`forecast_threshold` picks on the looked-at runs.

Scores (:func:`score`): recall = stale intervention points it warns at / stale points; false-alarm rate =
fresh points it warns at / fresh points; lead time per run with a stale point = first stale point's step minus
the first warning's step (negative: it warned after), over the log steps of the whole run.

    python -m bnrotation.study.analysis.tables.calibration --results results/reference   # writes <results>/calibration.md
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .... import records
from ....staleness import Thresholds, channel_signals, in_warmup, warmup_steps
from ...constants import STALE_RECOVERY  # the truth's X, below the training code and the analysis
from ..results import RUNNER, BadRunError, Run, find_run_dirs, load_run, once_per_run
from ..results import ZOO as ZOO_LAYOUT  # ZOO here is the zoo's folder under a root
from ..formatting import schema_versions
from .frozen import load_frozen_runs

__all__ = ["out_of_sample_roots", "load_calibration_runs", "STALE_RECOVERY", "TARGET_RECALL", "IN_SAMPLE_TASK", "SIGNALS", "Signal", "in_sample", "out_of_sample_run", "task_of",
           "log_signals", "truth", "points", "warns_at", "choose_threshold", "score", "lead_times", "chosen_thresholds",
           "frozen_verdicts", "to_markdown", "main"]

TARGET_RECALL = 0.9  # the method's recall target (the out-of-sample claim asks >= 0.8)
IN_SAMPLE_TASK = "noisy_templates"  # conf/task/noisy_templates.yaml: the synthetic task the thresholds are fit on
TABLES = ("checks", "layers", "channels", "interventions")


@dataclass(frozen=True)
class Signal:
    """One signal: its column in :func:`log_signals`, its unit and its words."""

    column: str
    unit: str
    words: str


SIGNALS = (
    Signal("mode_gap", "", "mode gap on the monitor's probe batch (training images: what ships)"),
    Signal("lag_sigma", "σ", "worst layer's median absolute mean lag (fresh σ, with eps)"),
    Signal("eval_error_median_sigma", "σ", "worst layer's median E"),
    Signal("eval_error_max_sigma", "σ", "worst layer's max E"),
    Signal("log_std_ratio_median_abs", "", "worst layer's median absolute log s (the variance part alone)"),
)
BY_COLUMN = {s.column: s for s in SIGNALS}
# The truth's own gap: training- minus evaluation-mode accuracy on the held-out images the truth is measured on.
# Training mode there is already an evaluation with fresh statistics, so it is the truth by construction: a
# labelled reference line, never a score of the monitor (issue 48).
HELDOUT_GAP = Signal("heldout_mode_gap", "", "the truth's own gap (held-out images; a reference, not a score)")
RULE = "rule"  # the rule as it ships: the probe gap, and E or the lag
RULE_HELDOUT = "rule_heldout"  # the same thresholds fed the held-out gap: the reference line, and the history


# ----------------------------------------------------------------------------- which runs
def task_of(run: Run) -> str:
    """The run's task: ``config.yaml``'s ``task.name`` where it says one; a task config without a name but with
    the noisy-template task's ``template_scale`` is :data:`IN_SAMPLE_TASK` (every run written before the suite
    had a second task); else ``"unknown"``."""
    task = run.config.get("task") or {}
    if task.get("name"):
        return str(task["name"])
    return IN_SAMPLE_TASK if "template_scale" in task else "unknown"


def in_sample(run: Run) -> bool:
    """Whether ``run`` is one the thresholds may be chosen on: the synthetic task, and not a Fashion-MNIST row
    by name (``fmnist*``), whatever its config says."""
    return task_of(run) == IN_SAMPLE_TASK and not run.row.startswith("fmnist")


def out_of_sample_run(run: Run) -> bool:
    """Whether ``run`` is scored out of sample: a named task other than the synthetic one, or a Fashion-MNIST row
    by name. A run whose task cannot be told (``"unknown"``) is in neither sample."""
    return not in_sample(run) and (task_of(run) != "unknown" or run.row.startswith("fmnist"))


def _bn_layers(run: Run) -> dict[str, dict]:
    """``run.json``'s BatchNorm layers that keep running statistics: ``{norm layer: {class, momentum, eps, ...}}``.

    Raises:
        BadRunError: naming ``run.json`` when it lacks ``norm_layers``.
    """
    layers = run.info.get("norm_layers")
    if not isinstance(layers, dict):
        raise BadRunError(f"{run.path / 'run.json'}: no norm_layers (each layer's eps and momentum), which the "
                          "calibration needs to recompute the signals")
    return {k: v for k, v in layers.items() if "BatchNorm" in str(v.get("class")) and v.get("track_running_stats",
                                                                                           True)}


# ----------------------------------------------------------------------------- per run
@once_per_run
def log_signals(run: Run) -> pd.DataFrame:
    """The signals (:data:`SIGNALS`) of ``run`` at every log step.

    Returns:
        One line per log step with a finite E: ``step``, each signal's column (NaN where not logged: the mode
        gap before ``scale.check_start``) and ``warming_up`` (the step is below the monitor's warm-up). Empty
        for a run without BatchNorm running statistics.
    """
    return _log_signals(run)


def _log_signals(run: Run) -> pd.DataFrame:
    """:func:`log_signals` computed afresh (undecorated, so that ``make mutants`` mutates it)."""
    layers = _bn_layers(run)
    ch = run.tables.get("channels")
    ch = ch[ch["norm_layer"].isin(list(layers))] if ch is not None and "norm_layer" in ch else None
    if ch is None or ch.empty:
        return _layer_signals(run, layers)
    eps = ch["norm_layer"].map({k: float(v["eps"]) for k, v in layers.items()}).to_numpy()
    cols = [ch[k].to_numpy(float) for k in ("running_mean", "running_var", "fresh_mean", "fresh_var")]
    sig = channel_signals(*cols, eps)  # each (channels of every step and layer,)
    per_channel = pd.DataFrame({"step": ch["step"].to_numpy(), "norm_layer": ch["norm_layer"].to_numpy(),
                                "lag": np.abs(sig.lag_sigma), "e": sig.eval_error_sigma,
                                "log_s": np.abs(sig.log_std_ratio)})
    per_layer = per_channel.groupby(["step", "norm_layer"]).agg(
        lag_sigma=("lag", "median"), eval_error_median_sigma=("e", "median"), eval_error_max_sigma=("e", "max"),
        log_std_ratio_median_abs=("log_s", "median"))
    out = per_layer.groupby("step").max().reset_index()
    out = out[np.isfinite(out["eval_error_median_sigma"])]
    return _with_gap_and_warmup(run, layers, out)


LAYER_COLUMNS = {"lag_sigma": "lag_median_abs_sigma", "eval_error_median_sigma": "eval_error_median_sigma",
                 "eval_error_max_sigma": "eval_error_max_sigma", "log_std_ratio_median_abs": "log_std_ratio_median_abs"}


def _layer_signals(run: Run, layers: dict[str, dict]) -> pd.DataFrame:
    """:func:`log_signals` of a run that stored no ``channels`` table (the staleness zoo by default), from the
    monitor's own per-layer columns in its ``layers`` table (:data:`LAYER_COLUMNS`; NaN where the monitor that ran
    did not record one, as before E): the worst layer's value per step."""
    empty = pd.DataFrame(columns=["step", *BY_COLUMN, HELDOUT_GAP.column, *FORECAST_COLUMNS, "warming_up"])
    lay = run.tables.get("layers")
    if lay is None or "norm_layer" not in lay or "lag_median_abs_sigma" not in lay:
        return empty
    lay = lay[lay["norm_layer"].isin(list(layers))]
    if lay.empty:
        return empty
    cols = {ours: lay[theirs] if theirs in lay else np.nan for ours, theirs in LAYER_COLUMNS.items()}
    out = pd.DataFrame({"step": lay["step"].to_numpy(), **cols}).groupby("step").max().reset_index()
    out = out[np.isfinite(out["lag_sigma"]) | np.isfinite(out["eval_error_median_sigma"])]
    return _with_gap_and_warmup(run, layers, out)


def _with_gap_and_warmup(run: Run, layers: dict[str, dict], out: pd.DataFrame) -> pd.DataFrame:
    """``out`` (one line per log step) with the ``checks`` table's two gaps, the forecasters' signals
    (:data:`FORECASTERS`) and ``warming_up``: ``mode_gap``, the monitor's gap on its probe batch (the ``checks``
    column of that name, which the zoo and, since issue 48, the runner log; NaN where a run logged none),
    and ``heldout_mode_gap``, the truth's own (:data:`HELDOUT_GAP`)."""
    checks = run.tables["checks"]
    gaps = pd.DataFrame({"step": checks["step"],
                         "mode_gap": checks["mode_gap"] if "mode_gap" in checks else np.nan,
                         "heldout_mode_gap": checks["acc_train_mode"] - checks["acc_eval_mode"]})
    out = out.merge(gaps, on="step", how="left")
    momenta = [v.get("momentum") for v in layers.values()]
    out = _forecaster_signals(run, layers, out, momenta)
    warm = warmup_steps(momenta)
    return out.assign(warming_up=in_warmup(out["step"], warm))[["step", *BY_COLUMN, HELDOUT_GAP.column,
                                                                 *FORECAST_COLUMNS, "warming_up"]]


# ----------------------------------------------------------------------------- forecasters (issue 48, item 4)
# Registered before the second zoo ran: candidates for a warning *before* the first stale point. Each is a number
# per log step; it warns at or above a threshold chosen on the runs already looked at (:func:`forecast_threshold`)
# and is scored, on the second zoo, by how often it warns at least one log step before a run's first stale point.
FORECASTERS = (
    Signal("e_slope_per_100", "σ", "slope of the worst layer's median E since the previous call (σ per 100 steps)"),
    Signal("rotation_in_memory_deg", "°", "worst layer's median rotation within the running statistics' memory "
           "(rotation per step × 1/momentum, degrees)"),
    Signal("probe_disagreement", "", "share of probe samples whose predicted class differs between the modes "
           "(1 − mode agreement; at least the gap, and moving before it)"),
)
FORECAST_COLUMNS = tuple(f.column for f in FORECASTERS)
FORECAST_FALSE_ALARMS = 0.05  # each forecaster's threshold holds false alarms to this share of fresh points


def _forecaster_signals(run: Run, layers: dict[str, dict], out: pd.DataFrame, momenta: list) -> pd.DataFrame:
    """``out`` with :data:`FORECAST_COLUMNS`: E's slope between consecutive log steps (σ per 100 steps; NaN at
    the first), the worst layer's median rotation per step times the memory of the running statistics, 1/m for
    the smallest momentum m (1 step for a cumulative average, ``momentum=None``), from the ``layers`` table's
    ``rotation_deg_per_100`` (NaN where it holds none), and the probe's disagreement between the modes, 1 minus
    the ``checks`` table's ``mode_agreement`` (NaN where a run logged none)."""
    out = out.sort_values("step").reset_index(drop=True)
    e, steps = out["eval_error_median_sigma"].to_numpy(float), out["step"].to_numpy(float)
    slope = np.full(len(out), np.nan)
    if len(out) > 1:
        slope[1:] = 100.0 * np.diff(e) / np.diff(steps)
    finite = [float(m) for m in momenta if m is not None and float(m) > 0]
    memory = 1.0 / min(finite) if finite else 1.0  # steps
    rot = np.full(len(out), np.nan)
    lay = run.tables.get("layers")
    if lay is not None and "rotation_deg_per_100" in lay and "norm_layer" in lay:
        per_step = lay[lay["norm_layer"].isin(list(layers))].groupby("step")["rotation_deg_per_100"].max()
        rot = out["step"].map(per_step).to_numpy(float) * memory / 100.0
    checks = run.tables["checks"]
    agreement = (checks.set_index("step")["mode_agreement"] if "mode_agreement" in checks
                 else pd.Series(dtype=float))
    disagreement = 1.0 - out["step"].map(agreement).to_numpy(float)
    return out.assign(e_slope_per_100=slope, rotation_in_memory_deg=rot, probe_disagreement=disagreement)


@once_per_run
def truth(run: Run) -> pd.DataFrame:
    """Per intervention step: ``acc_stored`` and ``acc_reestimated`` (evaluation-mode accuracy on the held-out
    set with the stored and the re-estimated statistics, fractions), ``recovery`` (their difference) and
    ``stale`` (``recovery >= STALE_RECOVERY``). Empty without interventions, or without a re-estimated accuracy
    (a run without running statistics records NaN there)."""
    return _truth(run)


def _truth(run: Run) -> pd.DataFrame:
    """:func:`truth` computed afresh (undecorated, so that ``make mutants`` mutates it)."""
    empty = pd.DataFrame(columns=["step", "acc_stored", "acc_reestimated", "recovery", "stale"])
    iv = run.tables.get("interventions")
    if iv is None or iv.empty:
        return empty
    both = iv[iv["intervention"].isin(["none", "reestimate"])]
    wide = both.pivot_table(index="step", columns="intervention", values="acc_eval_mode").dropna()
    if not {"none", "reestimate"} <= set(wide.columns):  # no running statistics (the GroupNorm control): NaN
        return empty
    wide = wide.rename(columns={"none": "acc_stored", "reestimate": "acc_reestimated"}).reset_index()
    wide["recovery"] = wide["acc_reestimated"] - wide["acc_stored"]
    return wide.assign(stale=wide["recovery"] >= STALE_RECOVERY)[["step", "acc_stored", "acc_reestimated",
                                                                   "recovery", "stale"]]


def points(runs: list[Run]) -> pd.DataFrame:
    """Every run's intervention points with the signals at the same step: ``row``, ``seed``, ``step``, the truth's
    columns (:func:`truth`) and the signals' (:func:`log_signals`). Runs without BatchNorm or interventions add
    none."""
    frames = []
    for r in runs:
        t, s = truth(r), log_signals(r)
        if t.empty or s.empty:
            continue
        frames.append(t.merge(s, on="step", how="inner").assign(row=r.row, seed=r.seed))
    if not frames:
        return pd.DataFrame(columns=["row", "seed", "step", "recovery", "stale", *BY_COLUMN, HELDOUT_GAP.column,
                                     *FORECAST_COLUMNS, "warming_up"])
    return pd.concat(frames, ignore_index=True)


# ----------------------------------------------------------------------------- the method and the scores
def _round_down(t: float, digits: int = 2) -> float:
    """``t`` > 0 rounded down to ``digits`` significant figures (0.0703 -> 0.07)."""
    if not t > 0 or not math.isfinite(t):
        return t
    places = digits - 1 - math.floor(math.log10(t))
    return round(math.floor(t * 10 ** places) / 10 ** places, max(places, 0))


def choose_threshold(values, stale, target: float = TARGET_RECALL) -> float:
    """The method: among the thresholds t (each observed value at a stale point; a signal warns at values
    >= t) whose recall is at least ``target``, the one with the lowest false-alarm rate, the smallest on a tie,
    rounded down to two significant figures (which keeps the recall).

    Args:
        values: the signal at each point (NaN: not measured, never warns); stale: the truth at each point.

    Raises:
        ValueError: when there is no stale point, or no threshold reaches ``target``.
    """
    v, y = np.asarray(values, float), np.asarray(stale, bool)
    if not y.any():
        raise ValueError("choose_threshold: no stale point to reach a recall on")
    best = None
    for t in np.unique(v[y & np.isfinite(v)]):
        warn = v >= t
        recall, far = (warn & y).sum() / y.sum(), (warn & ~y).sum() / max((~y).sum(), 1)
        if recall >= target and (best is None or far < best[1]):
            best = (float(t), far)
    if best is None:
        raise ValueError(f"choose_threshold: no threshold reaches a recall of {target}")
    return _round_down(best[0])


def score(warn, stale) -> dict:
    """``stale``, ``caught``, ``recall``, ``fresh``, ``false_alarms``, ``far`` (false-alarm rate) of the warnings
    ``warn`` against the truth ``stale`` (bool arrays of one length); a rate is NaN over no points."""
    w, y = np.asarray(warn, bool), np.asarray(stale, bool)
    n_stale, n_fresh = int(y.sum()), int((~y).sum())
    caught, false = int((w & y).sum()), int((w & ~y).sum())
    return {"stale": n_stale, "caught": caught, "recall": caught / n_stale if n_stale else math.nan,
            "fresh": n_fresh, "false_alarms": false, "far": false / n_fresh if n_fresh else math.nan}


def warns_at(signals: pd.DataFrame, what: str, thresholds: Thresholds, alone: dict[str, float]):
    """Whether ``what`` (a signal's column at ``alone[what]``, or :data:`RULE` as ``thresholds`` decide on the
    probe gap, or :data:`RULE_HELDOUT` on the held-out gap) warns on each line of ``signals`` (:func:`log_signals`
    or :func:`points` lines): a bool array, False in the warm-up."""
    if what in (RULE, RULE_HELDOUT):
        gap = signals["mode_gap" if what == RULE else HELDOUT_GAP.column].to_numpy(float)
        w = thresholds.warns(gap, signals["lag_sigma"].to_numpy(float),
                             signals["eval_error_median_sigma"].to_numpy(float))
    else:
        with np.errstate(invalid="ignore"):
            w = signals[what].to_numpy(float) >= alone[what]
    return np.asarray(w, bool) & ~signals["warming_up"].to_numpy(bool)


def lead_times(runs: list[Run], what: str, thresholds: Thresholds, alone: dict[str, float]) -> dict:
    """Per run with a stale intervention point: the first stale point's step minus the step of the first log
    step at which ``what`` warns.

    Returns:
        ``runs`` (with a stale point), ``warned_by`` (of them, those warned at or before it), ``median_steps``
        (median lead time over the runs that warned at all; NaN when none did), ``never`` (runs never warned)
        and ``first_warning_step`` (the median step of the first warning, over the runs that warned).
    """
    leads, firsts, never, n = [], [], 0, 0
    for r in runs:
        t, s = truth(r), log_signals(r)
        if t.empty or s.empty or not t["stale"].any():
            continue
        n += 1
        first_stale = int(t.loc[t["stale"], "step"].min())
        warned = s.loc[warns_at(s, what, thresholds, alone), "step"]
        if warned.empty:
            never += 1
        else:
            leads.append(first_stale - int(warned.min()))
            firsts.append(int(warned.min()))
    return {"runs": n, "warned_by": sum(1 for x in leads if x >= 0), "never": never,
            "median_steps": float(np.median(leads)) if leads else math.nan,
            "first_warning_step": float(np.median(firsts)) if firsts else math.nan}


def chosen_thresholds(pts: pd.DataFrame) -> dict[str, float]:
    """:func:`choose_threshold` of every signal alone, and of the held-out gap, on the points ``pts``
    (:func:`points`); NaN for a signal that no point logged (the probe gap of runs written before the runner
    logged it: the rule's gap threshold was chosen on the held-out gap, the only gap those runs hold)."""
    return {s.column: (choose_threshold(pts[s.column], pts["stale"]) if pts[s.column].notna().any() else math.nan)
            for s in (*SIGNALS, HELDOUT_GAP)}


GAP_OF = {"mode_gap": "mode_gap", RULE: "mode_gap", HELDOUT_GAP.column: HELDOUT_GAP.column,
          RULE_HELDOUT: HELDOUT_GAP.column}  # the gap a score needs: runs that did not log it are left out of it


def logged(runs: list[Run], column: str) -> list[Run]:
    """The runs of ``runs`` whose :func:`log_signals` hold a finite ``column`` at some log step."""
    return [r for r in runs if not log_signals(r).empty and log_signals(r)[column].notna().any()]


def forecast_threshold(values, stale, far: float = FORECAST_FALSE_ALARMS) -> float:
    """A forecaster's threshold, chosen on points already looked at: the smallest observed value t whose warnings
    (values >= t) fall on at most ``far`` of the fresh points, rounded up to two significant figures (which keeps
    the rate); NaN when no value is finite.

    Args:
        values: the forecaster at each point past the warm-up (NaN: not measured); stale: the truth there.
    """
    v, y = np.asarray(values, float), np.asarray(stale, bool)
    fresh = v[~y]
    best = math.nan
    for t in np.unique(v[np.isfinite(v)])[::-1]:
        if (fresh >= t).sum() / max(len(fresh), 1) > far:
            break
        best = float(t)
    return _round_up(best)


def _round_up(t: float, digits: int = 2) -> float:
    """``t`` > 0 rounded up to ``digits`` significant figures (0.0703 -> 0.071); others as they are."""
    if not t > 0 or not math.isfinite(t):
        return t
    places = digits - 1 - math.floor(math.log10(t))
    return round(math.ceil(round(t * 10 ** places, 9)) / 10 ** places, max(places, 0))


def early_warning(runs: list[Run], what: str, threshold: float) -> dict:
    """How early the forecaster ``what`` (a :data:`FORECAST_COLUMNS` column) warns at ``threshold``, past the
    warm-up: ``runs`` (with a stale point past the warm-up), ``early`` (of them, those it warned at a log step
    strictly before the first stale point: at least one log step ahead), ``median_lead_steps`` (first stale point
    minus first warning, over the runs it warned at all; NaN when none), ``fresh``, ``false_alarms`` and ``far``
    over the fresh intervention points past the warm-up."""
    early, leads, n, fresh, false = 0, [], 0, 0, 0
    for r in runs:
        t, s = truth(r), log_signals(r)
        if t.empty or s.empty:
            continue
        s = s[~s["warming_up"].to_numpy(bool)]
        with np.errstate(invalid="ignore"):
            warned_steps = s.loc[s[what].to_numpy(float) >= threshold, "step"]
        t = t[t["step"].isin(s["step"])]
        on_fresh = t.loc[~t["stale"].astype(bool), "step"]
        fresh += len(on_fresh)
        false += int(on_fresh.isin(warned_steps).sum())
        if not t["stale"].any():
            continue
        n += 1
        first_stale = int(t.loc[t["stale"].astype(bool), "step"].min())
        if not warned_steps.empty:
            leads.append(first_stale - int(warned_steps.min()))
            early += int(warned_steps.min() < first_stale)
    return {"runs": n, "early": early, "median_lead_steps": float(np.median(leads)) if leads else math.nan,
            "fresh": fresh, "false_alarms": false, "far": false / fresh if fresh else math.nan}


def forecast_thresholds(pts: pd.DataFrame) -> dict[str, float]:
    """:func:`forecast_threshold` of every forecaster on the points ``pts`` (:func:`points`) past the warm-up."""
    past = pts[~pts["warming_up"].astype(bool)]
    return {f.column: forecast_threshold(past[f.column], past["stale"]) for f in FORECASTERS}


SCORED = (*BY_COLUMN, RULE, HELDOUT_GAP.column, RULE_HELDOUT)  # the lines of a score table, in order


def scores(runs: list[Run], thresholds: Thresholds, alone: dict[str, float]) -> pd.DataFrame:
    """One line per signal alone (at ``alone``'s threshold), for the rule as it ships (:data:`RULE`, the probe
    gap) and for the reference lines (the held-out gap alone and the rule fed it): ``what``, ``threshold``,
    ``runs`` (those scored: a line that needs a gap reads only the runs that logged it, :data:`GAP_OF`) and the
    columns of :func:`score` and :func:`lead_times`. Empty without points."""
    if points(runs).empty:
        return pd.DataFrame()
    lines = []
    for what in SCORED:
        mine = logged(runs, GAP_OF[what]) if what in GAP_OF else runs
        lines.append({"what": what, "threshold": alone.get(what, math.nan), "runs": len(mine),
                      **score_of(mine, what, thresholds, alone),
                      **{f"lead_{k}": v for k, v in lead_times(mine, what, thresholds, alone).items()}})
    return pd.DataFrame(lines)


def score_of(runs: list[Run], what: str, thresholds: Thresholds, alone: dict[str, float] | None = None,
             warmup_points: bool = False) -> dict:
    """:func:`score` of ``what`` (a signal at ``alone``'s threshold, :data:`RULE` or :data:`RULE_HELDOUT`) over the
    intervention points of ``runs`` past the warm-up, where no verdict is given (with ``warmup_points``, over every
    point, counting those in the warm-up as not warned at: issue 38's scoring, kept for its claims' history); a
    line that needs a gap (:data:`GAP_OF`) reads only the runs that logged it."""
    runs = logged(runs, GAP_OF[what]) if what in GAP_OF else runs
    pts = points(runs)
    pts = pts[~pts["warming_up"].astype(bool)] if not pts.empty and not warmup_points else pts
    if pts.empty:
        return score(np.zeros(0, bool), np.zeros(0, bool))
    return score(warns_at(pts, what, thresholds, alone or {}), pts["stale"])


# ----------------------------------------------------------------------------- the frozen case
def frozen_verdicts(root: str | Path, thresholds: Thresholds) -> pd.DataFrame:
    """The rule re-applied to the frozen-backbone runs' monitor records on the original task's probe: per row,
    the share of log points at which it warns (its verdict, the record's ``stale``: these runs start from
    pre-trained statistics, not from an initialisation, so no warm-up applies).

    Returns:
        One line per frozen row: ``row``, ``runs``, ``log_points``, ``warned`` (share), ``mode_gap_end`` and
        ``eval_error_end`` (means over seeds at the last step; the worst layer's median E), or, where the
        records predate E, ``measured`` False. Empty when ``root`` holds no frozen run.
    """
    runs, _ = load_frozen_runs(root)
    lines = []
    for row in sorted({r.row for r in runs}):
        mine = [r for r in runs if r.row == row]
        frames = [r.tables["monitor"].query("probe == 'original'") for r in mine]
        has_e = all("eval_error_median_sigma" in f for f in frames)
        if not has_e:
            lines.append({"row": row, "runs": len(mine), "measured": False})
            continue
        per_step = [f.groupby("step").agg(mode_gap=("mode_gap", "first"), lag=("lag_median_abs_sigma", "max"),
                                          e=("eval_error_median_sigma", "max")) for f in frames]
        warned = np.concatenate([thresholds.warns(p["mode_gap"], p["lag"], p["e"]) for p in per_step])
        lines.append({"row": row, "runs": len(mine), "measured": True, "log_points": int(warned.size),
                      "warned": float(warned.mean()),
                      "mode_gap_end": float(np.mean([p["mode_gap"].iloc[-1] for p in per_step])),
                      "eval_error_end": float(np.mean([p["e"].iloc[-1] for p in per_step]))})
    return pd.DataFrame(lines)


# ----------------------------------------------------------------------------- reading the roots
ZOO = "zoo"  # <root>/zoo/runs/...: the staleness zoo's runs, beside a root's own
SECOND_ZOO_DIR = "zoo2"  # <root>/zoo2/runs/...: the second zoo's runs (bnrotation.study.constants.SECOND_ZOO)


def out_of_sample_roots(root: str | Path) -> list[Path]:
    """The roots whose runs of another task were scored out of sample for issue 38, and have been looked at since
    (:data:`LOOKED_AT`): ``root`` itself (the Fashion-MNIST rows beside the synthetic ones) and ``root/zoo``."""
    return [Path(root), Path(root) / ZOO]


def second_zoo_roots(root: str | Path) -> list[Path]:
    """The roots of the runs none of issue 48's choices was made on (:data:`FRESH`): ``root/zoo2``."""
    return [Path(root) / SECOND_ZOO_DIR]


@dataclass(frozen=True)
class Sample:
    """A set of runs the report scores apart: its key, its heading and what was chosen on it."""

    key: str
    title: str
    words: str


SYNTHETIC = Sample("synthetic", "The synthetic runs", "the thresholds were chosen here (task `noisy_templates`, "
                   "no `fmnist*` row); these runs logged no probe gap, only the held-out one")
LOOKED_AT = Sample("looked_at", "Fashion-MNIST rows and the first zoo",
                   "scored out of sample for issue 38 and looked at since: in sample for anything chosen from then "
                   "on, the forecasters' thresholds among them")
FRESH = Sample("fresh", "The second zoo", "none of this was chosen on it: the rule, its thresholds, the scoring, "
               "the forecasters and the claims were committed before its first run")
SAMPLES = (SYNTHETIC, LOOKED_AT, FRESH)


def finished_runs(roots: list[str | Path]) -> tuple[list[Run], list[str]]:
    """Every finished run under ``roots`` (each ``<root>/runs/<row>/seed=<s>``), diverged ones included, each folder
    once, and one line per folder refused. Each is read by the run reader
    (:func:`bnrotation.study.analysis.results.load_run`) with the layout of the experiment that wrote it: the
    runner's (:data:`bnrotation.study.analysis.results.RUNNER`) or the staleness zoo's
    (:data:`bnrotation.study.analysis.results.ZOO`: no ``scale`` section, no ``channels`` table by default)."""
    runs, problems, seen = [], [], set()
    for root in roots:
        for d in find_run_dirs(root):
            if d.resolve() in seen:
                continue
            seen.add(d.resolve())
            try:
                runs.append(load_run(d, TABLES, (RUNNER, ZOO_LAYOUT)))
            except BadRunError as err:
                problems.append(str(err))
    return runs, problems


def load_calibration_runs(roots: list[str | Path], keep) -> tuple[list[Run], list[str]]:
    """The finished, non-diverged runs under ``roots`` for which ``keep(run)`` holds, and one line per folder
    refused (:func:`finished_runs`)."""
    runs, problems = finished_runs(roots)
    return [r for r in runs if not r.diverged and keep(r)], problems


def diverged_runs(runs: list[Run]) -> list[str]:
    """The diverged runs among ``runs`` (``run.json`` status ``diverged``), as ``<row> seed <s> (step <n>)``:
    finished, so a zoo that holds them is whole, but left out of every score (:func:`load_calibration_runs`)."""
    out = []
    for r in runs:
        if r.diverged:
            step = r.info.get("diverged_at_step")
            out.append(f"`{r.row}` seed {r.seed}" + (f" (step {step:,})" if isinstance(step, int) else ""))
    return out


# ----------------------------------------------------------------------------- the report
def _thr(what: str, value: float) -> str:
    unit = BY_COLUMN[what].unit if what in BY_COLUMN else ""
    return f"{value:g}{unit}"


def _rate(line, key: str, count: str, n: str) -> str:
    if line is None:
        return "not run"
    if not line[n]:
        return "–"
    return f"{line[key]:.2f} ({int(line[count])}/{int(line[n])})"


def _lead(line) -> str:
    if line is None:
        return "not run"
    if not line["lead_runs"]:
        return "–"
    med = line["lead_median_steps"]
    head = f"{med:+,.0f} steps" if math.isfinite(med) else "never warned"
    return f"{head} ({int(line['lead_warned_by'])}/{int(line['lead_runs'])} runs by the first stale point)"


def _rule_words(t: Thresholds) -> str:
    return (f"mode gap ≥ {t.mode_gap:g} and (worst layer's median E ≥ {t.eval_error_sigma:g}σ or worst layer's "
            f"median absolute lag ≥ {t.lag_sigma:g}σ)")


def _describe(runs: list[Run]) -> str:
    if not runs:
        return "none"
    rows = sorted({r.row for r in runs})
    return f"{len(runs)} runs of {len(rows)} rows ({', '.join(f'`{x}`' for x in rows)})"


def _line_words(what: str, thresholds: Thresholds, alone: dict[str, float]) -> str:
    if what == RULE:
        return f"**the rule as it ships** (probe gap): {_rule_words(thresholds)}"
    if what == RULE_HELDOUT:
        return "*reference: the rule fed the truth's own gap (held-out images), not a score*"
    if what == HELDOUT_GAP.column:
        return f"*reference: {HELDOUT_GAP.words} ≥ {_thr(what, alone[what])}*"
    return f"{BY_COLUMN[what].words} ≥ {_thr(what, alone[what])}"


def _score_table(runs: list[Run], thresholds: Thresholds, alone: dict[str, float]) -> list[str]:
    table = scores(runs, thresholds, alone)
    if table.empty:
        return ["No run yet" + (": `make zoo2`, in the background (docs/running.md)." if runs == [] else ".")]
    t = table.set_index("what")
    out = ["| Signal (threshold) | Runs | Recall | False alarms | Lead time |", "|---|---:|---:|---:|---|"]
    for what in SCORED:
        line = t.loc[what]
        if not line["runs"]:
            out.append(f"| {_line_words(what, thresholds, alone)} | 0 | not logged | – | – |")
            continue
        out.append(f"| {_line_words(what, thresholds, alone)} | {int(line['runs'])} | "
                   f"{_rate(line, 'recall', 'caught', 'stale')} | {_rate(line, 'far', 'false_alarms', 'fresh')} | "
                   f"{_lead(line)} |")
    return out


def _forecast_cell(runs: list[Run], what: str, threshold: float) -> str:
    if not runs:
        return "not run"
    e = early_warning(runs, what, threshold)
    if not e["runs"]:
        return "no run goes stale"
    lead = f"{e['median_lead_steps']:+,.0f} steps" if math.isfinite(e["median_lead_steps"]) else "never warned"
    far = f"{e['far']:.2f} ({e['false_alarms']}/{e['fresh']})" if e["fresh"] else "–"
    return f"{e['early']}/{e['runs']} runs early; median lead {lead}; false alarms {far}"


def to_markdown(samples: dict[str, list[Run]], roots: dict[str, list[Path]], frozen: pd.DataFrame,
                thresholds: Thresholds = Thresholds()) -> str:
    """``calibration.md``: the truth, the method, the thresholds chosen on the synthetic runs against the committed
    defaults; then, for each sample (:data:`SAMPLES`), each signal's and the rule's recall, false alarms and lead
    time, with the rule fed the gap the monitor ships (its probe batch of training images) and the held-out gap
    kept as a labelled reference; the forecasters; then the frozen-backbone case."""
    ins = samples[SYNTHETIC.key]
    pts = points(ins)
    chosen = chosen_thresholds(pts)
    alone = _alone(chosen, thresholds)
    looked_pts = points(samples[LOOKED_AT.key])
    forecast = forecast_thresholds(looked_pts) if not looked_pts.empty else {f.column: math.nan for f in FORECASTERS}
    out = ["# The monitor's rule, calibrated in sample and scored as it ships\n",
           "Rebuilt by `make calibrate` (`bnrotation.study.analysis.tables.calibration`) from the runs under "
           + "; ".join(f"{s.title.lower()}: {', '.join(f'`{p}`' for p in roots[s.key]) or 'no root'}" for s in SAMPLES)
           + f"; {schema_versions(r.info.get('schema_version') for runs in samples.values() for r in runs)}.\n",
           f"- **Truth** (fixed before any data): at an intervention point, the statistics are stale when "
           f"re-estimating them on training data recovers at least {STALE_RECOVERY * 100:g} points of "
           "evaluation-mode accuracy on the held-out set.",
           "- **What is scored** (issue 48): the signals the shipped monitor computes in a user's loop. Its mode gap "
           "is measured on its probe batch of training images, never on the held-out images the truth is measured "
           "on. The held-out gap is kept only as a labelled reference line, *the truth's own gap*: training mode on "
           "the held-out images is already an evaluation with fresh statistics, so that gap is the truth by "
           "construction. A line that needs a gap reads only the runs that logged it (the `Runs` column).",
           f"- **Method**: for each signal alone, the threshold with the lowest false-alarm rate among those with "
           f"in-sample recall ≥ {TARGET_RECALL:g}, the smallest on a tie, rounded down to two significant figures. "
           "A miss costs an evaluation wrong by 5 points or more, a false alarm one re-estimation: recall is fixed, "
           "false alarms minimised (not Youden's J, which weighs them alike).",
           f"- **The rule** (`bnrotation.Thresholds()`): {_rule_words(thresholds)}. Its mode-gap threshold is the "
           "method's choice on the synthetic runs' held-out gap (the only gap they logged), its E threshold the "
           "method's choice on E (checked by `tests/test_calibration.py`); the lag keeps its earlier default.\n"]
    for sm in SAMPLES:
        left = diverged_runs(finished_runs(roots[sm.key])[0]) if sm.key == FRESH.key else []
        out.append(f"- **{sm.title}**: {sm.words}; {_describe(samples[sm.key])}"
                   + (f"; left out, as every diverged run is: {', '.join(left)}" if left else "") + ".")
    out += ["", "## Thresholds\n", "| Signal | Method's choice on the synthetic runs | In `Thresholds()` |",
            "|---|---:|---:|"]
    committed = {"mode_gap": thresholds.mode_gap, "eval_error_median_sigma": thresholds.eval_error_sigma,
                 "lag_sigma": thresholds.lag_sigma}
    for sig in (*SIGNALS, HELDOUT_GAP):
        mine = _thr(sig.column, committed[sig.column]) if sig.column in committed else "–"
        got = _thr(sig.column, chosen[sig.column]) if math.isfinite(chosen[sig.column]) else "not logged"
        out.append(f"| {sig.words} | {got} | {mine} |")
    out += ["", "Recall: stale points warned at (count/stale); false alarms: fresh points warned at (count/fresh); "
            "lead time: median over runs with a stale point of (first stale point − first warning), in steps, over "
            "every log step past the monitor's warm-up. Rates over the intervention points past the warm-up."]
    for sm in SAMPLES:
        out += ["", f"## {sm.title}\n", f"{sm.words[0].upper()}{sm.words[1:]}.\n"]
        out += _score_table(samples[sm.key], thresholds, alone)
        if sm is SYNTHETIC:
            out += ["", "### Reading it\n"] + _reading(ins, pts, thresholds, alone)
    out += ["", "## Early warning: the forecasters\n",
            "Registered before the second zoo ran (issue 48, item 4). Each warns at or above a threshold chosen on the "
            f"runs already looked at (Fashion-MNIST rows and the first zoo), the smallest that holds false alarms to "
            f"{FORECAST_FALSE_ALARMS:.0%} of their fresh points past the warm-up, rounded up to two significant "
            "figures (`forecast_threshold`). *Early*: it warned at a log step before the run's first stale point, at "
            "least one check ahead.\n",
            "| Forecaster | Threshold | Looked at | Second zoo |", "|---|---:|---|---|"]
    for f in FORECASTERS:
        thr = forecast[f.column]
        if not math.isfinite(thr):
            out.append(f"| {f.words} | not logged | – | – |")
            continue
        out.append(f"| {f.words} | {thr:g}{f.unit} | {_forecast_cell(samples[LOOKED_AT.key], f.column, thr)} | "
                   f"{_forecast_cell(samples[FRESH.key], f.column, thr)} |")
    out += ["", "## The frozen backbone (original task's probe)\n"] + _frozen_lines(frozen, thresholds)
    return "\n".join(out) + "\n"


def _alone(chosen: dict[str, float], thresholds: Thresholds) -> dict[str, float]:
    """Each signal's threshold alone: the committed ones where the rule has them, else the method's choice."""
    return {**chosen, "mode_gap": thresholds.mode_gap, "eval_error_median_sigma": thresholds.eval_error_sigma,
            "lag_sigma": thresholds.lag_sigma, HELDOUT_GAP.column: thresholds.mode_gap}


def _reading(ins: list[Run], pts: pd.DataFrame, thresholds: Thresholds, alone: dict[str, float]) -> list[str]:
    """The in-sample facts that qualify the synthetic runs' table, each computed from the points."""
    gap_vs_truth = float((pts[HELDOUT_GAP.column] - pts["recovery"]).abs().max())
    starts = sorted({int(r.config["scale"]["check_start"]) for r in ins})
    e_only = warns_at(pts, "eval_error_median_sigma", thresholds, alone)
    lag_only = warns_at(pts, "lag_sigma", thresholds, alone)
    stale = pts["stale"].to_numpy(bool)
    chosen = chosen_thresholds(pts)
    fair = {k: score(warns_at(pts, k, thresholds, chosen), stale) for k in ("lag_sigma", "eval_error_median_sigma")}
    first = lead_times(ins, "eval_error_median_sigma", thresholds, alone)["first_warning_step"]
    first_lag = lead_times(ins, "lag_sigma", thresholds, alone)["first_warning_step"]
    return [
        f"- The held-out mode gap equals the truth's recovery to within {gap_vs_truth * 100:.3g} points at every "
        "intervention point: training-mode accuracy with the held-out set's own batch statistics is what "
        "re-estimation restores. The rule fed that gap scores the channel signal among the stale points, not the "
        "monitor as it ships.",
        f"- These runs log the held-out gap from step {' or '.join(f'{s:,}' for s in starts)} (`scale.check_start`), "
        "so the reference lines cannot warn before it; the channel signals are logged from step 0.",
        f"- E against the lag at their thresholds: E warns at {int((e_only & stale).sum())} stale and "
        f"{int((e_only & ~stale).sum())} fresh points, the lag at {int((lag_only & stale).sum())} and "
        f"{int((lag_only & ~stale).sum())}; the lag branch adds {int((lag_only & ~e_only & stale).sum())} stale and "
        f"{int((lag_only & ~e_only & ~stale).sum())} fresh points to E's. Each at the method's own choice (lag "
        f"{_thr('lag_sigma', chosen['lag_sigma'])}, E {_thr('eval_error_median_sigma', chosen['eval_error_median_sigma'])}): "
        f"recall {fair['lag_sigma']['recall']:.2f} and {fair['eval_error_median_sigma']['recall']:.2f}, false alarms "
        f"{fair['lag_sigma']['far']:.2f} and {fair['eval_error_median_sigma']['far']:.2f}. E is chosen for the rule "
        "because it also sees a moved running variance, which the lag cannot (the frozen case below).",
        f"- E alone first warns at a median step of {first:,.0f} (the lag alone at {first_lag:,.0f}), in every run, "
        "including rows that never go stale: early training, where the running statistics trail fast weights and "
        "no intervention point judges them. Those lead times are not early warnings; the forecasters below are "
        "scored for that at a fixed false-alarm rate.",
        "- The worst layer's median E, not its maximum: a maximum over channels grows with the channel count, so "
        "its threshold would not carry over between networks of different widths.",
    ]


def _frozen_lines(frozen: pd.DataFrame, thresholds: Thresholds) -> list[str]:
    if frozen.empty:
        return ["No frozen-backbone run under the root (`make frozen`)."]
    lines = ["| Row | Runs | Log points the rule warns at | Mode gap at the end | Worst median E at the end |",
             "|---|---:|---:|---:|---:|"]
    for _, f in frozen.iterrows():
        if not f["measured"]:
            lines.append(f"| `{f['row']}` | {f['runs']} | not measured: records written before E | – | – |")
        else:
            lines.append(f"| `{f['row']}` | {f['runs']} | {f['warned']:.0%} of {f['log_points']} | "
                         f"{f['mode_gap_end']:.1%} | {f['eval_error_end']:.3f}σ |")
    if not frozen["measured"].all():
        lines += ["", "The committed frozen runs' `monitor.parquet` holds per-layer lag and mode gap but no channel "
                      "statistics, so E cannot be recomputed from them: rerun them (`make frozen`, the monitor now "
                      "records E) to judge the frozen claim."]
    return lines


DOC_BLOCK = re.compile(r"(<!-- generated by make calibrate -->\n)(?P<text>.*?)(<!-- end -->)", re.S)


def doc_block(samples: dict[str, list[Run]], thresholds: Thresholds = Thresholds()) -> str:
    """The paragraph ``make calibrate`` writes into ``docs/monitor.md`` (between ``<!-- generated by make
    calibrate -->`` and ``<!-- end -->``): the shipped rule's recall, false alarms and lead time on each sample
    that logged its probe gap, where they were measured, and the forecasters' early warnings."""
    alone = _alone(chosen_thresholds(points(samples[SYNTHETIC.key])), thresholds)

    def figures(sm: Sample) -> str:
        table = scores(samples[sm.key], thresholds, alone)
        if table.empty:
            return f"{sm.title}: not run yet."
        line = table.set_index("what").loc[RULE]
        if not line["runs"]:
            return f"{sm.title}: no probe gap logged, so the rule as it ships cannot be scored there."
        return (f"{sm.title} ({int(line['runs'])} runs that logged the probe gap): recall "
                f"{_rate(line, 'recall', 'caught', 'stale')}, false alarms {_rate(line, 'far', 'false_alarms', 'fresh')}"
                f", lead time {_lead(line)}.")
    looked = points(samples[LOOKED_AT.key])
    forecast = forecast_thresholds(looked) if not looked.empty else {}
    early = []
    for f in FORECASTERS:
        thr = forecast.get(f.column, math.nan)
        if math.isfinite(thr) and samples[FRESH.key]:
            e = early_warning(samples[FRESH.key], f.column, thr)
            early.append(f"{f.words.split(' (')[0]} ≥ {thr:g}{f.unit}: {e['early']}/{e['runs']} runs")
    early_text = (" Warned at least one check before the first stale point, on the second zoo: " + "; ".join(early)
                  + "." if early else " The forecasters' early warnings are scored on the second zoo once it lands.")
    return ("Measured by `make calibrate` ([calibration.md](../results/reference/calibration.md), which gives the "
            "truth, the method, every signal and the held-out reference lines), the rule as it ships, with its "
            "mode gap on its probe batch: " + " ".join(figures(sm) for sm in (LOOKED_AT, FRESH)) + early_text + "\n")


def fill_doc(text: str, block: str, name: str) -> str:
    """``text`` with its ``make calibrate`` block replaced by ``block``.

    Raises:
        ValueError: naming ``name`` when the text has no such block.
    """
    if not DOC_BLOCK.search(text):
        raise ValueError(f"{name}: no block <!-- generated by make calibrate --> ... <!-- end -->")
    return DOC_BLOCK.sub(lambda m: m.group(1) + block + m.group(3), text)


def load_samples(results: Path, looked_at: list[Path], fresh: list[Path]) -> tuple[dict[str, list[Run]],
                                                                                     list[str]]:
    """The runs of each sample (:data:`SAMPLES`): the synthetic ones under ``results``; those of another task under
    ``looked_at``; those of another task under ``fresh``. Returns them and one line per out-of-sample folder
    refused.

    Raises:
        BadRunError: for a bad synthetic run, or no synthetic intervention point.
    """
    ins, problems = load_calibration_runs([results], in_sample)
    if problems:
        raise BadRunError(problems[0])
    if points(ins).empty:
        raise BadRunError(f"{results}: no in-sample run with interventions and BatchNorm statistics")
    looked, skipped = load_calibration_runs(looked_at, out_of_sample_run)
    new, more = load_calibration_runs([p for p in fresh if (Path(p) / "runs").is_dir()], out_of_sample_run)
    return {SYNTHETIC.key: ins, LOOKED_AT.key: looked, FRESH.key: new}, skipped + more


def write_calibration(results: Path, looked_at: list[Path], out: Path, doc: Path | None = None,
                      fresh: list[Path] | None = None) -> Path:
    """Write ``<out>/calibration.md`` from the runs of each sample (:func:`load_samples`; ``fresh`` defaults to
    :func:`second_zoo_roots` of ``results``), and the block of ``doc`` (:func:`doc_block`) when given; returns its
    path.

    Raises:
        BadRunError: for a bad in-sample run, or no in-sample intervention point.
    """
    fresh = second_zoo_roots(results) if fresh is None else fresh
    samples, skipped = load_samples(results, looked_at, fresh)
    for p in skipped:
        print(f"warning: out of sample, skipped: {p}", file=sys.stderr)
    frozen = frozen_verdicts(Path(results) / "frozen", Thresholds())
    roots = {SYNTHETIC.key: [results], LOOKED_AT.key: list(looked_at), FRESH.key: list(fresh)}
    text = to_markdown(samples, roots, frozen)
    path = Path(out) / "calibration.md"
    records.atomic_write_text(path, text)
    if doc is not None:
        records.atomic_write_text(doc, fill_doc(Path(doc).read_text(), doc_block(samples), str(doc)))
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m bnrotation.study.analysis.tables.calibration``: write ``calibration.md``; exit 2 with one line
    naming the run or folder on bad input."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default="results/reference", help="root of the in-sample runs")
    p.add_argument("--out-of-sample", nargs="*", default=None,
                   help="roots whose other-task runs have been looked at (default: --results and its zoo/)")
    p.add_argument("--fresh", nargs="*", default=None,
                   help="roots of the runs nothing was chosen on (default: --results' zoo2/)")
    p.add_argument("--out", default=None, help="folder for calibration.md (default: --results)")
    p.add_argument("--doc", default=None, help="a document whose make-calibrate block to fill (docs/monitor.md)")
    args = p.parse_args(argv)
    results = Path(args.results)
    if not (results / "runs").is_dir():
        print(f"error: {results}: no runs/ folder (expected <root>/runs/<row>/seed=<s>)", file=sys.stderr)
        return 2
    try:
        oos = out_of_sample_roots(results) if args.out_of_sample is None else [Path(x) for x in args.out_of_sample]
        fresh = None if args.fresh is None else [Path(x) for x in args.fresh]
        if args.doc and not Path(args.doc).is_file():
            raise BadRunError(f"{args.doc}: no such document (--doc)")
        path = write_calibration(results, oos, Path(args.out or results), Path(args.doc) if args.doc else None,
                                 fresh)
    except (BadRunError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
