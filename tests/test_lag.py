"""The lag table (results/lag.md) on channel tables with known answers; no torch."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from bnrotation.analysis.lag import lag_table, run_lags, spearman, to_markdown, write_lag
from bnrotation.analysis.results import Run

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


def test_spearman_is_scipys():
    rng = np.random.default_rng(0)
    a, b = pd.Series(rng.integers(0, 5, 40).astype(float)), pd.Series(rng.normal(size=40))  # ties in a
    assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)
    assert math.isnan(spearman(a[:2], b[:2]))


def test_one_run_medians_and_rank_correlation_inside_the_window():
    lags = run_lags(_run("adam", 0, _channels())).set_index("layer")
    pred = np.array([0.1 * (c + 1) * s / 1000 for s in (2000, 2100, 2200) for c in range(5)])
    assert lags.loc["conv2", "n"] == 15  # step 1900 is outside the window
    assert lags.loc["conv2", "median_predicted_lag_sigma"] == pytest.approx(np.median(pred))
    assert lags.loc["conv2", "median_abs_lag_sigma"] == pytest.approx(np.median(pred ** 2))
    assert lags.loc["conv3", "median_abs_lag_sigma"] == pytest.approx(np.median(1 / pred))
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
    md = to_markdown(table, without, Path("results"))
    assert "| Adam, lr 3e-3 (`adam`) | conv2 (bn2) | 2 | 15 |" in md
    assert "no lag to measure: `adam_groupnorm`" in md


def test_write_lag_with_only_norms_without_statistics(tmp_path):
    md = write_lag([_run("adam_layernorm", 0, _channels(norm="layer"))], tmp_path, Path("results"))
    assert (tmp_path / "lag.md").read_text() == md
    assert "No run logged a running-mean lag." in md and "`adam_layernorm`" in md
