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

* ``mode_gap``: training- minus evaluation-mode accuracy on the held-out set (the ``checks`` table; the
  runner's monitor runs without its probe mode check, so the held-out gap is the gap these runs hold; logged
  from ``scale.check_start`` on, NaN before);
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

**In sample**: the runs whose task is the synthetic noisy-template task (:func:`in_sample`: the explicit rule
is the run's ``config.yaml`` ``task``, plus a row name that does not start with ``fmnist``). **Out of sample**:
every other run under the roots given, scored with the thresholds as committed (``Thresholds()``), never
re-chosen.

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
from ....staleness import Thresholds, channel_signals, warmup_steps
from ..results import BadRunError, Run, find_run_dirs, load_run, once_per_run, read_table
from .frozen import load_frozen_runs

__all__ = ["out_of_sample_roots", "load_calibration_runs", "STALE_RECOVERY", "TARGET_RECALL", "IN_SAMPLE_TASK", "SIGNALS", "Signal", "in_sample", "out_of_sample_run", "task_of",
           "log_signals", "truth", "points", "warns_at", "choose_threshold", "score", "lead_times", "chosen_thresholds",
           "frozen_verdicts", "to_markdown", "main"]

STALE_RECOVERY = 0.05  # the truth's X, fixed before the data: re-estimation recovers >= 5 points (a fraction)
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
    Signal("mode_gap", "", "mode gap (held-out, training- minus evaluation-mode accuracy)"),
    Signal("lag_sigma", "σ", "worst layer's median absolute mean lag (fresh σ, with eps)"),
    Signal("eval_error_median_sigma", "σ", "worst layer's median E"),
    Signal("eval_error_max_sigma", "σ", "worst layer's max E"),
    Signal("log_std_ratio_median_abs", "", "worst layer's median absolute log s (the variance part alone)"),
)
BY_COLUMN = {s.column: s for s in SIGNALS}
RULE = "rule"


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
    empty = pd.DataFrame(columns=["step", *BY_COLUMN, "warming_up"])
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
    """``out`` (one line per log step) with the held-out ``mode_gap`` of the ``checks`` table and ``warming_up``."""
    checks = run.tables["checks"]
    gap = checks.assign(mode_gap=checks["acc_train_mode"] - checks["acc_eval_mode"])[["step", "mode_gap"]]
    out = out.merge(gap, on="step", how="left")
    warm = warmup_steps([v.get("momentum") for v in layers.values()])
    return out.assign(warming_up=out["step"] < warm)[["step", *BY_COLUMN, "warming_up"]]


@once_per_run
def truth(run: Run) -> pd.DataFrame:
    """Per intervention step: ``acc_stored`` and ``acc_reestimated`` (evaluation-mode accuracy on the held-out
    set with the stored and the re-estimated statistics, fractions), ``recovery`` (their difference) and
    ``stale`` (``recovery >= STALE_RECOVERY``). Empty without interventions, or without a re-estimated accuracy
    (a run without running statistics records NaN there)."""
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
        return pd.DataFrame(columns=["row", "seed", "step", "recovery", "stale", *BY_COLUMN])
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
    """Whether ``what`` (a signal's column at ``alone[what]``, or :data:`RULE` as ``thresholds`` decide) warns on
    each line of ``signals`` (:func:`log_signals` or :func:`points` lines): a bool array, False in the warm-up."""
    if what == RULE:
        w = thresholds.warns(signals["mode_gap"].to_numpy(float), signals["lag_sigma"].to_numpy(float),
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
    """:func:`choose_threshold` of every signal alone on the points ``pts`` (:func:`points`)."""
    return {s.column: choose_threshold(pts[s.column], pts["stale"]) for s in SIGNALS}


def scores(runs: list[Run], thresholds: Thresholds, alone: dict[str, float]) -> pd.DataFrame:
    """One line per signal alone (at ``alone``'s threshold) and for the rule (``thresholds``): ``what``,
    ``threshold`` and the columns of :func:`score` and :func:`lead_times`. Empty without points."""
    pts = points(runs)
    if pts.empty:
        return pd.DataFrame()
    lines = []
    for what in (*BY_COLUMN, RULE):
        w = warns_at(pts, what, thresholds, alone)
        lines.append({"what": what, "threshold": alone.get(what, math.nan), **score(w, pts["stale"]),
                      **{f"lead_{k}": v for k, v in lead_times(runs, what, thresholds, alone).items()}})
    return pd.DataFrame(lines)


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


def out_of_sample_roots(root: str | Path) -> list[Path]:
    """The roots whose runs of another task are scored out of sample by default: ``root`` itself (the
    Fashion-MNIST rows beside the synthetic ones) and ``root/zoo``."""
    return [Path(root), Path(root) / ZOO]


def load_calibration_runs(roots: list[str | Path], keep) -> tuple[list[Run], list[str]]:
    """The finished, non-diverged runs under ``roots`` (each ``<root>/runs/<row>/seed=<s>``) for which ``keep(run)``
    holds, each folder once, and one line per folder refused (:func:`bnrotation.study.analysis.results.load_run`)."""
    runs, problems, seen = [], [], set()
    for root in roots:
        for d in find_run_dirs(root):
            if d.resolve() in seen:
                continue
            seen.add(d.resolve())
            try:
                r = load_run(d, TABLES)
            except BadRunError as err:
                r = _run_of_another_layout(d)  # the zoo's runs have no scale section
                if r is None:
                    problems.append(str(err))
                    continue
            if not r.diverged and keep(r):
                runs.append(r)
    return runs, problems


def _run_of_another_layout(path: Path) -> Run | None:
    """A finished run whose ``config.yaml`` is not the runner's (the staleness zoo's: no ``scale`` section), read
    as :func:`bnrotation.study.analysis.results.load_run` reads tables (schema version and columns checked), or None
    when it is not finished or its ``run.json`` or a table is unreadable."""
    import json

    import yaml

    if not (path / records.DONE).exists():
        return None
    try:
        info = json.loads((path / "run.json").read_text())
        config = yaml.safe_load((path / "config.yaml").read_text())
        tables = {name: read_table(path / f"{name}.parquet", name)
                  for name in ("checks", "layers", "channels", "interventions") if (path / f"{name}.parquet").exists()}
    except (OSError, ValueError, yaml.YAMLError):
        return None
    if not isinstance(info, dict) or not isinstance(config, dict) or "checks" not in tables:
        return None
    return Run(path, info, config, tables)


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


def to_markdown(ins: list[Run], oos: list[Run], roots: tuple[list[Path], list[Path]], frozen: pd.DataFrame,
                thresholds: Thresholds = Thresholds()) -> str:
    """``calibration.md``: the truth, the method, the thresholds chosen in sample against the committed
    defaults, and each signal's and the rule's recall, false alarms and lead time in sample and out of sample;
    then the frozen-backbone case."""
    pts = points(ins)
    chosen = chosen_thresholds(pts)
    alone = {**chosen, "mode_gap": thresholds.mode_gap, "eval_error_median_sigma": thresholds.eval_error_sigma,
             "lag_sigma": thresholds.lag_sigma}  # the committed ones where the rule has them
    table_in = scores(ins, thresholds, alone).set_index("what")
    table_out = scores(oos, thresholds, alone)
    table_out = table_out.set_index("what") if not table_out.empty else None
    n_stale = int(pts["stale"].sum())
    out = ["# The monitor's rule, calibrated in sample and scored out of sample\n",
           f"Rebuilt by `make calibrate` (`bnrotation.study.analysis.tables.calibration`) from the runs under "
           f"{', '.join(f'`{p}`' for p in roots[0])} (in sample) and "
           f"{', '.join(f'`{p}`' for p in roots[1]) or 'no root'} (out of sample), schema version "
           f"{records.SCHEMA_VERSION}.\n",
           f"- **Truth** (fixed before any data): at an intervention point, the statistics are stale when "
           f"re-estimating them on training data recovers at least {STALE_RECOVERY * 100:g} points of "
           "evaluation-mode accuracy on the held-out set.",
           f"- **In sample** (the thresholds were chosen here; task `{IN_SAMPLE_TASK}`, no `fmnist*` row): "
           f"{_describe(ins)}; {len(pts)} intervention points of the {pts.groupby(['row', 'seed']).ngroups} runs with "
           f"BatchNorm statistics, {n_stale} stale.",
           f"- **Out of sample** (every other run, scored with the committed thresholds): {_describe(oos)}.",
           f"- **Method**: for each signal alone, the threshold with the lowest false-alarm rate among those with "
           f"in-sample recall ≥ {TARGET_RECALL:g}, the smallest on a tie, rounded down to two significant figures. "
           "A miss costs an evaluation wrong by 5 points or more, a false alarm one re-estimation: recall is fixed, "
           "false alarms minimised (not Youden's J, which weighs them alike).",
           f"- **The rule** (`bnrotation.Thresholds()`): {_rule_words(thresholds)}. Its mode-gap and E thresholds "
           "are the method's in-sample choices (checked by `tests/test_calibration.py`); the lag keeps its earlier "
           "default for the callers that measure only the lag.\n",
           "## Thresholds\n", "| Signal | Method's choice in sample | In `Thresholds()` |", "|---|---:|---:|"]
    committed = {"mode_gap": thresholds.mode_gap, "eval_error_median_sigma": thresholds.eval_error_sigma,
                 "lag_sigma": thresholds.lag_sigma}
    for s in SIGNALS:
        mine = _thr(s.column, committed[s.column]) if s.column in committed else "–"
        out.append(f"| {s.words} | {_thr(s.column, chosen[s.column])} | {mine} |")
    out += ["", "## Recall, false alarms and lead time\n",
            "Recall: stale points warned at (count/stale); false alarms: fresh points warned at (count/fresh); lead "
            "time: median over runs with a stale point of (first stale point − first warning), in steps, over every "
            "log step past the monitor's warm-up.\n",
            "| Signal (threshold) | In sample: recall | false alarms | lead time | Out of sample: recall | "
            "false alarms | lead time |", "|---|---:|---:|---|---:|---:|---|"]
    for what in (*BY_COLUMN, RULE):
        line = table_in.loc[what]
        other = table_out.loc[what] if table_out is not None else None
        name = (f"**the rule**: {_rule_words(thresholds)}" if what == RULE
                else f"{BY_COLUMN[what].words} ≥ {_thr(what, alone[what])}")
        out.append(f"| {name} | {_rate(line, 'recall', 'caught', 'stale')} | "
                   f"{_rate(line, 'far', 'false_alarms', 'fresh')} | {_lead(line)} | "
                   f"{_rate(other, 'recall', 'caught', 'stale')} | {_rate(other, 'far', 'false_alarms', 'fresh')} | "
                   f"{_lead(other)} |")
    out += ["", "## The rule by network, in sample\n", "| Network | Runs | Points | Stale | Recall | False alarms |",
            "|---|---:|---:|---:|---:|---:|"]
    for arch in sorted({r.arch for r in ins}):
        mine = [r for r in ins if r.arch == arch]
        sub = points(mine)
        if sub.empty:
            continue
        sc = score(warns_at(sub, RULE, thresholds, alone), sub["stale"])
        out.append(f"| `{arch}` | {len(mine)} | {len(sub)} | {sc['stale']} | {_rate(sc, 'recall', 'caught', 'stale')} "
                   f"| {_rate(sc, 'far', 'false_alarms', 'fresh')} |")
    out += ["", "## Reading it\n"] + _reading(ins, pts, thresholds, alone, table_in)
    out += ["", "## The frozen backbone (original task's probe)\n"] + _frozen_lines(frozen, thresholds)
    return "\n".join(out) + "\n"


def _reading(ins: list[Run], pts: pd.DataFrame, thresholds: Thresholds, alone: dict[str, float],
             table: pd.DataFrame) -> list[str]:
    """The in-sample facts that qualify the table, each computed from the points."""
    gap_vs_truth = float((pts["mode_gap"] - pts["recovery"]).abs().max())
    starts = sorted({int(r.config["scale"]["check_start"]) for r in ins})
    e_only = warns_at(pts, "eval_error_median_sigma", thresholds, alone)
    lag_only = warns_at(pts, "lag_sigma", thresholds, alone)
    stale = pts["stale"].to_numpy(bool)
    chosen = chosen_thresholds(pts)
    fair = {k: score(warns_at(pts, k, thresholds, chosen), stale) for k in ("lag_sigma", "eval_error_median_sigma")}
    return [
        f"- In sample the held-out mode gap equals the truth's recovery to within {gap_vs_truth * 100:.3g} points at "
        "every intervention point: training-mode accuracy with the held-out set's own batch statistics is what "
        "re-estimation restores. The gap's score here is that identity, not a finding; the rule's recall is the "
        "channel signal's among the stale points. The monitor in a user's loop measures its gap on its probe batch, "
        "which these runs do not record.",
        f"- These runs log the held-out gap from step {' or '.join(f'{s:,}' for s in starts)} (`scale.check_start`), "
        "so the gap and the rule cannot warn before it; the channel signals are logged from step 0.",
        f"- E against the lag at their thresholds: E warns at {int((e_only & stale).sum())} stale and "
        f"{int((e_only & ~stale).sum())} fresh points, the lag at {int((lag_only & stale).sum())} and "
        f"{int((lag_only & ~stale).sum())}; the lag branch adds {int((lag_only & ~e_only & stale).sum())} stale and "
        f"{int((lag_only & ~e_only & ~stale).sum())} fresh points to E's. Each at the method's own choice (lag "
        f"{_thr('lag_sigma', chosen['lag_sigma'])}, E {_thr('eval_error_median_sigma', chosen['eval_error_median_sigma'])}): "
        f"recall {fair['lag_sigma']['recall']:.2f} and {fair['eval_error_median_sigma']['recall']:.2f}, false alarms "
        f"{fair['lag_sigma']['far']:.2f} and {fair['eval_error_median_sigma']['far']:.2f}. In these runs the "
        "variance part is small and E scores as the lag does; E is chosen for the rule because it also sees a moved "
        "running variance, which the lag cannot (the frozen case below), and it is the error evaluation mode makes.",
        f"- Lead times count every warning, also those before the check window: E alone first warns at a median "
        f"step of {table.loc['eval_error_median_sigma', 'lead_first_warning_step']:,.0f} (the lag alone at "
        f"{table.loc['lag_sigma', 'lead_first_warning_step']:,.0f}), while the running statistics still trail fast "
        "early training, where no intervention point judges them; a lead time is only worth its false-alarm rate.",
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


def doc_block(ins: list[Run], oos: list[Run], thresholds: Thresholds = Thresholds()) -> str:
    """The paragraph ``make calibrate`` writes into ``docs/monitor.md`` (between ``<!-- generated by make
    calibrate -->`` and ``<!-- end -->``): the rule's and E's recall, false alarms and lead time, in sample and
    out of sample, and where they were measured."""
    alone = {**chosen_thresholds(points(ins)), "mode_gap": thresholds.mode_gap,
             "eval_error_median_sigma": thresholds.eval_error_sigma, "lag_sigma": thresholds.lag_sigma}

    def figures(runs: list[Run], where: str) -> str:
        table = scores(runs, thresholds, alone)
        if table.empty:
            return f"{where}: not run yet."
        t = table.set_index("what")
        parts = []
        for what, name in ((RULE, "the rule"), ("eval_error_median_sigma", "E alone"), ("lag_sigma", "the lag alone")):
            line = t.loc[what]
            parts.append(f"{name} recall {_rate(line, 'recall', 'caught', 'stale')}, false alarms "
                         f"{_rate(line, 'far', 'false_alarms', 'fresh')}, lead time {_lead(line)}")
        pts = points(runs)
        return (f"{where} ({pts.groupby(['row', 'seed']).ngroups} runs, {len(pts)} intervention points, "
                f"{int(pts['stale'].sum())} stale): " + "; ".join(parts) + ".")
    return ("Measured by `make calibrate` ([calibration.md](../results/reference/calibration.md), which gives the "
            "truth, the method and every signal). " + figures(ins, "In sample, on the synthetic reference runs the "
                                                              "thresholds were chosen on")
            + " " + figures(oos, "Out of sample (Fashion-MNIST rows, the staleness zoo)") + "\n")


def fill_doc(text: str, block: str, name: str) -> str:
    """``text`` with its ``make calibrate`` block replaced by ``block``.

    Raises:
        ValueError: naming ``name`` when the text has no such block.
    """
    if not DOC_BLOCK.search(text):
        raise ValueError(f"{name}: no block <!-- generated by make calibrate --> ... <!-- end -->")
    return DOC_BLOCK.sub(lambda m: m.group(1) + block + m.group(3), text)


def write_calibration(results: Path, out_of_sample: list[Path], out: Path, doc: Path | None = None) -> Path:
    """Write ``<out>/calibration.md`` from the in-sample runs under ``results`` and the out-of-sample runs
    under ``out_of_sample``, and the block of ``doc`` (:func:`doc_block`) when given; returns its path.

    Raises:
        BadRunError: for a bad in-sample run, or no in-sample intervention point.
    """
    ins, problems = load_calibration_runs([results], in_sample)
    if problems:
        raise BadRunError(problems[0])
    if points(ins).empty:
        raise BadRunError(f"{results}: no in-sample run with interventions and BatchNorm statistics")
    oos, skipped = load_calibration_runs(out_of_sample, out_of_sample_run)
    for p in skipped:
        print(f"warning: out of sample, skipped: {p}", file=sys.stderr)
    frozen = frozen_verdicts(Path(results) / "frozen", Thresholds())
    text = to_markdown(ins, oos, ([results], list(out_of_sample)), frozen)
    path = Path(out) / "calibration.md"
    records.atomic_write_text(path, text)
    if doc is not None:
        records.atomic_write_text(doc, fill_doc(Path(doc).read_text(), doc_block(ins, oos), str(doc)))
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m bnrotation.study.analysis.tables.calibration``: write ``calibration.md``; exit 2 with one line
    naming the run or folder on bad input."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default="results/reference", help="root of the in-sample runs")
    p.add_argument("--out-of-sample", nargs="*", default=None,
                   help="roots whose other-task runs are scored (default: --results and its zoo/)")
    p.add_argument("--out", default=None, help="folder for calibration.md (default: --results)")
    p.add_argument("--doc", default=None, help="a document whose make-calibrate block to fill (docs/monitor.md)")
    args = p.parse_args(argv)
    results = Path(args.results)
    if not (results / "runs").is_dir():
        print(f"error: {results}: no runs/ folder (expected <root>/runs/<row>/seed=<s>)", file=sys.stderr)
        return 2
    try:
        oos = out_of_sample_roots(results) if args.out_of_sample is None else [Path(x) for x in args.out_of_sample]
        if args.doc and not Path(args.doc).is_file():
            raise BadRunError(f"{args.doc}: no such document (--doc)")
        path = write_calibration(results, oos, Path(args.out or results), Path(args.doc) if args.doc else None)
    except (BadRunError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
