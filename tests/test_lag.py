"""The lag table (results/lag.md) on channel tables with known answers, and the lag of a moving mean in closed
form against PyTorch's own running average (the only use of torch here: as the oracle)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bnrotation.study.analysis.measures.lag import (age_interval, drift_exponent, drift_over_intervals, drift_scaling_table,
                                              lag_table, predicted_lag_combined, predicted_lag_correlated_walk,
                                              predicted_lag_random_walk, predicted_lag_steady, run_lags,
                                              running_average_age)
from bnrotation.study.analysis.results import Run
from bnrotation.study.analysis.tables.lag_report import drift_markdown, to_markdown, write_lag

CONFIG = {"scale": {"check_start": 2000, "steps": 2200, "log_every": 100}}


def _channels(scale: float = 1.0, norm: str = "batch") -> pd.DataFrame:
    """conv2: measured |lag| = predicted^2 (same ranking); conv3: measured = 1 / predicted (reversed).

    Steps 1900 (outside the window, wild values) and 2000-2200; channels 0-4; signs of the lag alternate.
    """
    rows = []
    for step in (1900, 2000, 2100, 2200):
        for layer in ("conv2", "conv3"):
            for c in range(5):
                pred = scale * 0.1 * (c + 1) * step / 1000
                meas = pred ** 2 if layer == "conv2" else 1 / pred
                if step == 1900:
                    meas, pred = 1e6 * (5 - c), 1e-6
                running = norm == "batch"
                rows.append({"row": "adam", "seed": 0, "step": step, "layer": layer,
                             "norm_layer": layer.replace("conv", "bn" if running else "gn"), "channel": c,
                             "lag_sigma": (-1) ** c * meas if running else math.nan,
                             "predicted_lag_sigma": pred if running else math.nan,
                             "drift_sigma_per_step": pred * 0.03 / 0.97})
    return pd.DataFrame(rows)


def _run(row: str, seed: int, channels: pd.DataFrame) -> Run:
    return Run(Path(f"runs/{row}/seed={seed}"), {"row": row, "seed": seed}, CONFIG,
               {"channels": channels.assign(row=row, seed=seed)})


def test_one_run_medians_and_rank_correlation_inside_the_window():
    lags = run_lags(_run("adam", 0, _channels())).set_index("layer")
    pred = np.array([0.1 * (c + 1) * s / 1000 for s in (2000, 2100, 2200) for c in range(5)])
    assert lags.loc["conv2", "n"] == 15  # step 1900 is outside the window
    assert lags.loc["conv2", "median_predicted_lag_sigma"] == pytest.approx(np.median(pred))
    assert lags.loc["conv2", "lag_window_median_abs_sigma"] == pytest.approx(np.median(pred ** 2))
    assert lags.loc["conv3", "lag_window_median_abs_sigma"] == pytest.approx(np.median(1 / pred))
    assert lags.loc["conv2", "spearman"] == pytest.approx(1.0)
    assert lags.loc["conv3", "spearman"] == pytest.approx(-1.0)
    assert lags.loc["conv2", "measured_over_predicted"] == pytest.approx(np.median(pred ** 2) / np.median(pred))
    assert lags.loc["conv2", "norm_layer"] == "bn2"


def test_pairs_with_a_missing_side_are_left_out():
    ch = _channels()
    ch.loc[(ch["step"] == 2000), "predicted_lag_sigma"] = math.nan  # the first interval has no drift yet
    lags = run_lags(_run("adam", 0, ch)).set_index("layer")
    assert lags.loc["conv2", "n"] == 10 and lags.loc["conv2", "spearman"] == pytest.approx(1.0)


def test_seeds_are_averaged_with_their_spread_and_norms_without_statistics_listed():
    runs = [_run("adam", 0, _channels(1.0)), _run("adam", 1, _channels(2.0)),
            _run("adam_groupnorm", 0, _channels(norm="group"))]
    table, without = lag_table(runs)
    assert without == ["adam_groupnorm"]
    conv2 = table.set_index("layer").loc["conv2"]
    one, two = (run_lags(r).set_index("layer").loc["conv2", "median_predicted_lag_sigma"] for r in runs[:2])
    assert two == pytest.approx(2 * one)
    assert conv2["median_predicted_lag_sigma_mean"] == pytest.approx(1.5 * one)
    assert conv2["median_predicted_lag_sigma_std"] == pytest.approx(np.std([one, two], ddof=1))
    assert conv2["n_seeds"] == 2 and conv2["n_per_seed"] == "15" and conv2["spearman_mean"] == pytest.approx(1.0)
    md = to_markdown(table, without, Path("results"), schema="schema version 2")
    assert "| Adam, lr 3e-3 (`adam`) | conv2 (bn2) | 2 | 15 |" in md
    assert "no lag to measure: `adam_groupnorm`" in md


def test_write_lag_with_only_norms_without_statistics(tmp_path):
    md = write_lag([_run("adam_layernorm", 0, _channels(norm="layer"))], tmp_path, Path("results"))
    assert (tmp_path / "lag.md").read_text() == md
    assert "No run logged a running-mean lag." in md and "`adam_layernorm`" in md


# ----------------------------------------------------------------------------- drift against the interval
def _fresh(means: np.ndarray, steps: np.ndarray, std: float = 2.0, window: tuple[int, int] | None = None) -> Run:
    """A run whose conv2 fresh means are ``means`` (steps x channels) at ``steps``, fresh std ``std``; the check
    window is ``window``, by default the second half of ``steps``."""
    n_steps, n_channels = means.shape
    ch = pd.DataFrame({"row": "adam", "seed": 0, "step": np.repeat(steps, n_channels), "layer": "conv2",
                       "norm_layer": "bn2", "channel": np.tile(np.arange(n_channels), n_steps),
                       "fresh_mean": means.ravel(), "fresh_var": std ** 2, "lag_sigma": 0.1,
                       "predicted_lag_sigma": 0.1, "drift_sigma_per_step": 0.001})
    first, last = window or (int(steps[len(steps) // 2]), int(steps[-1]))
    config = {"scale": {"check_start": first, "steps": last, "log_every": 100}}
    return Run(Path("runs/adam/seed=0"), {"row": "adam", "seed": 0}, config, {"channels": ch})


def test_drift_over_one_interval_is_the_logged_drift_and_a_steady_drift_has_exponent_zero():
    steps = np.arange(0, 4100, 100)
    rates = np.array([0.001, 0.002, 0.003, 0.004])  # σ per step, steady
    run = _fresh(2.0 * steps[:, None] * rates[None, :] * np.array([1, -1, 1, -1]), steps)
    drift = drift_over_intervals(run)
    assert list(drift.index) == [100, 200, 400, 800, 1600]
    assert drift.to_numpy() == pytest.approx(np.full(5, np.median(rates)))
    assert drift_exponent(drift) == pytest.approx(0.0, abs=1e-9)


def test_a_random_walk_has_exponent_minus_one_half():
    rng = np.random.default_rng(0)
    steps = np.arange(0, 200_100, 100)  # a long walk, so the medians settle
    walk = np.cumsum(rng.normal(size=(len(steps), 64)), axis=0)
    drift = drift_over_intervals(_fresh(walk, steps, std=1.0), multiples=(1, 2, 4, 8))
    assert drift_exponent(drift) == pytest.approx(-0.5, abs=0.05)
    # at one interval: |N(0, 1)| / 100 has median 0.6745 / 100
    assert drift[100] == pytest.approx(0.6745 / 100, rel=0.05)


def test_a_missing_log_step_drops_its_pairs_instead_of_spanning_the_gap():
    steps = np.arange(0, 2100, 100)
    gap = np.delete(steps, 14)  # step 1400 missing; only the interval ending at 1500 is in the window
    run = _fresh(2.0 * 0.003 * gap[:, None], gap, window=(1500, 1500))  # steady 0.003σ per step
    drift = drift_over_intervals(run, multiples=(1, 2, 3))
    assert math.isnan(drift[100])  # 1300→1500 is not read as a 100-step interval (that would give 0.006)
    assert drift[200] == pytest.approx(0.003) and drift[300] == pytest.approx(0.003)  # not 0.0045 or 0.004


def test_no_fresh_statistics_gives_no_drift_and_the_section_is_left_out():
    run = _run("adam_groupnorm", 0, _channels(norm="group"))  # no fresh_mean column; lag is NaN
    assert drift_over_intervals(run).empty
    assert drift_scaling_table([run]).empty and drift_markdown(drift_scaling_table([run])) == []
    assert math.isnan(drift_exponent(pd.Series([0.1], index=[100])))


def test_drift_section_of_lag_md(tmp_path):
    steps = np.arange(0, 4100, 100)
    run = _fresh(2.0 * steps[:, None] * np.array([[0.001, 0.002, 0.003]]), steps)
    md = write_lag([run], tmp_path, tmp_path)
    assert "## Drift of the middle layer against the interval Δ" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| Adam") and "0.00200" in ln)
    assert line.count("0.00200") == 5
    assert [abs(float(c)) for c in line.strip("| ").split(" | ")[-2:]] == [0.0, 0.0]  # both exponents


# ----------------------------------------------------------------------------- the lag of a moving mean, closed forms
M = 0.03  # the article's BatchNorm momentum


def _torch_running_lag(increments: np.ndarray, m: float, after_step: bool) -> np.ndarray:
    """Feed a channel mean whose increments are ``increments`` (steps, walks) through PyTorch's own BatchNorm1d
    running average (momentum m, float64), one batch per step whose mean is the channel's mean, and return the
    lag running − mean after the last step, per walk. ``after_step``: the runner's timing, the batch of step t
    at the mean before its increment; else the article's, the batch at the mean after it."""
    import torch
    steps, walks = increments.shape
    bn = torch.nn.BatchNorm1d(walks, momentum=m).double().train()
    spread = torch.tensor([[-1.0], [1.0]], dtype=torch.float64)  # two samples around the mean: batch mean = mean
    mean = torch.zeros(walks, dtype=torch.float64)
    d = torch.from_numpy(increments)
    with torch.no_grad():
        for t in range(steps):
            if after_step:
                bn(mean + spread)
                mean = mean + d[t]
            else:
                mean = mean + d[t]
                bn(mean + spread)
    return (bn.running_mean - mean).numpy()


@pytest.mark.parametrize("after_step", [False, True])
def test_a_steady_drift_lags_by_its_rate_times_the_running_averages_age(after_step):
    """Exact: after 2,000 steps the start is forgotten to (1 − m)^2000 ≈ 3e-27; the two timings differ by 1 − m."""
    r = 0.0074
    lag_measured = _torch_running_lag(np.full((2000, 1), r), M, after_step)[0]
    assert -lag_measured == pytest.approx(predicted_lag_steady(r, M, measured_after_step=after_step), rel=1e-9)
    assert predicted_lag_steady(r, M) == pytest.approx(r * (1 - M) / M) == pytest.approx(0.239, abs=1e-3)
    assert predicted_lag_steady(r, M, measured_after_step=True) == pytest.approx(r / M)


@pytest.mark.parametrize("after_step", [False, True])
def test_a_random_walk_lags_by_its_step_times_one_over_root_m_two_minus_m(after_step):
    """20,000 independent walks of 600 steps (the start forgotten to (1 − m)^1200): the lag's RMS estimated
    from 20,000 Gaussian values has a relative standard error of 1/√(2 · 20,000) = 0.5%; tolerance 4 of them,
    2%, less than the 3% (a factor 1 − m) that separates the two timings."""
    s, walks = 0.01, 20_000
    rng = np.random.default_rng(1)
    lag = _torch_running_lag(s * rng.normal(size=(600, walks)), M, after_step)
    rms, tol = float(np.sqrt(np.mean(lag ** 2))), 4 / math.sqrt(2 * walks)
    assert rms == pytest.approx(predicted_lag_random_walk(s, M, measured_after_step=after_step), rel=tol)
    assert predicted_lag_random_walk(s, M) == pytest.approx(s * (1 - M) / math.sqrt(M * (2 - M)))
    assert predicted_lag_random_walk(1.0, M) == pytest.approx(3.99, abs=0.01)  # about 4 s, where drift gives 32 r
    assert abs(float(np.mean(lag))) < 4 * rms / math.sqrt(walks)  # no drift, no mean lag
    # both at once: the mean and the spread add in quadrature
    assert predicted_lag_combined(0.003, s, M) == pytest.approx(
        math.hypot(predicted_lag_steady(0.003, M), predicted_lag_random_walk(s, M)))


def test_a_walk_with_correlated_steps_lags_by_the_ar1_closed_form():
    """Steps that are an exponential average (factor 0.9, Adam's β1) of white noise: AR(1) with ρ = 0.9, started
    stationary. Same tolerance as the uncorrelated walk (the lags are still 20,000 independent Gaussians)."""
    s, rho, walks, steps = 0.01, 0.9, 20_000, 600
    rng = np.random.default_rng(2)
    x = np.empty((steps, walks))
    x[0] = rng.normal(size=walks)
    for t in range(1, steps):
        x[t] = rho * x[t - 1] + math.sqrt(1 - rho ** 2) * rng.normal(size=walks)
    lag = _torch_running_lag(s * x, M, after_step=True)
    rms = float(np.sqrt(np.mean(lag ** 2)))
    predicted = predicted_lag_correlated_walk(s, rho, M, measured_after_step=True)
    assert rms == pytest.approx(predicted, rel=4 / math.sqrt(2 * walks))
    assert predicted > 3.5 * predicted_lag_random_walk(s, M, measured_after_step=True)  # correlation adds up
    assert predicted_lag_correlated_walk(s, 0.0, M) == pytest.approx(predicted_lag_random_walk(s, M))


def test_lag_closed_forms_refuse_a_momentum_outside_zero_to_one_and_name_the_running_averages_age():
    assert running_average_age(M) == pytest.approx(97 / 3) and age_interval(M) == 32
    assert age_interval(0.1) == 9 and age_interval(0.3) == 2  # PyTorch's default, the window test
    for bad in (0.0, -0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="momentum m"):
            predicted_lag_random_walk(0.01, bad)
    with pytest.raises(ValueError, match="autocorrelation"):
        predicted_lag_correlated_walk(0.01, 1.0, M)
