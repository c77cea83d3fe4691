"""Running-mean lag against depth (:mod:`bnrotation.study.analysis.measures.depth`) and checks against the learning rate
(:mod:`bnrotation.study.analysis.measures.midrun`): closed forms, invariances and failures, on tables built here (no torch)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bnrotation.study.analysis.measures import depth, midrun
from bnrotation.study.analysis.results import Run


def _channels_run(lags_by_layer: list[list[float]], steps=(1900, 2000, 3000), window=(2000, 3000)) -> Run:
    """A run whose layer i (conv<i>, forward order) has lags ``lags_by_layer[i]`` (σ) over its channels at every
    step in ``steps``."""
    lines = [{"step": s, "layer": f"conv{i}", "norm_layer": f"bn{i}", "channel": c, "lag_sigma": lag}
             for s in steps for i, lags in enumerate(lags_by_layer) for c, lag in enumerate(lags)]
    return Run(Path("runs/x/seed=0"), {"row": "x", "seed": 0},
               {"scale": {"check_start": window[0], "steps": window[1]}}, {"channels": pd.DataFrame(lines)})


def test_depth_profile_has_its_closed_form_and_its_rank_correlation():
    """Layer d's channels lag ±0.1(d+1), ∓0.2(d+1), ±0.3(d+1) σ: median |lag| 0.2(d+1), worst 0.3(d+1); rho +1."""
    lags = [[0.1 * (d + 1), -0.2 * (d + 1), 0.3 * (d + 1)] for d in range(21)]
    profile = depth.layer_profile(_channels_run(lags))
    assert list(profile["depth"]) == list(range(21)) and list(profile["norm_layer"]) == [f"bn{d}" for d in range(21)]
    assert profile["lag_window_median_abs_sigma"].to_numpy() == pytest.approx(0.2 * np.arange(1, 22))
    assert profile["lag_window_max_abs_sigma"].to_numpy() == pytest.approx(0.3 * np.arange(1, 22))
    assert (profile["n"] == 2 * 3).all()  # two steps in the window (2,000 and 3,000) x three channels
    assert depth.depth_rho(profile) == pytest.approx(1.0)
    assert depth.depth_rho(depth.layer_profile(_channels_run(lags[::-1]))) == pytest.approx(-1.0)  # failure


def test_depth_profile_is_invariant_to_scale_steps_outside_the_window_and_step_order():
    rng = np.random.default_rng(0)
    lags = [list(rng.normal(size=4) * (1 + d)) for d in range(21)]
    base = depth.layer_profile(_channels_run(lags))
    scaled = depth.layer_profile(_channels_run([[7 * v for v in layer] for layer in lags]))
    assert depth.depth_rho(scaled) == pytest.approx(depth.depth_rho(base))  # ranks, not values
    run = _channels_run(lags, steps=(3000, 2000))  # steps logged in another order
    outside = run.tables["channels"].assign(step=1000, lag_sigma=100.0)  # huge lags before the window
    run.tables["channels"] = pd.concat([run.tables["channels"], outside], ignore_index=True)
    pd.testing.assert_frame_equal(depth.layer_profile(run), base)
    assert depth.layer_profile(_channels_run([[math.nan] * 2] * 3)).empty  # no running statistics: no profile
    assert depth.row_profile([]).empty


def test_row_profile_averages_seeds_layer_by_layer():
    a = _channels_run([[0.1], [0.2], [0.3]])
    b = _channels_run([[0.3], [0.2], [0.1]])
    b.info = {"row": "x", "seed": 1}
    profile = depth.row_profile([a, b])
    assert profile["lag_window_median_abs_sigma"].to_numpy() == pytest.approx([0.2, 0.2, 0.2])
    assert profile["median_sd"].to_numpy() == pytest.approx([math.sqrt(0.02), 0.0, math.sqrt(0.02)])
    assert list(profile["seeds"]) == [2, 2, 2] and math.isnan(depth.depth_rho(profile))  # a constant profile
    assert depth.short_name("layer3.0.shortcut.1") == "3.0.sc" and depth.short_name("bn1") == "bn1"


def _checks_run(lr: list[float], acc: list[float]) -> Run:
    steps = [2000 + 100 * i for i in range(len(lr))]
    checks = pd.DataFrame({"step": steps, "lr": lr, "acc_eval_mode": acc, "acc_train_mode": 1.0})
    return Run(Path("runs/x/seed=0"), {"row": "x", "seed": 0}, {"scale": {"check_start": 2000, "steps": steps[-1]}},
               {"checks": checks})


def test_rate_halves_split_at_the_median_rate():
    halves = midrun.rate_halves(_checks_run([1.0, 0.75, 0.5, 0.25, 0.0], [0.5, 0.6, 0.7, 0.9, 1.0]))
    assert halves["acc_high"] == pytest.approx(0.55) and halves["acc_low"] == pytest.approx(0.95)
    assert (halves["n_high"], halves["n_low"], halves["failing_high"], halves["failing_low"]) == (2, 2, 2, 0)
    assert halves["lr_median"] == 0.5 and halves["rho_lr_acc"] == pytest.approx(-1.0)
    constant = midrun.rate_halves(_checks_run([3e-3] * 4, [0.5, 0.6, 0.7, 0.9]))  # nothing to split
    assert constant["n_high"] == constant["n_low"] == 0 and math.isnan(constant["acc_high"])
    assert math.isnan(constant["rho_lr_acc"])
