"""The frozen-backbone runs, read back (no torch): per-run figures and the table of ``frozen.md``.

The runs are :mod:`bnrotation.study.frozen`'s, under ``<reference root>/frozen/runs/<row>/seed=<s>/``
(:data:`bnrotation.study.rows.FROZEN_ROOT`), rows :data:`bnrotation.study.rows.FROZEN_ROWS`, read by the analysis's
run reader (:func:`bnrotation.study.analysis.results.load_run` with the frozen experiment's layout,
:data:`bnrotation.study.analysis.results.FROZEN`): a run without ``DONE``, with a table or column missing, or whose
``run.json`` says another row, mode or seed than its folder, is refused by name. The claim's test and the command
that writes ``frozen.md`` are :mod:`bnrotation.study.analysis.claims.frozen`'s.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ...rows import FROZEN_ROWS
from ..results import FROZEN, BadRunError, Run, find_run_dirs, load_run
from ..stats import SeedStat

__all__ = ["load_frozen_runs", "per_run", "seed_stat", "table_markdown", "COLUMNS"]


def load_frozen_runs(root: str | Path) -> tuple[list[Run], list[str]]:
    """The finished runs under ``root/runs/`` (:func:`.results.load_run`, layout :data:`.results.FROZEN`), and one
    line per folder refused."""
    runs, problems = [], []
    for path in find_run_dirs(root):
        try:
            runs.append(load_run(path, tuple(FROZEN.columns), FROZEN))
        except BadRunError as err:
            problems.append(str(err))
    return runs, problems


def per_run(runs: list[Run]) -> pd.DataFrame:
    """One line per run: ``row``, ``seed`` and, at the last log point unless said otherwise,

    * ``displacement_sigma``: the running statistics' displacement from the pre-trained ones, mean over the
      BatchNorm layers of the per-layer mean over channels of (|Δ running mean| + |Δ running σ|) / pre-trained
      σ (:func:`bnrotation.study.frozen.statistics_move`); ``mean_displacement_sigma`` and
      ``std_displacement_sigma`` its two parts;
    * ``max_displacement_sigma``: the largest of any layer at any log point;
    * ``peak_drift_sigma_per_100``: the largest drift of any layer between two log points (σ per 100 steps);
    * ``late_drift_sigma_per_100``: the mean over layers of the drift over the last log interval;
    * ``acc_original_start``, ``acc_original_end``: evaluation-mode accuracy on the original task with the
      pre-trained head at step 0 and at the end; ``acc_original_drop`` the first minus the second;
    * ``acc_original_train_mode``, ``acc_shifted_eval_mode``, ``acc_shifted_train_mode`` (end);
    * ``stale_shifted``, ``stale_original``: the share of log points at which the monitor's rule fired on
      the shifted and on the original probe; ``lag_shifted_sigma``, ``lag_original_sigma``: its largest
      per-layer median |lag| of the running mean at the end (σ); ``gap_shifted``, ``gap_original``: its mode gap
      (training- minus evaluation-mode accuracy on the probe, with the new head) at the end;
    * ``pretrained_acc``: the pre-trained network's evaluation-mode accuracy on the original task.
    """
    lines = []
    for r in runs:
        st, acc, mon = r.tables["statistics"], r.tables["accuracy"], r.tables["monitor"]
        last = int(st["step"].max())
        end = st[st["step"] == last]
        orig, shifted = acc[acc["task"] == "original"].sort_values("step"), acc[acc["task"] == "shifted"]
        shifted_end = shifted[shifted["step"] == last].iloc[0]
        stale = mon.groupby(["probe", "step"])["stale"].first()
        mon_end = mon[mon["step"] == last].groupby("probe")["lag_median_abs_sigma"].max()
        gap_end = mon[mon["step"] == last].groupby("probe")["mode_gap"].first()
        lines.append({
            "row": r.row, "seed": r.seed,
            "displacement_sigma": float(end["displacement_sigma"].mean()),
            "mean_displacement_sigma": float(end["mean_displacement_sigma"].mean()),
            "std_displacement_sigma": float(end["std_displacement_sigma"].mean()),
            "max_displacement_sigma": float(st["displacement_sigma"].max()),
            "peak_drift_sigma_per_100": float(st["drift_sigma_per_100"].max()),
            "late_drift_sigma_per_100": float(end["drift_sigma_per_100"].mean()),
            "acc_original_start": float(orig["acc_eval_mode"].iloc[0]),
            "acc_original_end": float(orig["acc_eval_mode"].iloc[-1]),
            "acc_original_drop": float(orig["acc_eval_mode"].iloc[0] - orig["acc_eval_mode"].iloc[-1]),
            "acc_original_train_mode": float(orig["acc_train_mode"].iloc[-1]),
            "acc_shifted_eval_mode": float(shifted_end["acc_eval_mode"]),
            "acc_shifted_train_mode": float(shifted_end["acc_train_mode"]),
            "stale_shifted": float(stale.get("shifted", pd.Series(dtype=float)).mean()),
            "stale_original": float(stale.get("original", pd.Series(dtype=float)).mean()),
            "lag_shifted_sigma": float(mon_end.get("shifted", math.nan)),
            "lag_original_sigma": float(mon_end.get("original", math.nan)),
            "gap_shifted": float(gap_end.get("shifted", math.nan)),
            "gap_original": float(gap_end.get("original", math.nan)),
            "pretrained_acc": float(r.info.get("pretrained", {}).get("acc_eval_mode", math.nan)),
            "steps": last,
        })
    return pd.DataFrame(lines)


def seed_stat(frame: pd.DataFrame, row: str, column: str) -> SeedStat:
    """``column`` of :func:`per_run`'s ``frame`` over the seeds of ``row``."""
    g = frame[frame["row"] == row].sort_values("seed")
    return SeedStat.of(g[column], g["seed"])


COLUMNS = (("displacement_sigma", "displacement at the end", "sigma"),
           ("mean_displacement_sigma", "… of the running mean", "sigma"),
           ("std_displacement_sigma", "… of the running σ", "sigma"),
           ("peak_drift_sigma_per_100", "peak drift, per 100 steps", "sigma"),
           ("late_drift_sigma_per_100", "drift over the last interval, per 100 steps", "sigma"),
           ("acc_original_start", "original task, eval mode, step 0", "pct"),
           ("acc_original_end", "original task, eval mode, end", "pct"),
           ("acc_original_train_mode", "original task, train mode, end", "pct"),
           ("acc_shifted_eval_mode", "shifted task, eval mode, end", "pct"),
           ("acc_shifted_train_mode", "shifted task, train mode, end", "pct"),
           ("stale_shifted", "monitor STALE on the shifted probe (share of log points)", "pct"),
           ("stale_original", "monitor STALE on the original probe (share of log points)", "pct"),
           ("lag_shifted_sigma", "monitor lag (running mean) on the shifted probe, end", "sigma"),
           ("lag_original_sigma", "monitor lag (running mean) on the original probe, end", "sigma"),
           ("gap_shifted", "monitor mode gap on the shifted probe, end", "pct"),
           ("gap_original", "monitor mode gap on the original probe, end", "pct"))


def table_markdown(runs: list[Run], root: str | Path) -> str:
    """The frozen-backbone figures as a markdown table: one column per row (BatchNorm mode), one line per
    quantity (:data:`COLUMNS`), mean ± sample standard deviation over seeds with n."""
    frame = per_run(runs)
    rows = [r for r in FROZEN_ROWS if len(frame) and (frame["row"] == r).any()]
    steps = ", ".join(str(s) for s in sorted(int(s) for s in frame["steps"].unique())) if len(frame) else "–"
    out = [f"Frozen-backbone runs under `{root}` ({len(runs)} runs; fine-tuning steps: {steps}). Mean ± sample "
           "standard deviation over seeds (n). Displacement (from the pre-trained statistics) and drift (between log "
           "points, per 100 steps): mean over the BatchNorm layers of the mean over channels of (|Δ running mean| + "
           "|Δ running σ|) / the earlier running σ (`bnrotation.study.frozen.running_drift`).\n",
           "| | " + " | ".join(f"`{r}`" for r in rows) + " |", "|---|" + "---|" * len(rows)]
    for key, title, unit in COLUMNS:
        out.append(f"| {title} | " + " | ".join(
            seed_stat(frame, r, key).describe(unit).replace(" seeds)", ")") for r in rows) + " |")
    return "\n".join(out) + "\n"
