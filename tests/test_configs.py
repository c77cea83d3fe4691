"""Every experiment config composes to what its row means; bad configs stop before training."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest
import yaml
from omegaconf import OmegaConf

from bnrotation.study.config import AveragingConfig, ConfigError, ScaleConfig, TaskConfig, to_run_config
from bnrotation.study.rows import ROWS, SETS, SWEEPS

from conftest import CONF, EXPERIMENTS, ROOT, compose_cfg, run_cfg


def test_every_row_has_an_experiment_file_and_back():
    assert set(EXPERIMENTS) == set(ROWS)


@pytest.mark.parametrize("scale, name", [(scale, None) for scale in sorted(SWEEPS)]
                         + [(scale, name) for name, sweep in sorted(SETS.items()) for scale in sweep.scales])
def test_make_sweep_runs_the_rows_and_seeds_that_rows_py_declares(scale, name):
    sweep = SETS[name] if name else SWEEPS[scale]
    assert set(sweep.rows) <= set(ROWS) and (ROOT / "conf" / "scale" / f"{scale}.yaml").exists()
    dry = subprocess.run(["make", "-n", "sweep", f"SCALE={scale}", f"SET={name or ''}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    # seeds first: every row's seed 0 runs before any row's seed 1, so a sweep stopped halfway is balanced
    assert f"seed={','.join(map(str, sweep.seeds))} experiment={','.join(sweep.rows)} scale={scale} " in dry.stdout
    assert all(o in dry.stdout for o in sweep.overrides)


def test_a_set_at_a_scale_it_is_not_for_is_refused_naming_it():
    dry = subprocess.run(["make", "-n", "sweep", "SCALE=smoke", "SET=ten_seeds"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert "SET=ten_seeds runs at SCALE=full only" in dry.stderr


@pytest.mark.parametrize("row", EXPERIMENTS)
def test_experiment_composes_to_its_row(row, tmp_path):
    cfg = run_cfg([f"experiment={row}"], tmp_path)
    spec = ROWS[row]
    assert cfg.row == row
    assert cfg.optimizer.name == spec.optimizer
    assert math.isclose(cfg.optimizer.lr, spec.lr)
    assert cfg.schedule.name == spec.schedule
    assert math.isclose(cfg.model.bn_momentum, spec.bn_momentum)
    assert math.isclose(cfg.optimizer.weight_decay, spec.weight_decay)
    assert cfg.model.norm == spec.norm
    assert (cfg.model.arch, cfg.task.name, cfg.task.image_size) == (spec.arch, spec.task, spec.image_size)


# Every section of the config is a conf/ group whose default file lists every key of its schema, so that
# reading conf/ shows the whole config.
GROUP_DEFAULTS = {"task": ("noisy_templates", TaskConfig), "scale": ("full", ScaleConfig),
                  "averaging": ("default", AveragingConfig)}


@pytest.mark.parametrize("group", GROUP_DEFAULTS)
def test_each_default_group_file_lists_every_key_of_its_schema_at_its_default(group):
    name, schema = GROUP_DEFAULTS[group]
    listed = yaml.safe_load((CONF / group / f"{name}.yaml").read_text())
    assert list(listed) == [f.name for f in dataclasses.fields(schema)]
    assert listed == OmegaConf.to_container(OmegaConf.structured(schema))
    assert f"  - {group}: {name}" in (CONF / "config.yaml").read_text().splitlines()


@pytest.mark.parametrize("row", [r for r in EXPERIMENTS if ROWS[r].task == TaskConfig.name])
def test_task_and_averaging_groups_change_no_composed_config(row):
    """The default task and averaging groups only restate the schema's defaults (the rows of the default task;
    a Fashion-MNIST row picks another task file): a config composed without them
    (task and averaging then come from RunConfig's defaults, as before the groups existed) is the same, and
    so is the config.yaml a run writes (OmegaConf.to_yaml of the validated RunConfig)."""
    with_groups = compose_cfg([f"experiment={row}"])
    without = compose_cfg([f"experiment={row}", "~task", "~averaging"])
    assert OmegaConf.to_container(with_groups, resolve=True) == OmegaConf.to_container(without, resolve=True)
    assert OmegaConf.to_yaml(OmegaConf.structured(to_run_config(with_groups))) == \
        OmegaConf.to_yaml(OmegaConf.structured(to_run_config(without)))


def test_full_scale_is_the_default_and_matches_the_protocol(tmp_path):
    cfg = to_run_config(compose_cfg(["experiment=adam"]))
    s = cfg.scale
    assert (s.steps, s.log_every, s.check_start, s.check_every, s.heldout_size) == (6000, 100, 2000, 100, 4000)
    assert len(range(s.check_start, s.steps + 1, s.check_every)) == 41
    assert cfg.task.batch_size == 128 and cfg.task.template_scale == 0.6 and cfg.task.num_classes == 10
    assert cfg.model.bn_momentum == 0.03 and cfg.model.bn_eps == 1e-5 and list(cfg.model.channels) == [32, 64, 64]


@pytest.mark.parametrize("override, key", [
    ("optimizer.lr=-0.1", "optimizer.lr"),
    ("optimizer.lr=0", "optimizer.lr"),
    ("model.bn_momentum=0", "model.bn_momentum"),
    ("model.bn_momentum=1.5", "model.bn_momentum"),
    ("optimizer.name=rmsprop", "optimizer.name"),
    ("schedule.name=step", "schedule.name"),
    ("model.norm=instance", "model.norm"),
    ("scale.check_start=99999", "scale.check_start"),
    ("scale.steps=0", "scale.steps"),
    ("seed=-1", "seed"),
    ("device=tpu", "device"),
    ("optimizer.weight_decay=-1", "optimizer.weight_decay"),
])
def test_out_of_range_value_names_the_key(override, key, tmp_path):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        run_cfg(["experiment=adam", override], tmp_path)


def test_missing_row_says_how_to_pick_one(tmp_path):
    with pytest.raises(ConfigError, match="experiment=<row>"):
        run_cfg([], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("argv, needle", [
    (["experiment=adam", "optimizer.lrr=0.1"], "lrr"),           # misspelt key: struct mode
    (["experiment=adam", "optimizer.lr=fast"], "optimizer.lr"),  # wrong type
    (["experiment=nope"], "experiment"),                          # unknown row
    (["experiment=adam", "optimizer.lr=-1"], "optimizer.lr"),     # range, checked before any work
])
def test_cli_rejects_bad_config_without_traceback(argv, needle, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "train.py"), *argv, "scale=smoke",
                           f"results_root={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()  # stopped before any work
