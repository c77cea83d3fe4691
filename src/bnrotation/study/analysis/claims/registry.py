"""Every claim of the article ``make claims`` checks, declared once: :data:`CLAIMS` and :data:`TABLE_CELLS` (no torch).

A claim is one entry of :data:`CLAIMS`, in the order ``claims.md`` lists
them: a declared kind (:mod:`.kinds`: a value against a published one, an
ordering between two rows, a rank correlation across rows, a recovery share)
or a bespoke check, a function decorated with :func:`.kinds.bespoke`.
Every published figure a claim quotes or tests is read from
:mod:`bnrotation.study.rows` (the article's table) or :mod:`bnrotation.study.article` (its
text); none is typed here. Tolerances fixed a priori are the named constants
below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ... import article as A
from ...rows import PUBLISHED_ROWS, ROWS
from ..formatting import cell, seed_ranges, spread
from ..measures import lag, metrics
from ..measures.dense import DENSE_INTERVALS
from ..results import Run, count
from ..stats import SeedStat, half_unit, spearman_rho
from ..tables.table import COLUMNS as TABLE_COLUMNS
from . import carryover, condition_map, frozen, outofsample, real_images, why
from .evidence import CONV_LAYERS, Evidence, middle_lag_at_failing
from .kinds import (FAIL, NOT_RUN, Z, Above, Below, Check, Match, MatchesPublished, NotBelow, Outcome, RankOrder,
                    RecoveryShare, above, bespoke, match_words, matches, said, table_figure)

SGD, ADAM, ADAMW, PROJ, COS, SMALL_LR, WINDOW = ("sgd", "adam", "adamw", "adam_projected", "adam_cosine",
                                                 "adam_lr3e-4", "adam_bn_m0.3")
ROT, ACC = "rotation_per_100_deg", "acc_eval_mode"
MODEL_FACTOR = 2.0  # a priori tolerance for claims about a model, not a mean (lag formula, stale channel): a factor 2
TRAIN_MODE_FLOOR = 0.99  # no single training-mode check below 99%
CHANCE_MARGIN = 0.05  # "dips to chance": the lowest check within 5 points of the article's 10%
MATCH_MARGIN = 0.01  # "matches SGD": not below it by more than 1 point (or 2 standard errors, if larger)
STUDY_ARCH = "convnet"  # the article's claims are about its network only (RowSpec.arch)
STUDY_TASK = "noisy_templates"  # and its task only (RowSpec.task): Fashion-MNIST has checks of its own


def quoted(row: str, column: str, unit: str, digits: int | None = None) -> str:
    """The article's figure for ``column`` of ``row`` as a claim's sentence quotes it (:func:`.kinds.said`)."""
    return said(table_figure(row, column), unit, digits)


def bn_rows(runs: list[Run]) -> list[str]:
    """The rows of ``runs`` that trained the study's network with BatchNorm on the templates (rows not in the
    registry count as BatchNorm). Other networks' rows (ResNet-20) and other tasks' (Fashion-MNIST) have checks of
    their own (:mod:`.carryover`, :mod:`.real_images`)."""
    return [r.row for r in runs if study_run(r) and (ROWS.get(r.row) is None or ROWS[r.row].norm == "batch")]


def study_run(run: Run) -> bool:
    """Whether ``run`` is one the article's claims weigh: the study's network (:data:`STUDY_ARCH`) on the
    templates (:data:`STUDY_TASK`)."""
    return run.arch == STUDY_ARCH and run.task == STUDY_TASK


# ----------------------------------------------------------------------------- bespoke checks
@bespoke(f"In training mode every run scored {said(A.TRAINING_MODE, 'pct')} on the held-out images the whole time.",
         f"{said(A.TRAINING_MODE, 'pct')} at every check")
def training_mode_stays_at_100(ev: Evidence) -> Outcome:
    checks = metrics.tidy(ev.runs, "checks")
    checks = checks[checks["in_window"] & checks["row"].isin(bn_rows(ev.runs))]
    if checks.empty:
        return Outcome("no checks", "–", None)
    lowest = checks.loc[checks["acc_train_mode"].idxmin()]
    mean = float(checks["acc_train_mode"].mean())
    rounds_up = A.TRAINING_MODE.value - half_unit(A.TRAINING_MODE.decimals)
    heldout = int(ev.runs[0].config["scale"]["heldout_size"])
    return Outcome(f"mean {cell(mean, 'pct')} over {len(checks)} checks of {checks.groupby(['row', 'seed']).ngroups} "
                   f"runs; lowest {cell(float(lowest['acc_train_mode']), 'pct')} (`{lowest['row']}` seed "
                   f"{lowest['seed']}, step {lowest['step']}); {ev.seeds_per_row(bn_rows(ev.runs))}",
                   f"mean ≥ {cell(rounds_up, 'pct')} (rounds to {said(A.TRAINING_MODE, 'pct')}) and no check below "
                   f"{cell(TRAIN_MODE_FLOOR, 'pct', digits=0)} ({round((1 - TRAIN_MODE_FLOOR) * heldout):,} errors in "
                   f"{heldout:,} samples)",
                   mean >= rounds_up and float(lowest["acc_train_mode"]) >= TRAIN_MODE_FLOOR)


@bespoke(f"Under Adam evaluation-mode accuracy averaged {quoted(ADAM, ACC, 'pct', 0)}, dipping to "
         f"{said(A.LOWEST_CHECK, 'pct')}, which is chance for ten classes.",
         f"lowest check {said(A.LOWEST_CHECK, 'pct')} (chance)", rows=(ADAM,))
def adam_dips_to_chance(ev: Evidence) -> Outcome:
    checks = metrics.tidy(ev.runs_of(ADAM), "checks")
    checks = checks[checks["in_window"]]
    lowest = checks.loc[checks["acc_eval_mode"].idxmin()]
    per_run = checks.groupby("seed")["acc_eval_mode"].min()
    ceiling = A.LOWEST_CHECK.value + CHANCE_MARGIN
    return Outcome(f"lowest check {cell(float(lowest['acc_eval_mode']), 'pct')} (seed {lowest['seed']}, step "
                   f"{lowest['step']}); lowest per seed {', '.join(cell(float(v), 'pct') for v in per_run)} "
                   f"({len(checks)} checks of {count(len(per_run), 'run')}; {ev.seeds_per_row((ADAM,))})",
                   f"the lowest check within {spread(CHANCE_MARGIN, 'pct', digits=0)} of chance "
                   f"(≤ {cell(ceiling, 'pct', digits=0)})", float(lowest["acc_eval_mode"]) <= ceiling)


@bespoke(f"On the same inputs, evaluation-mode accuracy falls ({ROWS[ADAM].short}: {quoted(ADAM, ACC, 'pct', 0)}) "
         f"while training mode stays at {said(A.TRAINING_MODE, 'pct')}.",
         f"training {said(A.TRAINING_MODE, 'pct')}, evaluation {quoted(ADAM, ACC, 'pct')} ({ROWS[ADAM].short})",
         rows=(ADAM,))
def evaluation_mode_falls_below_training_mode(ev: Evidence) -> Outcome:
    tr, evaluation = ev.stat(ADAM, "acc_train_mode"), ev.stat(ADAM, ACC)
    ok, how = above(tr, evaluation)
    return Outcome(f"training {tr.describe('pct')}, evaluation {evaluation.describe('pct')} (`{ADAM}`)",
                   f"training above evaluation by more than {Z:g} standard errors: {how}", ok)


@bespoke("The raw gradient's cosine with the weights is zero to four decimal places (scale invariance).",
         said(A.GRADIENT_COSINE, "plain"))
def gradient_cosine_is_zero(ev: Evidence) -> Outcome:
    bn = ev.per_run[ev.per_run["row"].isin(bn_rows(ev.runs))] if len(ev.per_run) else ev.per_run
    if bn.empty:
        return Outcome("no runs", "–", None)
    worst = bn.loc[bn["grad_cos_max_abs"].idxmax()]
    rounds_to_zero = half_unit(A.GRADIENT_COSINE.decimals)
    run = next(r for r in ev.runs if r.row == worst["row"] and r.seed == worst["seed"])
    return Outcome(f"largest |cos(∇L, w)| at any logged step of the check window, any conv layer, any of "
                   f"{len(bn)} runs: {worst['grad_cos_max_abs']:.2e} (`{worst['row']}` seed {worst['seed']}); "
                   f"{ev.seeds_per_row(bn['row'].unique())}",
                   f"|cos| < {cell(rounds_to_zero, 'plain', digits=A.GRADIENT_COSINE.decimals + 1)} everywhere "
                   f"(rounds to {said(A.GRADIENT_COSINE, 'plain')})",
                   float(worst["grad_cos_max_abs"]) < rounds_to_zero, _epsilon_note(run))


def _epsilon_note(run: Run) -> str:
    """Why the gradient's cosine is not exactly 0: BatchNorm divides by sqrt(σ² + ε), so scaling w by c changes
    the output by the factor ε/(σ² + ε) (d/d log c at c = 1): exact scale invariance holds only up to ε/σ²."""
    layer = max(("conv1", "conv2", "conv3"), key=lambda la: metrics.layer_max_abs(run, "grad_cos", la))
    eps = float(run.config.get("model", {}).get("bn_eps", 1e-5))
    var = metrics.channel_median(run, "fresh_var", layer)
    if not math.isfinite(var) or var <= 0:
        return ""
    return (f"Exact scale invariance holds only up to BatchNorm's ε: the output is divided by √(σ² + ε), so "
            f"⟨∇L, w⟩ carries a factor ε/(σ² + ε). The largest cosine is in {layer} of that run, whose median "
            f"channel variance σ² (fresh statistics) is {var:.3g}: ε/σ² = {eps / var:.1e}, the cosine's order of "
            "size there.")


PARTS = {"window": "the whole window", "start": "its start", "end": "its end"}  # metrics.window_ends, in words


def update_cosine_note(ev: Evidence, claim: MatchesPublished) -> str:
    """Whether a gap between the measured update cosine and the article's comes from the definition or the data.

    The definition is the article's words: the update is the step the optimizer takes, w(t+1) − w(t) across
    ``optimizer.step()`` (the runner snapshots the weights just before it, ``monitor.StalenessMonitor.snapshot``,
    and the monitor takes the difference after it), so SGD's includes its momentum. What the article leaves
    open is the layer and the part of the window: each conv layer's cosine over the whole check window, its
    first and its last 500 steps (:func:`.evidence.update_cosines`), against the published figure with the
    claim's own tolerance (:func:`.kinds.matches`)."""
    fig = claim.figure()
    stats = {(layer, part): ev.stat(claim.row, f"update_cos_{layer}_{part}") for layer in CONV_LAYERS
             for part in PARTS}
    if not any(st.n for st in stats.values()):
        return ""
    per_layer = "; ".join(f"{layer} " + ", ".join(f"{cell(stats[layer, part].mean, 'cos')} ({PARTS[part]})"
                                                  for part in PARTS) for layer in CONV_LAYERS)
    met = {layer: [PARTS[part] for part in PARTS if matches(stats[layer, part], fig)] for layer in CONV_LAYERS}
    met = [f"{layer} ({', '.join(parts)})" for layer, parts in met.items() if parts]
    ends = metrics.window_ends(ev.runs_of(claim.row)[0])
    seeds = ev.stat(claim.row, claim.column)
    text = ("Definition: the update is w(t+1) − w(t) across `optimizer.step()`, the step the optimizer actually "
            "takes (the runner snapshots the weights just before it; for SGD the step includes its momentum), "
            "and the cosine is over the whole layer, in float64: the article's \"cosine between each update and "
            "the weight vector\". The article does not say which layer, nor over which steps. Mean cosine per conv "
            f"layer over the whole check window, its start (steps {ends['start'][0]:,}–{ends['start'][1]:,}) and "
            f"its end (steps {ends['end'][0]:,}–{ends['end'][1]:,}), mean over {count(seeds.n, 'seed')} "
            f"({seed_ranges(seeds.seeds)}): {per_layer}. ")
    if met:
        return text + (f"The published {said(fig, 'cos')} is matched, within the same tolerance, by "
                       f"{', '.join(met)}: the gap comes from the choice of layer or steps (the definition), not "
                       "from the data.")
    return text + (f"None of them matches the published {said(fig, 'cos')} within the same tolerance: the gap "
                   "comes from the data, not from the definition of the update, the layer or the steps.")


def drift_interval_note(drift: SeedStat, exponent: SeedStat, published: float, run: Run) -> str:
    """Drift depends on the interval Δ it is measured over, which the article does not state: at the
    first doubling's exponent a (drift ∝ Δ^a, :func:`..measures.lag.drift_exponent`), the interval at which the
    measured drift (σ/step) would equal the published one is Δ · (published / measured)^(1/a)."""
    interval = int(run.config["scale"]["log_every"])
    if exponent.n == 0 or not math.isfinite(exponent.mean) or exponent.mean >= 0 or drift.mean <= 0:
        return ""
    at = interval * (published / drift.mean) ** (1 / exponent.mean)
    return (f"Drift depends on the interval Δ it is measured over, which the article does not give; here Δ is the "
            f"log interval, {interval} steps. Between Δ = {interval} and {2 * interval} the median drift falls as "
            f"Δ^{exponent.mean:.2f} (mean over {count(exponent.n, 'seed')}; a random walk gives Δ^-0.50; `lag.md` "
            f"has Δ up to {interval * lag.INTERVAL_MULTIPLES[-1]:,}). Extrapolated below the logged interval at that "
            f"rate, the published {cell(published, 'drift')} corresponds to Δ ≈ {at:.0f} steps: a guess at the "
            "article's Δ, not a measurement.")


def drift_note(ev: Evidence, claim: MatchesPublished) -> str:
    """:func:`drift_interval_note` for a drift claim's row."""
    return drift_interval_note(ev.stat(claim.row, claim.column), ev.stat(claim.row, "drift_exponent_mid"),
                               claim.figure().value, ev.runs_of(claim.row)[0])


AGE_M = ROWS[ADAM].bn_momentum  # the article's m, 0.03 (SGD's is the same)
AGE = lag.age_interval(AGE_M)  # the running average's age (1 − m)/m, in whole steps: 32
AGE_RULE = (f"Judged at the drift interval Δ = {AGE} steps, the running average's age (1 − m)/m at m = {AGE_M:g}: "
            "the formula drift·(1 − m)/m multiplies the drift by that age, so it is the interval the article most "
            "plausibly measured its drift over (it states none). Measured from the dense windows (fresh statistics at "
            "every step, `scale.dense_windows`) of the row's runs that have them; where none has, over the log "
            "interval, as the check then says. Rule fixed before the ten-seed runs with dense windows came in.")


@dataclass(frozen=True)
class MatchesPublishedAtAge(MatchesPublished):
    """A claim about the middle layer's drift (or the lag the formula predicts from it), judged at the drift
    interval Δ = the running average's age (:data:`AGE_RULE`): ``column`` is the value at that Δ from the dense
    windows (:func:`.evidence.dense_values`), used when any run of the row has them, over those runs only;
    ``fallback`` is the value over the log interval, used otherwise. The tolerance is
    :class:`.kinds.MatchesPublished`'s. The note keeps the figure at the log interval beside it."""

    fallback: str = ""

    def judge(self, ev: Evidence) -> Match:
        at_age = ev.stat(self.row, self.column)
        return Match(at_age if at_age.n else ev.stat(self.row, self.fallback), self.figure())

    def words(self, ev: Evidence, m: Match) -> Outcome:
        at_age, logged = ev.stat(self.row, self.column), ev.stat(self.row, self.fallback)
        measured, tolerance = match_words(m, self.unit)
        interval = int(ev.runs_of(self.row)[0].config["scale"]["log_every"])
        if at_age.n:
            scale = next(r.config["scale"] for r in ev.runs_of(self.row) if r.seed in at_age.seeds)
            starts = ", ".join(f"{w:,}" for w in scale.get("dense_windows") or ())
            where = (f"at Δ = {AGE} steps from the dense windows of {count(at_age.n, 'seed')} "
                     f"({seed_ranges(at_age.seeds)}" + (f"; windows of {scale['dense_length']} steps from steps "
                                                         f"{starts}" if starts else "") + ")")
            note = (f"At Δ = {interval} steps, the log interval (the figure this check used before the dense "
                    f"windows), over seeds {seed_ranges(logged.seeds)}: {logged.describe(self.unit)}. Drift at "
                    f"every Δ from {DENSE_INTERVALS[0]} to {DENSE_INTERVALS[-1]} steps: the finding \"Drift at short "
                    "intervals\" below and `lag.md`.")
        else:
            where = (f"at Δ = {interval} steps, the log interval: no run of `{self.row}` has dense windows, so not at "
                     f"Δ = {AGE}")
            note = self.note(ev, MatchesPublished(self.name, self.claim, self.row, self.fallback, self.unit)) \
                if self.note else ""
        return Outcome(f"{where}: {measured}", tolerance, m.passed, note, m.figures())


@bespoke("The running mean trails the drifting fresh mean by drift·(1 − m)/m: the formula's "
         f"{quoted(ADAM, 'predicted_lag_mid', 'sigma')} is the typical lag of a middle-layer channel under Adam.",
         f"predicted {quoted(ADAM, 'predicted_lag_mid', 'sigma')} (the article gives no measured median)",
         rows=(ADAM,))
def lag_formula_predicts_measured_lag(ev: Evidence) -> Outcome:
    ratio, rho = ev.stat(ADAM, "lag_ratio_mid"), ev.stat(ADAM, "lag_spearman_mid")
    measured, predicted = ev.stat(ADAM, "lag_mid"), ev.stat(ADAM, "predicted_lag_mid")
    return Outcome(f"median |lag| measured {measured.describe('sigma')}, predicted {predicted.describe('sigma')}; "
                   f"ratio {ratio.describe('plain')}; Spearman ρ over (step, channel) pairs {rho.describe('plain')}",
                   f"measured/predicted within a factor of {MODEL_FACTOR:g}, fixed a priori: the formula is a "
                   "steady-state approximation (constant drift), not a fit",
                   1 / MODEL_FACTOR <= ratio.mean <= MODEL_FACTOR,
                   "medians over the middle layer's (step, channel) pairs in the check window, as in `lag.md`; "
                   "figure 5 shows the comparison channel by channel")


@bespoke(f"At a failing Adam checkpoint one middle-layer channel's stored mean was "
         f"{cell(A.STALE_CHANNEL.value, 'plain', digits=A.STALE_CHANNEL.decimals)} standard deviations off.",
         f"{said(A.STALE_CHANNEL, 'sigma')} (one checkpoint)", rows=(ADAM,))
def stale_middle_channel_at_failing_check(ev: Evidence) -> Outcome:
    worst = [v for r in ev.runs_of(ADAM) for v in middle_lag_at_failing(r)]
    if not worst:
        return Outcome(f"no failing check in the `{ADAM}` runs", "–", None)
    top, stale = max(worst), A.STALE_CHANNEL.value
    return Outcome(f"largest middle-layer |lag| at any failing check: {top:.2g}σ; per failing check from "
                   f"{min(worst):.2g}σ to {top:.2g}σ, median {float(np.median(worst)):.2g}σ, over {len(worst)} "
                   f"failing checks (`{ADAM}`; {ev.seeds_per_row((ADAM,))})",
                   f"the largest within a factor of {MODEL_FACTOR:g} of {said(A.STALE_CHANNEL, 'sigma')}: the article "
                   "shows one checkpoint, so the claim is that such a channel exists, not that it is typical",
                   stale / MODEL_FACTOR <= top <= stale * MODEL_FACTOR,
                   f"lag against fresh statistics of the probe set ({ev.runs_of(ADAM)[0].config['task']['probe_size']} "
                   "training samples)")


@bespoke(f"Re-estimating the statistics brought every final checkpoint back to {said(A.REESTIMATED, 'pct')}.",
         f"{said(A.REESTIMATED, 'pct')} for every run")
def reestimation_restores_every_final_checkpoint(ev: Evidence) -> Outcome:
    study = ev.per_run["row"].isin({r.row for r in ev.runs if study_run(r)})
    finals = ev.per_run[study].dropna(subset=["acc_reestimated_final"])
    if finals.empty:
        return Outcome("no re-estimation results", "–", None)
    worst = finals.loc[finals["acc_reestimated_final"].idxmin()]
    rounds_up = A.REESTIMATED.value - half_unit(A.REESTIMATED.decimals)
    return Outcome(f"lowest {cell(float(worst['acc_reestimated_final']), 'pct')} (`{worst['row']}` seed "
                   f"{worst['seed']}); mean {cell(float(finals['acc_reestimated_final'].mean()), 'pct')} over "
                   f"{count(len(finals), 'run')}; {ev.seeds_per_row(finals['row'].unique())}",
                   f"every run ≥ {cell(rounds_up, 'pct')} (rounds to {said(A.REESTIMATED, 'pct')})",
                   float(worst["acc_reestimated_final"]) >= rounds_up)


LIFT_LOW, LIFT_HIGH = A.MIDDLE_LIFT


@bespoke(f"Fresh statistics for the middle layer alone lift the failing checkpoints from as low as "
         f"{said(A.LOWEST_CHECK, 'pct')} to between {said(LIFT_LOW, 'pct')} and {said(LIFT_HIGH, 'pct')}.",
         f"from as low as {said(A.LOWEST_CHECK, 'pct')} to "
         f"{cell(LIFT_LOW.value, 'pct', digits=0, sign=False)}–{said(LIFT_HIGH, 'pct')}", rows=(ADAM,))
def middle_layer_alone_lifts_failing_checks(ev: Evidence) -> Outcome:
    failing = metrics.failing_checks(ev.runs_of(ADAM))
    stored = list(failing["stored"]) if len(failing) else []
    lifted = list(failing[metrics.MIDDLE_NORM].dropna()) if metrics.MIDDLE_NORM in failing else []
    if not lifted:
        return Outcome(f"no failing check in the `{ADAM}` runs", "–", None)
    share = float(np.mean(np.array(lifted) >= LIFT_LOW.value))
    low = said(LIFT_LOW, "pct")
    return Outcome(f"from as low as {cell(min(stored), 'pct')} to {cell(min(lifted), 'pct')}–"
                   f"{cell(max(lifted), 'pct')} (median {cell(float(np.median(lifted)), 'pct')}); "
                   f"{cell(share, 'pct', digits=0)} of {len(lifted)} failing checks reach {low} (`{ADAM}`, "
                   f"{metrics.MIDDLE_NORM} given fresh statistics; {ev.seeds_per_row((ADAM,))})",
                   f"every failing check lifted to ≥ {low}, the article's own lower end (its claim covers every "
                   "failing checkpoint)", min(lifted) >= LIFT_LOW.value)


WINDOW_CHANGE = table_figure(WINDOW, ROT).value / table_figure(ADAM, ROT).value - 1  # the article's: −10%


@bespoke(f"With BatchNorm momentum {ROWS[WINDOW].bn_momentum:g}, Adam rotated at almost the same rate "
         f"({quoted(WINDOW, ROT, 'deg')} against {quoted(ADAM, ROT, 'deg')}).",
         f"{quoted(WINDOW, ROT, 'deg')} against {quoted(ADAM, ROT, 'deg')} "
         f"({'−' if WINDOW_CHANGE < 0 else '+'}{cell(abs(WINDOW_CHANGE), 'pct', digits=0)})", rows=(WINDOW, ADAM))
def window_test_rotation_almost_unchanged(ev: Evidence) -> Outcome:
    # Same seed, same training batches: the two rows are compared on the seeds both have (on a CPU their
    # weights even follow the same trajectory, since running statistics never feed back into training).
    both = set(ev.stat(WINDOW, ROT).seeds) & set(ev.stat(ADAM, ROT).seeds)
    if not both:
        return Outcome("no seed that both rows ran", "–", None)
    w, a = ev.stat(WINDOW, ROT, both), ev.stat(ADAM, ROT, both)
    rel = w.mean / a.mean - 1
    # standard error of a ratio of means (delta method): the relative standard errors add in quadrature
    se = math.sqrt((w.sd / w.mean) ** 2 / w.n + (a.sd / a.mean) ** 2 / a.n) if w.n > 1 and a.n > 1 else math.nan
    floor = 2 * abs(WINDOW_CHANGE)  # twice the published change
    tol = max(floor, Z * se) if not math.isnan(se) else floor
    return Outcome(f"`{WINDOW}` {w.describe('deg')}, `{ADAM}` {a.describe('deg')}: {rel:+.0%} (on the seeds both "
                   f"rows ran: {', '.join(map(str, sorted(both)))})",
                   f"|relative change| ≤ {tol:.0%} = max({floor:.0%}, {Z:g} standard errors of the relative "
                   f"difference); {floor:.0%} is twice the published change", abs(rel) <= tol)


@bespoke(f"AdamW (weight decay {ROWS[ADAMW].weight_decay:g}) landed between Adam and SGD.",
         f"{quoted(ADAM, ACC, 'pct')} < {quoted(ADAMW, ACC, 'pct')} < {quoted(SGD, ACC, 'pct')}",
         rows=(ADAMW, ADAM, SGD))
def adamw_between_adam_and_sgd(ev: Evidence) -> Outcome:
    w, a, s = (ev.stat(r, ACC) for r in (ADAMW, ADAM, SGD))
    ok1, how1 = above(w, a)
    ok2, how2 = above(s, w)
    return Outcome(f"`{ADAM}` {a.describe('pct')} < `{ADAMW}` {w.describe('pct')} < `{SGD}` {s.describe('pct')}",
                   f"each step of the order by more than {Z:g} standard errors: AdamW − Adam {how1}; SGD − AdamW "
                   f"{how2}", ok1 and ok2)


# ----------------------------------------------------------------------------- the registry
CLAIMS = (
    RankOrder("rotation_orders_accuracy", "Sorted by rotation, evaluation-mode accuracy falls in order across the six "
              "rows of the table.", ROT, orders=True),
    RankOrder("norm_growth_does_not_order_accuracy", "The norm column does not line up with accuracy.", "norm_growth",
              orders=False),
    Below("projected_grows_less_than_adam", "With the radial part projected out the norm grows less than under Adam "
          f"({quoted(PROJ, 'norm_growth', 'x', 0)} against {quoted(ADAM, 'norm_growth', 'x', 0)})…", PROJ, ADAM,
          "norm_growth", "x"),
    Below("projected_does_worse_than_adam", f"…and evaluation-mode accuracy is worse ({quoted(PROJ, ACC, 'pct', 0)} "
          f"against {quoted(ADAM, ACC, 'pct', 0)}).", PROJ, ADAM, ACC, "pct"),
    Above("projected_rotates_faster_than_adam", f"The projected row turns fastest ({quoted(PROJ, ROT, 'deg')} against "
          f"{quoted(ADAM, ROT, 'deg')} per 100 steps).", PROJ, ADAM, ROT, "deg"),
    training_mode_stays_at_100,
    adam_dips_to_chance,
    evaluation_mode_falls_below_training_mode,
    MatchesPublished("update_cosine_adam", "The update's cosine with the weights is about "
                     f"{quoted(ADAM, 'update_cos', 'cos')} under Adam (last conv layer, mean over the check window).",
                     ADAM, "update_cos", "cos"),
    MatchesPublished("update_cosine_sgd", f"…and about {quoted(SGD, 'update_cos', 'cos')} under SGD.", SGD,
                     "update_cos", "cos", note=update_cosine_note),
    Above("update_cosine_adam_above_sgd", "The update leans outward more under Adam than under SGD.", ADAM, SGD,
          "update_cos", "cos"),
    gradient_cosine_is_zero,
    MatchesPublishedAtAge("drift_middle_adam", "Median drift of the middle layer's fresh means under Adam. "
                          + AGE_RULE, ADAM, "drift_mid_at_age", "drift", note=drift_note, fallback="drift_mid"),
    MatchesPublishedAtAge("drift_middle_sgd", "Median drift of the middle layer's fresh means under SGD. " + AGE_RULE,
                          SGD, "drift_mid_at_age", "drift", note=drift_note, fallback="drift_mid"),
    Above("drift_adam_above_sgd", "The middle layer drifts faster under Adam than under SGD "
          f"({cell(A.MIDDLE_DRIFT[ADAM].value / A.MIDDLE_DRIFT[SGD].value, 'x', digits=1)}).", ADAM, SGD,
          "drift_mid", "drift"),
    MatchesPublishedAtAge("predicted_lag_middle_adam", "The lag formula drift·(1 − m)/m puts a typical middle-layer "
                          f"channel about {quoted(ADAM, 'predicted_lag_mid', 'sigma')} behind under Adam… " + AGE_RULE,
                          ADAM, "predicted_lag_mid_at_age", "sigma", fallback="predicted_lag_mid"),
    MatchesPublishedAtAge("predicted_lag_middle_sgd", f"…and {quoted(SGD, 'predicted_lag_mid', 'sigma')} under SGD. "
                          + AGE_RULE, SGD, "predicted_lag_mid_at_age", "sigma", fallback="predicted_lag_mid"),
    lag_formula_predicts_measured_lag,
    stale_middle_channel_at_failing_check,
    MatchesPublished("abs_mean_over_std_middle", "The median |mean|/std of the middle layer's channels is about "
                     f"{quoted(ADAM, 'abs_mean_over_std_mid', 'plain')} (Adam row).", ADAM, "abs_mean_over_std_mid",
                     "plain"),
    reestimation_restores_every_final_checkpoint,
    middle_layer_alone_lifts_failing_checks,
    window_test_rotation_almost_unchanged,
    RecoveryShare("window_test_recovers_most_accuracy", f"BatchNorm momentum {ROWS[WINDOW].bn_momentum:g} recovers most "
                  f"of the accuracy Adam loses ({quoted(WINDOW, ACC, 'pct')} against {quoted(ADAM, ACC, 'pct')}).",
                  WINDOW, lost=ADAM, reference=SGD),
    RecoveryShare("cosine_decay_recovers", f"Cosine decay took Adam from {quoted(ADAM, ACC, 'pct', 0)} to "
                  f"{quoted(COS, ACC, 'pct', 0)}.", COS, lost=ADAM, reference=SGD),
    NotBelow("small_learning_rate_matches_sgd", "A ten times smaller constant learning rate (3e-4) matched SGD.",
             SMALL_LR, SGD, ACC, "pct", margin=MATCH_MARGIN,
             margin_words=f"{spread(MATCH_MARGIN, 'pct', digits=0, sign=False)} point"),
    adamw_between_adam_and_sgd,
    # Does it carry over? ResNet-20 (claims.md lists these under their own heading; analysis/claims/carryover.py)
    *carryover.CHECKS,
    # Does it happen on real images? Fashion-MNIST (its own heading; analysis/claims/real_images.py)
    *real_images.CHECKS,
    *frozen.CHECKS,  # beyond the article: the frozen-backbone experiment (analysis/claims/frozen.py)
    # The monitor's rule out of sample (issue 38), fixed before its runs (analysis/claims/outofsample.py)
    *outofsample.CHECKS,
    *condition_map.CHECKS,  # where does the collapse live? the condition map's predictions (issue 49)
    *why.CHECKS,  # why do fresh samples keep Adam rotating? the data swap's predictions (issue 64)
)

# The article's table, cell by cell: every published cell against the measured row mean.
TABLE_CELLS = tuple(MatchesPublished(f"{row}:{col.key}", col.header, row, col.key, col.unit)
                    for row in ROWS for col in TABLE_COLUMNS if col.published and
                    ROWS[row].published is not None and not math.isnan(getattr(ROWS[row].published, col.published)))


# ----------------------------------------------------------------------------- why a check fails
# A failing check's one-line reason, computed from the same evidence and put first in its note (:func:`explain`).
# Reasons quote measured figures through the evidence and name the checks they rest on, with those checks'
# verdicts, so that claims.md states them on whatever runs it reads.
def _verdicts(checks: list[Check], *names: str) -> str:
    by_name = {c.name: c.verdict for c in checks}
    return ", ".join(f"`{n}` {by_name.get(n, NOT_RUN)}" for n in names)


def _why_norm_growth(ev: Evidence, checks: list[Check]) -> str:
    rows = [r for r in PUBLISHED_ROWS if ev.has(r)]
    means = ev.per_run[ev.per_run["row"].isin(rows)].groupby("row")[["norm_growth", ROT, ACC]].mean()
    norm, rot = (cell(spearman_rho(means[c], means[ACC]), "rho") for c in ("norm_growth", ROT))
    return (f"norm growth orders the {len(rows)} rows' accuracy too (rho {norm} over row means, rotation's {rot}), "
            "so across these rows the table cannot tell norm from rotation; the direct test of the norm is the "
            f"projected row ({_verdicts(checks, 'projected_grows_less_than_adam', 'projected_does_worse_than_adam')})")


def _why_update_cosine(ev: Evidence, checks: list[Check]) -> str:
    return (f"the check reads the last conv layer ({metrics.LAST_CONV}) over the whole window; the article names "
            "neither the layer nor the steps, and the rest of this note gives every layer and part of the window "
            "against its figure")


def _why_gradient_cosine(ev: Evidence, checks: list[Check]) -> str:
    bn = ev.per_run[ev.per_run["row"].isin(bn_rows(ev.runs))]
    worst = float(bn["grad_cos_max_abs"].max())
    return (f"the largest |cos| is {worst:.1e}, which rounds to {worst:.{A.GRADIENT_COSINE.decimals}f} at "
            f"{A.GRADIENT_COSINE.decimals} decimals; BatchNorm's ε bounds scale invariance at about that size "
            "(the rest of this note)")


def _why_drift(row: str):
    def why(ev: Evidence, checks: list[Check]) -> str:
        published = A.MIDDLE_DRIFT[row].value
        drift = {d: ev.stat(row, f"dense_drift_{d}").mean for d in DENSE_INTERVALS}
        drift = {d: v for d, v in drift.items() if math.isfinite(v)}
        rule = f"judged at Δ = {AGE} steps, the rule fixed before the dense windows"
        if not drift:
            return f"{rule}; without dense windows only the log interval is measured (the rest of this note)"
        at = ", ".join(f"{cell(drift[d], 'drift')} at Δ = {d}" for d in (min(drift), max(drift)))
        if max(drift.values()) < published:
            where = f"no measured Δ from {min(drift)} to {max(drift)} steps reaches the article's"
        elif min(drift.values()) > published:
            where = f"every measured Δ from {min(drift)} to {max(drift)} steps exceeds the article's"
        else:
            where = "the article's figure lies inside the measured range, at another Δ than the rule's:"
        return f"{rule}; {where} {cell(published, 'drift')} ({at})"
    return why


def _why_predicted_lag(drift_check: str):
    def why(ev: Evidence, checks: list[Check]) -> str:
        return (f"the prediction is the drift at Δ = {AGE} times the running average's age (1 − m)/m, so it follows "
                f"the drift ({_verdicts(checks, drift_check)}); the formula itself is tested against the measured "
                f"lag ({_verdicts(checks, 'lag_formula_predicts_measured_lag')})")
    return why


def _why_middle_layer_alone(ev: Evidence, checks: list[Check]) -> str:
    failing = metrics.failing_checks(ev.runs_of(ADAM))
    short = failing[failing[metrics.MIDDLE_NORM] < LIFT_LOW.value].sort_values(metrics.MIDDLE_NORM, ascending=False)
    listed = "; ".join(f"{cell(float(f[metrics.MIDDLE_NORM]), 'pct')} (seed {f['seed']}, step {int(f['step']):,}, "
                       f"from {cell(float(f['stored']), 'pct')})" for _, f in short.iterrows())
    return (f"the check asks every failing check to reach {said(LIFT_LOW, 'pct')} with {metrics.MIDDLE_NORM} fresh; "
            f"{len(short)} of {len(failing)} do not: {listed}")


WHY_IT_FAILS = {
    "norm_growth_does_not_order_accuracy": _why_norm_growth,
    "update_cosine_sgd": _why_update_cosine,
    "gradient_cosine_is_zero": _why_gradient_cosine,
    "drift_middle_adam": _why_drift(ADAM),
    "drift_middle_sgd": _why_drift(SGD),
    "predicted_lag_middle_adam": _why_predicted_lag("drift_middle_adam"),
    "predicted_lag_middle_sgd": _why_predicted_lag("drift_middle_sgd"),
    "middle_layer_alone_lifts_failing_checks": _why_middle_layer_alone,
}


def explain(checks: list[Check], ev: Evidence) -> None:
    """Put each failing check's one-line reason (:data:`WHY_IT_FAILS`) first in its note, in place."""
    for c in checks:
        if c.verdict == FAIL and c.name in WHY_IT_FAILS:
            why = WHY_IT_FAILS[c.name](ev, checks)
            c.note = f"Why it fails: {why}." + (f" {c.note}" if c.note else "")
