"""The lag formula, checked channel by channel: ``results/lag.md``, written by ``make table`` (no torch).

An exponential running average with momentum m trails a mean that drifts at
a steady rate by ``drift * (1 - m) / m`` (its average age in steps times the
drift; PROTOCOL.md, "Predicted lag", from the rotation study). The
``channels`` table logs, at every log step, each channel's measured lag
``(running_mean - fresh_mean) / fresh_std`` and the lag predicted from the
drift of its fresh mean over the last interval. Here, per row and conv layer
(the lag is that of the BatchNorm after it), over the channels and log steps
inside the check window: the median measured |lag|, the median predicted lag,
their ratio, and Spearman's rank correlation between the two over the
(step, channel) pairs. Each is computed per run, then averaged over seeds
with the sample standard deviation as spread. Rows whose norm keeps no running
statistics (GroupNorm, LayerNorm) log no lag and are listed, not tabulated.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from .. import records
from ..rows import ROWS, row_order
from .metrics import check_window
from .results import Run

# (column key, header, format)
COLUMNS = (
    ("median_drift_sigma_per_step", "Median drift (σ/step)", "{:.4f}"),
    ("median_abs_lag_sigma", "Median measured abs lag (σ)", "{:.3f}"),
    ("median_predicted_lag_sigma", "Median predicted lag (σ)", "{:.3f}"),
    ("measured_over_predicted", "Measured / predicted", "{:.2f}"),
    ("spearman", "Spearman ρ", "{:.2f}"),
)


def spearman(a: pd.Series, b: pd.Series) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks (ties get their average rank).

    NaN with fewer than 3 pairs or when either side is constant.
    """
    if len(a) < 3:
        return math.nan
    return float(a.rank().corr(b.rank()))


def run_lags(run: Run) -> pd.DataFrame:
    """One line per conv layer of one run, over the (step, channel) pairs inside the check window
    where both the measured and the predicted lag are finite: ``layer``, ``norm_layer``, ``n``,
    ``median_abs_lag_sigma``, ``median_predicted_lag_sigma``, ``measured_over_predicted``,
    ``median_drift_sigma_per_step``, ``spearman``. Empty for a run without running statistics."""
    ch = run.tables["channels"]
    first, last = check_window(run)
    ch = ch[(ch["step"] >= first) & (ch["step"] <= last)]
    measured, predicted = ch["lag_sigma"].abs(), ch["predicted_lag_sigma"]
    ch = ch.assign(abs_lag=measured)[np.isfinite(measured) & np.isfinite(predicted)]
    lines = []
    for layer, g in ch.groupby("layer", sort=True):
        med_lag, med_pred = float(g["abs_lag"].median()), float(g["predicted_lag_sigma"].median())
        lines.append({"layer": layer, "norm_layer": g["norm_layer"].iloc[0] if "norm_layer" in g else "",
                      "n": len(g), "median_abs_lag_sigma": med_lag, "median_predicted_lag_sigma": med_pred,
                      "measured_over_predicted": med_lag / med_pred if med_pred > 0 else math.nan,
                      "median_drift_sigma_per_step": float(g["drift_sigma_per_step"].median()),
                      "spearman": spearman(g["abs_lag"], g["predicted_lag_sigma"])})
    return pd.DataFrame(lines)


def lag_table(runs: list[Run]) -> tuple[pd.DataFrame, list[str]]:
    """Per row and layer: ``<col>_mean`` and ``<col>_std`` over seeds for each column, ``n_seeds``,
    ``n_per_seed`` (pairs; a range if seeds differ). Also the rows that logged no lag."""
    per_run = [run_lags(r).assign(row=r.row, seed=r.seed) for r in runs]
    per_run = [df for df in per_run if not df.empty]
    without = sorted({r.row for r in runs} - {df["row"].iloc[0] for df in per_run}, key=row_order)
    if not per_run:
        return pd.DataFrame(), without
    all_runs = pd.concat(per_run, ignore_index=True)
    lines = []
    for (row, layer), g in sorted(all_runs.groupby(["row", "layer"]), key=lambda kv: (row_order(kv[0][0]), kv[0][1])):
        n_lo, n_hi = int(g["n"].min()), int(g["n"].max())
        line = {"row": row, "label": ROWS[row].label if row in ROWS else row, "layer": layer,
                "norm_layer": g["norm_layer"].iloc[0], "n_seeds": len(g),
                "n_per_seed": str(n_lo) if n_lo == n_hi else f"{n_lo}–{n_hi}"}
        for key, _, _ in COLUMNS:
            line[f"{key}_mean"] = float(g[key].mean())
            line[f"{key}_std"] = float(g[key].std(ddof=1)) if g[key].notna().sum() > 1 else math.nan
        lines.append(line)
    return pd.DataFrame(lines), without


def _cell(mean: float, std: float, fmt: str) -> str:
    if math.isnan(mean):
        return "–"
    return fmt.format(mean) + ("" if math.isnan(std) else " ± " + fmt.format(std))


def to_markdown(table: pd.DataFrame, without: list[str], root: Path) -> str:
    """``results/lag.md``: one line per row and layer, ``mean ± spread`` in each cell."""
    out = ["# The lag formula, channel by channel\n",
           f"Rebuilt by `make table` from the runs under `{root}` (schema version {records.SCHEMA_VERSION}). "
           "Per row and conv layer (the lag is that of the BatchNorm after it), over the channels and log steps "
           "inside the check window: measured lag = |running mean − fresh mean| / fresh std; predicted lag = "
           "drift · (1 − m) / m, with the drift of the fresh mean over the last log interval, in σ per step; "
           "Spearman ρ ranks the two against each other over the (step, channel) pairs. Each cell: mean over "
           "seeds ± sample standard deviation over seeds; n: (step, channel) pairs per seed.\n"]
    if not table.empty:
        out += ["| Row | Layer | Seeds | n | " + " | ".join(h for _, h, _ in COLUMNS) + " |",
                "|---|---|---:|---:|" + "---:|" * len(COLUMNS)]
        for _, r in table.iterrows():
            cells = [_cell(r[f"{k}_mean"], r[f"{k}_std"], fmt) for k, _, fmt in COLUMNS]
            out.append(f"| {r['label']} (`{r['row']}`) | {r['layer']} ({r['norm_layer']}) | {r['n_seeds']} | "
                       f"{r['n_per_seed']} | " + " | ".join(cells) + " |")
    else:
        out.append("No run logged a running-mean lag.")
    if without:
        out.append("\nNo running statistics, so no lag to measure: " + ", ".join(f"`{w}`" for w in without) + ".")
    return "\n".join(out) + "\n"


def write_lag(runs: list[Run], out: Path, root: Path) -> str:
    """Write ``<out>/lag.md`` atomically and return its text."""
    table, without = lag_table(runs)
    md = to_markdown(table, without, root)
    records.atomic_write_text(Path(out) / "lag.md", md)
    return md
