"""The staleness zoo's runs (bnrotation.study.zoo, experiments/zoo.py) at toy size on the committed Fashion-MNIST sample:
the tables and run.json a run writes, skip / rerun / refuse of its folder, the GroupNorm control's refusal recorded,
and a bad key or a lost run seen from the command line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from conftest import FASHION_MNIST_SAMPLE, ROOT
from thirdparty import import_timm

from bnrotation import records
from bnrotation.study.analysis.results import ZOO, load_run
from bnrotation.study.config import ConfigError
from bnrotation.monitor import StalenessMonitor
from bnrotation.study.rundir import RunExistsError, config_yaml
from bnrotation.study.task import FashionMNIST
from bnrotation.study.zoo import (CONTROL, STALE_RECOVERY, ZooConfig, build_zoo_network, check_steps, costs,
                                  optimizer_config, run, to_zoo_config)

CHEAP = "lcnet_050"  # the cheapest BatchNorm architecture of the zoo
# probe_size 20: the smallest probe whose one sample moves the mode gap by no more than the threshold (no warning)
TOY = {"steps": 4, "check_every": 2, "heldout_size": 32, "reestimate_batches": 2, "progress": False,
       "task": {"name": "fashion_mnist", "image_size": 8, "batch_size": 8, "probe_size": 20,
                "data_dir": str(FASHION_MNIST_SAMPLE)}}
SGD = dataclasses.asdict(optimizer_config("sgd"))
CHECKS = ("step", "lr", "loss", "acc_train_mode", "acc_eval_mode", "acc_eval_mode_reestimated", "recovered", "stale",
          "probe_acc_train_mode", "probe_acc_eval_mode", "mode_agreement", "mode_gap", "probe_size", "rule_stale",
          "rule_flagged", "warming_up")


def toy(root, **overrides) -> ZooConfig:
    return to_zoo_config({**TOY, "results_root": str(root), **overrides})


@pytest.mark.parametrize("override, key", [({"nonsense": 1}, "nonsense"), ({"arch": "resnet50"}, "arch"),
                                           ({"optimizer": {"name": "adamw"}}, "optimizer.name"),
                                           ({"optimizer": {"lr": 0.1}}, "optimizer.lr"),
                                           ({"check_every": 5}, "check_every"),
                                           ({"stale_recovery": 0.0}, "stale_recovery"),
                                           ({"task": {"name": "noisy_templates"}}, "task.name")])
def test_a_bad_key_or_value_is_one_line_naming_it(tmp_path, override, key):
    with pytest.raises(ConfigError) as err:
        toy(tmp_path, **override)
    assert str(err.value).startswith(key + ":") and "\n" not in str(err.value)


def test_checks_at_step_0_every_check_every_steps_and_the_last():
    assert check_steps(ZooConfig(steps=250, check_every=100)) == [0, 100, 200, 250]
    assert ZooConfig().stale_recovery == STALE_RECOVERY == 0.05


def test_conf_zoo_yaml_composes_to_the_schemas_defaults_and_the_docstring_counts_its_checks():
    """conf/zoo.yaml repeats ZooConfig's defaults for the reader; they must agree (but the data folder, which
    follows $FASHION_MNIST_DIR), and the module docstring's count of checks a run is check_steps' of them."""
    import re

    import bnrotation.study.zoo as zoo
    from hydra import compose, initialize_config_dir

    zoo.register_zoo_config()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        composed = to_zoo_config(compose(config_name="zoo"))
    default = ZooConfig()
    default.task.data_dir = composed.task.data_dir
    assert composed == default
    said = re.search(r"\((\d+) checks a run", zoo.__doc__)
    assert said and int(said.group(1)) == len(check_steps(default)) >= 15


def test_the_optimizers_are_the_study_rows_settings():
    sgd, adam = optimizer_config("sgd"), optimizer_config("adam")
    assert (sgd.name, sgd.lr, sgd.momentum, adam.name, adam.lr) == ("sgd", 0.05, 0.9, "adam", 3e-3)


@pytest.mark.slow
def test_a_toy_run_writes_its_tables_and_is_skipped_rerun_or_refused(tmp_path):
    import_timm()
    cfg = toy(tmp_path, arch=CHEAP, optimizer=SGD)
    out = run(cfg)
    assert out == records.run_dir(tmp_path, "lcnet_050-sgd", 0) and (out / records.DONE).exists()
    checks = pd.read_parquet(out / "checks.parquet")
    assert set(CHECKS) <= set(checks.columns) and checks["step"].tolist() == [0, 2, 4]
    assert checks["recovered"].tolist() == pytest.approx(
        (checks["acc_eval_mode_reestimated"] - checks["acc_eval_mode"]).tolist())
    assert (checks["stale"] == (checks["recovered"] >= STALE_RECOVERY)).all()
    layers = pd.read_parquet(out / "layers.parquet")
    assert set(records.TABLE_COLUMNS["layers"]) | {"norm_layer", "lag_median_abs_sigma"} <= set(layers.columns)
    assert layers.groupby("step").size().tolist() == [27] * 3  # lcnet_050's BatchNorm layers, every one paired
    iv = pd.read_parquet(out / "interventions.parquet")
    assert iv["intervention"].tolist() == ["none", "reestimate"] * 3
    assert not (out / "channels.parquet").exists()
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "done" and info["monitor"]["refused"] is None and info["bn_momenta"] == [0.1]
    assert info["model"]["class"] == "MobileNetV3" and info["optimizer"]["class"] == "SGD"
    assert {g["lr"] for g in info["optimizer"]["param_groups"]} == {0.05}
    # on the suite's frame: the run reader reads it with the zoo's layout, and it holds what a committed run holds
    read = load_run(out, ("checks", "layers", "interventions"), ZOO)
    assert read.row == "lcnet_050-sgd" and len(read.tables["checks"]) == 3
    committed = ROOT / "results" / "reference" / "zoo2" / "runs" / "resnet14t-sgd" / "seed=10"
    # the keys a committed run holds, and those recorded since it ran (provenance.cpu_model's ``cpu``)
    assert set(info) == set(json.loads((committed / "run.json").read_text())) | {"cpu"}
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in committed.iterdir())
    assert run(cfg) is None  # finished with the same config: skipped
    (out / records.DONE).unlink()
    assert run(cfg) == out and (out / records.DONE).exists()  # no DONE: rerun from scratch
    with pytest.raises(RunExistsError):
        run(toy(tmp_path, arch=CHEAP, optimizer=SGD, heldout_size=40))
    assert not any(c.startswith("eval_path") for c in layers.columns)  # off by default
    # a run's config.yaml written before evaluation_path was a key: the same config (the key at its default)
    saved = (out / "config.yaml").read_text()
    (out / "config.yaml").write_text("\n".join(l for l in saved.splitlines() if not l.startswith("evaluation_path")))
    assert run(cfg) is None
    assert run(toy(tmp_path, arch=CHEAP, optimizer=SGD, heldout_size=40, force=True, channels=True,
                   evaluation_path=True)) == out
    channels = pd.read_parquet(out / "channels.parquet")
    assert set(records.TABLE_COLUMNS["channels"]) - {"row", "seed"} <= set(channels)
    assert {"eval_path_mean", "eval_path_var", "eval_path_error_sigma"} <= set(channels)
    layers = pd.read_parquet(out / "layers.parquet")
    assert layers[["eval_path_error_median_sigma", "eval_path_error_max_sigma"]].notna().all().all()


@pytest.mark.slow
def test_the_groupnorm_control_trains_and_records_the_monitors_refusal(tmp_path):
    import_timm()
    cfg = toy(tmp_path, arch=CONTROL)
    out = run(cfg)
    task = FashionMNIST.build(cfg.task, 0)
    with pytest.raises(ValueError) as err:
        StalenessMonitor(build_zoo_network(CONTROL, 0), task.fixed_set(20, 0, "probe"))
    info = json.loads((out / "run.json").read_text())
    assert info["monitor"]["refused"] == str(err.value).splitlines()[0] and "no BatchNorm" in info["monitor"]["refused"]
    assert info["bn_momenta"] == [] and {v["class"] for v in info["norm_layers"].values()} == {"GroupNorm"}
    checks = pd.read_parquet(out / "checks.parquet")
    assert checks["acc_eval_mode"].notna().all() and checks["recovered"].isna().all() and not checks["stale"].any()
    assert checks["acc_eval_mode"].tolist() == checks["acc_train_mode"].tolist()  # no running statistics: one mode
    assert pd.read_parquet(out / "layers.parquet").empty and (out / records.DONE).exists()


@pytest.mark.slow
def test_costs_measures_steps_and_checks_in_cpu_seconds(tmp_path):
    import_timm()
    table = costs(8, 8, archs=(CHEAP, CONTROL), cfg=toy(tmp_path))
    assert table["arch"].tolist() == [CHEAP, CONTROL] and (table[["step_cpu_ms", "check_cpu_s"]] > 0).all().all()
    runs = len(check_steps(toy(tmp_path)))
    assert table["run_cpu_s"].tolist() == pytest.approx(
        (4 * table["step_cpu_ms"] / 1e3 + runs * table["check_cpu_s"]).tolist(), abs=0.2)


def _zoo(tmp_path, *args) -> subprocess.CompletedProcess:
    toy_args = ["steps=2", "check_every=2", "heldout_size=16", "reestimate_batches=1", "progress=false",
                "task.image_size=8", "task.batch_size=8", "task.probe_size=20", f"results_root={tmp_path}"]
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "zoo.py"), *args, *toy_args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "FASHION_MNIST_DIR": str(FASHION_MNIST_SAMPLE)})


@pytest.mark.slow
def test_the_command_refuses_a_bad_key_in_one_line_and_a_sweep_that_lost_a_run_fails(tmp_path):
    bad = _zoo(tmp_path, "arch=resnet50")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "arch: expected one of" in bad.stderr
    # two runs in two joblib workers, the optimizers by name (conf/optimizer/); adam's folder holds a finished run of
    # another config (refused)
    other = records.run_dir(tmp_path, f"{CHEAP}-adam", 0)
    records.atomic_write_text(other / "config.yaml", config_yaml(toy(tmp_path, arch=CHEAP, heldout_size=12)))
    records.mark_done(other)
    sweep = _zoo(tmp_path, "-m", f"arch={CHEAP}", "optimizer=sgd,adam", "hydra/launcher=joblib",
                 "hydra.launcher.n_jobs=2")
    assert sweep.returncode == 1, sweep.stderr
    assert "sweep: 2 runs: 1 done, 1 refused" in sweep.stderr and "refused: lcnet_050-adam seed=0" in sweep.stderr
    info = json.loads((tmp_path / "runs" / f"{CHEAP}-sgd" / "seed=0" / "run.json").read_text())
    assert info["optimizer"]["class"] == "SGD" and info["status"] == "done"
