"""Figures, claims, theory and notebooks: closed forms, simulations, and runs against real smoke results.

Two kinds of results feed these tests. A synthetic results set, written here
with the real schema (``records.write_table``) and values chosen so that every
summary has a closed form (the article's published numbers, constant in time),
checks each quantity and verdict exactly. A real smoke-scale results set, from
the runner itself at a toy size, checks that ``make figures``, ``make claims``
and the notebooks run on what the runner writes.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from bnrotation import records
from bnrotation.study.analysis import claims
from bnrotation.study.analysis.claims import evidence, kinds, registry
from bnrotation.study.analysis.measures import intervention_log, metrics, theory
from bnrotation.study.analysis.results import (BadRunError, Run, check_against_row, load_run, load_runs, once_per_run,
                                      protocol_scale)
from bnrotation.study.analysis.stats import SeedStat
from bnrotation.study.analysis.tables import figures, table
from bnrotation.study.names import OPTIMIZER_CLASSES
from bnrotation.study.rows import ARTICLE_ROWS, PUBLISHED_ROWS, ROWS, RowSpec, on_fashion_mnist
from test_monitor_notebook import MONITOR_NOTEBOOK

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
LAYERS = {"conv1": ("bn1", 4), "conv2": ("bn2", 6), "conv3": ("bn3", 6)}  # toy widths: 16 channels
SCALE = {"name": "synthetic", "steps": 6000, "log_every": 100, "check_start": 2000, "check_every": 100,
         "heldout_size": 4000, "reestimate_batches": 2, "intervene_every": 500}
SPREAD = np.linspace(0.5, 1.5, 6)  # per-channel factors: median 1 over 6 channels


# ----------------------------------------------------------------------------- a synthetic results set
def _run_json(row: str, seed: int, layers: dict = LAYERS) -> dict:
    spec = ROWS[row]
    modes = {"adam_projected": ["always", "never"], "adamp": ["adamp"]}.get(spec.optimizer, [])
    norm = ({"class": "BatchNorm2d", "momentum": spec.bn_momentum, "eps": 1e-5} if spec.norm == "batch"
            else {"class": "GroupNorm", "num_groups": {"group": 8, "layer": 1}[spec.norm]})
    return {"schema_version": records.SCHEMA_VERSION, "row": row, "seed": seed, "status": "done",
            "optimizer": {"class": OPTIMIZER_CLASSES[spec.optimizer],
                          "param_groups": [{"name": "conv", "lr": spec.lr, "weight_decay": spec.weight_decay}]},
            "projection": {"mode": modes},
            "schedule": {"class": "CosineAnnealingLR"} if spec.schedule == "cosine" else None,
            "norm_layers": {bn: dict(norm) for bn, _ in layers.values()}, "wall_seconds": 1.0}


def write_run(root: Path, row: str, seed: int, *, rotation: float, norm_growth: float, acc_eval: float,
              acc_train: float = 1.0, update_cos: float = 0.01, grad_cos: float = 1e-6, drift: float = 0.001,
              abs_mean: float = 1.7, stale_channel_sigma: float = 0.0, lifted: float = 0.9, reestimated: float = 1.0,
              averaging: pd.DataFrame | None = None, scale: dict = SCALE, rotation_before_window: float | None = None,
              lowest: float | None = None, layers: dict = LAYERS, model: dict | None = None,
              lag_scale: dict | None = None, lifted_layer: str = "bn2", acc_eval_at=None, lr_at=None,
              task: str | None = None):
    """One finished run whose every summary is known in closed form.

    Every logged step has the same values: channel c of a layer turns ``rotation * SPREAD[c]`` degrees per
    ``log_every`` steps (median ``rotation``), drifts ``drift * SPREAD[c]`` sigma per step, lags by the formula's
    prediction with alternating sign; evaluation-mode accuracy is ``acc_eval`` at every check but the one at step
    4,000, which is ``lowest`` if given.

    Another network: ``layers`` ({conv: (norm layer, width)}, in forward order) and ``model`` (the config's
    ``model`` section); ``lag_scale`` ({conv: factor}) multiplies a layer's lag, ``lifted_layer`` is the norm layer
    whose fresh statistics alone give ``lifted``; ``acc_eval_at(step)`` and ``lr_at(step)`` replace the constant
    evaluation-mode accuracy (checks and stored-statistics interventions) and learning rate. ``task``: the
    ``task.name`` written into ``config.yaml`` and ``run.json`` (``fashion_mnist``); None writes none, as runs
    made before the second task.
    """
    spec = ROWS[row]
    acc_at = acc_eval_at or (lambda s: lowest if lowest is not None and s == 4000 else acc_eval)
    m = spec.bn_momentum
    out = records.run_dir(root, row, seed)
    out.mkdir(parents=True, exist_ok=True)
    named = {"name": task} if task else {}
    cfg = {"row": row, "seed": seed, "scale": dict(scale),
           "optimizer": {"name": spec.optimizer, "lr": spec.lr, "weight_decay": spec.weight_decay,
                         "momentum": 0.9, "beta1": 0.9},
           "model": model or {"channels": [c for _, c in LAYERS.values()]}, "task": {"probe_size": 512, **named}}
    (out / "config.yaml").write_text(yaml.safe_dump(cfg))
    (out / "run.json").write_text(json.dumps(_run_json(row, seed, layers) | ({"task": named} if task else {})))
    steps = list(range(0, scale["steps"] + 1, scale["log_every"]))
    checks = list(range(scale["check_start"], scale["steps"] + 1, scale["check_every"]))
    base = dict(row=row, seed=seed)
    records.write_table(pd.DataFrame([dict(base, step=s, lr=lr_at(s) if lr_at else spec.lr, loss=0.1,
                                           acc_train_mode=acc_train, acc_eval_mode=acc_at(s))
                                      for s in checks]), out / "checks.parquet", "checks")
    layer_lines, channels = [], []
    for s in steps:
        for layer, (bn, width) in layers.items():
            w = 1.0 + (norm_growth - 1.0) * s / scale["steps"]
            layer_lines.append(dict(base, step=s, layer=layer, weight_norm=w,
                                    update_cos=update_cos if s else math.nan, grad_cos=grad_cos if s else math.nan))
            rot = rotation if rotation_before_window is None or s >= scale["check_start"] else rotation_before_window
            for c in range(width):
                f = SPREAD[c] if width == 6 else 1.0
                d = drift * f
                pred = d * (1 - m) / m
                lag = pred * (-1) ** c * (lag_scale or {}).get(layer, 1.0)
                if stale_channel_sigma and layer == "conv2" and c == width - 1:
                    lag = stale_channel_sigma
                channels.append(dict(base, step=s, layer=layer, norm_layer=bn, channel=c,
                                     rotation_deg=rot * f if s else math.nan, weight_norm=w / 2,
                                     running_mean=0.0, running_var=1.0, fresh_mean=0.0, fresh_var=1.0,
                                     lag_sigma=lag if s else 0.0, drift_sigma_per_step=d if s else math.nan,
                                     predicted_lag_sigma=pred if s else math.nan, abs_mean_over_std=abs_mean * f))
    records.write_table(pd.DataFrame(layer_lines), out / "layers.parquet", "layers")
    records.write_table(pd.DataFrame(channels), out / "channels.parquet", "channels")
    iv = []
    for s in sorted(set(range(scale["check_start"], scale["steps"] + 1, scale["intervene_every"])) | {scale["steps"]}):
        stored = acc_eval_at(s) if acc_eval_at else acc_eval  # ``lowest`` is a check's, not an intervention's
        iv += [dict(base, step=s, intervention="none", k=-1, norm_layer="", acc_eval_mode=stored),
               dict(base, step=s, intervention="reestimate", k=-1, norm_layer="", acc_eval_mode=reestimated)]
        iv += [dict(base, step=s, intervention="layer", k=-1, norm_layer=bn,
                    acc_eval_mode=lifted if bn == lifted_layer else stored) for bn, _ in layers.values()]
        total = sum(width for _, width in layers.values())
        for k in [0] + [2 ** i for i in range(total.bit_length()) if 2 ** i < total] + [total]:
            # half the gain at k = 2, all of it at k = 8 (0, 1, 2, 4, 8, 16 for the 16 channels of LAYERS)
            iv.append(dict(base, step=s, intervention="top_k", k=k, norm_layer="",
                           acc_eval_mode=stored + (reestimated - stored) * min(1.0, {0: 0, 1: .2, 2: .5, 4: .8}
                                                                                   .get(k, 1.0))))
    records.write_table(pd.DataFrame(iv), out / "interventions.parquet", "interventions")
    if averaging is not None:
        records.write_table(averaging.assign(row=row, seed=seed), out / "averaging.parquet", "averaging")
    records.mark_done(out)


@functools.lru_cache(maxsize=None)
def _resnet_pairs() -> tuple[tuple[str, str], ...]:
    from bnrotation.study.config import ModelConfig
    from bnrotation.study.model import build_network
    from bnrotation.monitor import find_pairs
    model = build_network(ModelConfig(arch="resnet20", channels=[16, 32, 64]), 10, seed=0)
    return tuple((p.weight, p.norm) for p in find_pairs(model).pairs)


def resnet_layers(width: int = 2) -> dict:
    """ResNet-20's {conv: (norm layer, ``width``)} in the forward order the runner logs them: the real model's
    pairing (:func:`bnrotation.monitor.find_pairs`), at a toy width per layer (21 layers)."""
    return {conv: (norm, width) for conv, norm in _resnet_pairs()}


RESNET_MODEL = {"arch": "resnet20", "channels": [16, 32, 64]}


def write_resnet_run(root: Path, row: str, seed: int, **kw) -> None:
    """:func:`write_run` for a ResNet-20 row: its 21 BatchNorm layers, two channels each (42 in all)."""
    write_run(root, row, seed, layers=resnet_layers(), model=RESNET_MODEL, **kw)


def cosine_lr(step: int, lr: float = 3e-3, steps: int = 6000) -> float:
    """Cosine decay to 0 over ``steps``, as the ``cosine`` schedule logs it at a check."""
    return 0.5 * lr * (1 + math.cos(math.pi * step / steps))


PUBLISHED_LIKE = {  # row: cosine of the update, middle-layer drift; the rest comes from the published table
    "sgd": (0.005, 0.0010), "adam_lr3e-4": (0.01, 0.001), "adam_cosine": (0.02, 0.003), "adamw": (0.03, 0.005),
    "adam": (0.04, 0.0074), "adam_projected": (0.0, 0.02), "adam_bn_m0.3": (0.04, 0.0074)}


def write_replication(root: Path, seeds=(0, 1, 2), rows=tuple(PUBLISHED_LIKE), **overrides) -> Path:
    """A results set that replicates the article: each row at its published figures, ±2% across seeds."""
    for row in rows:
        pub = ROWS[row].published
        cos, drift = PUBLISHED_LIKE[row]
        for seed in seeds:
            f = 1 + 0.02 * (seed - 1)
            kw = dict(rotation=pub.rotation_deg_per_100 * f,
                      norm_growth=(pub.norm_growth if not math.isnan(pub.norm_growth) else 5.0) * f,
                      acc_eval=min(pub.acc_eval_mode * f, 1.0), update_cos=cos * f, drift=drift * f,
                      stale_channel_sigma=2.0 if row == "adam" else 0.0, lowest=0.1 if row == "adam" else None)
            kw.update(overrides.get(row, {}))
            write_run(root, row, seed, **kw)
    return root


@pytest.fixture(scope="module")
def replication(tmp_path_factory) -> Path:
    return write_replication(tmp_path_factory.mktemp("replication"))


def _load(root: Path):
    return load_runs(root, tables=claims.TABLES)


# ----------------------------------------------------------------------------- metrics: closed forms
def test_per_channel_summaries_have_their_closed_forms(tmp_path):
    write_run(tmp_path, "adam", 0, rotation=7.0, norm_growth=3.0, acc_eval=0.6, update_cos=0.04, drift=0.0074,
              rotation_before_window=50.0)
    half = dict(SCALE, log_every=50)
    write_run(tmp_path, "sgd", 0, rotation=0.2, norm_growth=1.1, acc_eval=0.99, scale=half)
    adam, sgd = (load_run(records.run_dir(tmp_path, row, 0), claims.TABLES) for row in ("adam", "sgd"))
    with pytest.raises(BadRunError, match="ran different scales \\(scale.log_every 50 against 100\\)"):
        _load(tmp_path)  # one results root holds one scale
    assert metrics.rotation_per_100_deg(adam) == pytest.approx(7.0)  # the 50° intervals before the window are out
    assert metrics.rotation_per_100_series(adam).loc[1000] == pytest.approx(50.0)
    assert metrics.rotation_per_100_deg(sgd) == pytest.approx(0.4)  # 0.2° per 50 steps
    assert metrics.norm_growth(adam) == pytest.approx(3.0)
    assert metrics.channel_median(adam, "drift_sigma_per_step") == pytest.approx(0.0074)
    assert metrics.channel_median(adam, "predicted_lag_sigma") == pytest.approx(0.0074 * 0.97 / 0.03)
    assert metrics.channel_median(adam, "lag_sigma", absolute=True) == pytest.approx(0.0074 * 0.97 / 0.03)
    # signed lags +0.5, -0.7, +0.9, -1.1, +1.3, -1.5 (x the prediction): median (-0.7 + 0.5) / 2
    assert metrics.channel_median(adam, "lag_sigma") == pytest.approx(-0.1 * 0.0074 * 0.97 / 0.03)
    assert metrics.layer_mean(adam, "update_cos") == pytest.approx(0.04)
    assert metrics.failing_steps(adam) == list(range(2000, 6001, 500))
    assert metrics.failing_steps(sgd) == []
    with pytest.raises(KeyError, match="no column 'nope'"):
        metrics.channel_median(adam, "nope")
    stacked = metrics.tidy([adam, sgd], "checks")
    assert set(stacked["row"]) == {"adam", "sgd"} and stacked["in_window"].all()
    assert metrics.tidy([adam], "averaging").empty


def test_a_row_whose_optimizer_the_suite_does_not_know_is_named_not_a_key_error():
    info = _run_json("adam", 0)
    assert check_against_row(info, ROWS["adam"]) == []
    problems = check_against_row(info, RowSpec("Lion, lr 1e-4", "lion", 1e-4))
    assert len(problems) == 1 and "optimizer 'lion'" in problems[0] and "OPTIMIZER_CLASSES" in problems[0]
    assert "schedule 'step'" in check_against_row(info, RowSpec("Adam, step decay", "adam", 3e-3, schedule="step"))[0]
    problems = check_against_row(info, RowSpec("SGD, lr 0.05", "sgd", 0.05))  # known, but not what ran
    assert problems == ["optimizer class 'Adam', the row means 'SGD'", "learning rate 0.003 in group 'conv', "
                        "the row means 0.05"]


def _checks_run(acc: list[float]) -> Run:
    """A run whose checks (and stored-statistics interventions) at steps 2,000, 2,100, ... have accuracies ``acc``."""
    steps = [2000 + 100 * i for i in range(len(acc))]
    checks = pd.DataFrame({"step": steps, "acc_eval_mode": acc, "acc_train_mode": 1.0})
    iv = pd.DataFrame({"step": steps, "intervention": "none", "k": -1, "norm_layer": "", "acc_eval_mode": acc})
    return Run(Path("runs/adam/seed=0"), {"row": "adam", "seed": 0},
               {"scale": {"check_start": 2000, "steps": steps[-1]}}, {"checks": checks, "interventions": iv})


def test_a_check_at_exactly_90_percent_is_not_below_90_percent():
    """"Checks below 90%" counts accuracies strictly below 0.90: 3,600 of 4,000 right is not a failing check."""
    run = _checks_run([0.8995, 3600 / 4000, 0.9005, 0.90, 0.5])
    assert 3600 / 4000 == 0.90
    assert metrics.checks_below(run) == (2, 5)
    assert metrics.failing_steps(run) == [2000, 2400]
    # and recovering to exactly 90% counts as recovered (smallest_k: accuracy >= the threshold)
    curve = pd.Series([0.5, 0.7, 0.90, 0.95], index=[0, 1, 2, 4])
    assert intervention_log.smallest_k(curve) == 2


def test_a_per_run_measure_is_computed_once_until_the_run_changes():
    """``once_per_run``: the table and the claims share a run's measures; a run whose tables, info or config are
    replaced (as tests build runs) is measured afresh."""
    calls = []

    @once_per_run
    def measure(run: Run, factor: int = 1) -> int:
        calls.append(factor)
        return len(run.tables["checks"]) * factor

    run = _checks_run([0.5, 0.95])
    assert measure(run) == measure(run) == 2 and calls == [1]
    assert measure(run, 3) == 6 and calls == [1, 3]
    run.tables["checks"] = run.tables["checks"].iloc[:1]
    assert measure(run) == 1 and calls == [1, 3, 1]
    run.info = {"row": "adam", "seed": 1}
    assert measure(run) == 1 and calls == [1, 3, 1, 1]
    assert metrics.failing_checks([run]) is not metrics.failing_checks([run])  # a new frame for every caller


def test_the_table_spread_is_the_sample_sd_over_seeds(tmp_path):
    """Three seeds at 10%, 20% and 40%: mean 7/30, sample sd 0.1 · √(7/3) (the population sd would be
    0.1 · √(14/9)); the cell prints both, and claims.md describes the row with the same spread."""
    for seed, acc in enumerate((0.1, 0.2, 0.4)):
        write_run(tmp_path, "adam", seed, rotation=7.0, norm_growth=6.0, acc_eval=acc)
    runs = _load(tmp_path)
    line = table.build_table(runs).iloc[0]
    assert line["acc_eval_mode_mean"] == pytest.approx(7 / 30)
    assert line["acc_eval_mode_std"] == pytest.approx(0.1 * math.sqrt(7 / 3), rel=1e-12)
    assert "| 23.3% ± 15.3 [60.0%] |" in table.to_markdown(table.build_table(runs), tmp_path)
    assert evidence.collect(tmp_path, runs).stat("adam", "acc_eval_mode").describe("pct") == \
        "23.3% ± 15.3 points (n = 3 seeds)"


def test_the_lowest_check_is_the_rows_lowest_over_its_runs_with_its_seed_and_step(tmp_path):
    """Seed 1 falls to 20% at its check at step 4,000, seed 2 to 30% there, seed 0 never below 90%: the row's lowest
    check is seed 1's; alone, seed 0's lowest is its first check at 90% (a tie: the first step), without a seed."""
    for seed, lowest in ((0, None), (1, 0.2), (2, 0.3)):
        write_run(tmp_path, "adam", seed, rotation=7.0, norm_growth=6.0, acc_eval=0.9, lowest=lowest)
    runs = _load(tmp_path)
    line = table.build_table(runs).iloc[0]
    assert (line["lowest_check"], line["lowest_check_step"], line["lowest_check_seed"]) == (0.2, 4000, 1)
    assert "| 20.0% (seed 1, step 4,000) |" in table.to_markdown(table.build_table(runs), tmp_path)
    alone = table.build_table([r for r in runs if r.seed == 0]).iloc[0]
    assert table.lowest_cell(alone) == f"90.0% (step {SCALE['check_start']:,})"


def test_make_claims_ends_with_each_rows_lowest_check_and_the_finding(tmp_path):
    """The console's last lines: verdicts counted in one line (none listed as NOT RUN), one line per row with its
    lowest check (step) and training-mode accuracy, and the finding, whose figures are the runs' own."""
    from bnrotation.study.analysis.claims.command import console_summary
    from bnrotation.study.analysis.formatting import cell
    write_run(tmp_path, "sgd", 0, rotation=0.5, norm_growth=1.2, acc_eval=0.99)
    write_run(tmp_path, "adam", 0, rotation=7.0, norm_growth=6.0, acc_eval=0.8, lowest=0.1)
    runs = _load(tmp_path)
    ev = evidence.collect(tmp_path, runs)
    checks = [claim.check(ev) for claim in registry.CLAIMS]
    lines = console_summary(ev, checks)
    assert lines[0].startswith("claims: ") and "NOT RUN" in lines[0] and "not weighed" in lines[0]
    by_row = {ln.split()[0]: ln for ln in lines[2:4]}
    n = len(range(SCALE["check_start"], SCALE["steps"] + 1, SCALE["check_every"]))
    mean = cell((0.8 * (n - 1) + 0.1) / n, "pct")
    assert f"evaluation mode {mean}" in by_row["adam"]  # the row's mean, as table.md gives it
    assert "lowest check 10.0% (step 4,000)" in by_row["adam"] and "training mode 100.0%" in by_row["adam"]
    assert "lowest check 99.0% (step 2,000)" in by_row["sgd"]
    lost = f"{100 - float(mean.rstrip('%')):.1f}"
    assert lines[-1] == (f"finding: On the synthetic task (noisy templates), {ROWS['adam'].label} (`adam`) loses "
                         f"{lost} points, from training mode's 100.0% to evaluation mode's {mean} (n = 1 seed), down "
                         f"to 10.0% at one check (step 4,000); {ROWS['sgd'].label} (`sgd`) loses less, 1.0 points, "
                         "from training mode's 100.0% to evaluation mode's 99.0% (n = 1 seed); re-estimating the "
                         "running statistics brings both back to 100.0% and 100.0% at the last step.")


def test_the_rank_claims_use_ranks_not_values():
    """Rotation that grows geometrically while accuracy falls linearly: the order is perfect (Spearman's rho = -1),
    Pearson's r is not (about -0.6); the published rho is Spearman's over the article's own figures."""
    from scipy.stats import spearmanr
    rotation = dict(zip(PUBLISHED_ROWS, (1.0, 2.0, 4.0, 8.0, 16.0, 1000.0)))
    accuracy = dict(zip(PUBLISHED_ROWS, (0.99, 0.98, 0.97, 0.96, 0.95, 0.94)))
    assert np.corrcoef(list(rotation.values()), list(accuracy.values()))[0, 1] > -0.7
    per_run = pd.DataFrame([{"row": r, "seed": s, "rotation_per_100_deg": rotation[r] * (1 + 0.01 * s),
                             "norm_growth": 1.0, "acc_eval_mode": accuracy[r]} for r in PUBLISHED_ROWS for s in (0, 1, 2)])
    claim = next(c for c in registry.CLAIMS if c.name == "rotation_orders_accuracy")
    check = claim.check(evidence.Evidence(Path("."), [], per_run))
    assert check.measured == ("rho = -1.00 over row means of 6 rows (n per row: 3 seeds (0–2) for `sgd`, "
                              "`adam_lr3e-4`, `adam_cosine`, `adamw`, `adam`, `adam_projected`); per seed -1.00, "
                              "-1.00, -1.00 (seeds 0–2, those all 6 rows ran)")
    assert check.verdict == "PASS"
    published = spearmanr([ROWS[r].published.rotation_deg_per_100 for r in PUBLISHED_ROWS],
                          [ROWS[r].published.acc_eval_mode for r in PUBLISHED_ROWS]).statistic
    assert check.published == f"rho = {published:+.2f} over the six rows of the article's table"


# ----------------------------------------------------------------------------- theory
def test_equilibrium_formulas_and_where_they_do_not_apply():
    assert theory.adamw_angular_update(3e-3, 0.05, 0.9) == pytest.approx(math.sqrt(2 * 1.5e-4 * 0.1 / 1.9))
    assert theory.sgdm_angular_update(0.05, 5e-4, 0.9) == pytest.approx(math.sqrt(2 * 2.5e-5 / 1.9))
    assert theory.adamw_equilibrium_norm(3e-3, 0.05, 576) == pytest.approx(math.sqrt(3e-3 * 576 / 0.1))
    p = theory.predict({"name": "adamw", "lr": 3e-3, "weight_decay": 0.05, "beta1": 0.9, "momentum": 0.9})
    assert p.applies and p.equilibrium_steps == pytest.approx(1 / (2 * 1.5e-4))
    assert p.path_deg_per_100 == pytest.approx(100 * math.degrees(p.per_step_rad))
    assert p.net_deg_per_100 == pytest.approx(theory.random_walk_factor(100, 0.9) * math.degrees(p.per_step_rad))
    for opt in ({"name": "sgd", "lr": 0.05, "weight_decay": 0.0, "momentum": 0.9},
                {"name": "adam", "lr": 3e-3, "weight_decay": 0.0, "beta1": 0.9}):
        none = theory.predict(opt)
        assert not none.applies and "no weight decay" in none.reason and math.isnan(none.net_deg_per_100)
    assert not theory.predict({"name": "adam", "lr": 3e-3, "weight_decay": 0.01}).applies  # coupled L2: no formula
    with pytest.raises(ValueError, match="no rotational equilibrium"):
        theory.adamw_angular_update(3e-3, 0.0, 0.9)
    with pytest.raises(ValueError, match="momentum"):
        theory.sgdm_angular_update(0.1, 0.1, 1.0)


def test_random_walk_factor_closed_form_and_monte_carlo():
    assert theory.random_walk_factor(1, 0.9) == pytest.approx(1.0)
    assert theory.random_walk_factor(100, 0.0) == pytest.approx(10.0)
    assert theory.random_walk_factor(100, 0.9) == pytest.approx(41.47, abs=0.01)
    rng = np.random.default_rng(0)
    beta, n, chains = 0.9, 100, 4000
    g = rng.normal(size=(chains, 300 + n))
    ema = np.zeros(chains)
    steps = []
    for t in range(g.shape[1]):  # an EMA of white noise, as Adam's first moment
        ema = beta * ema + (1 - beta) * g[:, t]
        if t >= 300:
            steps.append(ema.copy())
    steps = np.array(steps)  # (n, chains)
    ratio = np.sqrt((steps.sum(0) ** 2).mean() / (steps ** 2).mean())
    assert ratio == pytest.approx(theory.random_walk_factor(n, beta), rel=0.05)
    with pytest.raises(ValueError):
        theory.random_walk_factor(0, 0.9)


def _simulate(optimizer: str, lr: float, wd: float, beta: float = 0.9, dim: int = 300, channels: int = 8,
              steps: int = 6000, seed: int = 0) -> tuple[float, float]:
    """Scale-invariant weights under pure gradient noise: the gradient is orthogonal to w and scales as 1/||w||.
    Returns (RMS angle per step, RMS net angle per 100 steps), radians, over the second half."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(channels, dim))
    w /= np.linalg.norm(w, axis=1, keepdims=True)  # unit norm; 1/(2 lr wd) = 1,000 steps to equilibrium
    m, v = np.zeros_like(w), np.zeros_like(w)
    per_step, snapshots = [], []

    def angle(a, b):
        a = a / np.linalg.norm(a, axis=1, keepdims=True)
        b = b / np.linalg.norm(b, axis=1, keepdims=True)
        return 2 * np.arctan2(np.linalg.norm(a - b, axis=1), np.linalg.norm(a + b, axis=1))

    for t in range(1, steps + 1):
        xi = rng.normal(size=w.shape)
        n2 = (w * w).sum(1, keepdims=True)
        g = (xi - (xi * w).sum(1, keepdims=True) / n2 * w) / np.sqrt(n2)
        before = w
        if optimizer == "sgd":  # torch.optim.SGD: L2 in the gradient, heavy ball, no dampening
            m = beta * m + g + wd * w
            w = w - lr * m
        else:  # torch.optim.AdamW
            m = beta * m + (1 - beta) * g
            v = 0.999 * v + 0.001 * g * g
            w = w * (1 - lr * wd) - lr * (m / (1 - beta ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
        if t > steps // 2:
            per_step.append(angle(before, w))
            if t % 100 == 0:
                snapshots.append(w)
    net = [angle(a, b) for a, b in zip(snapshots, snapshots[1:])]
    return float(np.sqrt(np.mean(np.square(per_step)))), float(np.sqrt(np.mean(np.square(net))))


def test_equilibrium_angular_update_matches_a_simulated_random_walk():
    """The two papers' formulas from first principles: scale-invariant weights, white-noise gradients."""
    sgd = theory.predict({"name": "sgd", "lr": 0.05, "weight_decay": 0.01, "momentum": 0.9})
    step, _ = _simulate("sgd", 0.05, 0.01)
    assert step == pytest.approx(sgd.per_step_rad, rel=0.05)
    adamw = theory.predict({"name": "adamw", "lr": 0.01, "weight_decay": 0.05, "beta1": 0.9})
    step, net = _simulate("adamw", 0.01, 0.05)
    assert step == pytest.approx(adamw.per_step_rad, rel=0.08)
    assert net == pytest.approx(math.radians(adamw.net_deg_per_100), rel=0.08)
    assert net < 0.5 * math.radians(adamw.path_deg_per_100)  # the net angle is far below the summed one


# ----------------------------------------------------------------------------- claims: statistics and verdicts
def test_every_claim_is_declared_once_and_bespoke_checks_register_under_their_name():
    names = [c.name for c in registry.CLAIMS]
    assert len(names) == len(set(names))
    sections = [c.section for c in registry.CLAIMS]
    assert sections.count(kinds.ARTICLE) == 27 and sections.count(kinds.RESNET) == 9
    assert sections.count(kinds.FROZEN) == 1 and sections.count(kinds.FASHION_MNIST) == 6
    assert sections.count(kinds.CALIBRATION) == 9 and sections.count(kinds.MAP) == 6  # issue 38's four, issue 48's five
    assert sections.count(kinds.WHY) == 4  # issue 64's four mechanisms
    assert sections == sorted(sections, key=[kinds.ARTICLE, kinds.RESNET, kinds.FASHION_MNIST, kinds.FROZEN,
                                             kinds.CALIBRATION, kinds.MAP, kinds.WHY].index)
    assert registry.training_mode_stays_at_100.name == "training_mode_stays_at_100"
    assert isinstance(registry.training_mode_stays_at_100, kinds.Bespoke)
    # the article's table, cell by cell: every published cell that is not NaN (6 rows x 4 + the window test's 3)
    assert len(registry.TABLE_CELLS) == 27 and {c.row for c in registry.TABLE_CELLS} == {
        row for row, spec in ROWS.items() if spec.published is not None}


def test_published_figures_are_read_from_rows_and_article():
    from bnrotation.study import article
    by_name = {c.name: c for c in registry.CLAIMS}
    assert by_name["update_cosine_adam"].figure() == article.UPDATE_COSINE["adam"]
    assert by_name["drift_middle_sgd"].figure() == article.MIDDLE_DRIFT["sgd"]
    assert by_name["projected_grows_less_than_adam"].published_text() == (
        f"{ROWS['adam_projected'].published.norm_growth:.2f}× against "
        f"{ROWS['adam'].published.norm_growth:.2f}×")
    assert kinds.published("adam", "acc_eval_mode") == article.Figure(ROWS["adam"].published.acc_eval_mode, 3)
    assert kinds.published("adam_bn_m0.3", "norm_growth") is None  # the article gives no norm for it
    assert kinds.published("adamp", "rotation_per_100_deg") is None  # nor any figure for AdamP
    with pytest.raises(KeyError, match="no figure for 'norm_growth' of row 'adam_bn_m0.3'"):
        kinds.table_figure("adam_bn_m0.3", "norm_growth")


def test_tolerances_follow_the_seed_spread():
    a, b = SeedStat((0.5, 0.6, 0.7)), SeedStat((0.1, 0.2, 0.3))
    assert a.sd == pytest.approx(0.1) and kinds.above(a, b)[0] and not kinds.above(b, a)[0]
    close = SeedStat((0.25, 0.35, 0.45))
    assert not kinds.above(close, b)[0]  # 0.15 apart, 2 SE = 0.163
    ok, how = kinds.above(SeedStat((0.3,)), SeedStat((0.2,)))
    assert ok and "sign alone" in how


def test_a_replication_that_matches_the_article_passes(replication, tmp_path):
    md, checks = claims.build_report(replication, _load(replication))
    verdict = {c.name: c.verdict for c in checks}
    expected_pass = ["rotation_orders_accuracy", "norm_growth_does_not_order_accuracy",
                     "projected_grows_less_than_adam", "projected_does_worse_than_adam",
                     "projected_rotates_faster_than_adam", "training_mode_stays_at_100",
                     "evaluation_mode_falls_below_training_mode", "adam_dips_to_chance", "update_cosine_adam", "update_cosine_sgd",
                     "update_cosine_adam_above_sgd", "gradient_cosine_is_zero", "drift_middle_adam",
                     "drift_middle_sgd", "drift_adam_above_sgd", "predicted_lag_middle_adam",
                     "predicted_lag_middle_sgd", "lag_formula_predicts_measured_lag",
                     "stale_middle_channel_at_failing_check", "abs_mean_over_std_middle",
                     "reestimation_restores_every_final_checkpoint", "middle_layer_alone_lifts_failing_checks",
                     "window_test_rotation_almost_unchanged", "window_test_recovers_most_accuracy",
                     "cosine_decay_recovers", "small_learning_rate_matches_sgd", "adamw_between_adam_and_sgd"]
    assert {n: verdict[n] for n in expected_pass} == {n: "PASS" for n in expected_pass}
    grad = next(c for c in checks if c.name == "gradient_cosine_is_zero")
    assert "ε/σ² = 1.0e-05" in grad.note  # the synthetic runs' fresh variance is 1, BatchNorm's default ε 1e-5
    ev = evidence.collect(replication, _load(replication))
    for cell_claim in registry.TABLE_CELLS:
        c = cell_claim.check(ev)
        if cell_claim.column != "checks_below_90":  # constant accuracy per run: all or none of its checks fail
            assert c.verdict == "PASS", (cell_claim.row, c.claim, c.measured, c.tolerance)
    assert "NOT RUN: no run has an averaging table" in md and "NOT RUN: no runs of `adam_groupnorm`" in md
    assert "| `adam` | 27 | 4 (25%) | 4–4 | 0 | 16 |" in md  # 9 failing checks x 3 seeds; 90% first reached at k = 4
    assert "`adamw` | sqrt(2 lr wd (1 - beta1) / (1 + beta1))" in md


def test_a_broken_replication_fails_the_claims_it_breaks(tmp_path):
    """Projected Adam as accurate as SGD and an evaluation mode that never falls break named claims."""
    root = write_replication(tmp_path, **{"adam_projected": {"acc_eval": 0.99}, "adam": {"acc_train": 0.6}})
    _, checks = claims.build_report(root, _load(root))
    verdict = {c.name: c.verdict for c in checks}
    assert verdict["projected_does_worse_than_adam"] == "FAIL"
    assert verdict["training_mode_stays_at_100"] == "FAIL"
    assert verdict["evaluation_mode_falls_below_training_mode"] == "FAIL"
    assert verdict["rotation_orders_accuracy"] == "FAIL"  # the fastest-turning row is now among the best


def test_the_window_test_compares_rotation_on_the_seeds_both_rows_ran(tmp_path):
    """The window row at seed 0 only against Adam at seeds 0-2: the same seed means the same training batches,
    so seed 0 is compared with seed 0 (here equal, 0%), not with a mean over other seeds (+69%)."""
    for seed, rot in ((0, 7.7), (1, 3.0), (2, 3.0)):
        write_run(tmp_path, "adam", seed, rotation=rot, norm_growth=6.0, acc_eval=0.6)
    write_run(tmp_path, "adam_bn_m0.3", 0, rotation=7.7, norm_growth=6.0, acc_eval=0.93)
    check = registry.window_test_rotation_almost_unchanged.check(evidence.collect(tmp_path, _load(tmp_path)))
    assert check.verdict == "PASS" and "+0% (on the seeds both rows ran: 0)" in check.measured


def test_missing_rows_and_single_seeds_are_not_run(tmp_path, capsys):
    write_replication(tmp_path, seeds=(0,), rows=("sgd", "adam"))
    assert claims.main(["--results", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "claims.md").read_text()
    _, checks = claims.build_report(tmp_path, _load(tmp_path))
    verdict = {c.name: c.verdict for c in checks}
    assert verdict["window_test_recovers_most_accuracy"] == "NOT RUN"
    assert verdict["rotation_orders_accuracy"] == "NOT RUN"  # 2 of 6 rows
    assert verdict["update_cosine_adam"] == "NOT RUN"  # one seed: no spread, no tolerance
    assert verdict["update_cosine_adam_above_sgd"] == "PASS"  # an order needs no spread: the sign alone, said so
    assert "sign alone" in md and "missing runs of `adam_bn_m0.3`" in md
    assert claims.main(["--results", str(tmp_path / "nowhere")]) == 2


def test_the_protocol_scale_is_the_full_config():
    full = yaml.safe_load((ROOT / "conf" / "scale" / "full.yaml").read_text())
    assert protocol_scale() == {k: full[k] for k in protocol_scale()}


def test_runs_below_the_article_scale_get_no_verdict(tmp_path):
    """A replication at a shorter scale would pass and fail claims by accident: every verdict is withheld,
    the one it would have had is said, and the table marks its published figures as for orientation."""
    quick = dict(SCALE, name="quick", steps=2000, check_start=1000, heldout_size=2000)
    root = tmp_path / "quick"
    for row in ("sgd", "adam"):
        pub = ROWS[row].published
        for seed in (0, 1, 2):
            write_run(root, row, seed, rotation=pub.rotation_deg_per_100, norm_growth=pub.norm_growth,
                      acc_eval=pub.acc_eval_mode, scale=quick)
    md, checks = claims.build_report(root, _load(root))
    assert {c.verdict for c in checks} == {"NOT RUN", "not judged at this scale"}  # NOT RUN: rows never run
    assert all(c.verdict == "NOT RUN" for c in checks if "it would read" not in c.note)
    assert any("it would read PASS" in c.note for c in checks)
    assert re.search(r"Named checks: \*\*0 PASS, 0 FAIL, \d+ NOT RUN, \d+ not judged at this scale\*\*", md)
    assert "**Not the article's scale.**" in md and "2,000 steps" in md and "6,000 steps" in md
    assert table.main(["--results", str(root), "--out", str(tmp_path / "out")]) == 0
    assert "**Not the article's scale.**" in (tmp_path / "out" / "table.md").read_text()
    assert set(pd.read_csv(tmp_path / "out" / "table.csv")["scale"]) == {"quick"}


def test_a_results_root_that_mixes_scales_is_refused(tmp_path, capsys):
    write_run(tmp_path, "adam", 0, rotation=7.7, norm_growth=6.0, acc_eval=0.6)
    write_run(tmp_path, "adam", 1, rotation=7.7, norm_growth=6.0, acc_eval=0.6, scale=dict(SCALE, steps=3000))
    with pytest.raises(BadRunError, match=r"adam/seed=0 and .*adam/seed=1 ran different scales"):
        _load(tmp_path)
    assert table.main(["--results", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "keep one scale per results root" in capsys.readouterr().err


def test_norms_without_running_statistics_finding(tmp_path):
    write_run(tmp_path, "adam", 0, rotation=7.7, norm_growth=6.0, acc_eval=0.6)
    write_run(tmp_path, "adam_groupnorm", 0, rotation=7.0, norm_growth=5.0, acc_eval=0.99, acc_train=0.995)
    md, _ = claims.build_report(tmp_path, _load(tmp_path))
    assert "| `adam_groupnorm` | 7.00° (n = 1 seed) | 99.5% (n = 1 seed) | 99.0% (n = 1 seed) |" in md
    assert "- `adam`: training mode minus evaluation mode, 40.0 points." in md
    assert "- `adam_groupnorm`: training mode minus evaluation mode, 0.5 points." in md
    assert "NOT RUN: no runs of" not in md


def test_failing_checks_and_recovery_share(tmp_path):
    write_run(tmp_path, "adam", 0, rotation=7.0, norm_growth=3.0, acc_eval=0.6, lifted=0.85)
    write_run(tmp_path, "sgd", 0, rotation=0.5, norm_growth=1.1, acc_eval=0.95)
    failing = metrics.failing_checks(_load(tmp_path))
    assert list(failing["row"].unique()) == ["adam"] and len(failing) == 9  # steps 2,000, 2,500, ..., 6,000
    assert failing["stored"].tolist() == [0.6] * 9 and failing["bn2"].tolist() == [0.85] * 9
    assert failing["k_needed"].tolist() == [4] * 9  # 0.6 + 0.4 * 0.8 = 0.92 is the first k past 90%
    ev = evidence.Evidence(Path("."), [], pd.DataFrame({"row": ["sgd", "adam", "x", "sgd", "adam", "x"],
                                                        "seed": [0, 0, 0, 1, 1, 1],
                                                        "acc_eval_mode": [1.0, 0.6, 0.9, 1.0, 0.5, 0.5]}))
    assert evidence.recovery_share(ev, "x", lost="adam", reference="sgd").values == pytest.approx((0.75, 0.0))


# ----------------------------------------------------------------------------- figures
def test_each_row_keeps_the_colour_its_row_spec_declares():
    import matplotlib.colors
    palette = figures.row_palette(["adam", "my_row"])
    assert all(palette[row] == matplotlib.colors.to_rgb(spec.colour) for row, spec in ROWS.items())
    for arch, task in {(spec.arch, spec.task) for spec in ROWS.values()}:  # no two rows of one network and task
        rows = [row for row, spec in ROWS.items() if (spec.arch, spec.task) == (arch, task)]  # share a colour
        assert len({palette[row] for row in rows}) == len(rows), (arch, task)
    assert all(palette[on_fashion_mnist(row)] == palette[row] for row in ARTICLE_ROWS)  # twins share theirs
    assert palette["my_row"] not in {palette[row] for row in ROWS}  # a row without one gets another


def test_figures_state_n_and_skip_what_has_no_data(replication, tmp_path):
    out = tmp_path / "figures"
    done = figures.make_figures(replication, _load(replication), out,
                                only=("01_accuracy_vs_rotation", "06_single_layer_fresh_statistics", "09_averaging"))
    drawn = {d.name: d for d in done}
    assert drawn["09_averaging"].skipped.startswith("no averaging results")
    for name in ("01_accuracy_vs_rotation", "06_single_layer_fresh_statistics"):
        assert (out / f"{name}.png").stat().st_size > 10_000 and (out / f"{name}.pdf").exists()
    assert "(n = 21 runs, 7 rows × 3 seeds)" in drawn["01_accuracy_vs_rotation"].caption
    assert "Failing checks per row: adamw 27, adam 27, adam_projected 27." in \
        drawn["06_single_layer_fresh_statistics"].caption
    assert not (out / "09_averaging.png").exists()
    assert not (out / "README.md").exists()  # a partial run leaves the index of every figure alone
    readme = figures.index_markdown(done, replication)
    assert "## 1. Evaluation-mode accuracy against rotation\n\n![Evaluation-mode accuracy against rotation]" \
           "(01_accuracy_vs_rotation.png)" in readme
    assert "## 9. Weight averaging" in readme and "Not drawn: no averaging results" in readme
    assert drawn["01_accuracy_vs_rotation"].caption + " ([PDF](01_accuracy_vs_rotation.pdf))" in readme


def test_averaging_figure_and_finding_from_an_averaging_table(tmp_path):
    av = pd.DataFrame([dict(step=s, average=a, decay=d, window_steps=w, policy=p, acc_eval_mode=acc)
                       for s in (4000, 6000)
                       for a, d, w, p, acc in (("live", math.nan, -1, "none", 0.6), ("ema", 0.999, -1, "copy", 0.4),
                                               ("ema", 0.999, -1, "refresh", 1.0),
                                               ("tail", math.nan, 1000, "refresh", 0.99))])
    write_replication(tmp_path, seeds=(0, 1), rows=("sgd", "adam"), adam={"averaging": av}, sgd={"averaging": av})
    runs = _load(tmp_path)
    done = figures.make_figures(tmp_path, runs, tmp_path / "fig", only=("09_averaging",))
    assert not done[0].skipped and (tmp_path / "fig" / "09_averaging.png").exists()
    md, _ = claims.build_report(tmp_path, runs)
    assert ("- `adam` (n = 2 seeds): Live 60.0% (none); EMA 0.999 from 40.0% (copy) to 100.0% (refresh); "
            "Tail 1000 steps 99.0% (refresh).") in md


# ----------------------------------------------------------------------------- real smoke results, notebooks
@pytest.fixture(scope="module")
def smoke_root(tmp_path_factory) -> Path:
    """The runner itself at a toy size: sgd and adamw (the row with an equilibrium prediction), seed 0."""
    from conftest import run_cfg

    from bnrotation.study.runner import run
    root = tmp_path_factory.mktemp("smoke")
    toy = ["task.probe_size=32", "task.batch_size=16", "scale.heldout_size=32", "scale.steps=12",
           "scale.log_every=4", "scale.check_start=4", "scale.check_every=4", "scale.intervene_every=4",
           "scale.reestimate_batches=1"]
    for row, seed in (("sgd", 0), ("adamw", 0)):
        assert run(run_cfg([f"experiment={row}", f"seed={seed}", *toy], root)) is not None
    return root


@pytest.mark.slow
def test_make_figures_and_claims_run_on_the_runners_output(smoke_root, tmp_path):
    """Every figure is drawn from the runner's output by the notebook test below; here the command line."""
    assert figures.main(["--results", str(smoke_root), "--out", str(tmp_path / "figures"),
                         "--only", "04_rotation_over_steps", "09_averaging"]) == 0
    for name in ("04_rotation_over_steps", "09_averaging"):  # the runner logs the averaging table
        assert (tmp_path / "figures" / f"{name}.pdf").exists(), name
    assert claims.main(["--results", str(smoke_root), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "claims.md").read_text()
    assert "Seeds per row: `sgd` 0, `adamw` 0." in md
    assert "| `adamw` | sqrt(2 lr wd (1 - beta1) / (1 + beta1))" in md


NO_TORCH = """
import runpy, sys
import bnrotation.study.analysis.claims, bnrotation.study.analysis.tables.figures, bnrotation.study.analysis.measures.metrics
import bnrotation.study.analysis.results, bnrotation.study.analysis.tables.table, bnrotation.study.analysis.measures.theory
for path in sys.argv[1:]:
    runpy.run_path(path, run_name="__main__")
bad = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
sys.exit(f"analysis imported {bad}" if bad else 0)
"""


@pytest.mark.slow
def test_notebooks_run_against_smoke_results_and_analysis_never_imports_torch(smoke_root):
    """Every notebook runs as a plain script on the runner's output, drawing every figure; and neither the
    analysis modules nor the notebooks import torch (one interpreter, to keep the test fast)."""
    import jupytext
    notebooks = sorted(p for p in (ROOT / "notebooks").glob("*.py") if p.name != MONITOR_NOTEBOOK)  # it trains
    assert notebooks
    for nb in notebooks:
        assert len(jupytext.read(nb).cells) > 5, nb  # a percent-format notebook, not a bare script
    env = dict(os.environ, PYTHONPATH=str(SRC), BNROTATION_RESULTS=str(smoke_root), MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, "-c", NO_TORCH, *map(str, notebooks)], env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert f"2 runs under {smoke_root}" in done.stdout
    assert "Weight averaging and BatchNorm statistics" in done.stdout and "Rotation of the last conv" in done.stdout


def test_drift_note_extrapolates_the_interval_at_the_measured_exponent():
    Stat, note_for = SeedStat, registry.drift_interval_note
    run = Run(Path("runs/adam/seed=0"), {"row": "adam", "seed": 0}, {"scale": {"log_every": 100}}, {})
    # drift ∝ Δ^-1/2 and the published drift 4× the measured one: 4 = (100 / Δ)^(1/2) at Δ = 100 / 16
    note = note_for(Stat((0.001, 0.003)), Stat((-0.5, -0.5)), 0.008, run)
    assert "Δ^-0.50 (mean over 2 seeds" in note and "corresponds to Δ ≈ 6 steps" in note
    assert note_for(Stat((0.002,)), Stat((0.0,)), 0.008, run) == ""  # steady drift: no interval fits
