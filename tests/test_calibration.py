"""The calibration of the monitor's rule (bnrotation.study.analysis.tables.calibration): the method, the scores, the
in-sample rule, the signals recomputed from a run's tables; and, on the committed runs, that ``Thresholds()``
holds the method's in-sample choices and that ``calibration.md`` is what ``make calibrate`` writes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bnrotation.study.analysis.results import Run
from bnrotation.study.analysis.tables import calibration as cal
from bnrotation.staleness import Thresholds, channel_signals

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = Path("results/reference")


# ----------------------------------------------------------------------------- the method
def test_choose_threshold_takes_the_fewest_false_alarms_at_the_target_recall():
    stale = np.array([True] * 10 + [False] * 4)
    values = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0.5, 1.5, 2.5, 11.0])
    # recall >= 0.9 allows thresholds up to 2 (9 of 10 stale values >= 2), with 2 false alarms there (2.5, 11)
    assert cal.choose_threshold(values, stale, target=0.9) == 2.0
    # a target of 1.0 forces the threshold down to 1, which adds the alarm at 1.5
    assert cal.choose_threshold(values, stale, target=1.0) == 1.0


def test_choose_threshold_breaks_a_tie_towards_the_higher_recall_and_rounds_down():
    stale = np.array([True, True, True, False])
    values = np.array([0.0713, 0.0789, 0.5, 0.01])  # every threshold in (0.01, 0.0713] has no false alarm
    assert cal.choose_threshold(values, stale, target=0.6) == 0.071  # 0.0713 -> two significant figures, down
    with pytest.raises(ValueError, match="no stale point"):
        cal.choose_threshold(values, np.zeros(4, bool))
    with pytest.raises(ValueError, match="no threshold reaches"):
        cal.choose_threshold(np.array([np.nan, np.nan, 1.0, 0.0]), stale, target=0.9)  # NaN never warns


def test_score_counts():
    s = cal.score([True, False, True, True], [True, True, False, False])
    assert (s["stale"], s["caught"], s["fresh"], s["false_alarms"]) == (2, 1, 2, 2)
    assert s["recall"] == 0.5 and s["far"] == 1.0
    assert math.isnan(cal.score([False], [False])["recall"])
    # the second case: warnings and truth as 0/1 numbers (a float column, an int one) count as the truth values
    assert cal.score(np.array([1.0, 0.0, 1.0, 1.0]), np.array([1, 1, 0, 0])) == s


# ----------------------------------------------------------------------------- which runs, and what they hold
def _run(row: str = "adam", task: dict | None = None, eps: float = 1e-5, momentum: float = 0.1) -> Run:
    """A run of one BatchNorm layer of two channels, logged at steps 0, 100, 200, with one intervention point at
    200 (stale: re-estimation recovers 30 points) and one at 100 (fresh)."""
    info = {"row": row, "seed": 0, "status": "done",
            "norm_layers": {"bn": {"class": "BatchNorm2d", "momentum": momentum, "eps": eps,
                                   "track_running_stats": True}}}
    config = {"task": task if task is not None else {"template_scale": 0.6}, "scale": {"check_start": 100}}
    steps = np.repeat([0, 100, 200], 2)
    shift = np.where(steps == 200, 0.5, 0.01)  # the running mean 0.5σ off at step 200
    channels = pd.DataFrame({"step": steps, "norm_layer": "bn", "channel": np.tile([0, 1], 3),
                             "running_mean": shift, "running_var": 1.0 - eps, "fresh_mean": 0.0,
                             "fresh_var": 1.0 - eps})
    checks = pd.DataFrame({"step": [100, 200], "acc_train_mode": [1.0, 1.0], "acc_eval_mode": [0.99, 0.7]})
    iv = pd.DataFrame({"step": [100, 100, 200, 200], "intervention": ["none", "reestimate"] * 2,
                       "acc_eval_mode": [0.99, 1.0, 0.7, 1.0]})
    return Run(Path(f"/nowhere/{row}"), info, config, {"channels": channels, "checks": checks, "interventions": iv})


def test_in_sample_is_the_synthetic_task_and_never_a_fashion_mnist_row():
    assert cal.in_sample(_run())
    assert not cal.in_sample(_run(task={"name": "fashion_mnist"}))
    assert not cal.in_sample(_run(row="fmnist_adam"))  # by name, even with a synthetic-looking config
    assert cal.task_of(_run(task={"name": "noisy_templates"})) == cal.IN_SAMPLE_TASK
    assert cal.task_of(_run(task={})) == "unknown"


def test_signals_and_truth_from_a_runs_tables():
    run = _run()
    sig = cal.log_signals(run).set_index("step")
    # σ = sqrt(var + eps) = 1 exactly: d = -0.5, s = 1, E = 0.5 at step 200
    assert sig.loc[200, "eval_error_median_sigma"] == pytest.approx(0.5, rel=1e-12)
    assert sig.loc[200, "lag_sigma"] == pytest.approx(0.5, rel=1e-12)
    # the held-out gap is the reference line; the probe gap is what ships, and this run logged none
    assert sig.loc[200, "heldout_mode_gap"] == pytest.approx(0.3) and math.isnan(sig.loc[0, "heldout_mode_gap"])
    assert sig["mode_gap"].isna().all()
    assert sig.loc[0, "warming_up"] and not sig.loc[100, "warming_up"]  # 44 steps at momentum 0.1
    want = channel_signals(0.01, 1.0 - 1e-5, 0.0, 1.0 - 1e-5, 1e-5).eval_error_sigma
    assert sig.loc[100, "eval_error_max_sigma"] == pytest.approx(want, rel=1e-12)
    t = cal.truth(run).set_index("step")
    assert t.loc[200, "stale"] and not t.loc[100, "stale"]
    assert t.loc[100, "recovery"] == pytest.approx(0.01)


def test_the_rule_as_it_ships_reads_the_probe_gap_never_the_held_out_one():
    """Issue 48: a run that logged the monitor's probe gap is scored on it. The two gaps differ here, so the wrong
    one gives another verdict: held-out 0.3 at step 200 (the truth's own), probe 0.02 (below the 0.05 threshold)."""
    run = _run()
    run.tables["checks"] = run.tables["checks"].assign(mode_gap=[0.0, 0.02], mode_agreement=[1.0, 0.9])
    sig = cal.log_signals(run).set_index("step")
    assert sig.loc[200, "mode_gap"] == pytest.approx(0.02) and sig.loc[200, "heldout_mode_gap"] == pytest.approx(0.3)
    t = Thresholds()
    shipped = cal.score_of([run], cal.RULE, t)
    reference = cal.score_of([run], cal.RULE_HELDOUT, t)
    assert (shipped["stale"], shipped["caught"]) == (1, 0)  # the probe gap is below the threshold: a miss
    assert (reference["stale"], reference["caught"]) == (1, 1)
    assert sig.loc[200, "probe_disagreement"] == pytest.approx(0.1)
    # a run that logged no probe gap is left out of the shipped rule's score, not counted as a miss
    assert cal.score_of([_run()], cal.RULE, t)["stale"] == 0 and cal.score_of([_run()], cal.RULE_HELDOUT, t)["stale"]


def test_the_forecasters_signals_from_a_runs_tables():
    """E's slope between calls (σ per 100 steps) and the rotation within the running statistics' memory
    (rotation per step × 1/momentum): at momentum 0.1 the memory is 10 steps, so 3°/100 steps is 0.3°; the worst
    of two layers is read, not the first."""
    run = _run()
    run.tables["layers"] = pd.DataFrame({"step": [0, 0, 100, 100, 200, 200], "norm_layer": "bn",
                                         "rotation_deg_per_100": [np.nan, np.nan, 1.0, 3.0, 2.0, 0.5]})
    run.info["norm_layers"]["bn2"] = run.info["norm_layers"]["bn"]
    run.tables["layers"]["norm_layer"] = ["bn", "bn2"] * 3
    sig = cal.log_signals(run).set_index("step")
    e100, e200 = sig.loc[100, "eval_error_median_sigma"], sig.loc[200, "eval_error_median_sigma"]
    assert sig.loc[200, "e_slope_per_100"] == pytest.approx(e200 - e100, rel=1e-12)
    assert math.isnan(sig.loc[0, "e_slope_per_100"])
    assert sig.loc[100, "rotation_in_memory_deg"] == pytest.approx(0.3) and sig.loc[200, "rotation_in_memory_deg"] == \
        pytest.approx(0.2)


def test_a_forecasters_threshold_holds_false_alarms_and_early_means_before_the_first_stale_point():
    # fresh values 0..19 (20 points): at most 5% may warn, so one: t = 19; stale values do not move it
    values, stale = np.r_[np.arange(20.0), 30.0, 5.0], np.r_[np.zeros(20, bool), True, True]
    assert cal.forecast_threshold(values, stale, 0.05) == 19.0
    assert cal.forecast_threshold(values, stale, 0.10) == 18.0  # the second case: two may warn
    assert cal.forecast_threshold([0.0123, 0.5], [False, True], 0.0) == pytest.approx(0.5)
    assert cal._round_up(0.01231) == 0.013 and cal._round_up(0.013) == 0.013
    run = _run()  # stale at 200, fresh at 100
    run.tables["checks"] = run.tables["checks"].assign(mode_agreement=[0.7, 0.2])
    early = cal.early_warning([run], "probe_disagreement", 0.25)  # warns at 100 (0.3) and 200 (0.8)
    assert (early["runs"], early["early"], early["median_lead_steps"]) == (1, 1, 100.0)
    assert (early["fresh"], early["false_alarms"]) == (1, 1)
    late = cal.early_warning([run], "probe_disagreement", 0.5)  # warns at 200 only: on time, not early
    assert (late["early"], late["median_lead_steps"], late["false_alarms"]) == (0, 0.0, 0)


def test_a_run_without_norm_layers_in_its_run_json_is_refused_by_name():
    run = _run()
    del run.info["norm_layers"]
    with pytest.raises(cal.BadRunError, match="run.json: no norm_layers"):
        cal.log_signals(run)


def test_lead_time_is_the_first_stale_point_minus_the_first_warning():
    run = _run()
    t = Thresholds()
    lead = cal.lead_times([run], "eval_error_median_sigma", t, {"eval_error_median_sigma": 0.4})
    assert lead == {"runs": 1, "warned_by": 1, "never": 0, "median_steps": 0.0, "first_warning_step": 200.0}
    early = cal.lead_times([run], "eval_error_median_sigma", t, {"eval_error_median_sigma": 0.005})
    assert early["median_steps"] == 100.0  # warns at 100 (step 0 is in the warm-up)
    assert cal.lead_times([run], "eval_error_median_sigma", t, {"eval_error_median_sigma": 9.0})["never"] == 1


# ----------------------------------------------------------------------------- on the committed runs
@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("calibration")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)  # the roots' names are part of the report, as make writes it
        return cal.write_calibration(REFERENCE, cal.out_of_sample_roots(REFERENCE), out)


def test_the_committed_thresholds_are_the_methods_in_sample_choices(written):
    runs, _ = cal.load_calibration_runs([ROOT / REFERENCE], cal.in_sample)
    chosen = cal.chosen_thresholds(cal.points(runs))
    t = Thresholds()
    # the gap threshold was chosen on the held-out gap, the only one the synthetic runs logged
    assert (t.mode_gap, t.eval_error_sigma) == (chosen[cal.HELDOUT_GAP.column], chosen["eval_error_median_sigma"])
    assert math.isnan(chosen["mode_gap"])


def test_calibration_md_is_what_make_calibrate_writes(written):
    got, want = written.read_text(), (ROOT / REFERENCE / "calibration.md").read_text()
    assert got == want, "rerun `make calibrate`"


# ----------------------------------------------------------------------------- the out-of-sample claims
def _oos_run(stale: list[bool], warn: list[bool], gap: list[float] | None = None, seed: int = 0) -> Run:
    """A Fashion-MNIST-like run (out of sample by its task) with one intervention point per entry: stale points
    recover 30 points; ``warn`` puts its running mean 0.5σ off (E = 0.5) there, else exactly on (E = 0); the
    held-out gap is ``gap`` (default the recovery)."""
    n = len(stale)
    steps = 1000 + 100 * np.arange(n)
    rec = np.where(stale, 0.3, 0.0)
    gap = rec if gap is None else np.asarray(gap)
    eps = 1e-5
    channels = pd.DataFrame({"step": np.repeat(steps, 2), "norm_layer": "bn", "channel": np.tile([0, 1], n),
                             "running_mean": np.repeat(np.where(warn, 0.5, 0.0), 2), "running_var": 1.0 - eps,
                             "fresh_mean": 0.0, "fresh_var": 1.0 - eps})
    checks = pd.DataFrame({"step": steps, "acc_train_mode": 1.0, "acc_eval_mode": 1.0 - gap})
    iv = pd.DataFrame({"step": np.repeat(steps, 2), "intervention": ["none", "reestimate"] * n,
                       "acc_eval_mode": np.ravel(np.column_stack([1.0 - rec, np.ones(n)]))})
    info = {"row": "fmnist_adam", "seed": seed, "status": "done",
            "norm_layers": {"bn": {"class": "BatchNorm2d", "momentum": 0.1, "eps": eps}}}
    return Run(Path(f"/nowhere/fmnist/{seed}"), info, {"task": {"name": "fashion_mnist"}, "scale": {"check_start": 0}},
               {"channels": channels, "checks": checks, "interventions": iv})


def _evidence(tmp_path, runs):
    from bnrotation.study.analysis.claims.evidence import Evidence
    return Evidence(tmp_path, runs, pd.DataFrame({"row": [r.row for r in runs], "seed": [r.seed for r in runs]}))


def test_the_out_of_sample_recall_claim_just_inside_and_just_outside(tmp_path):
    from bnrotation.study.analysis.claims import outofsample as oos

    inside = _oos_run([True] * 10, [True] * 8 + [False] * 2)  # recall 0.8: at the tolerance
    outside = _oos_run([True] * 10, [True] * 7 + [False] * 3, seed=1)  # 0.7
    assert oos.rule_recall_out_of_sample.check(_evidence(tmp_path, [inside])).verdict == "PASS"
    assert oos.rule_recall_out_of_sample.check(_evidence(tmp_path, [outside])).verdict == "FAIL"
    few = _oos_run([True] * 9, [True] * 9, seed=2)  # fewer stale points than MIN_POINTS: not judged
    assert oos.rule_recall_out_of_sample.check(_evidence(tmp_path, [few])).verdict == "NOT RUN"
    assert oos.rule_recall_out_of_sample.check(_evidence(tmp_path, [_run()])).verdict == "NOT RUN"  # in sample


def test_the_out_of_sample_false_alarm_claim_just_inside_and_just_outside(tmp_path):
    from bnrotation.study.analysis.claims import outofsample as oos

    def run(alarms: int) -> Run:  # 20 fresh points, each with a gap of 0.06 (above the rule's) but no recovery
        return _oos_run([False] * 20, [True] * alarms + [False] * (20 - alarms), gap=[0.06] * 20)
    assert oos.rule_false_alarms_out_of_sample.check(_evidence(tmp_path, [run(1)])).verdict == "PASS"  # 0.05
    assert oos.rule_false_alarms_out_of_sample.check(_evidence(tmp_path, [run(2)])).verdict == "FAIL"  # 0.10


def test_the_monitor_doc_block_is_what_make_calibrate_writes(written):
    samples, _ = cal.load_samples(ROOT / REFERENCE, cal.out_of_sample_roots(ROOT / REFERENCE),
                                  cal.second_zoo_roots(ROOT / REFERENCE))
    doc = (ROOT / "docs" / "monitor.md").read_text()
    assert cal.fill_doc(doc, cal.doc_block(samples), "docs/monitor.md") == doc, "rerun `make calibrate`"
    with pytest.raises(ValueError, match="x.md: no block"):
        cal.fill_doc("no block here", "", "x.md")


def test_a_run_of_unknown_task_is_in_neither_sample():
    run = _run(task={})
    assert not cal.in_sample(run) and not cal.out_of_sample_run(run)
    assert cal.out_of_sample_run(_run(task={"name": "fashion_mnist"})) and cal.out_of_sample_run(_run(row="fmnist_x"))
    # the second case: a task that cannot be told, on a row named as Fashion-MNIST's, is out of sample by its name
    assert cal.out_of_sample_run(_run(row="fmnist_adam", task={})) and not cal.in_sample(_run(row="fmnist_adam", task={}))


ZOO_INFO = {"schema_version": 1, "row": "lcnet_050-adam", "seed": 0, "status": "done", "arch": "lcnet_050",
            "optimizer_name": "adam", "optimizer": {"class": "Adam", "param_groups": [
                {"name": "conv", "lr": 0.003, "weight_decay": 0.0}, {"name": "other", "lr": 0.003, "weight_decay": 0.0}]}}


def _zoo_folder(root: Path, done: bool = True, **info) -> Path:
    """A zoo run's folder as ``bnrotation.study.zoo`` writes it (its ``run.json`` keys, no ``scale`` section, no
    ``channels`` table), with two intervention points (:func:`_oos_run`: the first stale and warned at, the
    second neither); ``info`` changes its ``run.json``."""
    import json

    from bnrotation import records

    run = _oos_run([True, False], [True, False])
    d = root / "runs" / "lcnet_050-adam" / "seed=0"
    d.mkdir(parents=True)
    layers = pd.DataFrame({"step": [1000, 1100], "layer": "conv", "norm_layer": "bn", "weight_norm": 1.0,
                           "update_cos": np.nan, "grad_cos": np.nan, "lag_median_abs_sigma": [0.5, 0.0],
                           "eval_error_median_sigma": [0.5, 0.0], "eval_error_max_sigma": [0.6, 0.0]})
    for name, df in (("checks", run.tables["checks"]), ("interventions", run.tables["interventions"]),
                     ("layers", layers)):
        extra = {"interventions": {"k": -1, "norm_layer": ""}, "checks": {"lr": 0.0, "loss": 0.0}}.get(name, {})
        records.write_table(df.assign(row="lcnet_050-adam", seed=0, **extra),
                            d / f"{name}.parquet", name)
    (d / "run.json").write_text(json.dumps({**run.info, **ZOO_INFO, **info}))
    (d / "config.yaml").write_text("arch: lcnet_050\ntask:\n  name: fashion_mnist\nsteps: 1600\n")
    if done:
        records.mark_done(d)
    return d


def test_a_zoo_run_without_channels_or_scale_is_read_from_its_layers_table(tmp_path):
    """The staleness zoo stores the monitor's per-layer table, no channels table and no ``scale`` section: its
    signals are the layers' own medians, its truth its interventions."""
    _zoo_folder(tmp_path)
    runs, problems = cal.load_calibration_runs([tmp_path], cal.out_of_sample_run)
    assert problems == [] and len(runs) == 1
    pts = cal.points(runs).set_index("step")
    assert pts.loc[1000, "stale"] and pts.loc[1000, "eval_error_median_sigma"] == 0.5
    assert not pts.loc[1100, "stale"] and math.isnan(pts.loc[1100, "log_std_ratio_median_abs"])


@pytest.mark.parametrize("change, done, said", [
    ({"optimizer_name": "sgd"}, True, "run.json says arch 'lcnet_050' and optimizer 'sgd'"),
    ({"optimizer": {"class": "SGD", "param_groups": [{"name": "conv", "lr": 0.05, "weight_decay": 0.0}]}}, True,
     "optimizer class 'SGD', the row means 'Adam'"),
    ({"status": "running"}, True, "status 'running', expected done or diverged"),
    ({"schema_version": 99}, True, "schema version 99"),
    ({}, False, "no DONE marker")])
def test_a_zoo_run_goes_through_the_run_readers_checks(tmp_path, change, done, said):
    """The zoo's runs are read by the run reader with the zoo's layout (no private fallback): one whose run.json
    contradicts its row ``<arch>-<optimizer>``, or that is not finished, is refused by name."""
    d = _zoo_folder(tmp_path, done, **change)
    runs, problems = cal.load_calibration_runs([tmp_path], cal.out_of_sample_run)
    assert runs == [] and len(problems) == 1 and problems[0].startswith(str(d)) and said in problems[0]


def test_the_second_zoos_claims_wait_for_the_whole_zoo(monkeypatch):
    """Its claims are about the whole second zoo: NOT RUN at one run short of it, judged at every run (the
    boundary), whatever the runs so far would say."""
    from bnrotation.study.analysis.claims import outofsample as oos
    from bnrotation.study.constants import SECOND_ZOO

    monkeypatch.setattr(oos, "_second_zoo_diverged", lambda ev: [])
    for have, judged in ((SECOND_ZOO.runs - 1, False), (SECOND_ZOO.runs, True)):
        monkeypatch.setattr(oos, "_second_zoo", lambda ev, n=have: [_run()] * n)
        out = oos._second_zoo_incomplete(None, "t")
        assert (out is None) == judged
        if not judged:
            assert out.passed is None and f"{have} of the second zoo's {SECOND_ZOO.runs} runs" in out.measured


def test_a_diverged_run_counts_in_the_whole_zoo_and_is_named_where_it_is_left_out(monkeypatch, tmp_path):
    """A run that diverged has finished: the zoo is whole with it (one run short without it is still NOT RUN),
    every score leaves it out as it leaves out every diverged run, and the claim and the sample line name it."""
    from bnrotation.study.analysis.claims import outofsample as oos
    from bnrotation.study.constants import SECOND_ZOO

    _zoo_folder(tmp_path, status="diverged", diverged_at_step=2000)
    assert cal.load_calibration_runs([tmp_path], cal.out_of_sample_run)[0] == []
    healthy = tmp_path / "healthy"
    _zoo_folder(healthy)
    finished = cal.finished_runs([tmp_path, healthy])[0]
    assert len(finished) == 2 and cal.diverged_runs(finished) == ["`lcnet_050-adam` seed 0 (step 2,000)"]
    unfinished = tmp_path / "other"
    _zoo_folder(unfinished, done=False, status="diverged")
    assert cal.finished_runs([unfinished])[0] == []  # no DONE marker: not finished, not counted
    monkeypatch.setattr(oos, "_second_zoo_diverged", lambda ev: cal.diverged_runs(finished))
    for have, judged in ((SECOND_ZOO.runs - 2, False), (SECOND_ZOO.runs - 1, True)):
        monkeypatch.setattr(oos, "_second_zoo", lambda ev, n=have: [_run()] * n)
        assert (oos._second_zoo_incomplete(None, "t") is None) == judged
    out = oos._left_out(None, cal_outcome := oos.Outcome("m", "t", True, "a note"))
    assert out.note == "a note Left out, as every diverged run is: `lcnet_050-adam` seed 0 (step 2,000)."
    assert (out.measured, out.passed) == (cal_outcome.measured, True)
    monkeypatch.setattr(oos, "_second_zoo_diverged", lambda ev: [])
    assert oos._left_out(None, cal_outcome) is cal_outcome


# ----------------------------------------------------------------------------- second cases (issue 52, make mutants)
def test_the_method_reads_none_as_not_measured_and_zero_one_truth_as_truth_values():
    """The inputs as a table column gives them: None (a point without the signal) never warns, and a truth of 0/1
    is the same truth as False/True (not indices)."""
    assert cal.choose_threshold([None, 1.0, 2.0, 3.0], [1, 1, 0, 1], target=0.6) == 1.0
    assert cal.choose_threshold([0.5, 3.0, 1.0, 2.0], [0, 0, 1, 1], target=1.0) == 1.0  # 0/1 read as indices: 0.5
    with pytest.raises(ValueError) as refused:
        cal.choose_threshold([1.0], [False])
    assert str(refused.value) == "choose_threshold: no stale point to reach a recall on"
    assert cal.choose_threshold([None, 1.0, 2.0, 3.0], [True, True, False, True], target=0.6) == 1.0
    assert cal.forecast_threshold([None, 1.0, 2.0, 3.0, 9.0], [0, 0, 0, 0, 1], far=0.4) == 3.0
    assert cal.forecast_threshold([None, 1.0, 2.0, 3.0, 9.0], [False] * 4 + [True], far=0.4) == 3.0


def test_the_methods_thresholds_are_stale_values_even_at_a_target_of_zero():
    """Every threshold tried is a stale point's value: with a target of 0 any would do, and the fresh value 3
    above every stale point (no false alarm below it at all) is not one of them."""
    assert cal.choose_threshold([1.0, 2.0, 3.0], [True, False, False], target=0.0) == 1.0


def test_a_forecasters_threshold_over_one_fresh_point_and_none_that_holds_its_rate():
    # one fresh point: warning at it is a rate of 1 (not 1/2), above a far of 0.5
    assert cal.forecast_threshold([1.0, 5.0], [False, True], far=0.5) == 5.0
    assert math.isnan(cal.forecast_threshold([np.nan, np.nan], [False, True]))
    assert math.isnan(cal.forecast_threshold([3.0, 1.0], [False, False], far=0.0))  # the top value already warns


def test_rounding_leaves_zero_negatives_and_non_finite_values_as_they_are():
    for round_ in (cal._round_down, cal._round_up):
        assert round_(0.0) == 0.0 and round_(-0.5) == -0.5 and round_(math.inf) == math.inf
        assert math.isnan(round_(math.nan))
    assert (cal._round_down(0.0789), cal._round_up(0.0781)) == (0.078, 0.079)
    assert (cal._round_down(1234.0), cal._round_up(1234.0)) == (1200.0, 1300.0)
    # rounding up forgives float noise below 5e-10 of the last figure kept (0.013 * 1000 = 12.999999999999998)
    assert (cal._round_up(0.013), cal._round_up(0.0120000000003), cal._round_up(0.012000000003)) == (0.013, 0.012,
                                                                                                     0.013)


def _points_frame() -> pd.DataFrame:
    """Six intervention points, the first two in the warm-up, with every signal's column."""
    stale = [True, False, True, True, False, False]
    cols = {c: [np.nan] * 6 for c in (*cal.BY_COLUMN, cal.HELDOUT_GAP.column, *cal.FORECAST_COLUMNS)}
    cols["lag_sigma"] = [0.05, 0.9, 0.3, 0.2, 0.1, 0.15]
    cols["heldout_mode_gap"] = [0.01, 0.5, 0.4, 0.2, 0.0, 0.05]
    cols["probe_disagreement"] = [0.01, 0.9, 0.4, 0.6, 0.3, 0.2]
    return pd.DataFrame({"stale": stale, "warming_up": [True, True, False, False, False, False], **cols})


def test_chosen_thresholds_choose_on_every_logged_signal_and_leave_the_others_nan():
    pts = _points_frame()
    chosen = cal.chosen_thresholds(pts)
    assert set(chosen) == {*cal.BY_COLUMN, cal.HELDOUT_GAP.column}
    assert chosen["lag_sigma"] == cal.choose_threshold(pts["lag_sigma"], pts["stale"]) == 0.05
    assert chosen["heldout_mode_gap"] == cal.choose_threshold(pts["heldout_mode_gap"], pts["stale"]) == 0.01
    assert all(math.isnan(chosen[c]) for c in ("mode_gap", "eval_error_median_sigma", "eval_error_max_sigma",
                                               "log_std_ratio_median_abs"))


def test_forecast_thresholds_leave_the_warm_up_out():
    """Past the warm-up the fresh disagreements are 0.3 and 0.2: a far of 5% keeps the threshold above both (0.4,
    a stale value); with the warm-up's fresh 0.9 counted, nothing below 0.9 would do."""
    found = cal.forecast_thresholds(_points_frame())
    assert set(found) == set(cal.FORECAST_COLUMNS)
    assert found["probe_disagreement"] == 0.4
    assert math.isnan(found["e_slope_per_100"]) and math.isnan(found["rotation_in_memory_deg"])


def _variant(seed: int, *, stale: tuple[bool, bool] | None, agreement: tuple[float, float], e_high: bool = True,
             signals: bool = True) -> Run:
    """:func:`_run` with its truth at steps 100 and 200 (``stale``; None: no interventions), the probe's mode
    agreement there, the running mean off at step 200 (E 0.5) or nowhere (``e_high`` False: E 0.01), and no
    logged signals at all (``signals`` False: neither channels nor layers)."""
    run = _run()
    run.info["seed"] = seed
    run.tables["checks"] = run.tables["checks"].assign(mode_agreement=list(agreement), mode_gap=[0.0, 0.3])
    if stale is None:
        run.tables["interventions"] = run.tables["interventions"].iloc[:0]
    else:
        run.tables["interventions"]["acc_eval_mode"] = [0.7 if s else 0.99 for s in stale for _ in (0, 1)]
        run.tables["interventions"].loc[1::2, "acc_eval_mode"] = 1.0
    if not e_high:
        run.tables["channels"]["running_mean"] = 0.01
    if not signals:
        del run.tables["channels"]
    return run


def _several_runs() -> list[Run]:
    """First the runs every score skips (no truth; no stale point; no signals), then three with a stale point."""
    return [_variant(0, stale=None, agreement=(0.5, 0.5)),
            _variant(1, stale=(False, False), agreement=(0.6, 0.6)),  # fresh only: two false alarms at 0.25
            _variant(2, stale=(False, True), agreement=(0.5, 0.5), signals=False),
            _variant(3, stale=(False, True), agreement=(0.75, 0.2)),  # warns at 100 (0.25 exactly): early
            _variant(4, stale=(True, True), agreement=(0.9, 0.1), e_high=False),  # warns at 200 only: late
            _variant(5, stale=(True, True), agreement=(0.5, 0.5), e_high=False)]  # warns at 100: on time


def test_early_warning_sums_over_several_runs_and_skips_those_without_a_stale_point():
    """Issue 52's second case for the forecasters' score: several runs, some skipped, each adding its own fresh
    points and false alarms, the threshold itself warning (at or above it)."""
    got = cal.early_warning(_several_runs(), "probe_disagreement", 0.25)
    # run 1: fresh 100 and 200 both warned; run 3: fresh 100 warned; runs 4, 5: no fresh point
    assert got == {"runs": 3, "early": 1, "median_lead_steps": 0.0, "fresh": 3, "false_alarms": 3, "far": 1.0}
    assert math.isnan(cal.early_warning(_several_runs()[4:5], "probe_disagreement", 0.25)["far"])  # no fresh point


def test_lead_times_over_several_runs_count_the_runs_never_warned_and_the_rule_reads_its_thresholds():
    got = cal.lead_times(_several_runs(), "eval_error_median_sigma", Thresholds(), {"eval_error_median_sigma": 0.4})
    # runs 3 (warned at 200, its first stale step), 4 and 5 (E 0.01: never); the others are skipped
    assert got == {"runs": 3, "warned_by": 1, "never": 2, "median_steps": 0.0, "first_warning_step": 200.0}
    rule = cal.lead_times(_several_runs()[3:4], cal.RULE, Thresholds(), {})  # probe gap 0.3 and E 0.5 at 200
    assert (rule["runs"], rule["median_steps"]) == (1, 0.0)


def test_runs_that_never_warn_give_nan_without_a_warning():
    import warnings

    runs = _several_runs()[4:]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lead = cal.lead_times(runs, "eval_error_median_sigma", Thresholds(), {"eval_error_median_sigma": 9.0})
        early = cal.early_warning(runs, "probe_disagreement", 0.95)
    assert math.isnan(lead["median_steps"]) and math.isnan(lead["first_warning_step"]) and lead["never"] == 2
    assert math.isnan(early["median_lead_steps"]) and early["runs"] == 2


def test_a_layers_table_is_read_with_its_lag_alone_and_refused_without_the_lag_or_the_layer_names():
    """A monitor before E logged the lag alone: its steps are kept (the lag is finite). A layers table without the
    lag column, or without the layers' names, gives the empty signals, with their columns."""
    run = _run()
    del run.tables["channels"]
    run.tables["layers"] = pd.DataFrame({"step": [100, 200], "norm_layer": "bn", "lag_median_abs_sigma": [0.1, 0.5]})
    sig = cal.log_signals(run)
    assert sig["step"].tolist() == [100, 200] and sig["lag_sigma"].tolist() == [0.1, 0.5]
    assert sig["eval_error_median_sigma"].isna().all()
    columns = ["step", *cal.BY_COLUMN, cal.HELDOUT_GAP.column, *cal.FORECAST_COLUMNS, "warming_up"]
    for drop in ("lag_median_abs_sigma", "norm_layer"):
        other = _run()
        del other.tables["channels"]
        other.tables["layers"] = run.tables["layers"].assign(eval_error_median_sigma=0.5).drop(columns=drop)
        empty = cal.log_signals(other)
        assert empty.empty and list(empty.columns) == columns, drop


def test_a_signal_warns_at_its_threshold_itself_never_where_unlogged_nor_in_the_warm_up():
    """At or above the threshold (the value itself warns), None (a line that logged no value, as an object column
    holds it) never warns, and no line in the warm-up warns; the rule reads the same way."""
    def column(*values):
        return pd.Series(values, dtype=object)  # None kept as None

    sig = pd.DataFrame({"lag_sigma": column(0.5, 0.5, 0.49, None),
                        "eval_error_median_sigma": column(None, 0.07, None, 0.5), "mode_gap": column(0.3, 0.3, 0.3, None), "heldout_mode_gap": column(0.3, None, 0.3, 0.3),
                        "warming_up": [False, True, False, False]})
    assert cal.warns_at(sig, "lag_sigma", Thresholds(), {"lag_sigma": 0.5}).tolist() == [True, False, False, False]
    rule = Thresholds(mode_gap=0.3, lag_sigma=0.5, eval_error_sigma=0.5)
    assert cal.warns_at(sig, cal.RULE, rule, {}).tolist() == [True, False, False, False]
    assert cal.warns_at(sig, cal.RULE_HELDOUT, rule, {}).tolist() == [True, False, False, True]


def test_a_run_without_interventions_has_an_empty_truth_with_its_columns_and_a_recovery_of_x_is_stale():
    columns = ["step", "acc_stored", "acc_reestimated", "recovery", "stale"]
    for drop in (True, False):
        run = _run()
        if drop:
            del run.tables["interventions"]
        else:
            run.tables["interventions"] = run.tables["interventions"].iloc[:0]
        empty = cal.truth(run)
        assert empty.empty and list(empty.columns) == columns
    run = _run()
    run.tables["interventions"]["acc_eval_mode"] = [0.0, cal.STALE_RECOVERY, 0.0, cal.STALE_RECOVERY - 1e-9]
    assert cal.truth(run)["stale"].tolist() == [True, False]  # a recovery of exactly X is stale (at least X)


def test_only_batchnorm_layers_that_track_statistics_count_and_the_memory_reads_their_momenta():
    """``_bn_layers`` keeps a BatchNorm layer with running statistics, not a GroupNorm nor a BatchNorm without
    them; the forecasters' memory is 1/m of the smallest momentum above 0 (None and 0 are skipped), 1 step without
    any; a run of two log steps has a slope at its second; no layers table: no rotation (NaN)."""
    run = _run(momentum=0.5)
    run.info["norm_layers"]["gn"] = {"class": "GroupNorm", "momentum": None, "eps": 1e-5}
    run.info["norm_layers"]["off"] = {"class": "BatchNorm2d", "momentum": 0.01, "eps": 1e-5,
                                      "track_running_stats": False}
    assert list(cal._bn_layers(run)) == ["bn"]
    run.tables["channels"] = run.tables["channels"][run.tables["channels"]["step"] > 0]
    run.tables["layers"] = pd.DataFrame({"step": [100, 200], "norm_layer": "bn", "rotation_deg_per_100": [3.0, 5.0]})
    sig = cal.log_signals(run).set_index("step")
    assert sig["rotation_in_memory_deg"].tolist() == pytest.approx([0.06, 0.1])  # memory 1/0.5 = 2 steps
    assert not math.isnan(sig.loc[200, "e_slope_per_100"]) and math.isnan(sig.loc[100, "e_slope_per_100"])
    for momenta, memory in (([None, 0.0], 1.0), ([None, 0.0, 0.25], 4.0)):
        lines = cal._log_signals(run)[["step", "eval_error_median_sigma"]]
        out = cal._forecaster_signals(run, cal._bn_layers(run), lines, momenta)
        assert out["rotation_in_memory_deg"].tolist() == pytest.approx([0.03 * memory, 0.05 * memory]), momenta
    del run.tables["layers"]
    assert cal._log_signals(run)["rotation_in_memory_deg"].isna().all()
    del run.info["norm_layers"]
    with pytest.raises(cal.BadRunError) as refused:
        cal._log_signals(run)  # afresh: the cache does not see a run.json changed in place
    assert str(refused.value) == (f"{run.path / 'run.json'}: no norm_layers (each layer's eps and momentum), which the "
                                  "calibration needs to recompute the signals")


def test_score_of_leaves_the_warm_up_out_unless_asked_and_a_gap_score_reads_only_the_runs_that_logged_it():
    """score_of's two filters, each with a case where it changes the counts: with momentum 0.03 the warm-up is 152
    steps, so the fresh point at step 100 is in it and the stale one at 200 past it (``warmup_points`` puts it
    back, not warned); and the rule, which needs the probe gap, reads only the run that logged one, while E, which
    needs none, reads both."""
    e = "eval_error_median_sigma"
    warm = _run(row="warm", momentum=0.03)
    past = cal.score_of([warm], e, Thresholds(), {e: 0.1})
    assert (past["stale"], past["caught"], past["fresh"]) == (1, 1, 0)
    every = cal.score_of([warm], e, Thresholds(), {e: 0.1}, warmup_points=True)
    assert (every["stale"], every["caught"], every["fresh"], every["false_alarms"]) == (1, 1, 1, 0)
    with_gap, without = _run(row="with_gap"), _run(row="without_gap")
    with_gap.tables["checks"] = with_gap.tables["checks"].assign(mode_gap=[0.0, 0.3])
    rule = cal.score_of([with_gap, without], cal.RULE, Thresholds(mode_gap=0.2, lag_sigma=0.1, eval_error_sigma=0.1))
    assert (rule["stale"], rule["caught"], rule["fresh"], rule["false_alarms"]) == (1, 1, 1, 0)
    both = cal.score_of([with_gap, without], e, Thresholds(), {e: 0.1})
    assert (both["stale"], both["caught"], both["fresh"]) == (2, 2, 2)


def test_points_of_several_runs_are_each_runs_own_lines_numbered_afresh_and_none_has_the_columns():
    """points over several runs (issue 52's second case: the tests before read one run, where a run's name, the
    index and a skipped run cannot show): each line names its run; the index runs 0..n-1 over every run; a run
    without interventions or without signals adds nothing; no run at all gives the columns and no line."""
    a, b, no_truth = _run(row="pts_a"), _run(row="pts_b"), _run(row="pts_none")
    no_truth.tables["interventions"] = no_truth.tables["interventions"].iloc[:0]
    no_signals = _run(row="pts_nosig")
    del no_signals.tables["channels"]
    pts = cal.points([a, no_truth, b, no_signals])
    assert pts["row"].tolist() == ["pts_a", "pts_a", "pts_b", "pts_b"] and pts["seed"].tolist() == [0] * 4
    assert pts.index.tolist() == [0, 1, 2, 3] and pts["step"].tolist() == [100, 200, 100, 200]
    assert pts["stale"].tolist() == [False, True, False, True]
    empty = cal.points([no_truth])
    assert empty.empty and list(empty.columns) == ["row", "seed", "step", "recovery", "stale", *cal.BY_COLUMN,
                                                   cal.HELDOUT_GAP.column, *cal.FORECAST_COLUMNS, "warming_up"]
