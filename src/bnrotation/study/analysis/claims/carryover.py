"""Does it carry over? The checks on ResNet-20, declared before its runs existed (no torch).

The study ran one small network and says so: "It does not give thresholds that
carry over to a real model." The five ResNet-20 rows (:data:`bnrotation.study.rows.RESNET_ROWS`:
SGD, Adam with cosine decay, AdamW, Adam, and Adam's window test, 16×16 images,
the study's protocol otherwise) ask whether the mechanism does. Each question is
a named check whose tolerance is fixed here, before the runs, with its reason in
the check's text; where no tolerance could be argued in advance the check is
*exploratory* (MEASURED, never PASS or FAIL). They are declared in
:data:`.registry.CLAIMS` and listed in ``claims.md`` under "Does it carry over?
ResNet-20" (:data:`.kinds.RESNET`); NOT RUN while their rows have no runs.

Where the study's own network has the same measurement (its ``adam_cosine`` and
``adam`` rows), it is shown beside the ResNet-20 figure without a verdict: those
runs existed before these rules were written.
"""

from __future__ import annotations

import math

import numpy as np

from ... import article as A
from ...article import FAIL_BELOW
from ...rows import ROWS, network_label
from ..formatting import cell
from ..measures import depth, metrics, midrun
from ..results import Run, count
from ..stats import SeedStat, half_unit, spearman_threshold
from .evidence import Evidence
from .kinds import ALPHA, RESNET, Z, Ordering, Outcome, RecoveryShareBeside, above, bespoke, said, table_figure

R_SGD, R_COS, R_ADAMW, R_ADAM, R_WINDOW = ("resnet20_sgd", "resnet20_adam_cosine", "resnet20_adamw", "resnet20_adam",
                                           "resnet20_adam_bn_m0.3")
# The study's rows these stand beside.
SGD, COS, ADAM, WINDOW = "sgd", "adam_cosine", "adam", "adam_bn_m0.3"
# Rotation must order these; the window test rotates as Adam does by construction (the same weights), so it is left out.
ORDERED_ROWS = (R_SGD, R_COS, R_ADAMW, R_ADAM)
ARCH = "resnet20"

TRAIN_FLOOR = 0.99  # a ResNet-20 run's mean training-mode accuracy: at least 99% (40 errors in 4,000)
REESTIMATED_FLOOR = TRAIN_FLOOR  # after re-estimation, at every intervention step: the same floor
DEPTH_ALPHA = ALPHA  # one-sided level of "lag grows with depth"
RESNET_NAME = network_label(ARCH)
STUDY_NAME = network_label("convnet")


def resnet_runs(ev: Evidence) -> list[Run]:
    """The runs of ``ev`` that trained ResNet-20."""
    return [r for r in ev.runs if r.arch == ARCH]


def _pct(value: float) -> str:
    return cell(value, "pct")


# ----------------------------------------------------------------------------- carry-over
@bespoke(f"On {RESNET_NAME} too, training mode stays near {said(A.TRAINING_MODE, 'pct')}: every {RESNET_NAME} run's "
         f"mean training-mode accuracy over the check window is at least {cell(TRAIN_FLOOR, 'pct', digits=0)}.",
         f"beyond the article (one network); {STUDY_NAME}: {said(A.TRAINING_MODE, 'pct')} at every check",
         rows=(R_ADAM,), section=RESNET)
def resnet_training_mode_stays_near_100(ev: Evidence) -> Outcome:
    runs = ev.per_run[ev.per_run["row"].isin([r.row for r in resnet_runs(ev)])].dropna(subset=["acc_train_mode"])
    lowest = runs.loc[runs["acc_train_mode"].idxmin()]
    checks = metrics.tidy(resnet_runs(ev), "checks")
    checks = checks[checks["in_window"]]
    worst = checks.loc[checks["acc_train_mode"].idxmin()]
    heldout = int(resnet_runs(ev)[0].config["scale"]["heldout_size"])
    return Outcome(f"lowest run mean {_pct(float(lowest['acc_train_mode']))} (`{lowest['row']}` seed "
                   f"{lowest['seed']}); "
                   f"mean {_pct(float(checks['acc_train_mode'].mean()))} over {len(checks):,} checks of "
                   f"{count(len(runs), 'run')}; lowest single check {_pct(float(worst['acc_train_mode']))} "
                   f"(`{worst['row']}` seed {worst['seed']}, step {worst['step']})",
                   f"every run's mean ≥ {cell(TRAIN_FLOOR, 'pct')} ({round((1 - TRAIN_FLOOR) * heldout):,} errors in "
                   f"{heldout:,} samples), fixed before the {RESNET_NAME} runs: the study's per-check floor, applied "
                   f"to each run's mean rather than to every check because {RESNET_NAME} on 16×16 images had not been "
                   "run here; one run below it fails the check",
                   float(lowest["acc_train_mode"]) >= TRAIN_FLOOR)


@bespoke(f"On {RESNET_NAME} too, {ROWS[R_ADAM].label.split(', ', 1)[1]} fails in evaluation mode (mean below "
         f"{cell(FAIL_BELOW, 'pct', digits=0)}) while training mode stays at or above "
         f"{cell(TRAIN_FLOOR, 'pct', digits=0)} on the same inputs.",
         f"beyond the article; {STUDY_NAME}: training {said(A.TRAINING_MODE, 'pct')}, evaluation "
         f"{said(table_figure(ADAM, 'acc_eval_mode'), 'pct')} ({ROWS[ADAM].label})", rows=(R_ADAM,), section=RESNET)
def resnet_adam_evaluation_mode_collapses(ev: Evidence) -> Outcome:
    tr, evaluation = ev.stat(R_ADAM, "acc_train_mode"), ev.stat(R_ADAM, "acc_eval_mode")
    gap, how = above(tr, evaluation)
    collapses, stays = evaluation.mean < FAIL_BELOW, tr.mean >= TRAIN_FLOOR
    checks = ev.stat(R_ADAM, "checks_below_90")
    return Outcome(f"training {tr.describe('pct')}, evaluation {evaluation.describe('pct')}; checks below "
                   f"{cell(FAIL_BELOW, 'pct', digits=0)}: {checks.describe('pct')} (`{R_ADAM}`)",
                   f"all three, fixed before the runs: evaluation-mode mean below {cell(FAIL_BELOW, 'pct', digits=0)} "
                   f"(the suite's failing check: a collapse, not a dip) — {'yes' if collapses else 'no'}; "
                   f"training-mode mean ≥ {cell(TRAIN_FLOOR, 'pct')} — {'yes' if stays else 'no'}; training above "
                   f"evaluation by more than {Z:g} standard errors of the difference — {how}",
                   collapses and stays and gap)


resnet_rotation_orders_accuracy = Ordering(
    "resnet_rotation_orders_accuracy",
    f"Rotation still orders accuracy on {RESNET_NAME}: sorted by the last conv layer's rotation per 100 steps "
    f"(`layer3.2.conv2`), evaluation-mode accuracy falls across {', '.join(f'`{r}`' for r in ORDERED_ROWS)}. The "
    f"window test (`{R_WINDOW}`) is left out: it follows Adam's weights, so it rotates as Adam does by construction.",
    ORDERED_ROWS, "rotation_per_100_deg",
    f"beyond the article; {STUDY_NAME}: the same order across the six rows of its table")


# ----------------------------------------------------------------------------- depth
@bespoke(f"Deeper BatchNorm layers lag more, as estimation shift predicts (Huang et al., CVPR 2022): under "
         f"{ROWS[R_ADAM].label.split(', ', 1)[1]}, the per-layer median |running-mean lag| rises with depth over "
         f"{RESNET_NAME}'s BatchNorm layers.",
         "beyond the article (three layers, one middle layer measured); Huang et al. predict that the shift "
         "accumulates with depth", rows=(R_ADAM,), section=RESNET)
def resnet_lag_grows_with_depth(ev: Evidence) -> Outcome:
    runs = ev.runs_of(R_ADAM)
    profile = depth.row_profile(runs)
    if len(profile) < 3:
        return Outcome(f"{len(profile)} BatchNorm layers with a logged lag", "needs ≥ 3 layers", None)
    rho, n = depth.depth_rho(profile), len(profile)
    crit, method = spearman_threshold(n, DEPTH_ALPHA)
    per_seed = [depth.depth_rho(depth.layer_profile(r)) for r in sorted(runs, key=lambda r: r.seed)]
    top = profile.loc[profile["lag_window_median_abs_sigma"].idxmax()]
    first, last = profile.iloc[0], profile.iloc[-1]
    return Outcome(f"rho = {cell(rho, 'rho')} over {n} layers (each layer's median |lag|, mean over "
                   f"{count(len(runs), 'seed')}); per seed {', '.join(cell(r, 'rho') for r in per_seed)}; median "
                   f"|lag| {cell(first['lag_window_median_abs_sigma'], 'sigma')} at depth 0 "
                   f"(`{first['norm_layer'] or first['layer']}`), "
                   f"{cell(last['lag_window_median_abs_sigma'], 'sigma')} at depth {int(last['depth'])} "
                   f"(`{last['norm_layer'] or last['layer']}`), largest {cell(top['lag_window_median_abs_sigma'], 'sigma')} "
                   f"at depth {int(top['depth'])} (`{top['norm_layer'] or top['layer']}`)",
                   f"rho ≥ +{crit:.3f}, the one-sided {cell(DEPTH_ALPHA, 'pct', digits=0)} critical value for {n} "
                   f"layers ({method}; exact counts stop at 12 items, and a permutation simulation in the tests puts "
                   "its level within a few thousandths of 5% at 21 layers), fixed before the runs: one-sided because "
                   "estimation shift predicts a direction",
                   rho >= crit,
                   "Depth is the forward order the runner logs the layers in (`metrics.conv_layers`; 0 is the stem's "
                   "bn1); the two projection shortcuts' norm layers come after their block's second conv there. "
                   "Per run, each layer's median |lag| over its (step, channel) pairs in the check window; per layer "
                   "the mean over seeds; one ρ of that profile against depth, so the permutation null holds. "
                   "Figure 10 shows the median and the worst channel per layer for every ResNet-20 row.")


@bespoke(f"Which single BatchNorm layer of {RESNET_NAME}, given fresh statistics alone, restores the most accuracy "
         f"at {ROWS[R_ADAM].label.split(', ', 1)[1]}'s failing checks? (On the study's three layers: the middle "
         "one.)",
         f"beyond the article; {STUDY_NAME}: the middle layer (bn2) alone lifts failing checks to "
         f"{cell(A.MIDDLE_LIFT[0].value, 'pct', digits=0, sign=False)}–{said(A.MIDDLE_LIFT[1], 'pct')}",
         rows=(R_ADAM,), section=RESNET, exploratory=True)
def resnet_single_layer_restores_most(ev: Evidence) -> Outcome:
    runs = ev.runs_of(R_ADAM)
    failing = metrics.failing_checks(runs)
    tolerance = "none: exploratory (which layer would matter most was not predicted before the runs)"
    if failing.empty:
        return Outcome(f"no failing check (below {cell(FAIL_BELOW, 'pct', digits=0)} at an intervention step) in the "
                       f"`{R_ADAM}` runs", tolerance, None)
    order = [la for la in dict.fromkeys(runs[0].tables["channels"].get("norm_layer", [])) if la in failing]
    layers = order or [c for c in failing.columns if c not in ("step", "stored", "reestimated", "k_needed",
                                                                "channels", "row", "seed")]
    means = failing[layers].mean().sort_values(ascending=False)
    best_at = failing[layers].idxmax(axis=1).value_counts()
    best = means.index[0]
    others = "; ".join(f"`{la}` {_pct(float(v))}" for la, v in means.iloc[1:3].items())
    return Outcome(f"at {count(len(failing), 'failing check')} (stored statistics "
                   f"{_pct(float(failing['stored'].min()))}–{_pct(float(failing['stored'].max()))}): `{best}` "
                   f"(depth {layers.index(best)} of {len(layers)}) "
                   f"alone fresh gives {_pct(float(means.iloc[0]))} on average, the best single layer at "
                   f"{int(best_at.get(best, 0))} of {len(failing)}; next {others}; all layers fresh "
                   f"{_pct(float(failing['reestimated'].mean()))}", tolerance, True,
                   "Accuracy with one layer's statistics re-estimated and the stored ones elsewhere, at the "
                   "intervention steps whose stored statistics are below 90% (`metrics.failing_checks`); depth in "
                   "forward order.")


# ----------------------------------------------------------------------------- mid-run checkpoints
def _halves_text(runs: list[Run]) -> tuple[SeedStat, str, int, int]:
    """Per seed the low-rate minus the high-rate checks' mean accuracy, the sentence that gives them, and the
    failing checks of each half pooled over seeds."""
    halves = {r.seed: midrun.rate_halves(r) for r in sorted(runs, key=lambda r: r.seed)}
    diff = SeedStat.of([h["acc_low"] - h["acc_high"] for h in halves.values()], halves)
    fail_high = sum(h["failing_high"] for h in halves.values())
    fail_low = sum(h["failing_low"] for h in halves.values())
    n_high = sum(h["n_high"] for h in halves.values())
    n_low = sum(h["n_low"] for h in halves.values())
    per_seed = "; ".join(f"seed {s}: {_pct(h['acc_high'])} high-rate, {_pct(h['acc_low'])} low-rate, "
                         f"rho(lr, accuracy) {cell(h['rho_lr_acc'], 'rho')}" for s, h in halves.items())
    text = (f"low-rate minus high-rate checks, per seed: {diff.describe('pct')}; failing checks "
            f"{fail_high} of {n_high} high-rate, {fail_low} of {n_low} low-rate ({per_seed})")
    return diff, text, fail_high, fail_low


@bespoke(f"Under cosine decay the checkpoints taken while the learning rate is still high are the exposed ones "
         f"(on {RESNET_NAME}, `{R_COS}`): evaluation-mode accuracy is lower at the checks above the window's median "
         "learning rate than at those below it, and the failing checks lie mostly among them.",
         "the article's expectation, not a measurement: the effect should \"show up mostly in checkpoints taken "
         "mid-run\"", rows=(R_COS,), section=RESNET)
def resnet_cosine_high_rate_checks_exposed(ev: Evidence) -> Outcome:
    diff, text, fail_high, fail_low = _halves_text(ev.runs_of(R_COS))
    if diff.n == 0:
        return Outcome("no run with checks on both sides of its median learning rate", "–", None)
    lower = diff.mean > Z * diff.se if diff.n > 1 else diff.mean > 0
    more = fail_high > fail_low
    beside = ""
    if ev.has(COS):
        _, study, _, _ = _halves_text(ev.runs_of(COS))
        beside = f"The study's network (`{COS}`, no verdict: its runs existed before this rule): {study}."
    return Outcome(text,
                   f"both, fixed before the runs: the low-rate checks' mean above the high-rate checks' by more than "
                   f"{Z:g} standard errors of the paired difference (the two halves of one run, per seed; one seed: "
                   f"the sign alone) — {'yes' if lower else 'no'}; more failing checks (below "
                   f"{cell(FAIL_BELOW, 'pct', digits=0)}) among the high-rate checks than among the low-rate ones, "
                   f"pooled over seeds — {'yes' if more else 'no'}. Halves: above and below each run's median "
                   "learning rate over the window (`midrun.rate_halves`); the Spearman ρ per seed describes, it does "
                   "not test (successive checks are not independent)",
                   lower and more, beside)


def _reestimated_text(runs: list[Run]) -> tuple[float, str]:
    """The lowest accuracy after re-estimation over every intervention step of ``runs``, and its sentence."""
    frames = [midrun.reestimated_at_every_step(r).assign(seed=r.seed) for r in runs]
    frames = [f for f in frames if len(f)]
    if not frames:
        return math.nan, "no interventions logged"
    steps = np.concatenate([f["reestimated"].to_numpy() for f in frames])
    worst = min(((float(f["reestimated"].min()), int(f.loc[f["reestimated"].idxmin(), "step"]), int(f["seed"].iloc[0]))
                 for f in frames))
    stored = min(float(f["stored"].min()) for f in frames)
    return worst[0], (f"lowest {_pct(worst[0])} (seed {worst[2]}, step {worst[1]:,}) over {len(steps)} intervention "
                      f"steps of {count(len(frames), 'run')}, mean {_pct(float(steps.mean()))}; with the stored "
                      f"statistics as low as {_pct(stored)}")


@bespoke(f"Re-estimation restores every {RESNET_NAME} checkpoint under cosine decay, those taken mid-run included "
         f"(`{R_COS}`, every intervention step).",
         f"beyond the article; {STUDY_NAME}: every final checkpoint back to {said(A.REESTIMATED, 'pct')}",
         rows=(R_COS,), section=RESNET)
def resnet_cosine_reestimation_restores_every_check(ev: Evidence) -> Outcome:
    lowest, text = _reestimated_text(ev.runs_of(R_COS))
    if math.isnan(lowest):
        return Outcome(f"no interventions logged in the `{R_COS}` runs", "–", None)
    beside = ""
    if ev.has(COS):
        study_low, study = _reestimated_text(ev.runs_of(COS))
        beside = f"The study's network (`{COS}`, no verdict: its runs existed before this rule): {study}."
    return Outcome(text,
                   f"every intervention step ≥ {cell(REESTIMATED_FLOOR, 'pct')} after re-estimation, fixed before the "
                   "runs: the training-mode floor above, since re-estimation gives the statistics training mode uses "
                   "and cannot be held above what the weights reach there (the study's network is held to "
                   f"{cell(A.REESTIMATED.value - half_unit(A.REESTIMATED.decimals), 'pct')}, rounding to "
                   f"{said(A.REESTIMATED, 'pct')}). "
                   "Intervention steps: every 500 steps in the check window, and the last",
                   lowest >= REESTIMATED_FLOOR, beside)


# ----------------------------------------------------------------------------- how many channels
def _k_text(runs: list[Run], name: str, row: str) -> str:
    failing = metrics.failing_checks(runs)
    if failing.empty:
        return f"{name} (`{row}`): no failing check"
    k, total = failing["k_needed"].dropna(), int(failing["channels"].max())
    share = k / failing.loc[k.index, "channels"]
    at = f"{name} (`{row}`): at {count(len(failing), 'failing check')}"
    if not len(k):
        return f"{at} even all {total} channels stay below 90%"
    return (f"{at}, median k {k.median():g} of {total} channels ({cell(float(share.median()), 'pct')}), range "
            f"{k.min():g}–{k.max():g} ({cell(float(share.min()), 'pct')}–{cell(float(share.max()), 'pct')}); "
            f"not reached at {int(failing['k_needed'].isna().sum())}")


@bespoke(f"How many channels carry the damage on {RESNET_NAME}, against the study's network: at Adam's failing "
         "checks, the fewest channels of largest |lag| that need fresh statistics to reach 90%, as a share of all "
         "channels.",
         "the article's open question (\"how few it takes\"); no figure", rows=(R_ADAM,), section=RESNET,
         exploratory=True)
def resnet_top_k_channel_share(ev: Evidence) -> Outcome:
    runs = ev.runs_of(R_ADAM)
    tolerance = ("none: exploratory (no expectation for the share was argued before the runs); k is resolved to the "
                 "grid 0, 1, 2, 4, … (`interventions.smallest_k`), so each share is known to within a factor 2")
    if metrics.failing_checks(runs).empty:
        return Outcome(f"no failing check in the `{R_ADAM}` runs", tolerance, None)
    parts = [_k_text(runs, RESNET_NAME, R_ADAM)]
    if ev.has(ADAM):
        parts.append(_k_text(ev.runs_of(ADAM), STUDY_NAME, ADAM))
    return Outcome("; ".join(parts), tolerance, True, "Figure 12 draws both networks' curves side by side.")


# ----------------------------------------------------------------------------- the window test
resnet_window_test_recovers_most_accuracy = RecoveryShareBeside(
    "resnet_window_test_recovers_most_accuracy",
    f"On {RESNET_NAME} too, BatchNorm momentum {ROWS[R_WINDOW].bn_momentum:g} recovers most of the evaluation-mode "
    f"accuracy Adam loses against SGD (the same rule as the study's window test, fixed before the runs).",
    R_WINDOW, lost=R_ADAM, reference=R_SGD, beside=(WINDOW, ADAM, SGD))


CHECKS = (resnet_training_mode_stays_near_100, resnet_adam_evaluation_mode_collapses, resnet_rotation_orders_accuracy,
          resnet_lag_grows_with_depth, resnet_single_layer_restores_most, resnet_cosine_high_rate_checks_exposed,
          resnet_cosine_reestimation_restores_every_check, resnet_top_k_channel_share,
          resnet_window_test_recovers_most_accuracy)
