"""The staleness zoo's table (bnrotation.study.analysis.tables.zoo_report) on runs built by hand, whose every figure
follows from their checks: the last check, the worst median E past the warm-up, the truth's stale checks and the
rule's recall and false alarms; the GroupNorm control's refusal; a root without runs refused in one line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from bnrotation import records
from bnrotation.study.analysis.results import Run
from bnrotation.study.analysis.tables import zoo_report
from bnrotation.study.names import OPTIMIZER_CLASSES
from bnrotation.study.rows import ROWS


def _run(arch: str, opt: str, seed: int, checks: list[dict], e: dict[int, list[float]], refused=None,
         met: dict[int, list[float]] | None = None) -> Run:
    """A zoo run: ``checks`` its check lines (step, accuracies, stale, rule_stale, warming_up), ``e`` per step the
    median E of each of its layers, ``met`` (a run made with ``evaluation_path=true``) the same along the
    evaluation path."""
    frame = pd.DataFrame([{"acc_eval_mode_reestimated": c["acc_eval_mode"] + c["recovered"], **c} for c in checks])
    layers = pd.DataFrame([{"step": step, "norm_layer": f"bn{i}", "eval_error_median_sigma": v,
                            **({"eval_path_error_median_sigma": met[step][i]} if met else {})}
                           for step, values in e.items() for i, v in enumerate(values)])
    info = {"row": f"{arch}-{opt}", "seed": seed, "arch": arch, "optimizer_name": opt, "monitor": {"refused": refused},
            "stale_recovery": 0.05}
    return Run(records.run_dir("zoo", f"{arch}-{opt}", seed), info, {}, {"checks": frame, "layers": layers})


def _check(step, train, evaluated, recovered, stale, rule, warming=False) -> dict:
    return {"step": step, "acc_train_mode": train, "acc_eval_mode": evaluated, "recovered": recovered,
            "stale": stale, "rule_stale": rule, "warming_up": warming}


# seed 0: a warm-up check (ignored by the rule's columns and the worst E), a stale check caught, a stale check
# missed, a fresh check warned at (a false alarm) and a fresh one left alone
SEED0 = [_check(0, 0.10, 0.10, 0.00, False, True, warming=True), _check(10, 0.80, 0.60, 0.20, True, True),
         _check(20, 0.85, 0.78, 0.06, True, False), _check(30, 0.86, 0.84, 0.01, False, True),
         _check(40, 0.88, 0.87, 0.00, False, False)]
SEED1 = [_check(0, 0.10, 0.10, 0.00, False, False, warming=True), _check(10, 0.82, 0.82, 0.00, False, False),
         _check(20, 0.84, 0.70, 0.14, True, True), _check(30, 0.86, 0.85, 0.02, False, False),
         _check(40, 0.90, 0.85, 0.05, True, True)]
E0 = {0: [9.0, 9.0], 10: [0.3, 0.5], 20: [0.2, 0.1], 30: [0.1, 0.1], 40: [0.05, 0.04]}
E1 = {0: [7.0, 7.0], 10: [0.1, 0.2], 20: [0.4, 0.9], 30: [0.1, 0.1], 40: [0.2, 0.1]}


def test_per_run_reads_the_last_check_the_worst_e_past_the_warm_up_and_the_counts():
    frame = zoo_report.per_run([_run("lcnet_050", "adam", 0, SEED0, E0)])
    line = frame.iloc[0]
    assert (line["acc_eval_mode"], line["gap"]) == pytest.approx((0.87, 0.01))
    assert line["worst_e"] == 0.5  # step 0's 9.0 is inside the warm-up: the initial statistics, not staleness
    assert (line["recovered"], line["recovered_max"]) == pytest.approx((0.00, 0.20))
    assert (line["checks"], line["stale"], line["warned_stale"], line["fresh"], line["warned_fresh"]) == (4, 2, 1, 2, 1)


def test_the_table_sums_counts_and_gives_mean_and_spread_over_seeds():
    runs = [_run("lcnet_050", "adam", 0, SEED0, E0), _run("lcnet_050", "adam", 1, SEED1, E1)]
    text = zoo_report.table_markdown(runs, "zoo")
    (line,) = [x for x in text.splitlines() if x.startswith("| `lcnet_050`")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:3] == ["`lcnet_050`", "adam", "2"]
    assert cells[3] == "86.0% ± 1.4"  # 0.87 and 0.85: mean 0.86, sample sd sqrt(2) points
    assert cells[5] == "0.7σ ± 0.28"  # worst E 0.5 and 0.9
    assert cells[-4:-1] == ["4/8", "3/4", "1/4"]  # stale 2 + 2 of 4 + 4; caught 1 + 2; false alarms 1 + 0
    assert cells[-1] == "–"  # runs built by hand record no CPU time
    runs[0].info["timings_s"], runs[1].info["timings_s"] = {"cpu": 100.2}, {"cpu": 120.0}
    line = [x for x in zoo_report.table_markdown(runs, "zoo").splitlines() if x.startswith("| `lcnet_050`")][0]
    assert line.rstrip(" |").endswith("| 110")  # the mean over seeds, whole seconds
    assert "recovers at least 5 points (the truth)" in text


def test_a_refused_architecture_keeps_its_accuracy_and_says_why():
    control = [_check(0, 0.1, 0.1, float("nan"), False, None, warming=True), _check(10, 0.8, 0.8, float("nan"),
                                                                                     False, None)]
    run = _run("resnet10t_gn", "sgd", 0, control, {}, refused="no BatchNorm layer with running statistics")
    (line,) = [x for x in zoo_report.table_markdown([run], "zoo").splitlines() if x.startswith("| `resnet10t_gn`")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3] == "80.0%" and set(cells[4:8]) == {"–"}
    assert cells[8] == "the monitor refuses it: no running statistics"


def test_a_root_without_runs_or_without_a_finished_run_exits_2_in_one_line(tmp_path, capsys):
    assert zoo_report.main(["--results", str(tmp_path / "nowhere")]) == 2
    assert "no runs/ folder" in capsys.readouterr().err
    (tmp_path / "runs" / "lcnet_050-sgd" / "seed=0").mkdir(parents=True)
    assert zoo_report.main(["--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"error: --results {tmp_path}: no finished zoo run"
    assert not (tmp_path / "zoo.md").exists()


def _on_disk(root, run: Run) -> Path:
    """``run`` in a folder under ``root`` as the zoo writes it: ``run.json`` (with the optimizer read back as the
    study's row of its name), ``config.yaml``, the ``checks``, ``layers`` and ``interventions`` tables, ``DONE``."""
    spec = ROWS[run.info["optimizer_name"]]
    path = records.run_dir(root, run.row, run.seed)
    path.mkdir(parents=True)
    records.write_json(path / "run.json", {
        "schema_version": records.SCHEMA_VERSION, "status": "done", **run.info,
        "optimizer": {"class": OPTIMIZER_CLASSES[spec.optimizer],
                      "param_groups": [{"name": "conv", "lr": spec.lr, "weight_decay": spec.weight_decay}]}})
    (path / "config.yaml").write_text(f"arch: {run.info['arch']}\n")
    checks = run.tables["checks"]
    filler = {"checks": {"lr": 0.05, "loss": 1.0}, "layers": {"layer": "conv", "weight_norm": 1.0, "update_cos": 0.0,
                                                            "grad_cos": 0.0}}
    for name, extra in filler.items():
        records.write_table(run.tables[name].assign(row=run.row, seed=run.seed, **extra), path / f"{name}.parquet",
                            name)
    interventions = pd.DataFrame({"row": run.row, "seed": run.seed, "step": checks["step"].repeat(2).to_numpy(),
                                  "intervention": ["none", "reestimate"] * len(checks), "k": -1, "norm_layer": "",
                                  "acc_eval_mode": checks[["acc_eval_mode", "acc_eval_mode_reestimated"]]
                                  .to_numpy().ravel()})
    records.write_table(interventions, path / "interventions.parquet", "interventions")
    records.mark_done(path)
    return path


def test_a_finished_run_on_disk_gives_the_table_and_the_figure(tmp_path, capsys):
    """The reader's path: a run folder as the zoo writes it (:func:`_on_disk`)."""
    path = _on_disk(tmp_path, _run("lcnet_050", "sgd", 0, SEED0, E0))
    code = zoo_report.main(["--results", str(tmp_path)])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "| `lcnet_050` | sgd | 1 | 87.0% |" in (tmp_path / "zoo.md").read_text()
    assert (tmp_path / "zoo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((path / "run.json").read_text())["arch"] == "lcnet_050"


# along the evaluation path: at step 10 bn0 is stale on its own and bn1 meets its lag (carried); at step 20 the
# lag is bn1's own; at step 40 nothing is over the threshold on either path
MET0 = {0: [9.0, 9.0], 10: [0.3, 0.9], 20: [0.2, 0.1], 30: [0.1, 0.1], 40: [0.05, 0.06]}
E0_LOW = {0: [9.0, 9.0], 10: [0.3, 0.01], 20: [0.01, 0.1], 30: [0.01, 0.01], 40: [0.05, 0.04]}


def test_depth_split_counts_own_met_and_carried_layers_past_the_warm_up():
    frame = zoo_report.depth_split([_run("regnetx_002", "adam", 0, SEED0, E0_LOW, met=MET0),
                                    _run("lcnet_050", "adam", 0, SEED0, E0)], threshold=0.069)
    assert frame["step"].tolist() == [10, 20, 30, 40]  # the run without the evaluation path is left out
    assert frame["own"].tolist() == [0.3, 0.1, 0.01, 0.05] and frame["met"].tolist() == [0.9, 0.2, 0.1, 0.06]
    assert frame["over_own"].tolist() == [1, 1, 0, 0] and frame["over_met"].tolist() == [2, 2, 2, 0]
    assert frame["carried"].tolist() == [1, 1, 2, 0]  # step 20: bn0 met 0.2 over, own 0.01 under
    assert frame["stale"].tolist() == [True, True, False, False]
    assert zoo_report.depth_split([_run("lcnet_050", "adam", 0, SEED0, E0)]).empty


def test_depth_markdown_gives_one_line_per_truth_and_nothing_without_the_evaluation_path():
    assert zoo_report.depth_markdown([_run("lcnet_050", "adam", 0, SEED0, E0)]) == ""
    text = zoo_report.depth_markdown([_run("regnetx_002", "adam", 0, SEED0, E0_LOW, met=MET0)])
    lines = [x for x in text.splitlines() if x.startswith("| `regnetx_002`")]
    # stale checks 10 and 20: own worst 0.3 and 0.1 (mean 0.2σ), met 0.9 and 0.2; over own 1/2 each, met 2/2,
    # carried 1/2; fresh checks 30 and 40: own 0.01 and 0.05, met 0.1 and 0.06, over met 2/2 then 0/2
    assert lines == ["| `regnetx_002` | adam | fresh | 2 | 0.03σ | 0.08σ | 0% | 50% | 50% |",
                     "| `regnetx_002` | adam | stale | 2 | 0.2σ | 0.55σ | 50% | 100% | 50% |"]
    assert "(1 run)" in text and "0.069σ" in text


def test_a_run_with_the_evaluation_path_on_disk_adds_its_table_and_figure(tmp_path, capsys):
    _on_disk(tmp_path, _run("regnetx_002", "adam", 0, SEED0, E0_LOW, met=MET0))
    assert zoo_report.main(["--results", str(tmp_path)]) == 0, capsys.readouterr().err
    assert "## A layer's own lag, or lag carried through depth" in (tmp_path / "zoo.md").read_text()
    assert (tmp_path / "zoo_eval_path.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_calibration_truth_of_a_run_without_running_statistics_is_empty_not_an_error():
    """The GroupNorm control records a NaN re-estimated accuracy at every check: it has no truth to score (before
    the fix, ``calibration.truth`` raised KeyError on the committed control runs)."""
    from bnrotation.study.analysis.tables import calibration

    iv = pd.DataFrame({"step": [0, 0, 75, 75], "intervention": ["none", "reestimate"] * 2, "k": -1, "norm_layer": "",
                       "acc_eval_mode": [0.09, float("nan"), 0.51, float("nan")]})
    run = _run("resnet10t_gn", "sgd", 0, SEED0, {}, refused="no BatchNorm")
    run.tables["interventions"] = iv
    assert calibration.truth(run).empty
    run = _run("lcnet_050", "sgd", 0, SEED0, E0)
    run.tables["interventions"] = iv.assign(acc_eval_mode=[0.5, 0.6, 0.7, 0.7])
    assert calibration.truth(run)["recovery"].tolist() == pytest.approx([0.1, 0.0])


# ----------------------------------------------------------------------------- second cases (issue 52, make mutants)
def test_per_run_counts_one_stale_check_of_three_and_reads_runs_that_logged_less():
    """One stale check of three judged (where stale and fresh counts differ), a rule that logged no verdict at a
    check (NaN: not warned), a run without the warm-up column, without E in its layers, without a layers table,
    without a monitor entry or timings in its run.json."""
    checks = [_check(10, 0.8, 0.6, 0.2, True, True), _check(20, 0.8, 0.79, 0.0, False, float("nan")),
              _check(30, 0.8, 0.8, 0.0, False, True)]
    run = _run("lcnet_050", "adam", 4, checks, {10: [0.3], 20: [0.2], 30: [0.1]})
    run.tables["checks"] = run.tables["checks"].drop(columns="warming_up")
    run.tables["layers"] = run.tables["layers"].drop(columns="eval_error_median_sigma").assign(lag=0.1)
    del run.info["monitor"]
    bare = _run("lcnet_050", "sgd", 5, checks, {10: [0.3]})
    del bare.tables["layers"]
    bare.info["timings_s"] = {"cpu": 12.5}
    frame = zoo_report.per_run([run, bare]).set_index("seed")
    for seed in (4, 5):
        line = frame.loc[seed]
        assert (line["checks"], line["stale"], line["warned_stale"], line["fresh"], line["warned_fresh"]) == \
            (3, 1, 1, 2, 1)
        assert math.isnan(line["worst_e"])
    assert frame.loc[4, "refused"] is None and math.isnan(frame.loc[4, "cpu_s"]) and frame.loc[5, "cpu_s"] == 12.5
    assert frame.loc[5, "optimizer"] == "sgd" and frame.loc[5, "arch"] == "lcnet_050"


def test_depth_split_at_another_threshold_with_layers_exactly_at_it_and_runs_that_logged_less():
    """The threshold given, not the rule's; a layer exactly at it is over (at or above); a run without a layers
    table or without the evaluation path is passed over wherever it comes, and a run without the warm-up column
    has every check judged."""
    e, met = {10: [0.25, 0.1, 0.3]}, {10: [0.25, 0.25, 0.2]}
    with_path = _run("regnetx_002", "adam", 0, [_check(10, 0.8, 0.6, 0.2, True, True)], e, met=met)
    with_path.tables["checks"] = with_path.tables["checks"].drop(columns="warming_up")
    without_layers = _run("lcnet_050", "adam", 1, SEED0, E0)
    del without_layers.tables["layers"]
    frame = zoo_report.depth_split([without_layers, _run("lcnet_050", "adam", 2, SEED0, E0), with_path],
                                   threshold=0.25)
    assert frame["seed"].tolist() == [0] and frame["step"].tolist() == [10]
    line = frame.iloc[0]
    assert (line["over_own"], line["over_met"], line["carried"], line["layers"]) == (2, 2, 1, 3)
    assert (line["own"], line["met"]) == (0.3, 0.25)


def test_a_count_over_nothing_is_a_dash():
    assert (zoo_report._count(0, 0), zoo_report._count(0, 3), zoo_report._count(2, 3)) == ("–", "0/3", "2/3")


def test_the_table_names_the_zoo_its_runs_come_from_and_the_command_that_runs_it():
    """The second zoo's table says ``make zoo2``; one run of a first-zoo architecture beside it makes it the first's."""
    second = [_run("tinynet_e", "sgd", 10, SEED0, E0), _run("regnety_002", "adam", 11, SEED1, E1)]
    text = zoo_report.table_markdown(second, "results/reference/zoo2")
    assert text.startswith("The second staleness zoo: 2 finished runs under `results/reference/zoo2` (`make zoo2`;")
    mixed = second + [_run("lcnet_050", "adam", 0, SEED0, E0)]
    assert zoo_report.table_markdown(mixed, "r").startswith("The staleness zoo: 3 finished runs under `r` (`make zoo`;")
    assert zoo_report.zoo_name([]) == ("The staleness zoo", "make zoo")


def test_a_diverged_run_is_named_under_the_table_not_averaged_into_it(tmp_path, capsys):
    """A run that diverged is finished but left out of the table (as the calibration leaves it out); zoo.md names
    it and its step, so that a row's seed count is explained."""
    _on_disk(tmp_path, _run("lcnet_050", "sgd", 0, SEED0, E0))
    bad = _run("lcnet_050", "sgd", 1, SEED1, E1)
    bad.info.update(status="diverged", diverged_at_step=20)
    _on_disk(tmp_path, bad)
    assert zoo_report.main(["--results", str(tmp_path)]) == 0, capsys.readouterr().err
    text = (tmp_path / "zoo.md").read_text()
    assert "| `lcnet_050` | sgd | 1 | 87.0% |" in text
    assert "Diverged (a non-finite loss), left out of the table: `lcnet_050-sgd` seed 1 (step 20)." in text
