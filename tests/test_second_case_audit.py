"""The second case of the four kinds of bug a mutation audit left alive (issue 52): a boundary no test reached (a
momentum of exactly 1.0, a step equal to the warm-up), the column beside the tested one (the pooled variances; a NaN
channel beside a large one), a property of a random stream (re-estimation batches that differ from one check to the
next) and a definition fed inputs where the wrong one gives another number (three stale points, not one: first ≠
last; odd and even channel counts, three seeds: median ≠ mean). Every expected number is a closed form written here.
Each test was seen failing on the bug its docstring names, planted by hand, then reverted."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn

from bnrotation.monitor import StalenessMonitor
from bnrotation.pooling import pooled_moments
from bnrotation.staleness import in_warmup, warmup_steps
from bnrotation.study.analysis.tables import calibration as cal
from bnrotation.study.analysis.tables import zoo_report
from test_calibration import _oos_run, _run
from test_zoo_report import E0, SEED0, _check
from test_zoo_report import _run as _zoo_run

torch.set_num_threads(1)


# ----------------------------------------------------------------------------- 1. boundaries
@pytest.mark.parametrize("momentum, steps", [(1.0, 1), (0.0, 1), (0.5, 7), (0.1, 44)])
def test_warmup_steps_at_the_ends_of_the_momentum_range(momentum, steps):
    """Momentum 1.0 replaces the running statistics at every batch (one step of warm-up, as the cumulative average's
    ``None``); 0.0 never moves them (no number of steps helps: 1, as the docstring says for m outside (0, 1)).
    Inside: ceil(ln 0.01 / ln(1 - m)): 0.5⁷ = 0.0078 < 0.01 < 0.5⁶ = 0.0156. Planted: ``0 < m <= 1`` (the
    logarithm of 0 at m = 1.0, a math domain error)."""
    assert warmup_steps([momentum]) == steps
    assert warmup_steps([momentum, None]) == steps  # None's 1 never raises a longer warm-up


def test_the_warm_up_boundary_is_one_rule_for_the_monitor_and_the_calibration():
    """The step equal to the warm-up is the first judged, in the monitor and in the calibration's recomputed
    ``warming_up`` (44 steps at momentum 0.1: ceil(ln 0.01 / ln 0.9)). Planted: the calibration's ``<=``, then
    ``in_warmup``'s ``<=``: each fails here."""
    assert in_warmup(43, 44) and not in_warmup(44, 44) and not in_warmup(0, 0)
    assert in_warmup(np.array([43, 44, 45]), 44).tolist() == [True, False, False]
    run = _run()
    run.tables["channels"] = pd.concat([run.tables["channels"].query("step == 100").assign(step=s)
                                        for s in (43, 44, 45)], ignore_index=True)
    flags = cal.log_signals(run).set_index("step")["warming_up"]
    assert flags.to_dict() == {43: True, 44: False, 45: False}
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=0.1), nn.Flatten(), nn.LazyLinear(3))
    x, y = torch.randn(32, 3, 6, 6), torch.randint(0, 3, (32,))
    net(x)
    monitor = StalenessMonitor(net, (x, y), warn=False)
    assert monitor.warmup_steps == 44
    assert [monitor(s).warming_up for s in (43, 44, 45)] == [flags[s] for s in (43, 44, 45)]


# ----------------------------------------------------------------------------- 2. the column beside
def test_pooling_a_layer_some_batches_miss_averages_its_variances_over_the_batches_that_reached_it():
    """Layer ``b`` is reached by two batches of three: its pooled mean and variance are the mean over those two,
    (2 + 4) / 2 = 3 and (1 + 7) / 2 = 4, not over all three (2 and 8/3). Planted: the variances' sum divided by
    ``len(per_batch)`` (the means' by the layers reached, as tested before)."""
    t = lambda v: torch.tensor([float(v)], dtype=torch.float64)  # noqa: E731  (C,) = (1,)
    per_batch = [{"a": (t(0), t(1)), "b": (t(2), t(1))}, {"a": (t(3), t(2))}, {"a": (t(6), t(6)), "b": (t(4), t(7))}]
    pooled = pooled_moments(per_batch)
    assert list(pooled) == ["a", "b"]
    assert [float(x) for x in pooled["a"]] == [3.0, 3.0]  # (0 + 3 + 6) / 3, (1 + 2 + 6) / 3
    assert [float(x) for x in pooled["b"]] == [3.0, 4.0]


def _offset_net(offsets_sigma: list[float], nan_channel: int | None = None) -> tuple[StalenessMonitor, nn.Module]:
    """A BatchNorm of len(offsets) channels whose running mean is ``offsets[c]`` fresh σ above the probe's fresh
    mean and whose running variance is the fresh one: per channel lag = +offsets[c], d = −offsets[c], s = 1, so
    E = |offsets[c]| (eps is in both σ alike). ``nan_channel``: that channel's running mean NaN."""
    c = len(offsets_sigma)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(c, 5))
    x = torch.randn(64, 3, 8, 8)
    monitor = StalenessMonitor(net, x, warn=False, warmup_steps=0)
    fresh = monitor(0).channels
    f_mean, f_var = fresh["fresh_mean"].to_numpy(copy=True), fresh["fresh_var"].to_numpy(copy=True)
    bn = net[1]
    mean = f_mean + np.asarray(offsets_sigma) * np.sqrt(f_var + bn.eps)
    if nan_channel is not None:
        mean[nan_channel] = math.nan
    with torch.no_grad():
        bn.running_mean.copy_(torch.from_numpy(mean))
        bn.running_var.copy_(torch.from_numpy(f_var))
    return monitor, net


def test_the_worst_channel_is_the_largest_finite_one_beside_a_nan_channel():
    """Channel 0's running mean is NaN (its lag and E NaN), channel 2 is 3σ off, the others 0.1σ: the worst channel
    is 2, in the record (:meth:`MonitorRecord.worst`) and in the layer's line (``worst_channel``), and the
    maxima are 3σ, not NaN. Planted: ``abs_lag.argmax()`` for ``worst_channel`` (torch's argmax takes NaN as the
    largest, channel 0); the record's pick over every channel with numpy's argmax."""
    monitor, _ = _offset_net([0.1, 0.1, 3.0, 0.1], nan_channel=0)
    record = monitor(1)
    layer = record.layers.iloc[0]
    assert math.isnan(record.channels["lag_sigma"].iloc[0])
    name, channel, lag = record.worst()
    assert (name, channel) == ("1", 2) and lag == pytest.approx(3.0, rel=1e-6)
    assert int(layer["worst_channel"]) == 2
    assert layer["lag_max_abs_sigma"] == pytest.approx(3.0, rel=1e-6)
    assert layer["eval_error_max_sigma"] == pytest.approx(3.0, rel=1e-6)


def test_the_calibration_reads_a_nan_channel_beside_a_large_one_as_the_monitor_does():
    """The calibration recomputes E from a run's channels: a NaN channel beside a 3σ one and a 0.1σ one gives the
    largest E 3σ and the median over the finite two, (0.1 + 3) / 2, as ``layer_measures.median_max`` does (finite
    channels only). Planted: the largest over channels taken with numpy (NaN)."""
    run = _run()
    ch = run.tables["channels"].query("step == 100").copy()
    ch = pd.concat([ch.iloc[[0]].assign(channel=c) for c in range(3)], ignore_index=True)
    ch["running_mean"] = [math.nan, 3.0, 0.1]  # fresh N(0, 1 - eps): σ = 1 exactly, so E = |offset|
    run.tables["channels"] = ch
    line = cal.log_signals(run).iloc[0]
    assert line["eval_error_max_sigma"] == pytest.approx(3.0, rel=1e-12)
    assert line["eval_error_median_sigma"] == pytest.approx(1.55, rel=1e-12)


def test_the_zoos_worst_e_passes_over_a_layer_without_e_beside_a_large_one():
    """A layer the probe did not reach logs a NaN median E; beside it a layer at 0.8σ: the run's worst E is 0.8σ.
    Planted: the largest over layers taken with numpy (NaN)."""
    e = {step: [math.nan, *values] for step, values in E0.items()}
    e[20] = [math.nan, 0.8, 0.1]
    line = zoo_report.per_run([_zoo_run("lcnet_050", "adam", 0, SEED0, e)]).iloc[0]
    assert line["worst_e"] == 0.8


# ----------------------------------------------------------------------------- 3. a random stream's property
def test_the_runners_re_estimation_batches_differ_from_one_step_to_the_next(tmp_path):
    """Drawn again at the same step they are the same (the runner and the offline diagnosis agree); at another
    step, or another seed, they are others. Planted: the stream seeded from the seed alone (the step dropped)."""
    from conftest import TOY_SIZE, run_cfg
    from bnrotation.study.task import build_task, reestimation_batches

    cfg = run_cfg(["experiment=adam", *TOY_SIZE, "scale.reestimate_batches=2"], tmp_path)
    task = build_task(cfg.task, cfg.seed)
    cpu = torch.device("cpu")
    at = {step: reestimation_batches(task, cfg, cpu, step) for step in (100, 200)}
    again = reestimation_batches(task, cfg, cpu, 100)
    assert len(at[100]) == 2 and all(torch.equal(a, b) for a, b in zip(at[100], again))
    assert not any(torch.equal(a, b) for a, b in zip(at[100], at[200]))
    assert not torch.equal(at[100][0], at[100][1])  # the batches of one step differ too


@pytest.mark.slow  # two toy zoo runs
def test_the_zoos_re_estimation_batches_differ_from_one_check_to_the_next(tmp_path, monkeypatch):
    """The zoo's truth re-estimates on batches drawn from its ``reestimate`` stream at every check: three checks,
    three different sets of batches, and again the same three in a second run of the same config. Planted: the
    stream made afresh at each check (every check re-estimated on the first check's batches)."""
    from test_zoo_runs import CHEAP, SGD, toy
    from thirdparty import import_timm

    import bnrotation.study.zoo as zoo

    import_timm()
    seen: list[list[torch.Tensor]] = []
    truth = zoo._truth
    monkeypatch.setattr(zoo, "_truth", lambda model, batches, *a: seen.append(batches) or truth(model, batches, *a))
    for root in ("a", "b"):
        zoo.run(toy(tmp_path / root, arch=CHEAP, optimizer=SGD))
    first, second = seen[:3], seen[3:]
    assert len(first) == len(second) == 3  # checks at steps 0, 2 and 4
    assert all(torch.equal(a, b) for x, y in zip(first, second) for a, b in zip(x, y))
    for i, j in ((0, 1), (1, 2), (0, 2)):
        assert not torch.equal(first[i][0], first[j][0]), (i, j)


# ----------------------------------------------------------------------------- 4. definitions
def test_lead_time_reads_the_first_stale_point_and_the_first_warning_of_several():
    """Three stale points (1100, 1200, 1300) and two warnings (1200, 1300): the lead is 1100 − 1200 = −100 (it
    warned one point late), not 1300 − 1200 (the last stale point) nor 1100 − 1300 (the last warning). Over three
    such runs with leads −100, 0 and 300 the median is 0 (the mean would be 66.7), and the median first warning
    1200 (of 1200, 1300 and 1000; the mean would be 1166.7). Planted: ``max()`` for the first stale point's
    ``min()``; the same for the first warning; the mean for the median lead; the mean for the median first
    warning."""
    alone = {"eval_error_median_sigma": 0.4}
    late = _oos_run([False, True, True, True], [False, False, True, True])
    on_time = _oos_run([False, False, False, True], [False, False, False, True], seed=1)
    early = _oos_run([False, False, False, True], [True, False, True, True], seed=2)
    t = cal.Thresholds()
    assert cal.lead_times([late], "eval_error_median_sigma", t, alone)["median_steps"] == -100.0
    lead = cal.lead_times([late, on_time, early], "eval_error_median_sigma", t, alone)
    assert lead == {"runs": 3, "warned_by": 2, "never": 0, "median_steps": 0.0, "first_warning_step": 1200.0}


def test_a_forecaster_is_early_only_before_the_first_of_several_stale_points():
    """Stale at 1100, 1200 and 1300; the forecaster warns at 1200 and 1300: after the first stale point, so not
    early (lead −100), though it warned before the last. Planted: the last stale point (``max()``)."""
    run = _oos_run([False, True, True, True], [False, False, True, True])
    got = cal.early_warning([run], "eval_error_median_sigma", 0.4)
    assert (got["runs"], got["early"], got["median_lead_steps"]) == (1, 0, -100.0)


def _layer_line(offsets: list[float]) -> pd.Series:
    monitor, _ = _offset_net(offsets)
    return monitor(1).layers.iloc[0]


def test_the_monitors_per_layer_medians_on_odd_and_even_channel_counts():
    """Three channels 0.1, 0.2 and 0.9σ off: every median is the middle one, 0.2 (the mean is 0.4). Four channels
    0.1, 0.2, 0.4 and 0.9σ: E's median is the mean of the middle two, 0.3, as numpy and pandas take it (the
    analysis recomputes it); the lag's median is torch's lower middle, 0.2 (its documented convention, since the
    first monitor; the mean is 0.4). Planted: the median turned into the mean, for E and for the lag."""
    odd = _layer_line([0.1, 0.2, 0.9])
    for col in ("lag_median_abs_sigma", "eval_error_median_sigma", "mean_shift_median_abs_sigma"):
        assert odd[col] == pytest.approx(0.2, rel=1e-6), col
    even = _layer_line([0.1, 0.2, 0.4, 0.9])
    assert even["eval_error_median_sigma"] == pytest.approx(0.3, rel=1e-6)
    assert even["mean_shift_median_abs_sigma"] == pytest.approx(0.3, rel=1e-6)
    assert even["lag_median_abs_sigma"] == pytest.approx(0.2, rel=1e-6)


@pytest.mark.parametrize("offsets, median", [([0.1, 0.2, 0.9], 0.2), ([0.1, 0.2, 0.4, 0.9], 0.3)])
def test_the_calibrations_per_layer_medians_on_odd_and_even_channel_counts(offsets, median):
    """The calibration's median over a layer's channels of |lag| and E (σ = 1 exactly, so both are the offsets):
    the middle one, or the mean of the middle two; the largest E the largest offset. Planted: the median turned
    into the mean (0.4 for both)."""
    run = _run()
    base = run.tables["channels"].query("step == 100").iloc[[0]]
    run.tables["channels"] = pd.concat([base.assign(channel=c, running_mean=o) for c, o in enumerate(offsets)],
                                       ignore_index=True)
    line = cal.log_signals(run).iloc[0]
    assert line["lag_sigma"] == pytest.approx(median, rel=1e-12)
    assert line["eval_error_median_sigma"] == pytest.approx(median, rel=1e-12)
    assert line["eval_error_max_sigma"] == pytest.approx(0.9, rel=1e-12)


def test_the_zoo_table_is_the_mean_over_three_seeds_not_the_median():
    """Three seeds whose final evaluation-mode accuracies are 0.87, 0.85 and 0.72 and CPU seconds 100, 110 and 150:
    the table gives the means, 81.3% and 120 (the medians would be 85.0% and 110), and the sample standard
    deviation, sqrt(((0.87 − m)² + (0.85 − m)² + (0.72 − m)²) / 2) = 8.1 points. Planted: the median over seeds
    for the table's mean (its middle value of three); the same for the CPU seconds."""
    third = [dict(c) for c in SEED0]
    third[-1] = _check(40, 0.80, 0.72, 0.00, False, False)
    runs = [_zoo_run("lcnet_050", "adam", s, checks, E0) for s, checks in enumerate((SEED0, SEED0, third))]
    runs[1].tables["checks"].loc[4, "acc_eval_mode"] = 0.85
    for r, cpu in zip(runs, (100.0, 110.0, 150.0)):
        r.info["timings_s"] = {"cpu": cpu}
    (line,) = [x for x in zoo_report.table_markdown(runs, "zoo").splitlines() if x.startswith("| `lcnet_050`")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    acc = np.array([0.87, 0.85, 0.72])
    assert cells[2] == "3"
    assert cells[3] == f"{100 * acc.mean():.1f}% ± {100 * acc.std(ddof=1):.1f}" == "81.3% ± 8.1"
    assert cells[-1] == "120"


def test_the_depth_table_is_the_mean_over_three_checks_not_the_median():
    """Three checks past the warm-up whose worst own median E is 0.1, 0.2 and 0.9σ (met 0.2, 0.3 and 1.3σ): the
    table's cells are the means, 0.4σ and 0.6σ (the medians would be 0.2σ and 0.3σ). Planted: the mean over
    checks turned into the median."""
    checks = [_check(0, 0.1, 0.1, 0.0, False, False, warming=True)] + [
        _check(s, 0.9, 0.9, 0.0, False, False) for s in (10, 20, 30)]
    own = {0: [5.0], 10: [0.1], 20: [0.2], 30: [0.9]}
    met = {0: [5.0], 10: [0.2], 20: [0.3], 30: [1.3]}
    text = zoo_report.depth_markdown([_zoo_run("lcnet_050", "adam", 0, checks, own, met=met)])
    (line,) = [x for x in text.splitlines() if x.startswith("| `lcnet_050`")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2:6] == ["fresh", "3", "0.4σ", "0.6σ"]
