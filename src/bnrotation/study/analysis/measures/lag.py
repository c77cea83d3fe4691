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

PROTOCOL.md defines drift over an interval Δ without fixing Δ; the runner
uses the log interval. :func:`drift_over_intervals` recomputes the middle
layer's drift from the logged fresh statistics at multiples of that interval,
and :func:`drift_exponent` fits how it scales: a mean that moves at a steady
rate gives the same drift at every Δ (exponent 0), a random walk gives drift
falling as Δ^-1/2 (net displacement grows as √Δ).

The lag of a moving mean in closed form, for a steady drift, a random walk,
both, and a walk whose steps are correlated: :func:`predicted_lag_steady`
(which derives the weights every one of them rests on),
:func:`predicted_lag_random_walk`, :func:`predicted_lag_combined`,
:func:`predicted_lag_correlated_walk`; :mod:`.dense` tests them on the fresh
means of the dense windows, and ``lag.md`` ends with both sections
(:func:`dense_markdown`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...rows import ROWS, row_order
from ..results import Run, once_per_run
from ..stats import over_seeds, spearman_rho
from .metrics import MIDDLE_CONV, check_window

# (column key, header, decimals of a cell: mean ± sd over seeds, unit in the header)
COLUMNS = (
    ("median_drift_sigma_per_step", "Median drift (σ/step)", 4),
    ("lag_window_median_abs_sigma", "Median measured abs lag (σ)", 3),
    ("median_predicted_lag_sigma", "Median predicted lag (σ)", 3),
    ("measured_over_predicted", "Measured / predicted", 2),
    ("spearman", "Spearman ρ", 2),
)
INTERVAL_MULTIPLES = (1, 2, 4, 8, 16)  # drift over Δ = k log intervals (100 to 1,600 steps at full scale)


# ----------------------------------------------------------------------------- the lag of a moving mean, closed forms
def _weight_sums(m: float, measured_after_step: bool) -> tuple[float, float]:
    """(Σ a_j, Σ a_j²) of the weights a_j with which the running average's lag sums a channel's past increments
    (:func:`predicted_lag_steady` derives them): a_j = (1 − m)^(j+1) for j ≥ 0, or (1 − m)^j with
    ``measured_after_step``.

    Raises:
        ValueError: unless 0 < m ≤ 1.
    """
    if not 0 < m <= 1:
        raise ValueError(f"BatchNorm momentum m must lie in (0, 1], got {m}")
    first = 1.0 if measured_after_step else 1.0 - m  # a_0
    return first / m, first ** 2 / (m * (2.0 - m))


def running_average_age(m: float) -> float:
    """(1 − m)/m, in steps: the mean age Σ_k k · m(1 − m)^k of the batches in PyTorch's running average with
    momentum m (the article's "average age of the estimate", about 32 steps at m = 0.03).

    Raises:
        ValueError: unless 0 < m ≤ 1.
    """
    return _weight_sums(m, False)[0]


def predicted_lag_steady(r: float, m: float, measured_after_step: bool = False) -> float:
    """The lag, in σ, of PyTorch's running average (momentum m) behind a channel mean that drifts at a steady
    r σ per step: r · (1 − m)/m (Pradeep 2026, "From rotation to a wrong mean"); r/m ``measured_after_step``.

    Derivation. Let μ_t be the channel's mean (in σ) at the weights after optimizer step t and d_t = μ_t −
    μ_(t−1) its increments. PyTorch updates ``running = (1 − m) · running + m · batch_mean`` in the forward
    pass, so in the steady state R_t = Σ_(k≥0) m(1 − m)^k B_(t−k), a weighted sum of past batch means whose
    weights sum to 1. The lag is R_t − μ_t.

    - The article's timing: the batch mean B_t is μ_t and the lag is read after that update. Then
      μ_t − μ_(t−k) = d_t + … + d_(t−k+1), and collecting the weight each increment gets,
      R_t − μ_t = −Σ_(j≥0) a_j d_(t−j) with a_j = Σ_(k>j) m(1 − m)^k = (1 − m)^(j+1):
      an exponentially weighted sum of past increments.
    - The runner's timing (``measured_after_step``): the batch of step t is normalised at the weights before
      the step (B_t = μ_(t−1)) and the lag is read after it, one increment later, so a_j = (1 − m)^j: every
      weight divided by (1 − m), the latest increment d_t counted in full.

    A steady drift, d_t = r for every t, gives |lag| = r Σ a_j = r (1 − m)/m (article) or r/m (runner):
    32.3 r and 33.3 r at m = 0.03.

    Raises:
        ValueError: unless 0 < m ≤ 1.
    """
    return r * _weight_sums(m, measured_after_step)[0]


def predicted_lag_random_walk(s: float, m: float, measured_after_step: bool = False) -> float:
    """The root-mean-square lag, in σ, of PyTorch's running average (momentum m) behind a channel mean that
    moves as a random walk, i.i.d. increments of mean 0 and standard deviation s σ per step:
    s · (1 − m)/√(m(2 − m)); s/√(m(2 − m)) ``measured_after_step``.

    Derivation: the lag is −Σ_(j≥0) a_j d_(t−j) (:func:`predicted_lag_steady`), a sum of independent
    increments, so its variance is s² Σ a_j² = s² (1 − m)² Σ_(j≥0) (1 − m)^(2j) = s² (1 − m)²/(1 − (1 − m)²)
    = s² (1 − m)²/(m(2 − m)), and s²/(m(2 − m)) with the runner's timing. At m = 0.03: 3.99 s and 4.11 s,
    where a steady drift r gives 32.3 r: a wandering mean's increments partly cancel inside the running
    average's window, a steady drift's add up. The lag is then Gaussian with mean 0 (for Gaussian increments),
    so its median |lag| is 0.674 times this RMS.

    Raises:
        ValueError: unless 0 < m ≤ 1.
    """
    return s * math.sqrt(_weight_sums(m, measured_after_step)[1])  # s may be an array, one value per channel


def predicted_lag_combined(r: float, s: float, m: float, measured_after_step: bool = False) -> float:
    """Root-mean-square lag, in σ, behind a mean that drifts at r σ per step and wanders with i.i.d. increments
    of standard deviation s σ per step (d_t = r + s ξ_t, ξ of mean 0 and variance 1): the lag −Σ a_j d_(t−j)
    has mean −r Σ a_j and variance s² Σ a_j², so E[lag²] = (r Σ a_j)² + s² Σ a_j², i.e.
    lag² = (r(1 − m)/m)² + s²(1 − m)²/(m(2 − m)) (:func:`predicted_lag_steady`,
    :func:`predicted_lag_random_walk`).

    Raises:
        ValueError: unless 0 < m ≤ 1.
    """
    return np.hypot(predicted_lag_steady(r, m, measured_after_step),
                    predicted_lag_random_walk(s, m, measured_after_step))


def predicted_lag_correlated_walk(s: float, rho: float, m: float, measured_after_step: bool = False) -> float:
    """The root-mean-square lag, in σ, of PyTorch's running average (momentum m) behind a channel mean that moves
    as a random walk whose steps are correlated: stationary increments of mean 0, standard deviation s σ per
    step and autocorrelation ρ^k at k steps apart (AR(1), as when each step is a momentum average of
    independent gradients: an exponential average with factor β has ρ = β). With q = 1 − m:
    s · √((1 + qρ)/((1 − q²)(1 − qρ))) with the runner's timing (``measured_after_step``), q times that with the
    article's; ρ = 0 gives :func:`predicted_lag_random_walk`.

    Derivation: the lag is −Σ_(j≥0) a_j d_(t−j) (:func:`predicted_lag_steady`), a_j = q^j (runner's timing), so
    Var = s² Σ_i Σ_j q^(i+j) ρ^|i−j| = s² Σ_i q^(2i) (1 + 2 Σ_(k≥1) (qρ)^k) = s² (1 + 2qρ/(1 − qρ))/(1 − q²)
    = s² (1 + qρ)/((1 − q²)(1 − qρ)); the article's a_j = q^(j+1) multiply it by q². At m = 0.03 and ρ = 0.9,
    3.8 times the uncorrelated walk's lag: steps that keep their direction for about 1/(1 − ρ) steps add up
    inside the running average's window like a drift, and cancel beyond it like a walk.

    Raises:
        ValueError: unless 0 < m ≤ 1 and −1 < ρ < 1.
    """
    rho = np.asarray(rho, dtype=float)
    if not np.all((rho > -1) & (rho < 1)):
        raise ValueError(f"the steps' lag-1 autocorrelation ρ must lie in (−1, 1), got {rho}")
    q = 1.0 - m
    return s * np.sqrt(_weight_sums(m, measured_after_step)[1] * (1 + q * rho) / (1 - q * rho))


def age_interval(m: float) -> int:
    """The drift interval Δ, in steps, that the lag formula's drift most plausibly refers to: the running
    average's age (1 − m)/m rounded to whole steps (32 at m = 0.03). The drift claims use it where a run
    has dense windows (:mod:`.dense`)."""
    return max(1, round(running_average_age(m)))


@once_per_run
def run_lags(run: Run) -> pd.DataFrame:
    """One line per conv layer of one run, over the (step, channel) pairs inside the check window
    where both the measured and the predicted lag are finite: ``layer``, ``norm_layer``, ``n``,
    ``lag_window_median_abs_sigma`` (median |lag| over those pairs, σ: :func:`.depth.layer_profile`'s column, over
    the pairs whose prediction is finite too), ``median_predicted_lag_sigma``, ``measured_over_predicted``,
    ``median_drift_sigma_per_step``, ``spearman``. Empty for a run without running statistics. Kept per run
    (:func:`..results.once_per_run`): ``lag.md`` and the claims share it."""
    ch = run.tables["channels"]
    first, last = check_window(run)
    ch = ch[(ch["step"] >= first) & (ch["step"] <= last)]
    measured, predicted = ch["lag_sigma"].abs(), ch["predicted_lag_sigma"]
    ch = ch.assign(abs_lag=measured)[np.isfinite(measured) & np.isfinite(predicted)]
    lines = []
    for layer, g in ch.groupby("layer", sort=True):
        med_lag, med_pred = float(g["abs_lag"].median()), float(g["predicted_lag_sigma"].median())
        lines.append({"layer": layer, "norm_layer": g["norm_layer"].iloc[0] if "norm_layer" in g else "",
                      "n": len(g), "lag_window_median_abs_sigma": med_lag, "median_predicted_lag_sigma": med_pred,
                      "measured_over_predicted": med_lag / med_pred if med_pred > 0 else math.nan,
                      "median_drift_sigma_per_step": float(g["drift_sigma_per_step"].median()),
                      "spearman": spearman_rho(g["abs_lag"], g["predicted_lag_sigma"])})
    return pd.DataFrame(lines)


def drift_over_intervals(run: Run, layer: str = MIDDLE_CONV,
                         multiples: tuple[int, ...] = INTERVAL_MULTIPLES) -> pd.Series:
    """Median drift of ``layer``'s fresh means over Δ = k log intervals, for each k in ``multiples``.

    Drift at a (step t, channel) pair is |fresh_mean(t) − fresh_mean(t − Δ)| / (fresh_std(t) · Δ), in σ
    per step (PROTOCOL.md, "Drift"), over the pairs whose interval ends inside the check window and
    starts at a logged step. At k = 1 this is the ``drift_sigma_per_step`` the runner logs. Index: Δ in
    steps; values NaN where no pair has both ends logged. Empty for a run without fresh statistics in
    ``layer`` (no running statistics) or with fewer than two log steps.
    """
    ch = run.tables["channels"]
    if not {"fresh_mean", "fresh_var"} <= set(ch.columns):
        return pd.Series(dtype=float)
    ch = ch[(ch["layer"] == layer) & np.isfinite(ch["fresh_mean"]) & np.isfinite(ch["fresh_var"])]
    if ch["step"].nunique() < 2 or not np.isfinite(ch["lag_sigma"]).any():
        return pd.Series(dtype=float)
    fresh = ch.pivot(index="step", columns="channel", values=["fresh_mean", "fresh_var"])  # (step, (value, channel))
    mean, std = fresh["fresh_mean"], np.sqrt(fresh["fresh_var"])
    steps = mean.index.to_numpy()
    interval = int(np.diff(steps).min())
    grid = range(int(steps[0]), int(steps[-1]) + 1, interval)  # a step off the grid (a last partial interval)
    mean, std = mean.reindex(grid), std.reindex(grid)          # is left out; a missing one leaves its pairs out
    first, last = check_window(run)
    ends = (mean.index >= first) & (mean.index <= last)
    out = {}
    for k in multiples:
        drift = (mean.diff(k).abs() / (std * interval * k))[ends]
        values = drift.to_numpy().ravel()
        values = values[np.isfinite(values)]
        out[interval * k] = float(np.median(values)) if len(values) else math.nan
    return pd.Series(out, name="median_drift_sigma_per_step").rename_axis("interval_steps")


def drift_exponent(drift: pd.Series) -> float:
    """Least-squares slope of log(median drift) on log(Δ) over the finite, positive entries of ``drift``
    (as returned by :func:`drift_over_intervals`): 0 for a steady drift, −1/2 for a random walk. NaN
    with fewer than two usable intervals."""
    d = drift[np.isfinite(drift) & (drift > 0)]
    if len(d) < 2:
        return math.nan
    return float(np.polyfit(np.log(d.index.to_numpy(dtype=float)), np.log(d.to_numpy()), 1)[0])


def drift_scaling_table(runs: list[Run]) -> pd.DataFrame:
    """Per row, the middle layer's median drift at each Δ (``<Δ>_mean``, ``<Δ>_std`` over seeds), the
    exponent over all Δ and over the first doubling (``exponent_*``, ``first_doubling_*``), ``n_seeds``."""
    lines = []
    for run in runs:
        drift = drift_over_intervals(run)
        if drift.empty:
            continue
        lines.append({"row": run.row, "seed": run.seed, **{int(k): v for k, v in drift.items()},
                      "exponent": drift_exponent(drift), "first_doubling": drift_exponent(drift.iloc[:2])})
    if not lines:
        return pd.DataFrame()
    per_run = pd.DataFrame(lines)
    keys = [c for c in per_run.columns if c not in ("row", "seed")]
    out = []
    for row, g in sorted(per_run.groupby("row"), key=lambda kv: row_order(kv[0])):
        out.append({"row": row, "label": ROWS[row].label if row in ROWS else row, "n_seeds": len(g)}
                   | over_seeds(g, keys))
    return pd.DataFrame(out)


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
        lines.append(line | over_seeds(g, [key for key, _, _ in COLUMNS]))
    return pd.DataFrame(lines), without
