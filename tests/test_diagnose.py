"""Offline diagnosis: a checkpoint reproduces the run's logged interventions; the reports and their failure cases."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pandas as pd
import pytest
import torch

from bnrotation.study.analysis.measures import intervention_log as logged
from bnrotation.study.analysis.results import load_run
from bnrotation.checkpoints import checkpoint_path, load_checkpoint
from bnrotation.study.diagnose import diagnose_checkpoint, format_checkpoint_report, main, refine_k
from bnrotation.evaluation import EVAL_CHUNK
from bnrotation.study.interventions import top_k_accuracy

from conftest import ROOT


@pytest.fixture(scope="module")
def diagnosis(adam_smoke_run):
    return diagnose_checkpoint(adam_smoke_run, 20, device="cpu")


@pytest.mark.kernels
def test_the_checkpoint_reproduces_the_logged_interventions(diagnosis, adam_smoke_run):
    iv = pd.read_parquet(adam_smoke_run / "interventions.parquet")
    keys = ["intervention", "k", "norm_layer"]
    logged_20 = iv[iv["step"] == 20].set_index(keys)["acc_eval_mode"]
    ours = diagnosis.result.table.set_index(keys)["acc_eval_mode"]
    pd.testing.assert_series_equal(ours.sort_index(), logged_20.sort_index())
    assert "every accuracy identical to the logged one" in format_checkpoint_report(diagnosis)


def test_the_lag_summary_is_the_stored_buffers_against_the_fresh_ones(diagnosis, adam_smoke_run):
    state = load_checkpoint(checkpoint_path(adam_smoke_run, 20))["model"]
    lags = diagnosis.lags.set_index("norm_layer")
    assert list(lags.index) == ["bn1", "bn2", "bn3"] and lags["channels"].tolist() == [32, 64, 64]
    eps = diagnosis.cfg.model.bn_eps  # every BatchNorm's eps: lag = (stored - fresh mean) / sqrt(fresh var + eps)
    for name, (fresh_mean, fresh_var) in diagnosis.result.fresh.items():
        assert torch.equal(diagnosis.result.stored[name][0], state[f"{name}.running_mean"])
        lag = (state[f"{name}.running_mean"].double() - fresh_mean.double()) / (fresh_var.double() + eps).sqrt()
        assert lags.loc[name, "lag_median_abs_sigma"] == pytest.approx(float(lag.abs().median()), rel=1e-12)
        worst = int(lag.abs().argmax())
        assert lags.loc[name, "worst_channel"] == worst
        assert lags.loc[name, "worst_lag_sigma"] == pytest.approx(float(lag[worst]), rel=1e-12)


def test_bisection_finds_a_k_where_the_accuracy_crosses_the_threshold(diagnosis, adam_smoke_run):
    """The refined k reaches the threshold and k - 1 does not; the k = all point always reaches it."""
    from bnrotation.study.task import heldout_set
    from bnrotation.study.task import NoisyTemplates
    from bnrotation.study.model import build_network
    cfg = diagnosis.cfg
    model = build_network(cfg.model, cfg.task.num_classes, cfg.seed)
    model.load_state_dict(load_checkpoint(checkpoint_path(adam_smoke_run, 20))["model"])
    x, y = heldout_set(NoisyTemplates.build(cfg.task, cfg.seed), cfg)
    res = diagnosis.result
    threshold = logged.accuracy_of(res.table, "reestimate")
    k = refine_k(model, res, x, y, threshold)
    acc = lambda k: top_k_accuracy(model, res.fresh, res.lag_sigma, k, x, y, EVAL_CHUNK)
    assert k is not None and acc(k) >= threshold > acc(k - 1)
    assert refine_k(model, res, x, y, 1.01) is None  # never reached
    stored = logged.accuracy_of(res.table, "none")
    assert refine_k(model, res, x, y, stored) == 0  # the stored statistics reach their own accuracy


def test_logged_report_names_the_worst_step_and_each_layer(adam_smoke_run):
    report = logged.logged_report(load_run(adam_smoke_run, tables=("checks", "interventions")))
    iv = pd.read_parquet(adam_smoke_run / "interventions.parquet")
    worst = logged.worst_step(iv)
    assert f"Worst intervention step: {worst}" in report
    for layer in ("bn1", "bn2", "bn3"):
        assert f"fresh {layer} only" in report
    assert report.count("\n| 10 |") == 1 and report.count("\n| 20 |") == 1
    assert f"make diagnose RUN={adam_smoke_run} STEP={worst}" in report


def test_logged_report_says_when_the_checkpoint_is_missing(adam_smoke_run, tmp_path, capsys):
    """A committed run has no checkpoints: the report must not suggest a command that cannot work."""
    bare = tmp_path / "runs" / "adam" / "seed=0"
    shutil.copytree(adam_smoke_run, bare, ignore=shutil.ignore_patterns("checkpoints"))
    report = logged.logged_report(load_run(bare, tables=("checks", "interventions")))
    assert "experiments/diagnose.py" not in report and "which this run folder lacks" in report
    assert main([f"run={tmp_path / 'nowhere'}"]) == 2
    assert "no such run folder" in capsys.readouterr().err



def test_diagnose_on_a_reference_run_says_checkpoints_are_not_committed_and_how_to_make_them(monkeypatch, capsys):
    """`make diagnose RUN=results/reference/runs/adam/seed=0 STEP=worst` on the committed runs."""
    monkeypatch.chdir(ROOT)
    for step in ("worst", "last", "4500"):
        assert main(["run=results/reference/runs/adam/seed=0", f"step={step}"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert "checkpoints are not committed with the reference runs" in err
        assert "make row ROW=adam SEED=0 " in err and f"make diagnose RUN=results/runs/adam/seed=0 STEP={step}" in err
        assert "save_checkpoints" not in err


def test_diagnose_on_a_run_made_without_checkpoints_says_so_from_its_config(adam_smoke_run, tmp_path, capsys):
    bare = tmp_path / "runs" / "adam" / "seed=0"
    shutil.copytree(adam_smoke_run, bare, ignore=shutil.ignore_patterns("checkpoints"))
    assert main([f"run={bare}", "step=worst"]) == 2
    err = capsys.readouterr().err
    assert "missing, although the run saved checkpoints" in err and "make row ROW=adam SEED=0 SCALE=smoke" in err
    config = bare / "config.yaml"
    config.write_text(config.read_text().replace("save_checkpoints: true", "save_checkpoints: false"))
    assert main([f"run={bare}", "step=last"]) == 2
    err = capsys.readouterr().err
    assert "made with save_checkpoints=false (its config.yaml)" in err
    assert f"make row ROW=adam SEED=0 SCALE=smoke RESULTS={tmp_path} FORCE=1" in err


def _table(step: int, stored: float, reest: float, layers: dict[str, float], curve: dict[int, float]):
    rows = [(step, "none", -1, "", stored), (step, "reestimate", -1, "", reest)]
    rows += [(step, "layer", -1, n, a) for n, a in layers.items()]
    rows += [(step, "top_k", k, "", a) for k, a in curve.items()]
    return pd.DataFrame(rows, columns=["step", "intervention", "k", "norm_layer", "acc_eval_mode"])


def test_per_step_summary_on_a_table_with_known_answers():
    iv = pd.concat([
        _table(2000, 0.95, 1.0, {"bn1": 0.95, "bn2": 0.99}, {0: 0.95, 1: 0.97, 2: 1.0}),
        _table(2500, 0.30, 1.0, {"bn1": 0.31, "bn2": 0.93}, {0: 0.30, 1: 0.5, 2: 0.92}),
        _table(3000, 0.30, 0.85, {"bn1": 0.30, "bn2": 0.80}, {0: 0.30, 1: 0.6, 2: 0.85}),
    ])
    s = logged.per_step(iv).set_index("step")
    assert s.loc[2000, "k_needed"] == 0 and s.loc[2500, "k_needed"] == 2 and pd.isna(s.loc[3000, "k_needed"])
    assert s.loc[2500, "bn2"] == 0.93 and s.loc[2500, "channels"] == 2
    assert logged.worst_step(iv) == 2500  # a tie goes to the earliest step
    assert logged.smallest_k(logged.top_k_curve(iv[iv["step"] == 2500]), threshold=0.5) == 1
    lines = "\n".join(logged.describe_step(iv[iv["step"] == 3000]))
    assert "not reached, not even with all 2 channels" in lines
    with pytest.raises(ValueError, match="no 'none' line"):
        logged.worst_step(iv[iv["intervention"] != "none"])


def test_command_line_failures_name_the_problem(adam_smoke_run, tmp_path, capsys):
    assert main([f"run={adam_smoke_run}", "step=7"]) == 2
    assert "no checkpoint at step 7; steps with one: 10, 20" in capsys.readouterr().err
    assert main([f"run={adam_smoke_run}", "setp=7"]) == 2
    assert "key one of run, step" in capsys.readouterr().err
    assert main(["step=20"]) == 2
    assert "run=<folder> is required" in capsys.readouterr().err
    assert main([f"run={tmp_path}", "step=20"]) == 2
    assert "config.yaml: missing" in capsys.readouterr().err
    assert main([f"run={adam_smoke_run}", "threshold=90"]) == 2
    assert "threshold" in capsys.readouterr().err
    # a checkpoint that belongs to another run is refused
    other = tmp_path / "runs" / "adam" / "seed=0"
    shutil.copytree(adam_smoke_run, other)
    ckpt = load_checkpoint(checkpoint_path(other, 20))
    torch.save({**ckpt, "seed": 1}, checkpoint_path(other, 20))
    assert main([f"run={other}", "step=20"]) == 2
    assert "holds {'row': 'adam', 'seed': 1, 'step': 20}" in capsys.readouterr().err


def test_a_run_without_running_statistics_has_nothing_to_diagnose(adam_smoke_run, tmp_path, capsys):
    gn = tmp_path / "runs" / "adam_groupnorm" / "seed=0"
    shutil.copytree(adam_smoke_run, gn)
    (gn / "config.yaml").write_text((gn / "config.yaml").read_text().replace("norm: batch", "norm: group"))
    assert main([f"run={gn}", "step=last"]) == 2
    assert "keeps no running statistics" in capsys.readouterr().err


def test_the_entry_point_and_out_file(adam_smoke_run, tmp_path):
    out = tmp_path / "report.md"
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "diagnose.py"), f"run={adam_smoke_run}",
                           "step=worst", "device=cpu", f"out={out}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == out.read_text()
    assert "Stored versus fresh running statistics" in proc.stdout and "| bn2 | 64 |" in proc.stdout
