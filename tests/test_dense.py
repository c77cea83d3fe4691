"""Drift and lag from the dense windows (analysis/measures/dense.py) on dense tables with known answers; no torch.

A synthetic dense table is built from a channel mean with known increments (a steady drift, a random walk, a
walk with correlated steps), its running mean made as the runner's PyTorch running average makes it: the batch
of step t normalised at the weights before the step, the statistics read after it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bnrotation.study.analysis.measures import dense, lag
from bnrotation.study.analysis.results import Run
from bnrotation.study.analysis.tables import lag_report

M = 0.03
STARTS, LENGTH = (300, 600, 900), 128


def dense_table(r: float = 0.0, s: float = 0.0, rho: float = 0.0, channels: int = 64, m: float = M,
                starts=STARTS, length: int = LENGTH, batch_noise: float = 0.0, std: float = 2.0, seed: int = 0,
                layers=("bn2",)) -> pd.DataFrame:
    """The ``dense`` table of a run whose channel means (in σ, fresh std ``std``) take increments r + s·x_t, x an
    AR(1) of unit variance and lag-1 autocorrelation ``rho`` (0: i.i.d. N(0, 1)), with the running mean of the
    runner's timing; ``batch_noise`` (σ) is the training batches' sampling noise around the mean."""
    rng = np.random.default_rng(seed)
    mean, running, x = np.zeros(channels), np.zeros(channels), rng.normal(size=channels)
    keep = sorted({w + i for w in starts for i in range(length + 1)})
    kept_mean, kept_running, kept_steps = [], [], set(keep)
    for t in range(1, keep[-1] + 1):
        running = (1 - m) * running + m * (mean + batch_noise * rng.normal(size=channels))  # forward pass
        x = rho * x + math.sqrt(1 - rho ** 2) * rng.normal(size=channels)
        mean = mean + r + s * x  # optimizer step
        if t in kept_steps:
            kept_mean.append(mean)
            kept_running.append(running)
    frames = [pd.DataFrame({"step": np.repeat(keep, channels), "norm_layer": layer,
                            "channel": np.tile(np.arange(channels), len(keep)),
                            "fresh_mean": std * np.concatenate(kept_mean), "fresh_var": std ** 2,
                            "running_mean": std * np.concatenate(kept_running), "running_var": 1.0})
              for layer in layers]
    return pd.concat(frames, ignore_index=True)


def dense_run(table: pd.DataFrame | None, row: str = "adam", seed: int = 0, m: float = M,
              config_windows: bool = True) -> Run:
    scale = {"check_start": 2000, "steps": 6000, "log_every": 100}
    if config_windows:
        scale |= {"dense_windows": list(STARTS), "dense_length": LENGTH}
    info = {"row": row, "seed": seed, "norm_layers": {"bn2": {"class": "BatchNorm2d", "momentum": m}}}
    return Run(Path(f"runs/{row}/seed={seed}"), info, {"scale": scale}, {} if table is None else {"dense": table})


# ----------------------------------------------------------------------------- drift over short intervals
def test_a_steady_drift_gives_its_rate_at_every_interval():
    """|r| per step at every Δ, whatever the channel's sign; a pair never spans two windows (that would mix in
    the 172 steps between them, still r per step here, so the next test checks it with a jump)."""
    table = dense_table(r=0.004)
    table.loc[table["channel"] % 2 == 1, "fresh_mean"] *= -1  # half the channels drift downwards
    drift = dense.dense_drift(dense_run(table))
    assert list(drift.index) == list(dense.DENSE_INTERVALS)
    assert drift.to_numpy() == pytest.approx(np.full(len(drift), 0.004), rel=1e-9)
    assert lag.drift_exponent(drift) == pytest.approx(0.0, abs=1e-9)


def test_pairs_stay_inside_one_window_and_windows_come_from_the_data_without_a_config():
    table = dense_table(r=0.004)
    table.loc[table["step"] >= STARTS[1], "fresh_mean"] += 100.0  # a jump between the first two windows
    for run in (dense_run(table), dense_run(table, config_windows=False)):
        assert dense.dense_windows(run, table["step"].unique()) == [(w, w + LENGTH) for w in STARTS]
        assert dense.dense_drift(run).to_numpy() == pytest.approx(np.full(len(dense.DENSE_INTERVALS), 0.004))
    short = dense.dense_drift(dense_run(table[table["step"] <= STARTS[0] + 40], config_windows=False))
    assert short[32] == pytest.approx(0.004) and math.isnan(short[64])  # no window is 64 steps long


def test_a_random_walk_gives_drift_falling_as_one_over_root_delta():
    """|W(Δ)| / Δ for a walk of step s has median 0.674 s / √Δ. The sampling error of a median of N values
    of |Z| is 0.787 / √N relative to 0.674 (density of |Z| at its median 2φ(0.674) = 0.636); N is at least the
    non-overlapping pairs, channels · windows · ⌊128 / Δ⌋, so 4 standard errors at each Δ."""
    s, channels = 0.01, 512
    drift = dense.dense_drift(dense_run(dense_table(s=s, channels=channels)))
    for delta, value in drift.items():
        n = channels * len(STARTS) * (LENGTH // delta)
        tol = 4 * 0.787 / math.sqrt(n) / dense.GAUSSIAN_MEDIAN_ABS
        assert value == pytest.approx(dense.GAUSSIAN_MEDIAN_ABS * s / math.sqrt(delta), rel=tol), delta
    assert lag.drift_exponent(drift) == pytest.approx(-0.5, abs=0.03)


def test_a_run_without_a_dense_table_has_no_drift_and_is_listed_by_row():
    assert dense.dense_drift(dense_run(None)).empty
    assert dense.dense_drift(dense_run(dense_table(r=0.004).iloc[:0])).empty  # the empty table the runner writes
    assert dense.dense_drift(dense_run(dense_table(r=0.004, layers=("bn1",)))).empty  # no middle layer
    runs = [dense_run(dense_table(r=0.004), "adam", 3), dense_run(None, "adam", 0), dense_run(None, "sgd", 1),
            dense_run(None, "sgd", 2), dense_run(None, "adam_groupnorm", 0, m=math.nan)]
    runs[-1].info["norm_layers"] = {}  # no running statistics: left out, not "lacking"
    table, lacking = dense.dense_drift_table(runs)
    assert lacking == {"sgd": [1, 2], "adam": [0]}
    assert table[["row", "n_seeds", "seeds"]].values.tolist() == [["adam", 1, "3"]]
    md = "\n".join(lag_report.dense_drift_markdown(table, lacking))
    assert "left out above: `sgd` (seeds 1, 2), `adam` (seed 0)." in md
    assert "| Adam, lr 3e-3 (`adam`) | 3 (1) | 0.00400 |" in md
    none, lacking = dense.dense_drift_table(runs[1:])
    assert none.empty and "No run here has dense windows" in lag_report.dense_drift_markdown(none, lacking)[0]
    assert dense.lag_model_fit(runs[1]).empty and dense.lag_model_table(runs[1:]).empty
    assert "no model is fitted" in lag_report.lag_models_markdown(pd.DataFrame())[0]


# ----------------------------------------------------------------------------- the lag of a wandering mean
def test_a_steady_drift_is_fitted_exactly_and_the_steady_model_predicts_its_lag():
    fit = dense.lag_model_fit(dense_run(dense_table(r=0.004)))
    assert len(fit) == 64 * len(STARTS) and (fit["n"] == LENGTH).all()
    assert fit["r"].to_numpy() == pytest.approx(np.full(len(fit), 0.004)) and fit["s"].max() < 1e-9
    # the start, 300 steps before the first window, is forgotten to (1 − m)^300 = 1e-4 of the lag
    assert -fit["measured"].to_numpy() == pytest.approx(np.full(len(fit), 0.004 / M), rel=(1 - M) ** STARTS[0])
    assert fit["steady"].to_numpy() == pytest.approx(np.full(len(fit), 0.004 / M), rel=1e-6)
    # the runner's timing: the lag is the path's own exponential sum, nothing left to the batches
    assert fit["noise"].abs().max() < 1e-9
    errors = dense.model_errors(fit)
    assert errors["steady_rms_ratio"] == pytest.approx(1.0, rel=1e-3) and errors["steady_log_error"] < 1e-3
    assert errors["random_walk_rms_ratio"] > 100  # a walk of step s ≈ 0 predicts no lag
    assert dense.lag_model_table([dense_run(dense_table(r=0.004))]).iloc[0]["best"] == "steady"


def test_a_random_walk_is_fitted_and_its_model_predicts_the_mean_square_lag():
    """1,536 (channel, window) lags of a walk of step s = 0.01σ: ŝ within 1% (each from 128 increments, relative
    error 1/√254 = 6%, a median of 1,536 of them: 0.2%); the RMS ratio within 4 standard errors of 1 (a mean
    square of 1,536 Gaussian values: relative error √(2/1536) = 3.6%, 1.8% on its root); and the steady model,
    whose r is only the walk's net displacement over 128 steps, off by more than 20%."""
    channels, s = 512, 0.01
    runs = [dense_run(dense_table(s=s, channels=channels, seed=k), seed=k) for k in range(3)]
    fit = dense.lag_model_fit(runs[0])
    assert float(fit["s"].median()) == pytest.approx(s, rel=0.01)
    assert abs(float(fit["autocorrelation"].median())) < 0.03
    errors = dense.model_errors(fit)
    tol = 4 * math.sqrt(2 / len(fit)) / 2
    assert errors["random_walk_rms_ratio"] == pytest.approx(1.0, abs=tol)
    assert errors["random_walk_ratio"] == pytest.approx(dense.GAUSSIAN_MEDIAN_ABS, abs=0.05)
    assert errors["random_walk_log_error"] == pytest.approx(dense.gaussian_median_log_error(), abs=0.05)
    assert abs(errors["steady_rms_ratio"] - 1) > 0.2
    table = dense.lag_model_table(runs)
    assert table.iloc[0]["best"] in ("random_walk", "correlated_walk")  # ρ ≈ 0: the same model
    assert table.iloc[0]["n_seeds"] == 3 and table.iloc[0]["seeds"] == "0–2"


def test_a_walk_with_correlated_steps_is_told_apart_and_batch_noise_is_separated():
    """Steps with lag-1 autocorrelation 0.9 (a momentum average): the uncorrelated walk under-predicts the lag
    several times over, the AR(1) walk does not. Training batches 0.05σ off the mean put their part of the lag
    in ``noise``: m · Σ (1 − m)^j e_j has variance 0.05² m/(2 − m) in the steady state."""
    run = dense_run(dense_table(s=0.01, rho=0.9, channels=256, batch_noise=0.05))
    fit = dense.lag_model_fit(run)
    errors = dense.model_errors(fit)
    assert float(fit["autocorrelation"].median()) == pytest.approx(0.9, abs=0.05)
    assert errors["random_walk_rms_ratio"] > 2.5
    assert errors["correlated_walk_rms_ratio"] == pytest.approx(1.0, abs=0.15)  # ρ from 128 steps is biased low
    noise_rms = float(np.sqrt(np.mean(fit["noise"] ** 2)))
    assert noise_rms == pytest.approx(0.05 * math.sqrt(M / (2 - M)), rel=4 / math.sqrt(2 * len(fit)))
    assert dense.lag_model_table([run]).iloc[0]["best"] == "correlated_walk"


def test_lag_md_has_both_dense_sections(tmp_path):
    runs = [dense_run(dense_table(r=0.004, s=0.002, seed=k), seed=k) for k in range(2)]
    for run in runs:
        run.tables["channels"] = pd.DataFrame({c: pd.Series(dtype=float) for c in (
            "step", "channel", "lag_sigma", "predicted_lag_sigma", "drift_sigma_per_step")}).assign(layer="")
    md = lag_report.write_lag(runs, tmp_path, tmp_path)
    assert "## Drift at short intervals, from the dense windows" in md
    assert "## The lag of a wandering mean: steady drift or random walk" in md
    drift_line = next(ln for ln in md.splitlines() if ln.startswith("| Adam") and "(2) |" in ln and "Δ" not in ln)
    assert drift_line.startswith("| Adam, lr 3e-3 (`adam`) | 0, 1 (2) | ")
    # a drift 2.5 times the walk's step over 33 steps: the two models with a drift term tie, the walks fall short
    assert re.search(r"\| (steady drift|drift and walk) \([12] of 2 seeds\) \|$", md.strip())
