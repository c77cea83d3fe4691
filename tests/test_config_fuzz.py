"""Bad configs, tried systematically.

Property: any value of any key, put into the composed real config, is either
accepted, and then within what the key allows, or rejected with a
:class:`ConfigError` whose message names the key; never another exception.
The allowed ranges below are written from PROTOCOL.md and the config's
docstrings, independently of the checks in ``config.py``; with a value of the
key's own type, accepted exactly when it is allowed. A handful of named cases
go through the real command line.
"""

from __future__ import annotations

import copy
import functools
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from omegaconf import OmegaConf

from bnrotation import records
from bnrotation.study.config import (AVERAGING_AT, DEVICES, DTYPES, NORMS, OPTIMIZERS, SCHEDULES, ConfigError,
                               RunConfig, to_run_config)

from conftest import ROOT, compose_cfg

# The composed real config of one row at smoke scale, as plain data (what Hydra hands to_run_config).
BASE = OmegaConf.to_container(compose_cfg(["experiment=adam", "scale=smoke"]))
BASE.pop("hydra", None)


def _finite(v) -> bool:
    return math.isfinite(v)


def alone(allowed):
    """A range that does not depend on other keys."""
    return lambda value, other: allowed(value)


# key: (allowed(value, other), the key's own type); other(key) is the value another key has in the same config.
ALLOWED = {
    "optimizer.lr": (alone(lambda v: _finite(v) and v > 0), float),
    "optimizer.momentum": (alone(lambda v: 0 <= v < 1), float),
    "optimizer.beta1": (alone(lambda v: 0 <= v < 1), float),
    "optimizer.beta2": (alone(lambda v: 0 <= v < 1), float),
    "optimizer.eps": (alone(lambda v: _finite(v) and v > 0), float),
    "optimizer.weight_decay": (alone(lambda v: _finite(v) and v >= 0), float),
    "model.bn_momentum": (alone(lambda v: 0 < v <= 1), float),  # PyTorch's convention: the weight of the batch
    "model.bn_eps": (alone(lambda v: _finite(v) and v > 0), float),
    "task.template_scale": (alone(lambda v: _finite(v) and v >= 0), float),
    # Probes every log_every steps must tile the run, and the check window must lie inside it.
    "scale.steps": (lambda v, o: v >= o("scale.check_start") and v % o("scale.log_every") == 0, int),
    "scale.log_every": (lambda v, o: v >= 1 and o("scale.steps") % v == 0, int),
    "scale.check_start": (lambda v, o: 0 <= v <= o("scale.steps"), int),
    "scale.check_every": (alone(lambda v: v >= 1), int),
    "scale.heldout_size": (alone(lambda v: v >= 2), int),
    "task.batch_size": (alone(lambda v: v >= 2), int),  # BatchNorm needs two samples
    "seed": (alone(lambda v: 0 <= v < 2**63), int),  # stored in an int64 column
    "threads": (alone(lambda v: v >= 0), int),
    "optimizer.name": (alone(lambda v: v in OPTIMIZERS), str),
    "schedule.name": (alone(lambda v: v in SCHEDULES), str),
    "model.norm": (alone(lambda v: v in NORMS), str),
    "device": (alone(lambda v: v in DEVICES), str),
    "dtype": (alone(lambda v: v in DTYPES), str),
    "averaging.at": (alone(lambda v: v in AVERAGING_AT), str),
    "averaging.tail_steps": (lambda v, o: v >= 0 and v % o("averaging.tail_every") == 0, int),
}
NUMERIC = {float: (int, float), int: (int,), str: (str,)}

wrong_type = st.one_of(st.none(), st.booleans(), st.text(max_size=6), st.lists(st.integers(), max_size=2),
                       st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))
own_type = {
    float: st.one_of(st.floats(), st.integers(), st.sampled_from([0.0, 1.0, -0.0, 1e-300, 1e308])),
    int: st.one_of(st.integers(), st.integers(-3, 30), st.sampled_from([2**63 - 1, 2**63, -(2**63), 0, 100, 300])),
    str: st.one_of(st.text(max_size=12),
                   st.sampled_from(OPTIMIZERS + SCHEDULES + NORMS + DEVICES + DTYPES + AVERAGING_AT + ("",))),
}


def with_values(values: dict) -> dict:
    cfg = copy.deepcopy(BASE)
    for key, value in values.items():
        *path, leaf = key.split(".")
        functools.reduce(lambda node, k: node[k], path, cfg)[leaf] = value
    return cfg


def get(run: RunConfig, key: str):
    return functools.reduce(getattr, key.split("."), run)


def in_base(key: str):
    return functools.reduce(lambda node, k: node[k], key.split("."), BASE)


def is_own_type(value, kind) -> bool:
    return isinstance(value, NUMERIC[kind]) and not isinstance(value, bool)


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.data())
def test_any_value_of_any_key_is_accepted_in_range_or_rejected_naming_the_key(data):
    key = data.draw(st.sampled_from(sorted(ALLOWED)), label="key")
    allowed, kind = ALLOWED[key]
    value = data.draw(st.one_of(own_type[kind], wrong_type), label="value")
    try:
        run = to_run_config(with_values({key: value}))
    except ConfigError as err:
        assert key in str(err), str(err)
        assert not (is_own_type(value, kind) and allowed(value, in_base)), f"{key}={value!r} is allowed: {err}"
        return
    got = get(run, key)
    assert allowed(got, in_base), f"{key}={value!r} accepted as {got!r}"
    if is_own_type(value, kind):
        assert got == (float(value) if kind is float else value)  # an integer for a float key: the nearest float


@FUZZ
@given(st.dictionaries(st.sampled_from(sorted(ALLOWED)), st.one_of(st.floats(), st.integers(), st.text(max_size=4)),
                       min_size=2, max_size=5))
def test_several_bad_values_at_once_name_one_of_them(values):
    try:
        run = to_run_config(with_values(values))
    except ConfigError as err:
        assert any(key in str(err) for key in values), str(err)
        return
    assert all(ALLOWED[key][0](get(run, key), lambda other: get(run, other)) for key in values)


ROW_NAMES = st.one_of(st.text(max_size=10), st.from_regex(r"[A-Za-z0-9_.+/ -]{0,8}", fullmatch=True),
                      st.sampled_from(["..", ".", "../up", "a/b", "", "???", "adam_lr1e-3", "${seed}",
                                       "${oc.env:HOME}", "${nope}", "adam\x00"]))


@FUZZ
@given(ROW_NAMES)
def test_any_row_name_stays_inside_runs_or_is_rejected_naming_row(row):
    """The row names the results folder: an accepted one must be a single folder under runs/."""
    try:
        run = to_run_config(with_values({"row": row}))
    except ConfigError as err:
        assert str(err).startswith("row:"), str(err)
        return
    root = Path("/results")
    folder = records.run_dir(root, run.row, 0).parent
    assert folder.parent == root / "runs" and folder.name == run.row and run.row not in (".", "..")
    assert "\x00" not in run.row


# ----------------------------------------------------------------------------- named cases, real command line
@pytest.mark.slow
@pytest.mark.parametrize("override, key", [
    ("optimizer.lr=nan", "optimizer.lr"),
    ("optimizer.eps=inf", "optimizer.eps"),
    ("row=../elsewhere", "row"),
    ("scale.log_every=7", "scale.log_every"),  # 20 smoke steps are not whole 7-step intervals
    ("seed=9223372036854775808", "seed"),
])
def test_cli_rejects_before_any_work_naming_the_key(override, key, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "train.py"), "experiment=adam", "scale=smoke",
                           f"results_root={tmp_path}", override], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: bad config: {key}:"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path.parent / "elsewhere").exists()
