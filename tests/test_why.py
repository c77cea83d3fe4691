"""The data-swap experiment (issue 64): its sweep, its claims' rule, and its per-run measures on hand-made runs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
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
    assert len(lines) == sum(len(a.optimizers) for a in (*why.ARMS, why.REAL_IMAGES))
    assert lines[0].startswith("experiment=adam ")  # Adam's arms first: they decide between the mechanisms
    assert sum("task.swap_to=finite" in line for line in lines) == 2  # fresh_to_finite, for both rows
    assert all(f"scale.mechanism_every={why.MECHANISM_EVERY}" in line for line in lines)
    assert not any("beta2" in line for line in lines if line.startswith("experiment=sgd "))
    assert why.runs_in_sweep() == 36
    assert lines[-1].startswith("experiment=fmnist_sgd ") and "row=why_${optimizer.name}+fashion_mnist" in lines[-1]


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


# ----------------------------------------------------------------------------- the measures and the verdicts
from bnrotation.study.analysis.claims.kinds import FAIL, PASS, PRECONDITION_FAILED  # noqa: E402
from bnrotation.study.analysis.results import Run  # noqa: E402


def fake_run(arm: str, seed: int, optimizer: str = "adam") -> Run:
    """A run whose last layer (conv3) turns 0.2° a step in the late window and 0.05° before it, except one log
    of 2°; whose first layer (conv1) turns 9° throughout (the claims must read the last); a normalised step of
    0.3 in steps 500-1,000 and 0.1 after; a loss of 2 over the first 100 steps, 0.01 before the swap with one
    spike of 0.05 per 100 steps in the late window; checks 1.0 / 0.8 in the window, 1.0 / 0.1 before it."""
    mech = []
    for step in range(10, 3001, 10):
        late = step >= 2000
        rot = 2.0 if step == 2500 else 0.2 if late else 0.05
        ns = 0.3 if 500 <= step <= 1000 else 0.1
        for layer, r in (("conv1", 9.0), ("conv3", rot)):
            mech.append({"step": step, "layer": layer, "angular_update_deg": r, "update_rms": 1.0,
                         "grad_rms": 2.0 if step <= 1000 else 0.5, "normalised_step_median": ns,
                         "normalised_step_p99": 1.0, "sqrt_v_median": 1.0, "eps_share_median": 0.0})
    losses = [{"step": s, "loss": 2.0 if s <= 100 else 0.05 if (s >= 2000 and s % 100 == 50) else 0.01}
              for s in range(1, 3001)]
    checks = [{"step": s, "acc_train_mode": 1.0, "acc_eval_mode": 0.8 if s >= 2000 else 0.1}
              for s in range(1000, 3001, 100)]
    info = {"row": why.why_row(optimizer, arm), "seed": seed}
    return Run(Path("/nowhere"), info, {}, {"mechanism": pd.DataFrame(mech), "losses": pd.DataFrame(losses),
                                            "checks": pd.DataFrame(checks)})


def test_each_measure_reads_its_window_at_the_last_layer():
    got = why_report.per_run(fake_run("fresh", 0))
    assert got["layer"] == "conv3"
    late = [2.0 if s == 2500 else 0.2 for s in range(2000, 3001, 10)]  # 101 logs, 2,000 and 3,000 both in
    assert got["rotation_deg_per_step"] == pytest.approx(np.mean(late))
    assert got["burst_share"] == pytest.approx((2.0 + 10 * 0.2) / sum(late))  # the largest 11 of 101 logs
    assert got["normalised_step_early"] == pytest.approx(0.3) and got["normalised_step"] == pytest.approx(0.1)
    assert got["grad_rms_late"] / got["grad_rms_early"] == pytest.approx(0.25)
    assert got["mode_gap"] == pytest.approx(0.2)  # the window's checks only
    assert got["loss_spike"] == pytest.approx(5.0)  # 0.05 over a median of 0.01, in every 100-step window
    assert got["loss_before_swap"] == pytest.approx(0.01) and got["loss_start"] == pytest.approx(2.0)


def test_burst_share_and_loss_spike_at_their_boundaries():
    assert why_report.burst_share(np.ones(10)) == pytest.approx(0.1)  # uniform: the top tenth carries a tenth
    assert why_report.burst_share(np.ones(11)) == pytest.approx(2 / 11)  # a tenth of 11 rounds up to 2 logs
    assert math.isnan(why_report.burst_share(np.zeros(5))) and math.isnan(why_report.burst_share(np.array([])))
    flat = pd.DataFrame({"step": range(1, 201), "loss": 0.0})
    assert math.isnan(why_report.loss_spike(flat, (1, 200)))  # a zero median: no ratio, not infinity


def _arm_stats(values: dict, seeds=(0, 1, 2), optimizer="adam", arm="x") -> why_report.ArmStats:
    """An arm whose every metric is ``values[metric]`` (default 1.0) with a small spread over ``seeds``."""
    metrics = {m: SeedStat.of([values.get(m, 1.0) * (1 + 0.01 * (i - 1)) for i in range(len(seeds))], seeds)
               for m in why_report.METRICS}
    return why_report.ArmStats(optimizer, arm, metrics, tuple(seeds))


def memorisation_world(**changes) -> dict:
    """The six Adam arms as memorisation predicts them, the finite set's loss flat by the swap."""
    base = {"loss_before_swap": 0.001, "loss_start": 2.0, "grad_rms_late": 0.2, "grad_rms_early": 1.0,
            "normalised_step_early": 1.0, "mode_gap": 0.0}
    arms = {
        "finite": base,
        "fresh": {**base, "rotation_deg_per_step": 5.0, "normalised_step": 5.0, "mode_gap": 0.3, "burst_share": 0.2},
        "fresh_to_finite": {**base, "rotation_deg_per_step": 0.5, "normalised_step": 0.5},
        "finite_to_fresh": {**base, "rotation_deg_per_step": 5.0, "normalised_step": 5.0, "mode_gap": 0.3},
        "finite_beta2_0.99": {**base, "rotation_deg_per_step": 3.0, "normalised_step": 3.0},
        "finite_beta2_0.9999": {**base, "rotation_deg_per_step": 0.3, "normalised_step": 0.3},
    }
    arms.update(changes)
    return {("adam", a): _arm_stats(v, arm=a) for a, v in arms.items()}


def _verdicts(monkeypatch, arms) -> dict:
    monkeypatch.setattr(why_report, "load", lambda root: (arms, [], Path(root) / "why"))
    ev = Evidence(Path("/nowhere"), [], pd.DataFrame({"row": [], "seed": []}))
    return {c.name: c.check(ev) for c in claims_why.CHECKS}


def test_the_arms_memorisation_predicts_pass_it_and_fail_the_noise_floor_on_beta2(monkeypatch):
    got = _verdicts(monkeypatch, memorisation_world())
    assert got["why_memorisation_shrinks_adams_steps"].verdict == PASS
    floor = got["why_a_gradient_noise_floor_keeps_adam_rotating"]
    assert floor.verdict == FAIL and "finite_beta2_0.99's rotation not the same" in floor.note
    assert got["why_loss_spikes_keep_adam_rotating"].verdict == FAIL  # the median step moved, no bursts


def test_the_signature_alone_can_fail_a_mechanism(monkeypatch):
    # the same arms, but the finite set's gradient does not decay: memorisation's signature fails
    world = memorisation_world()
    world[("adam", "finite")] = _arm_stats({"loss_before_swap": 0.001, "loss_start": 2.0, "grad_rms_late": 0.9,
                                            "grad_rms_early": 1.0, "mode_gap": 0.0}, arm="finite")
    got = _verdicts(monkeypatch, world)["why_memorisation_shrinks_adams_steps"]
    assert got.verdict == FAIL and "its signature" in got.note


def test_a_loss_not_flat_by_the_swap_fails_the_precondition_and_a_short_arm_is_not_run(monkeypatch):
    flat = {"loss_before_swap": 0.1, "loss_start": 2.0, "mode_gap": 0.0}  # 5% of the start: not flat
    got = _verdicts(monkeypatch, memorisation_world(finite=flat))
    assert {c.verdict for c in got.values()} == {PRECONDITION_FAILED}
    world = memorisation_world()
    world[("adam", "fresh")] = _arm_stats({}, seeds=(0, 1, 7), arm="fresh")  # seed 7 is outside the sweep
    got = _verdicts(monkeypatch, world)
    assert all(c.verdict == NOT_RUN and "adam+fresh (2 of 3 seeds)" in c.measured for c in got.values())


def _table(*lines) -> pd.DataFrame:
    """A :func:`claims_why.mechanism_table` frame from ``(mechanism, verdict, held, signature)`` lines."""
    return pd.DataFrame([{"mechanism": m, "verdict": v, "held": h, "predicted": 15, "failed_on": "",
                          "signature_held": sig.startswith("held") if sig else None, "signature": sig}
                         for m, v, h, sig in lines])


@pytest.mark.parametrize("lines, expected", [
    ([("a", "PASS", 15, "held: x"), ("b", "FAIL", 3, "held: x")], "The data swap supports a; b fail."),
    ([("a", "PASS", 15, "held: x"), ("b", "PASS", 15, "held: x")], "The data swap supports a and b."),
    # the closest: most predictions held; on a tie, the one whose signature held (b), not the first listed (a)
    ([("a", "FAIL", 14, "not held: x"), ("b", "FAIL", 14, "held: x"), ("c", "FAIL", 13, "held: x")],
     "The data swap supports none of its 3 mechanisms; b comes closest, 14 of 15 predictions held, its signature "
     "held."),
    ([("a", "FAIL", 9, "not held: x"), ("b", "FAIL", 10, "not held: x")],
     "The data swap supports none of its 2 mechanisms; b comes closest, 10 of 15 predictions held, its signature "
     "not."),
    ([("a", "PASS", math.nan, ""), ("b", "NOT RUN", math.nan, "")],
     "The data swap has 12 of its 30 runs in; no mechanism is judged until every arm is."),
    ([("a", "PRECONDITION FAILED", math.nan, "")],
     "The loss had not flattened by the swap on the finite set, so the data swap judges no mechanism."),
])
def test_the_sentence_says_which_mechanism_the_runs_support(lines, expected):
    text = claims_why.sentence(_table(*lines), 12, 30)
    assert text == expected and len(text.split()) <= 30


def test_the_mechanism_table_counts_each_claims_predictions_and_names_what_failed(monkeypatch):
    monkeypatch.setattr(why_report, "load", lambda root: (memorisation_world(), [], Path(root) / "why"))
    table = claims_why.mechanism_table("/nowhere").set_index("mechanism")
    assert list(table.index) == [m.title for m in claims_why.MECHANISMS]
    n = {m.title: 3 * len(m.predictions) for m in claims_why.MECHANISMS}  # 3 quantities an arm
    assert (table["predicted"] == pd.Series(n)).all()
    mem = table.loc["memorisation"]
    assert (mem["verdict"], mem["held"], mem["failed_on"]) == (PASS, 15, "") and mem["signature_held"]
    assert mem["signature"].startswith("held: ")
    regrowth = table.loc["regrowth once v forgets"]  # the step does not grow back after the swap: not held
    assert not regrowth["signature_held"] and regrowth["signature"].startswith("not held: ")
    floor = table.loc["a gradient noise floor"]
    assert floor["verdict"] == FAIL and "finite_beta2_0.99's rotation not the same" in floor["failed_on"]
    assert floor["held"] == 15 - len(floor["failed_on"].split("; "))  # the signature is not among the counts
    # a failed "not down" reads as what happened: the fresh-to-finite arm turned slower than the finite set
    assert "fresh_to_finite's rotation down" in table.loc["regrowth once v forgets", "failed_on"]
    world = memorisation_world()
    del world[("adam", "fresh")]
    monkeypatch.setattr(why_report, "load", lambda root: (world, [], Path(root) / "why"))
    short = claims_why.mechanism_table("/nowhere")
    assert (short["verdict"] == NOT_RUN).all() and short["held"].isna().all() and (short["failed_on"] == "").all()
    assert short["signature_held"].isna().all()
    assert "runs in" in claims_why.sentence(short, 15, 36)


def test_the_section_renders_the_table_with_its_legend(monkeypatch):
    from bnrotation.study.analysis.report.section import to_markdown
    monkeypatch.setattr(why_report, "load", lambda root: (memorisation_world(), [], Path(root) / "why"))
    text = to_markdown(claims_why.WHY_SECTION, claims_why.mechanism_table("/nowhere"))
    assert "| memorisation | PASS | 15 | 15 |" in text
    assert "(docs/PROTOCOL.md#the-data-swap-beyond-the-article-issue-64)" in text


def test_the_figure_draws_the_four_arms_with_their_seeds(tmp_path):
    runs = [fake_run(a, s, o) for a in why_report.FOUR_ARMS for s in (0, 1) for o in ("adam", "sgd")]
    frame = why_report.curves(runs)
    assert set(frame["arm"]) == set(why_report.FOUR_ARMS) and frame["seed"].nunique() == 2
    assert frame.groupby(["optimizer", "arm", "seed"]).size().eq(300).all()
    path = why_report.figure(frame, tmp_path / "why.png")
    assert path.stat().st_size > 10_000 and path.with_suffix(".pdf").exists()
