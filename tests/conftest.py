"""Shared helpers: compose the real Hydra configs, run rows at smoke scale."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from bnrotation.config import RunConfig, register_configs, to_run_config

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))

register_configs()
torch.set_num_threads(1)  # tests are many small runs; one thread each is fastest on 2 cores


def compose_cfg(overrides: list[str]) -> DictConfig:
    """The config `experiments/train.py <overrides>` would get."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def run_cfg(overrides: list[str], tmp: Path) -> RunConfig:
    return to_run_config(compose_cfg(["scale=smoke", f"results_root={tmp}", "progress=false", *overrides]))


@pytest.fixture(scope="session")
def adam_smoke_run(tmp_path_factory) -> Path:
    """One finished ``adam`` run at smoke scale, seed 0, with interventions and checkpoints; do not modify it."""
    from bnrotation.runner import run
    return run(run_cfg(["experiment=adam"], tmp_path_factory.mktemp("adam_smoke")))
