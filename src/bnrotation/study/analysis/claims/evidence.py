"""The evidence the claims weigh: every per-run value a claim uses, one line per run (no torch).

:func:`per_run_values` is the only place a claim's number is computed from a
run's tables: the table's columns (:func:`..tables.table.run_metrics`), the middle
layer's lag summary as ``lag.md`` has it (:func:`..measures.lag.run_lags`), and the
probes' other summaries. :class:`Evidence` holds them for all runs and hands a
claim the per-seed values of one row (:class:`..stats.SeedStat`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ...rows import row_order
from ..formatting import seed_ranges
from ..measures import dense, lag, metrics
from ..results import Run, count
from ..stats import SeedStat
from ..tables.table import run_metrics

CONV_LAYERS = ("conv1", "conv2", "conv3")


@dataclass
class Evidence:
    """Per-run values of every quantity a claim uses (``per_run``: one line per run, with ``row`` and
    ``seed``), the runs themselves, and the results root they came from."""

    root: Path
    runs: list[Run]
    per_run: pd.DataFrame

    def has(self, *rows: str) -> bool:
        """Whether every one of ``rows`` has at least one run."""
        return all((self.per_run["row"] == r).any() for r in rows)

    def stat(self, row: str, column: str, seeds: set[int] | None = None) -> SeedStat:
        """``column`` over the runs of ``row`` (only those of ``seeds``, when given), seeds ascending."""
        g = self.per_run[(self.per_run["row"] == row) & self.per_run[column].notna()].sort_values("seed")
        if seeds is not None:
            g = g[g["seed"].isin(seeds)]
        return SeedStat.of(g[column], g["seed"])

    def runs_of(self, row: str) -> list[Run]:
        return [r for r in self.runs if r.row == row]

    def seeds_per_row(self, rows: Iterable[str] | None = None) -> str:
        """n per row, in words, rows with the same seeds together: ``'n per row: 10 seeds (0–9) for `sgd`,
        `adam`; 3 seeds (0–2) for `adamw`'`` (every row with runs, or those of ``rows`` that have runs)."""
        have = self.per_run.groupby("row")["seed"].apply(lambda s: tuple(sorted(s)))
        rows = [r for r in dict.fromkeys(have.index if rows is None else rows) if r in have.index]
        groups: dict[tuple[int, ...], list[str]] = {}
        for row in sorted(rows, key=row_order):
            groups.setdefault(have[row], []).append(row)
        parts = [f"{count(len(seeds), 'seed')} ({seed_ranges(seeds)}) for " + ", ".join(f"`{r}`" for r in group)
                 for seeds, group in sorted(groups.items(), key=lambda kv: -len(kv[0]))]
        return "n per row: " + "; ".join(parts) if parts else "no runs"


def per_run_values(run: Run) -> dict:
    """Every per-run quantity the claims use, in the units of its source: the table's columns, then
    ``update_cos`` and ``grad_cos`` (mean over the window, last conv layer), ``grad_cos_max_abs`` (largest
    |cos(∇L, w)| of any conv layer), the middle layer's ``drift_mid`` (σ/step), ``drift_exponent_mid``
    (slope of log drift on log Δ over the first doubling of Δ), ``predicted_lag_mid``, ``lag_mid`` (σ),
    ``lag_ratio_mid``, ``lag_spearman_mid``, ``abs_mean_over_std_mid``, the drift from the dense windows
    (:func:`dense_values`), each conv layer's update cosine over the parts of the window
    (:func:`update_cosines`), and ``checks_below_90`` (fraction)."""
    values = dict(run_metrics(run))  # a copy: the table's own is shared
    lags = lag.run_lags(run)
    mid = lags[lags["layer"] == metrics.MIDDLE_CONV] if len(lags) else lags

    def middle(column: str) -> float:
        return float(mid[column].iloc[0]) if len(mid) else math.nan

    values.update(
        update_cos=metrics.layer_mean(run, "update_cos"),
        grad_cos=metrics.layer_mean(run, "grad_cos"),
        grad_cos_max_abs=max(metrics.layer_max_abs(run, "grad_cos", layer) for layer in CONV_LAYERS),
        drift_mid=middle("median_drift_sigma_per_step"),
        drift_exponent_mid=lag.drift_exponent(lag.drift_over_intervals(run, multiples=lag.INTERVAL_MULTIPLES[:2])),
        predicted_lag_mid=middle("median_predicted_lag_sigma"),
        lag_mid=middle("lag_window_median_abs_sigma"),
        lag_ratio_mid=middle("measured_over_predicted"),
        lag_spearman_mid=middle("spearman"),
        abs_mean_over_std_mid=metrics.channel_median(run, "abs_mean_over_std"),
    )
    values.update(dense_values(run))
    values.update(update_cosines(run))
    below, n = values["checks_below"], values["n_checks"]
    values["checks_below_90"] = below / n if n else math.nan
    return values


def dense_values(run: Run) -> dict:
    """The middle layer's drift from the dense windows (:func:`..measures.dense.dense_drift`), NaN for a run without
    them: ``dense_drift_<Δ>`` (σ/step) at each Δ of :data:`..measures.dense.DENSE_INTERVALS`; ``age_interval`` (steps),
    the running average's age (1 − m)/m rounded (:func:`..measures.lag.age_interval`, 32 at m = 0.03);
    ``drift_mid_at_age`` (σ/step), the drift over that Δ; ``predicted_lag_mid_at_age`` (σ), the article's
    formula on it, drift · (1 − m)/m (:func:`..measures.lag.predicted_lag_steady`)."""
    m = dense.momentum(run)
    age = lag.age_interval(m) if math.isfinite(m) else None
    intervals = tuple(sorted(set(dense.DENSE_INTERVALS) | ({age} if age else set())))
    drift = dense.dense_drift(run, intervals) if age else pd.Series(dtype=float)
    at = drift.get(age, math.nan) if age else math.nan
    return {**{f"dense_drift_{d}": float(drift.get(d, math.nan)) for d in dense.DENSE_INTERVALS},
            "age_interval": age if age else math.nan, "drift_mid_at_age": float(at),
            "predicted_lag_mid_at_age": lag.predicted_lag_steady(at, m) if age else math.nan}


def update_cosines(run: Run) -> dict:
    """``update_cos_<layer>_<part>``: the mean of cos(w(t+1) − w(t), w(t)) (the ``layers`` table) of each conv
    layer of :data:`CONV_LAYERS` over each part of the check window (:func:`..measures.metrics.window_ends`: ``window``,
    ``start``, ``end``)."""
    return {f"update_cos_{layer}_{part}": metrics.layer_mean_between(run, "update_cos", layer, first, last)
            for layer in CONV_LAYERS for part, (first, last) in metrics.window_ends(run).items()}


def collect(root: Path, runs: list[Run]) -> Evidence:
    """The evidence of ``runs`` (:func:`per_run_values` of each)."""
    return Evidence(root, runs, pd.DataFrame([per_run_values(r) for r in runs]))


def recovery_share(ev: Evidence, row: str, lost: str, reference: str) -> SeedStat:
    """Per seed present in ``row``, ``lost`` and ``reference``: (acc_row − acc_lost) / (acc_reference −
    acc_lost), the share of the evaluation-mode accuracy ``lost`` gives up against ``reference`` that ``row``
    wins back (paired by seed: the same data). Empty when no seed has all three rows."""
    acc = ev.per_run.pivot_table(index="seed", columns="row", values="acc_eval_mode")
    if not {row, lost, reference} <= set(acc.columns):
        return SeedStat(())
    acc = acc[[row, lost, reference]].dropna()
    values = (acc[row] - acc[lost]) / (acc[reference] - acc[lost])
    return SeedStat.of(values, acc.index)


def middle_lag_at_failing(run: Run) -> list[float]:
    """Per failing check of ``run`` (:func:`..measures.metrics.failing_steps`), the largest |lag| (σ) among the middle
    layer's channels."""
    ch = run.tables["channels"]
    out = []
    for step in metrics.failing_steps(run):
        sel = ch[(ch["layer"] == metrics.MIDDLE_CONV) & (ch["step"] == step)]
        if len(sel):
            out.append(float(sel["lag_sigma"].abs().max()))
    return out
