"""The condition map's predictions (bnrotation.study.analysis.claims.condition_map): NOT RUN without the map's runs,
PASS when the collapse is deeper where the prediction says, FAIL (with its reason) when it is not, on map run folders
built here (tests/test_map_report.py's builder)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from bnrotation.study.analysis.claims import condition_map as cm
from bnrotation.study.analysis.claims.evidence import Evidence
from bnrotation.study.analysis.claims.kinds import FAIL, MAP, NOT_RUN, PASS
from bnrotation.study.analysis.claims.registry import CLAIMS
from test_map_report import _diverge, write_map_run, write_point


def evidence(root: Path) -> Evidence:
    return Evidence(root, [], pd.DataFrame(columns=["row", "seed"]))


def claim(name: str):
    return next(c for c in CLAIMS if c.name == name)


def test_every_prediction_is_in_the_registry_in_the_maps_section_and_names_a_knob_of_the_map():
    names = {c.name for c in CLAIMS if c.section == MAP}
    assert names == {p.name for p in cm.PREDICTIONS} | {"map_reference_points_keep_their_behaviour"}
    knobs = {p.knob for p in cm.PREDICTIONS}
    assert knobs == {k.name for k in cm.KNOBS}  # one prediction per knob of the map
    for p in cm.PREDICTIONS:
        assert p.deeper != p.shallower
        assert all(s is None or s in p.turned.settings for s in (p.deeper, p.shallower))


@pytest.mark.parametrize("name", [p.name for p in cm.PREDICTIONS] + ["map_reference_points_keep_their_behaviour"])
def test_without_the_maps_runs_every_check_is_not_run(tmp_path, name):
    check = claim(name).check(evidence(tmp_path))
    assert check.verdict == NOT_RUN and check.measured.startswith("runs of both rows: 0 of 3 seeds at ")


SNR = "map_low_snr_deepens_the_collapse"  # deeper at template_scale 0.15 than at 1.2


@pytest.mark.parametrize("adam_low, expected", [
    (0.70, PASS),   # deeper at 0.15: Adam 29 points below SGD there, 0.5 at 1.2
    (0.985, FAIL),  # the same at both ends: no direction
])
def test_a_prediction_passes_only_when_the_collapse_moves_its_way(tmp_path, adam_low, expected):
    write_point(tmp_path / "map", "noisy_templates", "template_scale", 0.15, sgd=0.99, adam=adam_low)
    write_point(tmp_path / "map", "noisy_templates", "template_scale", 1.2, sgd=0.99, adam=0.985)
    check = claim(SNR).check(evidence(tmp_path))
    assert check.verdict == expected
    fails = "Fails on: Adam's deficit to SGD and Adam's mode gap not deeper at 0.15"
    assert (fails in check.note) is (expected == FAIL)
    assert "If the templates' low signal-to-noise ratio is the cause" in check.note


def test_a_prediction_against_the_tasks_own_setting_reads_its_reference_point(tmp_path):
    """Fashion-MNIST's pixel noise: deeper at 2.0 than at its own setting (0, the reference point); the deficit moves
    but the mode gap does not (Adam's training mode falls with its evaluation mode), so it fails on the gap alone."""
    root = tmp_path / "map"
    write_point(root, "fashion_mnist", None, None, sgd=0.86, adam=0.855)
    write_point(root, "fashion_mnist", "pixel_noise", 2.0, sgd=0.80, adam=0.70, adam_train=0.70)
    check = claim("map_pixel_noise_brings_the_collapse_to_real_images").check(evidence(tmp_path))
    assert check.verdict == FAIL and "Fails on: Adam's mode gap not deeper at 2" in check.note
    assert "its own setting (0)" in check.measured
    size = claim("map_a_small_real_set_deepens_the_collapse").check(evidence(tmp_path))
    assert size.verdict == NOT_RUN
    assert size.measured == "runs of both rows: 0 of 3 seeds at 1,000 of `task.train_size` on fashion_mnist"
    assert "deeper at 1,000 than at its own setting (all 60,000 images)" in size.claim


def test_the_reference_points_must_keep_their_tasks_behaviour(tmp_path):
    root = tmp_path / "map"
    write_point(root, "noisy_templates", None, None, sgd=0.99, adam=0.80)
    write_point(root, "fashion_mnist", None, None, sgd=0.86, adam=0.855)
    assert claim("map_reference_points_keep_their_behaviour").check(evidence(tmp_path)).verdict == PASS
    other = tmp_path / "other"
    write_point(other / "map", "noisy_templates", None, None, sgd=0.99, adam=0.97)  # the shorter run shows no collapse
    write_point(other / "map", "fashion_mnist", None, None, sgd=0.86, adam=0.855)
    assert claim("map_reference_points_keep_their_behaviour").check(evidence(other)).verdict == FAIL


@pytest.mark.parametrize("name, points", [
    (SNR, [("noisy_templates", "template_scale", 0.15, 0.70), ("noisy_templates", "template_scale", 1.2, 0.985)]),
    ("map_reference_points_keep_their_behaviour",
     [("noisy_templates", None, None, 0.80), ("fashion_mnist", None, None, 0.855)]),
])
def test_a_check_waits_for_every_seed_at_both_ends(tmp_path, name, points):
    """A map committed in batches: with one end a seed short (both rows of seeds 0 and 1 in, seed 2 not), the check
    is NOT RUN and says how many seeds are in; the last seed in, it is judged. A verdict from two of three seeds
    could flip when the third lands."""
    root = tmp_path / "map"
    (task, knob, setting, adam), (task2, knob2, setting2, adam2) = points
    write_point(root, task, knob, setting, sgd=0.99, adam=adam)
    write_point(root, task2, knob2, setting2, sgd=0.99 if task2 == "noisy_templates" else 0.86, adam=adam2,
                seeds=(0, 1))
    check = claim(name).check(evidence(tmp_path))
    assert check.verdict == NOT_RUN and "2 of 3 seeds" in check.measured, check.measured
    write_point(root, task2, knob2, setting2, sgd=0.99 if task2 == "noisy_templates" else 0.86, adam=adam2,
                seeds=(2,))
    assert claim(name).check(evidence(tmp_path)).verdict == PASS


def test_a_diverged_run_at_an_end_is_left_out_named_and_does_not_hold_the_check_back(tmp_path):
    """Adam seed 2 at template_scale 1.2 diverged (its one check kept, at 0.2): the check is judged on the other two
    seeds (PASS: with the run averaged in, 1.2 would look deeper than it is and the verdict turn FAIL) and its note
    names the run."""
    root = tmp_path / "map"
    write_point(root, "noisy_templates", "template_scale", 0.15, sgd=0.99, adam=0.70)
    write_point(root, "noisy_templates", "template_scale", 1.2, sgd=0.99, adam=0.985, seeds=(0, 1))
    write_map_run(root, "sgd", 2, knob="template_scale", setting=1.2, acc_eval=0.99)
    _diverge(write_map_run(root, "adam", 2, knob="template_scale", setting=1.2, acc_eval=0.2), 250)
    check = claim(SNR).check(evidence(tmp_path))
    assert check.verdict == PASS, check.measured
    assert "Diverged, and left out: Adam seed 2 (step 250) at 1.2." in check.note
    assert "Adam's mode gap 1.6 ± 0.1 points (n = 2 seeds)" in check.measured


def test_a_fail_where_both_optimizers_are_stale_says_so_in_points(tmp_path):
    """The templates' low SNR as measured: at 0.15 SGD's evaluation mode falls below Adam's (the deficit fails) while
    both mode gaps are large; the note says so, in points, and not at 1.2 where neither gaps."""
    write_point(tmp_path / "map", "noisy_templates", "template_scale", 0.15, sgd=0.35, adam=0.40)
    write_point(tmp_path / "map", "noisy_templates", "template_scale", 1.2, sgd=0.99, adam=0.985)
    check = claim(SNR).check(evidence(tmp_path))
    assert check.verdict == FAIL and "Fails on: Adam's deficit to SGD not deeper at 0.15" in check.note
    assert "Adam's deficit to SGD (SGD's evaluation-mode accuracy − Adam's, paired by seed) -5.5 points" in check.note
    assert "Adam's mode gap +58.5 points against 2 · SE = " in check.note
    assert "At 0.15 both optimizers lose to stale statistics: SGD's mode gap 65.0 points, Adam's 60.0" in check.note
    assert "At 1.2 both" not in check.note


def test_a_pass_where_both_optimizers_are_stale_names_it_without_calling_the_effect_shared(tmp_path):
    """20 classes as measured: Adam far below SGD while SGD's own mode gap passes the floor too; the prediction
    passes and the note says both are stale, without the FAIL's 'not Adam's alone'."""
    root = tmp_path / "map"
    write_point(root, "noisy_templates", "num_classes", 20, sgd=0.89, adam=0.30)
    write_point(root, "noisy_templates", "num_classes", 2, sgd=1.0, adam=0.99)
    check = claim("map_more_classes_deepen_the_collapse").check(evidence(tmp_path))
    assert check.verdict == PASS
    assert "At 20 both optimizers lose to stale statistics: SGD's mode gap 11.0 points, Adam's 70.0" in check.note
    assert "not Adam's alone" not in check.note
