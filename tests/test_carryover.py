"""Does it carry over? The ResNet-20 checks: each gives PASS on synthetic runs built to
pass, FAIL on runs built to fail and NOT RUN with its rows missing; both networks in one results root, for the
table, the claims and the figures, on synthetic runs and on the runner's own output (the depth statistic and the
learning-rate halves: tests/test_depth.py; the critical value for 21 layers: tests/test_stats.py).

Synthetic runs: :func:`test_analysis.write_run`, whose every summary is known in closed form, with ResNet-20's 21
BatchNorm layers from the real model's pairing (:func:`test_analysis.resnet_layers`).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from bnrotation import records
from bnrotation.study.analysis import claims
from bnrotation.study.analysis.claims import carryover, evidence, kinds
from bnrotation.study.analysis.tables import figures, table
from bnrotation.study.rows import RESNET_ROWS

from test_analysis import _load, cosine_lr, resnet_layers, write_replication, write_resnet_run

SEEDS = (0, 1, 2)
R_SGD, R_COS, R_ADAMW, R_ADAM, R_WINDOW = RESNET_ROWS
BY_DEPTH = {conv: 1.0 + i for i, conv in enumerate(resnet_layers())}  # lag grows layer after layer
AGAINST_DEPTH = {conv: 21.0 - i for i, conv in enumerate(resnet_layers())}  # and shrinks
DEEP_LAYER = "layer3.0.bn1"  # the layer whose fresh statistics alone lift the failing checks


def exposed(step: int) -> float:
    """Cosine decay's accuracy, built to pass: 85% (failing) while the rate is above its median (before step
    4,000), 99% below it."""
    return 0.85 if step < 4000 else 0.99 if step > 4000 else 0.92


PASSING = {  # row: write_run keywords; accuracy falls with rotation, Adam collapses, the window test recovers
    R_SGD: dict(rotation=0.5, acc_eval=0.995),
    R_COS: dict(rotation=2.0, acc_eval=0.92, acc_eval_at=exposed, lr_at=cosine_lr, reestimated=0.995),
    R_ADAMW: dict(rotation=5.0, acc_eval=0.80),
    R_ADAM: dict(rotation=8.0, acc_eval=0.60, lag_scale=BY_DEPTH, lifted_layer=DEEP_LAYER, lifted=0.95),
    R_WINDOW: dict(rotation=8.0, acc_eval=0.95),
}
FAILING = {  # each check broken where it looks: AdamW beats SGD, training mode falls, lag shrinks with depth,
    # cosine decay shows no exposure and re-estimation stops short, the window test recovers nothing
    R_SGD: dict(rotation=0.5, acc_eval=0.995),
    R_COS: dict(rotation=2.0, acc_eval=0.92, lr_at=cosine_lr, reestimated=0.98),
    R_ADAMW: dict(rotation=5.0, acc_eval=0.999),
    R_ADAM: dict(rotation=8.0, acc_eval=0.60, acc_train=0.95, lag_scale=AGAINST_DEPTH, lifted_layer=DEEP_LAYER,
                 lifted=0.95),
    R_WINDOW: dict(rotation=8.0, acc_eval=0.62),
}
CHECKS = [c.name for c in carryover.CHECKS]
EXPLORATORY = ["resnet_single_layer_restores_most", "resnet_top_k_channel_share"]


def write_resnet(root: Path, rows: dict, seeds=SEEDS) -> Path:
    """Every row of ``rows`` at every seed, each seed 2% apart (accuracy at most 1)."""
    for row, spec in rows.items():
        for seed in seeds:
            f = 1 + 0.02 * (seed - 1)
            kw = dict(spec, norm_growth=2.0, acc_eval=min(spec["acc_eval"] * f, 1.0))
            if "acc_eval_at" in spec:
                kw["acc_eval_at"] = lambda s, at=spec["acc_eval_at"], f=f: min(at(s) * f, 1.0)
            write_resnet_run(root, row, seed, **kw)
    return root


@pytest.fixture(scope="module")
def passing(tmp_path_factory) -> Path:
    """ResNet-20 built to pass, beside the study's rows its checks set beside it."""
    root = write_resnet(tmp_path_factory.mktemp("passing"), PASSING)
    return write_replication(root, rows=("sgd", "adam_cosine", "adam", "adam_bn_m0.3"))


def _verdicts(root: Path) -> tuple[dict[str, str], dict[str, kinds.Check], str]:
    md, checks = claims.build_report(root, _load(root))
    by_name = {c.name: c for c in checks}
    return {n: by_name[n].verdict for n in CHECKS}, by_name, md


@pytest.fixture(scope="module")
def passing_verdicts(passing) -> tuple[dict[str, str], dict[str, kinds.Check], str]:
    """:func:`_verdicts` of ``passing``, built once for the tests that only read it."""
    return _verdicts(passing)


# ----------------------------------------------------------------------------- the verdicts
def test_resnet_checks_pass_on_runs_built_to_pass(passing_verdicts):
    verdict, by_name, md = passing_verdicts
    assert {n: v for n, v in verdict.items() if n not in EXPLORATORY} == {
        n: "PASS" for n in CHECKS if n not in EXPLORATORY}
    assert {n: verdict[n] for n in EXPLORATORY} == {n: "MEASURED" for n in EXPLORATORY}  # never PASS or FAIL
    depth_check = by_name["resnet_lag_grows_with_depth"]
    assert depth_check.measured.startswith("rho = +1.00 over 21 layers") and "rho ≥ +0.369" in depth_check.tolerance
    assert "t-approximation, n − 2 = 19 degrees of freedom" in depth_check.tolerance
    assert "`layer3.0.bn1` (depth 14 of 21) alone fresh gives 95.0% on average, the best single layer at 27 of 27" \
        in by_name["resnet_single_layer_restores_most"].measured
    order = by_name["resnet_rotation_orders_accuracy"]
    assert order.measured.startswith("rho = -1.00 over the row means of 4 rows; per seed -1.00, -1.00, -1.00")
    assert "rho ≤ −1.00" in order.tolerance and "1 of 24 orders" in order.tolerance
    exposure = by_name["resnet_cosine_high_rate_checks_exposed"]
    assert "failing checks 60 of 60 high-rate, 0 of 60 low-rate" in exposure.measured  # 20 a run, 3 runs
    assert exposure.note.startswith("The study's network (`adam_cosine`, no verdict")
    share = by_name["resnet_window_test_recovers_most_accuracy"]
    assert "The study's network measured here: `adam_bn_m0.3` recovers" in share.note
    top_k = by_name["resnet_top_k_channel_share"].measured
    assert "ResNet-20 (`resnet20_adam`): at 27 failing checks, median k 4 of 42 channels (9.5%)" in top_k
    assert "the study's ConvNet (`adam`): at 27 failing checks, median k 4 of 16 channels (25.0%)" in top_k
    # claims.md: their own section, last; exploratory marked in the heading and the summary; the article's
    # summary counts the article's claims only
    assert md.index("## Does it carry over? ResNet-20") > md.index("## Findings on the article's open questions")
    assert "### `resnet_top_k_channel_share` *(exploratory)*: MEASURED" in md
    assert "| `resnet_single_layer_restores_most` *(exploratory)* | MEASURED |" in md
    assert "Does it carry over? ResNet-20 (its own section, at the end): **7 PASS, 0 FAIL, 0 NOT RUN**, 2 " \
           "exploratory (MEASURED, no verdict)." in md
    counts = re.search(r"Named checks: \*\*(\d+) PASS, (\d+) FAIL, (\d+) NOT RUN\*\*\.", md).groups()
    assert sum(map(int, counts)) == 27  # the article's claims only


def test_resnet_checks_fail_on_runs_built_to_fail(tmp_path):
    root = write_resnet(tmp_path, FAILING)
    verdict, by_name, _ = _verdicts(root)
    assert {n: v for n, v in verdict.items() if n not in EXPLORATORY} == {
        n: "FAIL" for n in CHECKS if n not in EXPLORATORY}
    assert {n: verdict[n] for n in EXPLORATORY} == {n: "MEASURED" for n in EXPLORATORY}
    assert by_name["resnet_lag_grows_with_depth"].measured.startswith("rho = -1.00 over 21 layers")
    assert "training-mode mean ≥ 99.0% — no" in by_name["resnet_adam_evaluation_mode_collapses"].tolerance
    assert "lowest 98.0%" in by_name["resnet_cosine_reestimation_restores_every_check"].measured


def test_resnet_checks_are_not_run_without_their_rows(tmp_path):
    root = write_replication(tmp_path, rows=("sgd", "adam", "adam_cosine", "adam_bn_m0.3"))  # the study's only
    verdict, by_name, md = _verdicts(root)
    assert verdict == {n: "NOT RUN" for n in CHECKS}
    assert by_name["resnet_rotation_orders_accuracy"].measured == (
        "missing runs of `resnet20_sgd`, `resnet20_adam_cosine`, `resnet20_adamw`, `resnet20_adam`")
    assert "**0 PASS, 0 FAIL, 9 NOT RUN**." in md
    assert "ResNet-20 runs have a section of their own" not in md  # the header says so only when they exist


def test_the_window_test_gives_no_verdict_when_adam_loses_nothing(tmp_path):
    root = write_resnet(tmp_path, {R_SGD: dict(rotation=0.5, acc_eval=0.99), R_ADAM: dict(rotation=8.0, acc_eval=0.99),
                                   R_WINDOW: dict(rotation=8.0, acc_eval=0.99)})
    _, by_name, _ = _verdicts(root)
    check = by_name["resnet_window_test_recovers_most_accuracy"]
    assert check.verdict == "PRECONDITION FAILED" and "nothing lost to recover" in check.measured


def test_the_articles_claims_are_weighed_on_the_study_network_only(tmp_path):
    """ResNet-20 runs whose training mode, gradient cosine and re-estimation would break three of the article's
    claims leave every one of them as it was."""
    alone = write_replication(tmp_path / "alone")
    both = write_replication(tmp_path / "both")
    for seed in SEEDS:
        write_resnet_run(both, R_ADAM, seed, rotation=8.0, norm_growth=2.0, acc_eval=0.6, acc_train=0.5,
                         grad_cos=0.5, reestimated=0.3)
    _, before = claims.build_report(alone, _load(alone))
    _, after = claims.build_report(both, _load(both))
    article = [c.name for c in before if c.section == kinds.ARTICLE]
    assert [(c.name, c.verdict, c.measured) for c in after if c.name in article] == \
        [(c.name, c.verdict, c.measured) for c in before if c.name in article]
    assert {c.verdict for c in before if c.name in ("training_mode_stays_at_100", "gradient_cosine_is_zero",
                                                    "reestimation_restores_every_final_checkpoint")} == {"PASS"}


# ----------------------------------------------------------------------------- both networks in one root
def test_the_table_names_the_network_of_every_row(passing, tmp_path):
    assert table.main(["--results", str(passing), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "table.md").read_text()
    assert "| Row | Network | Task | Seeds |" in md
    assert "| ResNet-20, Adam, lr 3e-3 (`resnet20_adam`) | ResNet-20 | noisy templates | 0–2 (3) |" in md
    assert "| Adam, lr 3e-3 (`adam`) | the study's ConvNet | noisy templates | 0–2 (3; to run: seeds 3–9) |" in md
    assert "(`conv3` in the study's ConvNet; `layer3.2.conv2` in ResNet-20)" in md
    csv = pd.read_csv(tmp_path / "table.csv").set_index("row")
    assert csv.loc["resnet20_adam", "network"] == "ResNet-20" and csv.loc["sgd", "arch"] == "convnet"
    assert csv.loc["resnet20_adam", "last_conv"] == "layer3.2.conv2"


def test_the_claims_header_and_theory_use_each_networks_last_conv(passing, passing_verdicts):
    md = passing_verdicts[2]
    assert "the ResNet-20 runs have a section of their own" in md
    ev = evidence.collect(passing, _load(passing))
    assert ev.stat(R_ADAM, "rotation_per_100_deg").mean == pytest.approx(8.0)  # layer3.2.conv2's, not conv3's


# ----------------------------------------------------------------------------- the runner's own output
@pytest.fixture(scope="module")
def both_networks(tmp_path_factory) -> Path:
    """The runner at a toy size, both networks in one root: the study's Adam row and two ResNet-20 rows."""
    from conftest import run_cfg

    from bnrotation.study.runner import run
    root = tmp_path_factory.mktemp("both")
    # channels_last off: at these toy widths (4 channels) PyTorch 2.13's CPU backward corrupts the heap with
    # channels_last on ResNet-20 (`free(): corrupted` aborts); the sweep's widths (16, 32, 64) are unaffected.
    toy = ["task.image_size=8", "task.batch_size=16", "task.probe_size=16", "scale.heldout_size=32",
           "model.channels=[4,8,8]", "model.channels_last=false"]
    for row in ("adam", R_ADAM, R_COS):
        assert run(run_cfg([f"experiment={row}", "seed=0", *toy], root)) is not None
    return root


@pytest.mark.slow
def test_table_claims_and_figures_run_on_a_root_holding_both_networks(both_networks, tmp_path):
    assert table.main(["--results", str(both_networks), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "table.md").read_text()
    assert "| the study's ConvNet | noisy templates | 0 (1) |" in md and \
        "| ResNet-20 | noisy templates | 0 (1; to run: seeds 1, 2)" in md
    assert claims.main(["--results", str(both_networks), "--out", str(tmp_path)]) == 0
    claims_md = (tmp_path / "claims.md").read_text()
    section = claims_md[claims_md.index("## Does it carry over? ResNet-20"):]
    assert "missing runs of `resnet20_adam`" not in section  # measured (verdicts withheld: toy scale)
    assert "### `resnet_lag_grows_with_depth`: not judged at this scale" in section and "over 21 layers" in section
    only = ["01_accuracy_vs_rotation", "10_lag_by_depth", "11_cosine_mid_run", "12_top_k_both_networks"]
    assert figures.main(["--results", str(both_networks), "--out", str(tmp_path / "fig"), "--only", *only]) == 0
    for name in only[:3]:
        assert (tmp_path / "fig" / f"{name}.png").stat().st_size > 10_000, name
    runs = _load(both_networks)
    channels = runs[-1].tables["channels"]
    assert channels["layer"].nunique() == 21 and records.run_dir(both_networks, R_COS, 0).exists()


def test_the_halves_are_compared_low_rate_minus_high_rate_per_seed(monkeypatch):
    """Issue 52's second case for the cosine check's figure: two seeds whose halves differ by different amounts,
    so that a sum, or a difference the other way round, gives other numbers; failing checks summed over seeds."""
    from bnrotation.study.analysis.results import Run

    halves = {0: dict(acc_high=0.6, acc_low=0.9, failing_high=3, failing_low=1, n_high=5, n_low=5, rho_lr_acc=-0.5),
              1: dict(acc_high=0.8, acc_low=0.85, failing_high=1, failing_low=0, n_high=4, n_low=6, rho_lr_acc=-0.25)}
    monkeypatch.setattr(carryover.midrun, "rate_halves", lambda run: halves[run.seed])
    runs = [Run(Path(f"/nowhere/{s}"), {"row": "resnet_cosine", "seed": s}, {}, {}) for s in (1, 0)]
    diff, text, fail_high, fail_low = carryover._halves_text(runs)
    assert diff.values == pytest.approx((0.3, 0.05)) and diff.seeds == (0, 1)
    assert (fail_high, fail_low) == (4, 1)
    assert text.endswith("failing checks 4 of 9 high-rate, 1 of 11 low-rate (seed 0: 60.0% high-rate, 90.0% "
                         "low-rate, rho(lr, accuracy) -0.50; seed 1: 80.0% high-rate, 85.0% low-rate, rho(lr, "
                         "accuracy) -0.25)")


def test_the_lowest_re_estimated_accuracy_names_its_seed_and_step_over_runs_of_one_and_several_steps(monkeypatch):
    from bnrotation.study.analysis.results import Run

    frames = {0: pd.DataFrame({"step": [500, 1000, 1500], "stored": [0.6, 0.2, 0.4],
                               "reestimated": [0.99, 0.998, 0.97]}),
              1: pd.DataFrame({"step": [500], "stored": [0.3], "reestimated": [0.994]}),
              2: pd.DataFrame({"step": [], "stored": [], "reestimated": []})}
    monkeypatch.setattr(carryover.midrun, "reestimated_at_every_step", lambda run: frames[run.seed])
    runs = [Run(Path(f"/nowhere/{s}"), {"row": "resnet_cosine", "seed": s}, {}, {}) for s in (1, 2, 0)]
    lowest, text = carryover._reestimated_text(runs)
    assert lowest == 0.97
    assert text == ("lowest 97.0% (seed 0, step 1,500) over 4 intervention steps of 2 runs, mean 98.8%; with the "
                    "stored statistics as low as 20.0%")
    nothing, words = carryover._reestimated_text(runs[1:2])
    assert math.isnan(nothing) and words == "no interventions logged"
