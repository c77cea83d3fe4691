"""The monitor's warning rule on the runs' checks (results/monitor.md), on tables with known answers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bnrotation.study.analysis.results import Run
from bnrotation.study.analysis.tables import monitor_report
from bnrotation.study.analysis.tables.monitor_report import (ALL, check_signals, classify, rule_fires, threshold_table,
                                                       to_markdown, write_monitor)

CONFIG = {"scale": {"check_start": 2000, "steps": 2300, "log_every": 100, "heldout_size": 4000},
          "task": {"probe_size": 512}}
# step: (evaluation-mode accuracy, worst layer's median |lag| in σ). Training mode is 100% at every check.
# 1900 lies before the check window; 2250 is a check without a log step (no lag): both are left out.
CHECKS = {1900: (0.10, 5.0),
          2000: (0.50, 0.30),  # failing, caught by the default rule
          2100: (0.85, 0.12),  # failing, missed at lag >= 0.25, caught at lag >= 0.1 (the default)
          2200: (0.93, 0.30),  # passing with a gap of 0.07: a false alarm of the default rule
          2250: (0.10, None),
          2300: (0.98, 0.60)}  # passing with a gap of 0.02: fires only with a gap threshold <= 0.02


def _run(row: str, seed: int, checks: dict = CHECKS, norm: bool = True, status: str = "done") -> Run:
    """bn1's channels have |lag| (lag, lag, lag) and bn2's (lag/2, 3 lag, lag/4): medians lag and lag/2, so
    bn1 is the worst layer at every step, with the listed lag."""
    check_lines, channel_lines = [], []
    for step, (acc, lag) in checks.items():
        check_lines.append({"row": row, "seed": seed, "step": step, "acc_train_mode": 1.0, "acc_eval_mode": acc})
        if lag is None:
            continue
        for layer, values in (("bn1", (lag, -lag, lag)), ("bn2", (lag / 2, -3 * lag, lag / 4))):
            for c, v in enumerate(values):
                channel_lines.append({"row": row, "seed": seed, "step": step, "layer": layer.replace("bn", "conv"),
                                      "norm_layer": layer, "channel": c, "lag_sigma": v if norm else math.nan})
    return Run(Path(f"runs/{row}/seed={seed}"), {"row": row, "seed": seed, "status": status}, CONFIG,
               {"checks": pd.DataFrame(check_lines), "channels": pd.DataFrame(channel_lines)})


def test_one_runs_signals_are_the_window_checks_with_a_log_step():
    s = check_signals(_run("adam", 0))
    assert s["step"].tolist() == [2000, 2100, 2200, 2300]
    assert s["mode_gap"].to_numpy() == pytest.approx([0.50, 0.15, 0.07, 0.02])
    assert s["lag_sigma"].to_numpy() == pytest.approx([0.30, 0.12, 0.30, 0.60])
    assert (s["lag_layer"] == "bn1").all() and s["failing"].tolist() == [True, True, False, False]


def test_the_worst_layer_is_the_one_with_the_largest_median_not_the_largest_channel():
    checks = {2000: (0.5, 0.2)}
    run = _run("adam", 0, checks)
    ch = run.tables["channels"]
    ch.loc[ch["norm_layer"] == "bn2", "lag_sigma"] = [0.3, -0.4, 0.0]  # median 0.3 > bn1's 0.2; bn1's max 0.2
    s = check_signals(run).iloc[0]
    assert s["lag_layer"] == "bn2" and s["lag_sigma"] == pytest.approx(0.3)


def test_rates_per_row_and_over_all_rows():
    runs = [_run("adam", 0), _run("adam", 1), _run("sgd", 0, {2000: (0.95, 0.01), 2100: (0.80, 0.26)}),
            _run("adam_groupnorm", 0, norm=False), _run("adamw", 0, status="diverged")]
    table = threshold_table(runs).set_index(["mode_gap", "lag_sigma", "row"])
    adam = table.loc[(0.05, 0.25, "adam")]
    assert (adam["failing"], adam["caught"], adam["passing"], adam["false_alarms"]) == (4, 2, 4, 2)
    assert adam["tpr"] == 0.5 and adam["fpr"] == 0.5 and adam["seeds"] == "0,1"
    every = table.loc[(0.05, 0.25, ALL)]  # adam's two seeds and sgd; groupnorm (no lag) and the diverged run out
    assert (every["failing"], every["caught"], every["passing"], every["false_alarms"]) == (5, 3, 5, 2)
    assert table.loc[(0.05, 0.1, ALL), "caught"] == 5  # the 2100 checks at 0.12σ join
    assert table.loc[(0.02, 0.5, "adam"), "false_alarms"] == 2  # the 2300 checks: gap 0.02, lag 0.6
    assert table.loc[(0.05, 0.5, "adam"), "false_alarms"] == 0
    assert table.loc[(0.0, 0.0, ALL), "tpr"] == 1.0 and table.loc[(0.0, 0.0, ALL), "fpr"] == 1.0
    assert set(table.index.get_level_values("row")) == {"adam", "sgd", ALL}
    no_failing = classify(check_signals(_run("adam", 0, {2200: (0.95, 0.3)})), 0.05, 0.25)
    assert math.isnan(no_failing["tpr"]) and no_failing["fpr"] == 1.0


def test_the_rule_fires_at_its_thresholds_and_never_on_nan():
    assert rule_fires(0.25, 0.5, 0.25, 0.5)  # exactly at both (representable values)
    assert not rule_fires(0.25, 0.5, 0.25, 0.5000001) and not rule_fires(0.2499999, 0.5, 0.25, 0.5)
    assert not rule_fires(math.nan, 9.0, 0.0, 0.0) and not rule_fires(1.0, math.nan, 0.0, 0.0)
    got = rule_fires(np.array([0.1, 0.1, 0.0]), np.array([0.3, 0.2, 0.3]), 0.05, 0.25)
    assert got.tolist() == [True, False, False]


def test_the_rule_and_its_defaults_are_the_monitors():
    from bnrotation.monitor import Thresholds
    default = Thresholds()
    assert (monitor_report.DEFAULT_MODE_GAP, monitor_report.DEFAULT_LAG_SIGMA) == (default.mode_gap, default.lag_sigma)
    values = (0.0, 0.049, 0.05, 0.1, 0.25, 0.3, math.nan)
    for t in (default, Thresholds(mode_gap=0.1, lag_sigma=0.1)):
        for gap in values:
            for lag in values:
                assert rule_fires(gap, lag, t.mode_gap, t.lag_sigma) == t.crossed(gap, lag), (t, gap, lag)


def test_the_report_states_the_counts_the_grid_and_what_was_left_out(tmp_path):
    runs = [_run("adam", 0), _run("adam_groupnorm", 0, norm=False)]
    path = write_monitor(runs, tmp_path, Path("results"))
    md = path.read_text()
    assert path == tmp_path / "monitor.md"
    assert "| Adam, lr 3e-3 (`adam`) | 0 | 2/2 (100%) | 1/2 (50%) |" in md
    assert "| **All rows** |  | 2/2 (100%) | 1/2 (50%) |" in md
    assert ("| gap ≥ 0.05 | 100% (2) / 50% (1) | **100% (2) / 50% (1)** | 50% (1) / 50% (1) | 0% (0) / 0% (0) | "
            "0% (0) / 0% (0) |") in md
    assert ("| lag alone | 100% (2) / 100% (2) | 100% (2) / 100% (2) | 50% (1) / 100% (2) | 0% (0) / 50% (1) | "
            "0% (0) / 0% (0) |") in md
    assert "held-out set (4,000 samples)" in md and "probe set (512 samples)" in md
    assert "every failing check has a gap of at least 0.150, so the gap threshold (0.05) holds" in md
    assert "(left out): adam_groupnorm seed=0." in md
    empty = to_markdown(pd.DataFrame(), pd.DataFrame(), ["adam_layernorm seed=0"], [], Path("results"))
    assert "nothing to classify" in empty and "adam_layernorm seed=0" in empty
