"""Launchers and execution settings: the Hydra launcher configs, a two-job submitit_local sweep, threads,
the determinism switch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bnrotation import records
from bnrotation.study.config import to_run_config
from bnrotation.study.runner import run
from bnrotation.study.runtime import resolve_threads

from conftest import CONF, ROOT
from test_reliability import TINY, tiny

LAUNCHERS = {
    "joblib": ("n_jobs",),
    "submitit_local": ("timeout_min", "cpus_per_task", "gpus_per_node"),
    "submitit_slurm": ("partition", "timeout_min", "gpus_per_task", "cpus_per_task", "array_parallelism", "mem_gb"),
}


def hydra_launcher(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=adam", f"hydra/launcher={name}", *overrides],
                      return_hydra_config=True)
    return cfg.hydra.launcher


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_launcher_configs_are_ours_and_document_their_keys(name):
    launcher = hydra_launcher(name)
    text = (CONF / "hydra" / "launcher" / f"{name}.yaml").read_text()
    for key in LAUNCHERS[name]:
        assert key in launcher, f"{name}: {key}"
        line = next(line for line in text.splitlines() if line.startswith(f"{key}:"))
        assert "#" in line, f"{name}.yaml: key {key} has no comment saying what it does"
    assert launcher._target_.startswith("hydra_plugins.")


def test_launcher_keys_are_validated_against_the_plugin_schema():
    assert hydra_launcher("submitit_slurm", "hydra.launcher.partition=gpu").partition == "gpu"
    with pytest.raises(Exception, match="partitoin"):
        hydra_launcher("submitit_slurm", "hydra.launcher.partitoin=gpu")


@pytest.mark.slow
def test_two_job_sweep_through_submitit_local_lands_both_runs(tmp_path):
    """`experiments/train.py -m ... hydra/launcher=submitit_local`: both runs write DONE, the sweep exits 0."""
    cmd = [sys.executable, str(ROOT / "experiments" / "train.py"), "-m", "experiment=sgd,adam", "scale=smoke",
           f"results_root={tmp_path}", "progress=false", "interventions=false", "averaging.enabled=false",
           "save_checkpoints=false", *TINY, "threads=1",  # the toy size: the launcher is under test, not the run
           "hydra/launcher=submitit_local", f"hydra.sweep.dir={tmp_path / 'hydra'}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for row in ("sgd", "adam"):
        out = records.run_dir(tmp_path, row, 0)
        assert (out / records.DONE).exists(), f"{row}: no DONE\n{proc.stderr[-3000:]}"
        info = json.loads((out / "run.json").read_text())
        assert info["status"] == "done" and info["threads"] == 1
    assert len(list((tmp_path / "hydra" / ".submitit").glob("*/*_result.pkl"))) == 2  # each job returned
    logs = [p.read_text() for p in (tmp_path / "hydra" / ".submitit").glob("*/*_log.err")] + [proc.stderr]
    assert not any("validated against ConfigStore schema" in text for text in logs)  # no noise from our yaml names


def test_threads_come_from_slurm_when_not_set(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
        assert resolve_threads(0) == 3
        assert resolve_threads(1) == 1  # an explicit value wins
        monkeypatch.delenv("SLURM_CPUS_PER_TASK")
        assert resolve_threads(0) == 1  # no launcher setting: left as it is
    finally:
        torch.set_num_threads(before)


@pytest.mark.kernels
def test_determinism_switch_is_applied_recorded_and_not_part_of_what_a_run_computes(tmp_path):
    cheap = ("experiment=sgd", "interventions=false", "averaging.enabled=false", "task.probe_size=32")
    try:
        out = run(tiny(tmp_path, *cheap, "deterministic=true"))
        info = json.loads((out / "run.json").read_text())
        assert info["determinism"]["deterministic_algorithms"] is True
        assert info["determinism"]["cudnn_deterministic"] is True and info["determinism"]["cudnn_benchmark"] is False
        # an execution setting: a resumed sweep with other settings skips the finished run
        assert run(tiny(tmp_path, *cheap, "deterministic=false")) is None
        # and on a CPU it changes no number
        off = run(tiny(tmp_path, *cheap, "deterministic=false", "row=sgd_nondeterministic"))
        assert json.loads((off / "run.json").read_text())["determinism"]["deterministic_algorithms"] is False
        for table in ("checks", "channels"):
            on_df, off_df = (pd.read_parquet(p / f"{table}.parquet").drop(columns="row") for p in (out, off))
            pd.testing.assert_frame_equal(on_df, off_df, check_exact=True)
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_deterministic_key_is_typed():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=adam", "deterministic=true"])
    assert to_run_config(cfg).deterministic is True
    assert OmegaConf.select(cfg, "deterministic") is True
    with pytest.raises(Exception, match="deterministic"):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            compose(config_name="config", overrides=["experiment=adam", "deterministic=maybe"])


def test_a_run_beside_others_prints_its_progress_as_whole_lines(capsys, monkeypatch):
    """In a joblib sweep every worker writes to the same terminal: each redraw of a bar is a line of its own, never a
    carriage return that would let two runs' bars overwrite each other; a run alone keeps tqdm's bar."""
    from bnrotation.study import runner
    monkeypatch.setattr(runner, "PROGRESS_LINE_SECONDS", 0.0)  # a line at every step
    for _ in runner.progress_bar(range(1, 4), 0, 3, "adam seed=0", enabled=True, lines=True):
        pass
    err = capsys.readouterr().err
    assert "\r" not in err and [ln.split("|")[0].strip() for ln in err.splitlines()][-1] == "adam seed=0: 100%"
    assert len(err.splitlines()) >= 2  # the start and the end at least
    for _ in runner.progress_bar(range(1, 4), 0, 3, "adam seed=0", enabled=False, lines=True):
        pass
    assert capsys.readouterr().err == ""  # progress=false: nothing


def test_only_a_joblib_multirun_counts_runs_beside_this_one(monkeypatch):
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from bnrotation.study.cli import runs_at_once
    assert runs_at_once() == 1  # no Hydra: a direct call

    def fake(mode, target, n_jobs):
        cfg = OmegaConf.create({"mode": mode, "launcher": {"_target_": target, "n_jobs": n_jobs}})
        monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: True))
        monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: cfg))
        return runs_at_once()

    joblib = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
    assert fake(RunMode.MULTIRUN, joblib, 3) == 3
    assert fake(RunMode.MULTIRUN, joblib, -1) == os.cpu_count()  # joblib's -1: one per core
    assert fake(RunMode.RUN, joblib, 3) == 1
    assert fake(RunMode.MULTIRUN, "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher", 3) == 1
