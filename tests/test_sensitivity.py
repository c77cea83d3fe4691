"""What stale statistics cost, layer by layer (tables/sensitivity.py), on runs built by hand where a wrong
definition gives another cell: a layer swap that helps against one that does not, a check and an intervention
outside the window, a run that stops short of the window, an exact layer (E = 0), seeds that disagree."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bnrotation.study.analysis.results import Run
from bnrotation.study.analysis.tables import sensitivity as sens

LAYERS = ("bn1", "bn2")


def make_run(seed: int, *, shift: dict, swap_gain: dict, acc_eval: float = 0.7, last: int = 3000) -> Run:
    """A run whose running means sit ``shift[layer]`` running σ from the fresh ones (variances equal, eps 0: E is the
    shift), whose ``layer`` interventions win ``swap_gain[layer]`` over the stored statistics inside the window,
    with a check and an intervention at step 3,500 that say otherwise (outside the window)."""
    steps = [s for s in range(2000, last + 1, 500)] + ([3500] if last >= 3500 else [])
    ch, iv, checks = [], [], []
    for step in steps:
        outside = step > sens.WINDOW[1]
        for layer in LAYERS:
            for c in range(3):  # three channels: an odd count, so the median is a channel's own
                ch.append({"step": step, "norm_layer": layer, "channel": c, "running_mean": 0.0,
                           "running_var": 1.0, "fresh_mean": 5.0 if outside else shift[layer], "fresh_var": 1.0})
            iv.append({"step": step, "intervention": "layer", "norm_layer": layer,
                       "acc_eval_mode": acc_eval + (0.0 if outside else swap_gain[layer])})
        iv.append({"step": step, "intervention": "none", "norm_layer": "", "acc_eval_mode": acc_eval})
        checks.append({"step": step, "acc_train_mode": 1.0, "acc_eval_mode": 0.1 if outside else acc_eval})
    info = {"row": "adam", "seed": seed, "norm_layers": {layer: {"eps": 0.0} for layer in LAYERS}}
    return Run(Path(f"/nowhere/seed={seed}"), info, {}, {"channels": pd.DataFrame(ch),
                                                          "interventions": pd.DataFrame(iv),
                                                          "checks": pd.DataFrame(checks)})


def test_a_layers_cost_is_what_swapping_it_alone_wins_back_inside_the_window():
    run = make_run(0, shift={"bn1": 0.2, "bn2": 0.05}, swap_gain={"bn1": 0.1, "bn2": 0.0}, last=3500)
    got = sens.layer_costs(run).set_index("norm_layer")
    assert got.loc["bn1", "e"] == pytest.approx(0.2) and got.loc["bn2", "e"] == pytest.approx(0.05)
    assert got.loc["bn1", "cost"] == pytest.approx(0.1) and got.loc["bn2", "cost"] == pytest.approx(0.0)
    assert got.loc["bn1", "cost_per_e"] == pytest.approx(0.5)
    assert got["mode_gap"].tolist() == pytest.approx([0.3, 0.3])  # the window's checks, not step 3,500's


def test_an_exact_layer_has_no_sensitivity_to_measure():
    run = make_run(0, shift={"bn1": 0.0, "bn2": 0.1}, swap_gain={"bn1": 0.0, "bn2": 0.02})
    got = sens.layer_costs(run).set_index("norm_layer")
    assert math.isnan(got.loc["bn1", "cost_per_e"]) and got.loc["bn2", "cost_per_e"] == pytest.approx(0.2)


def test_the_table_counts_only_runs_that_reach_the_windows_end_and_gives_the_spread_over_seeds():
    runs = {("noisy_templates", "adam"): [
        make_run(0, shift={"bn1": 0.1, "bn2": 0.1}, swap_gain={"bn1": 0.1, "bn2": 0.0}),
        make_run(1, shift={"bn1": 0.1, "bn2": 0.1}, swap_gain={"bn1": 0.3, "bn2": 0.0}),
        make_run(2, shift={"bn1": 9.0, "bn2": 9.0}, swap_gain={"bn1": 0.9, "bn2": 0.9}, last=2500)]}  # stops short
    table = sens.sensitivity_table(runs).set_index("norm_layer")
    assert table.loc["bn1", "n"] == 2 and table.loc["bn1", "seeds"] == "0, 1"
    assert table.loc["bn1", "cost"] == pytest.approx(0.2)
    assert table.loc["bn1", "cost_sd"] == pytest.approx(np.std([0.1, 0.3], ddof=1))
    assert sens.sensitivity_table({}).empty


def _two_tasks(templates_gain: tuple, fmnist_gain: tuple) -> pd.DataFrame:
    runs = {}
    for task, gains in (("noisy_templates", templates_gain), ("fashion_mnist", fmnist_gain)):
        runs[(task, "adam")] = [make_run(s, shift={"bn1": 0.1, "bn2": 0.1}, swap_gain={"bn1": g1, "bn2": g2})
                                for s, (g1, g2) in enumerate(gains)]
    return sens.sensitivity_table(runs)


def test_the_layer_where_the_tasks_differ_is_the_one_beyond_two_standard_errors():
    # bn2 differs (0.20 against 0.02, seeds that agree); bn1 differs more in ratio, but its seeds disagree.
    table = _two_tasks(((0.001, 0.20), (0.2, 0.21), (0.0, 0.19)), ((0.0001, 0.02), (0.0001, 0.021), (0.0001, 0.019)))
    got = sens.where_tasks_differ(table)
    assert got["norm_layer"] == "bn2" and got["difference"] == pytest.approx(1.8)
    words = sens.sentence(table)
    assert "bn2" in words and len(words.split()) <= 30
    same = _two_tasks(((0.1, 0.1), (0.12, 0.1)), ((0.1, 0.1), (0.12, 0.1)))
    assert sens.where_tasks_differ(same) is None
    assert "no layer" in sens.sentence(same) and len(sens.sentence(same).split()) <= 30
    # a difference, but within two standard errors (seeds that disagree): not named
    close = _two_tasks(((0.1, 0.1), (0.3, 0.1)), ((0.1, 0.1), (0.2, 0.1)))
    assert sens.where_tasks_differ(close) is None


def test_the_markdown_rounds_once_and_never_prints_minus_zero():
    table = _two_tasks(((-0.00001, 0.2), (0.00001, 0.2)), ((0.0, 0.02), (0.0, 0.02)))
    text = sens.markdown(table)
    assert "-0.0" not in text and "| templates | adam | bn2 | 2 (0, 1) | 0.100 ± 0.000 | 20.0 ± 0.0 |" in text
