"""Drift and lag at every step, from the dense windows (the ``dense`` table; no torch).

A run made with ``scale.dense_windows`` (the ``ten_seeds`` set: windows starting at steps 2,000, 4,000 and
5,800, ``scale.dense_length`` = 128 steps each) logs the fresh statistics of every norm layer on the fixed
probe set, and its running statistics, at every step of each window: steps w, w + 1, …, w + 128. Two
measurements come from it, both of the middle layer's BatchNorm (``bn2``, behind ``conv2``):

- :func:`dense_drift`: the drift over short intervals, Δ = 1, 2, 4, …, 128 steps, where the ``channels``
  table, logged every 100 steps, starts at Δ = 100. Drift of a channel over Δ is |fresh_mean(t) −
  fresh_mean(t − Δ)| / (fresh_std(t) · Δ), in σ per step (PROTOCOL.md, "Drift"), over the pairs (t − Δ, t)
  whose both ends lie in the same window; per run the median over the layer's channels and those pairs.
  A mean that moves at a steady rate gives the same drift at every Δ; a random walk gives drift falling as
  Δ^(−1/2).
- :func:`lag_model_fit`: the lag of a wandering mean. Per channel and window, the increments of the fresh
  mean, d_t = (fresh_mean(t) − fresh_mean(t − 1)) / fresh_std(t) in σ, give a drift r (their mean, σ per
  step) and a step size s (their sample standard deviation, σ per step). Each predicts the lag at the
  window's last step under a steady drift (:func:`.lag.predicted_lag_steady`), a random walk
  (:func:`.lag.predicted_lag_random_walk`), and both (:func:`.lag.predicted_lag_combined`), set against
  the measured |lag| = |running_mean − fresh_mean| / fresh_std there.

The probe set is fixed, so the fresh mean is a function of the weights alone: its increments carry no
sampling noise of their own, and r and s describe how the weights move the probe set's mean. The running
mean averages the training batches instead, so the measured lag carries what no model of the fresh mean's
path includes: the batches' sampling noise, and the offset of the probe set's mean from theirs. The
runner's timing makes that part exact: with the batch of step t normalised at the weights before the step
and the statistics read after it, lag_t = (1 − m) lag_(t−1) − d_t + m e_t, where e_t is that batch's mean
less the probe set's at the same weights, so :func:`lag_model_fit` splits each measured lag into the part
the window's own path explains, the part left from before the window, and the batches' part (``noise``).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pandas as pd

from ...rows import ROWS, row_order
from ..formatting import seed_ranges
from ..results import Run, once_per_run
from ..stats import over_seeds
from . import lag
from .metrics import MIDDLE_NORM

DENSE_INTERVALS = (1, 2, 4, 8, 16, 32, 64, 128)  # Δ in steps, up to scale.dense_length (128 in ten_seeds)
MODELS = ("steady", "random_walk", "combined", "correlated_walk")  # the predictions of lag_model_fit, in order
MODEL_NAMES = {"steady": "steady drift", "random_walk": "random walk", "combined": "drift and walk",
               "correlated_walk": "correlated walk"}


def momentum(run: Run, layer: str = MIDDLE_NORM) -> float:
    """BatchNorm momentum m of ``layer`` as ``run.json`` read it back from the built layer, else the row's
    (:data:`bnrotation.study.rows.ROWS`); NaN when neither is known."""
    read = run.info.get("norm_layers", {}).get(layer, {}).get("momentum")
    if read is not None:
        return float(read)
    spec = ROWS.get(run.row)
    return spec.bn_momentum if spec is not None and spec.norm == "batch" else math.nan


def dense_lines(run: Run, layer: str = MIDDLE_NORM) -> pd.DataFrame:
    """The ``dense`` table's lines of ``layer`` with finite fresh and running statistics; empty when the run
    has no dense table (runs made without ``scale.dense_windows``), no such layer, or no running statistics."""
    dense = run.tables.get("dense")
    if dense is None or dense.empty:
        return pd.DataFrame()
    sel = dense[dense["norm_layer"] == layer]
    keep = np.isfinite(sel[["fresh_mean", "fresh_var", "running_mean"]]).all(axis=1) & (sel["fresh_var"] > 0)
    return sel[keep]


def dense_windows(run: Run, steps: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) step of each dense window: from the run's config (``scale.dense_windows``,
    ``scale.dense_length``) where it has them, else each run of consecutive ``steps``. Windows without a
    logged step are left out."""
    scale = run.config.get("scale", {})
    starts, length = scale.get("dense_windows"), scale.get("dense_length")
    steps = np.unique(np.asarray(steps, dtype=int))
    if starts and length:
        logged = set(steps.tolist())
        return [(int(w), int(w) + int(length)) for w in sorted(starts) if int(w) in logged]
    if not len(steps):
        return []
    breaks = np.flatnonzero(np.diff(steps) != 1)
    firsts = np.r_[steps[0], steps[breaks + 1]]
    lasts = np.r_[steps[breaks], steps[-1]]
    return list(zip(firsts.tolist(), lasts.tolist()))


@once_per_run
def _windows(run: Run, layer: str) -> list[tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]]:
    """Per dense window, (fresh mean, fresh std, running mean), each (step, channel), every step of the window
    (a step missing from the table is NaN), the channels logged inside the window. Kept per run
    (:func:`..results.once_per_run`): :func:`dense_drift` and :func:`lag_model_fit` share it."""
    lines = dense_lines(run, layer)
    if lines.empty:
        return []
    wide = lines.pivot(index="step", columns="channel", values=["fresh_mean", "fresh_var", "running_mean"])
    out = []
    for first, last in dense_windows(run, lines["step"].to_numpy()):
        w = wide.reindex(range(first, last + 1)).dropna(axis=1, how="all")  # (step, (value, channel))
        out.append((w["fresh_mean"], np.sqrt(w["fresh_var"]), w["running_mean"]))
    return out


# ----------------------------------------------------------------------------- drift over short intervals
@once_per_run
def dense_drift(run: Run, intervals: tuple[int, ...] = DENSE_INTERVALS, layer: str = MIDDLE_NORM) -> pd.Series:
    """Median drift of ``layer``'s fresh means over each Δ in ``intervals``, σ per step: |fresh_mean(t) −
    fresh_mean(t − Δ)| / (fresh_std(t) · Δ) over the layer's channels and the pairs (t − Δ, t) with both ends
    in the same dense window. Index: Δ in steps; NaN where no window is Δ steps long. Empty for a run without
    dense windows (:func:`dense_lines`). Kept per run (:func:`..results.once_per_run`): ``lag.md`` and the claims
    share it."""
    windows = _windows(run, layer)
    if not windows:
        return pd.Series(dtype=float)
    arrays = [(mean.to_numpy(), std.to_numpy()) for mean, std, _ in windows]  # (step, channel) each
    out = {}
    for delta in intervals:
        values = [(np.abs(mean[delta:] - mean[:-delta]) / (std[delta:] * delta)).ravel() for mean, std in arrays
                  if len(mean) > delta]
        values = np.concatenate(values) if values else np.array([])
        values = values[np.isfinite(values)]
        out[int(delta)] = float(np.median(values)) if len(values) else math.nan
    return pd.Series(out, name="median_drift_sigma_per_step").rename_axis("interval_steps")


def dense_drift_table(runs: list[Run], intervals: tuple[int, ...] = DENSE_INTERVALS
                      ) -> tuple[pd.DataFrame, dict[str, list[int]]]:
    """Per row with dense windows: the middle layer's median drift at each Δ (``<Δ>_mean``, ``<Δ>_std`` over
    seeds, :func:`..stats.over_seeds`), the exponent of drift ∝ Δ^a over all Δ (``exponent_*``,
    :func:`.lag.drift_exponent`), ``n_seeds`` and ``seeds``. Also, per BatchNorm row, the seeds of its runs
    without dense windows (rows without running statistics are left out of both)."""
    lines, lacking = [], {}
    for run in runs:
        if math.isnan(momentum(run)):
            continue  # no running statistics: nothing for the drift to make stale
        drift = dense_drift(run, intervals)
        if drift.empty:
            lacking.setdefault(run.row, []).append(run.seed)
            continue
        lines.append({"row": run.row, "seed": run.seed, **{int(k): v for k, v in drift.items()},
                      "exponent": lag.drift_exponent(drift)})
    lacking = {row: sorted(seeds) for row, seeds in sorted(lacking.items(), key=lambda kv: row_order(kv[0]))}
    if not lines:
        return pd.DataFrame(), lacking
    per_run = pd.DataFrame(lines)
    keys = [c for c in per_run.columns if c not in ("row", "seed")]
    out = []
    for row, g in sorted(per_run.groupby("row"), key=lambda kv: row_order(kv[0])):
        out.append({"row": row, "label": ROWS[row].label if row in ROWS else row, "n_seeds": len(g),
                    "seeds": seed_ranges(g["seed"])} | over_seeds(g, keys))
    return pd.DataFrame(out), lacking


# ----------------------------------------------------------------------------- the lag of a wandering mean
@once_per_run
def lag_model_fit(run: Run, layer: str = MIDDLE_NORM) -> pd.DataFrame:
    """Per window and channel of ``layer``: the drift and step size of its fresh mean, the lag each model
    predicts from them, and the measured lag at the window's last step.

    Columns: ``window`` (first step), ``channel``, ``n`` (increments), ``r`` (mean increment, σ/step),
    ``s`` (their sample standard deviation, σ/step), ``autocorrelation`` (lag-1 autocorrelation of the
    increments: 0 for the i.i.d. increments the random-walk model assumes), ``measured`` (signed lag at the
    last step, σ), ``steady``, ``random_walk``, ``combined``, ``correlated_walk`` (predicted |lag| or RMS lag,
    σ; the last from s and the increments' lag-1 autocorrelation, :func:`.lag.predicted_lag_correlated_walk`),
    ``path`` (the lag the window's own increments make, −Σ_j (1 − m)^j d_(last−j), σ), ``before`` (what is
    left of the lag at the window's first step, (1 − m)^n · lag(first), σ) and ``noise`` (the rest: the
    training batches' part, measured − path − before, σ).

    Predictions use the runner's timing (``measured_after_step``: the lag is read after the step whose batch
    updated the running mean; 1/(1 − m) = 1.03 times the article's timing at m = 0.03). In the combined
    model r² is taken as max(r² − s²/n, 0), since the mean of n i.i.d. increments carries a variance s²/n
    that r² alone would count as drift; the steady model uses |r| as measured. Empty for a run without dense
    windows or running statistics. Kept per run (:func:`..results.once_per_run`): ``lag.md`` and the claims'
    findings share it.
    """
    m = momentum(run, layer)
    windows = _windows(run, layer) if math.isfinite(m) else []
    frames = []
    for mean, std, running in windows:
        if len(mean) < 3:
            continue
        d = (mean.diff() / std).iloc[1:]  # (n, channel) increments in σ of their own step
        n = d.notna().sum()
        r, s = d.mean(), d.std(ddof=1)
        auto = d.corrwith(d.shift(1))  # lag-1 autocorrelation per channel (Pearson, pairs with both ends)
        first, last = mean.index[0], mean.index[-1]
        lag_raw = running - mean  # (step, channel), in the channel's own units
        measured = lag_raw.loc[last] / std.loc[last]
        weights = (1 - m) ** np.arange(len(d))[::-1]  # (1 − m)^j for the increment j steps before the last
        path = -(mean.diff().iloc[1:].mul(weights, axis=0)).sum(min_count=1) / std.loc[last]
        before = (1 - m) ** len(d) * lag_raw.loc[first] / std.loc[last]
        r2 = np.maximum(r ** 2 - s ** 2 / n, 0.0)
        rho = auto.where((auto > -1) & (auto < 1))  # NaN (no prediction) where the steps do not vary
        frames.append(pd.DataFrame({
            "window": first, "channel": mean.columns, "n": n.to_numpy(), "r": r.to_numpy(), "s": s.to_numpy(),
            "autocorrelation": auto.to_numpy(), "measured": measured.to_numpy(),
            "steady": lag.predicted_lag_steady(r.abs().to_numpy(), m, measured_after_step=True),
            "random_walk": lag.predicted_lag_random_walk(s.to_numpy(), m, measured_after_step=True),
            "combined": lag.predicted_lag_combined(np.sqrt(r2.to_numpy()), s.to_numpy(), m, measured_after_step=True),
            "correlated_walk": np.where(rho.notna(), lag.predicted_lag_correlated_walk(
                s.to_numpy(), rho.fillna(0.0).to_numpy(), m, measured_after_step=True), math.nan),
            "path": path.to_numpy(), "before": before.to_numpy(),
            "noise": (measured - path - before).to_numpy()}))
    if not frames:
        return pd.DataFrame()
    fit = pd.concat(frames, ignore_index=True)
    ok = np.isfinite(fit[["r", "s", "measured"]]).all(axis=1)
    return fit[ok].reset_index(drop=True)


def gaussian_median_log_error() -> float:
    """x with P(e^(−x) < |Z| < e^x) = 1/2 for Z ~ N(0, 1): the median |log(|lag| / RMS)| of a Gaussian lag whose
    RMS a model gets exactly right (≈ 0.58), the least error a prediction of a wandering mean's RMS lag makes
    channel by channel. By bisection on that probability, which rises with x."""
    z = NormalDist()

    def p(x: float) -> float:  # P(a < |Z| < b) = 2 (Φ(b) − Φ(a))
        return 2 * (z.cdf(math.exp(x)) - z.cdf(math.exp(-x)))
    lo, hi = 0.0, 5.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p(mid) < 0.5 else (lo, mid)
    return (lo + hi) / 2


GAUSSIAN_MEDIAN_ABS = NormalDist().inv_cdf(0.75)  # median |Z| of Z ~ N(0, 1), ≈ 0.674: |lag| / RMS of a random walk


def model_errors(fit: pd.DataFrame) -> dict[str, float]:
    """Per model of :data:`MODELS`, how far its prediction is from the measured lag over ``fit``'s (window,
    channel) pairs:

    - ``<model>_rms_ratio`` = √(mean measured² / mean predicted²): every model predicts the mean-square lag
      (the steady one exactly, the others in expectation), so 1 means it gets that right;
      ``<model>_rms_error`` = |log(rms_ratio)|, the criterion by which one model predicts better than another;
    - ``<model>_log_error`` = median |log(|measured| / predicted)|, channel by channel (a prediction of 0 under a
      measured lag counts as an infinite error); for a Gaussian lag whose RMS a model gets exactly right it is
      :func:`gaussian_median_log_error`, ≈ 0.58, not 0;
    - ``<model>_ratio`` = median |measured| / predicted (≈ 0.674, :data:`GAUSSIAN_MEDIAN_ABS`, in that case).

    Pairs whose measured lag is exactly 0 are left out of the last two. Also ``noise_share``: the share of the
    mean-square measured lag that is the batches' part (:func:`lag_model_fit`'s ``noise``, squared),
    ``autocorrelation`` (median), ``r`` (median |r|, σ/step), ``s`` (median, σ/step) and ``pairs``.
    """
    out = {"pairs": float(len(fit))}
    meas = fit["measured"].abs()
    for model in MODELS:
        pred = fit[model]
        ok = (meas > 0) & np.isfinite(pred)
        with np.errstate(divide="ignore"):
            ratio = meas[ok] / pred[ok]
        out[f"{model}_log_error"] = float(np.median(np.abs(np.log(ratio)))) if ok.any() else math.nan
        out[f"{model}_ratio"] = float(np.median(ratio)) if ok.any() else math.nan
        finite = np.isfinite(pred)
        mean_pred2 = float(np.mean(pred[finite] ** 2)) if finite.any() else math.nan
        rms = (math.sqrt(float(np.mean(meas[finite] ** 2)) / mean_pred2) if mean_pred2 > 0
               else math.inf if mean_pred2 == 0 else math.nan)
        out[f"{model}_rms_ratio"] = rms
        out[f"{model}_rms_error"] = (math.nan if math.isnan(rms) else abs(math.log(rms)) if 0 < rms < math.inf
                                     else math.inf)
    total = float(np.mean(fit["measured"] ** 2)) if len(fit) else math.nan
    out["noise_share"] = float(np.mean(fit["noise"] ** 2)) / total if total else math.nan
    out["autocorrelation"] = float(fit["autocorrelation"].median()) if len(fit) else math.nan
    out["r"], out["s"] = float(fit["r"].abs().median()), float(fit["s"].median())
    return out


def lag_model_table(runs: list[Run]) -> pd.DataFrame:
    """Per row with dense windows: :func:`model_errors` of each run, as mean and sample sd over seeds
    (``<key>_mean``, ``<key>_std``), ``n_seeds``, ``seeds``, ``best`` (the model with the smallest mean
    ``rms_error`` over seeds) and ``best_seeds`` (on how many seeds that model has the smallest one)."""
    lines = []
    for run in runs:
        fit = lag_model_fit(run)
        if not fit.empty:
            lines.append({"row": run.row, "seed": run.seed, **model_errors(fit)})
    if not lines:
        return pd.DataFrame()
    per_run = pd.DataFrame(lines)
    errors = per_run[[f"{m}_rms_error" for m in MODELS]].to_numpy()  # (run, model)
    per_run["best"] = [MODELS[i] for i in np.argmin(errors, axis=1)]
    keys = [c for c in per_run.columns if c not in ("row", "seed", "best")]
    out = []
    for row, g in sorted(per_run.groupby("row"), key=lambda kv: row_order(kv[0])):
        line = {"row": row, "label": ROWS[row].label if row in ROWS else row, "n_seeds": len(g),
                "seeds": seed_ranges(g["seed"])} | over_seeds(g.replace(math.inf, np.nan), keys)
        best = min(MODELS, key=lambda m: g[f"{m}_rms_error"].mean())
        out.append(line | {"best": best, "best_seeds": int((g["best"] == best).sum())})
    return pd.DataFrame(out)
