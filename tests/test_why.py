"""The data-swap experiment (issue 64): its sweep, its claims' rule, and its per-run measures on hand-made runs."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from bnrotation.study import why
from bnrotation.study.analysis.claims import why as claims_why
from bnrotation.study.analysis.claims.evidence import Evidence
from bnrotation.study.analysis.claims.kinds import NOT_RUN
from bnrotation.study.analysis.stats import SeedStat
from bnrotation.study.analysis.tables import why_report


def test_sweep_names_every_arm_once_per_optimizer_and_counts_its_runs():
    lines = why.sweep_lines()
    assert len(lines) == sum(len(a.optimizers) for a in why.ARMS)
    assert lines[0].startswith("experiment=adam ")  # Adam's arms first: they decide between the mechanisms
    assert sum("task.swap_to=finite" in line for line in lines) == 2  # fresh_to_finite, for both rows
    assert all(f"scale.mechanism_every={why.MECHANISM_EVERY}" in line for line in lines)
    assert not any("beta2" in line for line in lines if line.startswith("experiment=sgd "))
    assert why.runs_in_sweep() == 30


def test_row_names_round_trip_and_refuse_what_is_not_an_arm():
    assert why.arm_of(why.why_row("adam", "finite_beta2_0.99")) == ("adam", "finite_beta2_0.99")
    with pytest.raises(ValueError, match="not an arm"):
        why.why_row("adam", "finte")
    with pytest.raises(ValueError, match="not a data-swap run"):
        why.arm_of("map_adam+reference")


def _stat(*values):
    return SeedStat.of(values, range(len(values)))


@pytest.mark.parametrize("direction, a, b, expected", [
    ("up", (2.0, 2.1, 1.9), (1.0, 1.1, 0.9), True),
    ("up", (1.05, 1.1, 0.95), (1.0, 1.1, 0.9), False),
    ("down", (1.0, 1.1, 0.9), (2.0, 2.1, 1.9), True),
    ("not up", (1.05, 1.1, 0.95), (1.0, 1.1, 0.9), True),
    ("not up", (2.0, 2.1, 1.9), (1.0, 1.1, 0.9), False),
    ("not down", (1.0, 1.1, 0.9), (2.0, 2.1, 1.9), False),
    ("same", (1.4, 1.4, 1.4), (1.0, 1.0, 1.0), True),  # 1.4 times: inside the factor 1.5
    ("same", (1.6, 1.6, 1.6), (1.0, 1.0, 1.0), False),  # 1.6 times: outside
    ("same", (1.0, 1.0, 1.0), (1.6, 1.6, 1.6), False),  # either way round
])
def test_a_direction_holds_as_registered(direction, a, b, expected):
    assert claims_why.holds(direction, _stat(*a), _stat(*b)) is expected


def test_same_for_the_mode_gap_is_absolute_and_unknown_directions_are_refused():
    assert claims_why.holds("same", _stat(0.04, 0.04), _stat(0.0, 0.0), gap_quantity=True)  # 4 points apart
    assert not claims_why.holds("same", _stat(0.06, 0.06), _stat(0.0, 0.0), gap_quantity=True)  # 6 points
    assert not claims_why.holds("same", _stat(0.04, 0.04), _stat(0.0, 0.0))  # as a ratio, 0 is never the same
    with pytest.raises(ValueError, match="direction 'sideways'"):
        claims_why.holds("sideways", _stat(1.0), _stat(1.0))


def test_a_mechanism_must_predict_every_arm_but_the_baseline():
    with pytest.raises(ValueError, match="predictions for"):
        claims_why.Mechanism("x", "x", "x", {"fresh": ("up", "up", "up")}, "x")
    full = {a.name: ("up", "up", "up") for a in why.ARMS if a.name != "finite"}
    with pytest.raises(ValueError, match="expected 3 of"):
        claims_why.Mechanism("x", "x", "x", {**full, "fresh": ("up", "upward", "up")}, "x")


def test_claims_are_not_run_without_runs_and_their_sentences_are_short(tmp_path: Path):
    ev = Evidence(tmp_path, [], pd.DataFrame({"row": [], "seed": []}))
    for claim in claims_why.CHECKS:
        check = claim.check(ev)
        assert check.verdict == NOT_RUN, check
        assert "runs missing" in check.measured
        assert len(claim.claim.split()) <= 32, claim.claim


# ----------------------------------------------------------------------------- the swap, the log, the runner
import torch  # noqa: E402

from bnrotation.study import mechanism  # noqa: E402
from bnrotation.study.config import ConfigError, TaskConfig  # noqa: E402
from bnrotation.study.task import NoisyTemplates  # noqa: E402

from conftest import TOY_SIZE, run_cfg  # noqa: E402


@pytest.mark.parametrize("swap_to, fresh_at", [("finite", {1, 5}), ("fresh", {6, 9})])
def test_the_swap_changes_the_source_after_its_step_either_way(swap_to, fresh_at):
    task = NoisyTemplates.build(TaskConfig(image_size=4, probe_size=2, train_size=8, swap_step=5, swap_to=swap_to), 0)
    for step in (1, 5, 6, 9):  # 5 is the last step of the first source, 6 the first of the second
        assert (task.at_step(step).train_y is None) == (step in fresh_at), (swap_to, step)
    plain = NoisyTemplates.build(TaskConfig(image_size=4, probe_size=2, train_size=8), 0)
    assert plain.at_step(1) is plain and plain.at_step(10**6) is plain  # no swap: the finite set throughout


def test_a_swap_without_a_finite_set_or_past_the_run_or_on_real_images_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="task.swap_step"):
        TaskConfig(swap_step=5)  # no finite set to swap with
    with pytest.raises(ConfigError, match="task.swap_step"):
        TaskConfig(name="fashion_mnist", train_size=1000, swap_step=5)
    with pytest.raises(ConfigError, match="task.swap_to"):
        TaskConfig(train_size=1000, swap_step=5, swap_to="finte")
    from bnrotation.study.config import check_row
    with pytest.raises(ConfigError, match="task.swap_step: expected a step before scale.steps=20"):
        check_row(run_cfg(["experiment=adam", "task.train_size=1000", "task.swap_step=20", "row=x"], tmp_path))
    with pytest.raises(ConfigError, match="scale.mechanism_every"):
        check_row(run_cfg(["experiment=adam", "scale.mechanism_every=5", "batch_seeds=[0,1]", "row=x"], tmp_path))


def _one_layer(seed: int = 0):
    torch.manual_seed(seed)
    conv = torch.nn.Conv2d(3, 4, 3, bias=False)
    return conv, {"conv": conv.weight}


def test_adams_first_normalised_step_is_one_and_sgds_columns_are_nan():
    # After Adam's first step m̂ = g and v̂ = g², so |m̂| / (√v̂ + ε) = |g| / (|g| + ε): 1 up to ε.
    conv, layers = _one_layer()
    opt = torch.optim.Adam(conv.parameters(), lr=1e-3, eps=1e-8)
    conv(torch.randn(2, 3, 5, 5)).square().sum().backward()
    before = mechanism.snapshot(layers)
    opt.step()
    line = mechanism.mechanism_lines(1, layers, before, opt).iloc[0]
    assert line["normalised_step_median"] == pytest.approx(1.0, abs=1e-5)
    assert line["normalised_step_p99"] == pytest.approx(1.0, abs=1e-5)
    g = conv.weight.grad.double()
    assert line["sqrt_v_median"] == pytest.approx(float(g.abs().flatten().quantile(0.5)), rel=1e-6)
    assert line["grad_rms"] == pytest.approx(float(g.pow(2).mean().sqrt()), rel=1e-9)
    # SGD (momentum's first step: the update is -lr · g): NaN where Adam's state is read, update RMS = lr · grad RMS
    conv, layers = _one_layer(1)
    opt = torch.optim.SGD(conv.parameters(), lr=0.05, momentum=0.9)
    conv(torch.randn(2, 3, 5, 5)).square().sum().backward()
    before = mechanism.snapshot(layers)
    opt.step()
    line = mechanism.mechanism_lines(1, layers, before, opt).iloc[0]
    assert math.isnan(line["normalised_step_median"]) and math.isnan(line["eps_share_median"])
    assert line["update_rms"] == pytest.approx(0.05 * line["grad_rms"], rel=1e-6)


def test_the_angular_update_is_each_channels_angle_and_its_median():
    # Channel c turned by a known angle in a plane of its own: 1, 2, 3, 10 degrees; the median is 2.5, not the mean.
    before = torch.zeros(4, 2, 1, 1)
    before[:, 0] = 1.0
    angles = torch.tensor([1.0, 2.0, 3.0, 10.0])
    after = torch.stack([torch.cos(torch.deg2rad(angles)), torch.sin(torch.deg2rad(angles))], 1)[..., None, None]
    w = torch.nn.Parameter(after.clone() * 3.0)  # a radial change (x3) adds no angle
    line = mechanism.mechanism_lines(7, {"w": w}, {"w": before}, torch.optim.SGD([w], lr=0.1)).iloc[0]
    assert line["angular_update_deg"] == pytest.approx(2.5, abs=1e-6)
    assert math.isnan(line["grad_rms"])  # no gradient: NaN, not 0


@pytest.mark.slow
def test_a_run_with_the_log_on_writes_every_step_s_loss_and_each_layer_every_k_steps(tmp_path):
    from bnrotation.study.runner import run
    import json
    out = run(run_cfg(["experiment=adam", *TOY_SIZE, "task.train_size=32", "task.swap_step=10",
                       "task.swap_to=fresh", "scale.mechanism_every=5", "row=why_adam+finite_to_fresh",
                       "interventions=false", "averaging.enabled=false"], tmp_path))
    mech, losses = pd.read_parquet(out / "mechanism.parquet"), pd.read_parquet(out / "losses.parquet")
    assert sorted(mech["step"].unique()) == [5, 10, 15, 20]
    assert list(mech["layer"].drop_duplicates()) == ["conv1", "conv2", "conv3"]
    assert list(losses["step"]) == list(range(1, 21))  # every step once, in order
    checks = pd.read_parquet(out / "checks.parquet")
    assert checks["margin_eval_median"].notna().all()
    assert json.loads((out / "run.json").read_text())["task"]["swap_to"] == "fresh"
    # The loss logged at a check step is the same one the checks table holds
    assert losses.set_index("step").loc[20, "loss"] == pytest.approx(checks.set_index("step").loc[20, "loss"])


@pytest.mark.slow
def test_a_run_with_the_log_on_stopped_between_log_steps_resumes_with_every_loss(tmp_path, monkeypatch):
    """A stop at step 7 (two steps after the log at 5, their losses not yet in the table) saves them in the
    resumable state: the resumed run's mechanism and losses tables equal an uninterrupted run's."""
    from bnrotation.study.runner import run
    from bnrotation.study.runtime import RunInterrupted
    from test_resume import interrupt_at
    overrides = ["experiment=adam", *TOY_SIZE, "task.train_size=32", "scale.mechanism_every=5",
                 "row=why_adam+finite", "interventions=false", "averaging.enabled=false"]
    whole = run(run_cfg(overrides, tmp_path / "whole"))
    cfg = run_cfg(overrides, tmp_path / "stopped")
    with monkeypatch.context() as m:
        interrupt_at(m, [7])
        with pytest.raises(RunInterrupted):
            run(cfg)
    out = run(cfg)
    for table in ("mechanism", "losses"):
        pd.testing.assert_frame_equal(pd.read_parquet(out / f"{table}.parquet"),
                                      pd.read_parquet(whole / f"{table}.parquet"))
