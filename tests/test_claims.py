"""Every kind of claim can fail: for each, a synthetic case just outside its tolerance must FAIL and one just inside
must PASS, on the registry's own entries (no torch, no runs: the evidence is a table of per-run values built here).

Each tolerance is written out below from the words ``claims.md`` uses for it, with the test's own constants (2
standard errors, the article's 3 seeds, the exact critical values of Zar 1972, "most" = a half), not read from
the code under test: a tolerance of 3 standard errors where the text says 2, or a comparison turned round, moves a
case across its boundary and fails here. "Just" is a relative step of ``EPS`` = 1e-6 across the boundary: the
per-seed values are built from it in float64, whose rounding (about 1e-16 relative) is ten orders smaller.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from bnrotation.study.analysis.claims import carryover, kinds, registry
from bnrotation.study.analysis.claims.evidence import Evidence
from bnrotation.study.analysis.claims.kinds import FAIL, NOT_RUN, PASS, PRECONDITION_FAILED
from bnrotation.study.rows import PUBLISHED_ROWS

EPS = 1e-6  # relative step across a boundary
SPREAD = (-1.0, -1.0, 1.0, 1.0)  # 4 seeds at mean ± a: sample sd 2a/√3 (squared deviations 4a², over n − 1 = 3)
# The registry's entries the boundary cases below use: together they cover every declared kind
# (test_every_declared_kind_is_covered_by_a_boundary_case).
BOUNDARY_CASES = ("update_cosine_adam", "drift_middle_adam", "projected_grows_less_than_adam",
                  "projected_rotates_faster_than_adam", "small_learning_rate_matches_sgd", "rotation_orders_accuracy",
                  "norm_growth_does_not_order_accuracy", "resnet_rotation_orders_accuracy",
                  "window_test_recovers_most_accuracy", "resnet_window_test_recovers_most_accuracy")


def claim(name: str) -> kinds.Claim:
    found = [c for c in registry.CLAIMS if c.name == name]
    assert len(found) == 1 and name in BOUNDARY_CASES, name
    return found[0]


def evidence(values: dict[str, dict[str, list[float]]], runs: list | None = None) -> Evidence:
    """Evidence whose per-run table has, for each row, one line per seed 0, 1, ... with the given columns."""
    lines = [{"row": row, "seed": seed, **{col: v[seed] for col, v in cols.items()}}
             for row, cols in values.items() for seed in range(len(next(iter(cols.values()))))]
    return Evidence(Path("."), runs or [], pd.DataFrame(lines))


def around(mean: float, a: float) -> list[float]:
    """4 values with mean ``mean`` and sample sd 2a/√3."""
    return [mean + d * a for d in SPREAD]


def sd_of(a: float) -> float:
    return 2 * a / math.sqrt(3)


def verdict(c: kinds.Claim, ev: Evidence) -> str:
    return c.check(ev).verdict


# ----------------------------------------------------------------------------- MatchesPublished
def match_tol(sd: float, n: int, decimals: int) -> float:
    """The text's tolerance: max(2 · s · √(1/n + 1/3), half a unit of the published figure's last digit)."""
    return max(2 * sd * math.sqrt(1 / n + 1 / 3), 0.5 * 10.0 ** -decimals)


@pytest.mark.parametrize("a", [0.003, 1e-9], ids=["two-standard-errors", "rounding-floor"])
@pytest.mark.parametrize("side", [1, -1], ids=["above", "below"])
def test_matches_published_fails_just_outside_two_standard_errors_and_passes_just_inside(a, side):
    c = claim("update_cosine_adam")
    fig = c.figure()
    tol = match_tol(sd_of(a), 4, fig.decimals)
    assert (tol > 0.5 * 10.0 ** -fig.decimals) == (a > 1e-6)  # the first case is set by the spread, the second by rounding
    inside = evidence({"adam": {"update_cos": around(fig.value + side * tol * (1 - EPS), a)}})
    outside = evidence({"adam": {"update_cos": around(fig.value + side * tol * (1 + EPS), a)}})
    assert verdict(c, inside) == PASS and verdict(c, outside) == FAIL
    assert c.check(outside).figures["tolerance"] == pytest.approx(tol, rel=1e-12)
    assert "max(2 · s · √(1/4 + 1/3)" in c.check(outside).tolerance  # the rule as the text states it


def test_matches_published_gives_no_verdict_on_one_seed():
    c = claim("update_cosine_adam")
    assert verdict(c, evidence({"adam": {"update_cos": [c.figure().value]}})) == NOT_RUN


@pytest.mark.parametrize("dense", [True, False], ids=["at-the-age-interval", "log-interval-fallback"])
def test_matches_published_at_age_has_the_same_boundary_on_the_column_it_judges(dense):
    """The drift claim judges the value at Δ = the running average's age where dense windows exist, else the
    log interval's; either way with MatchesPublished's tolerance."""
    c = claim("drift_middle_adam")
    fig, a = c.figure(), 1e-4
    tol = match_tol(sd_of(a), 4, fig.decimals)
    runs = [SimpleNamespace(row="adam", seed=s, config={"scale": {"log_every": 100, "dense_windows": [2000],
                                                                  "dense_length": 128}}) for s in range(4)]

    def ev(factor: float) -> Evidence:
        judged = around(fig.value + tol * factor, a)
        other = [math.nan] * 4 if not dense else around(fig.value * 10, a)  # the log interval's: far off
        cols = {"drift_mid_at_age": judged, "drift_mid": other} if dense else \
            {"drift_mid_at_age": other, "drift_mid": judged, "drift_exponent_mid": [math.nan] * 4}
        return evidence({"adam": cols}, runs)

    assert verdict(c, ev(1 - EPS)) == PASS and verdict(c, ev(1 + EPS)) == FAIL


# ----------------------------------------------------------------------------- Below, Above
def welch_se(a_lo: float, a_hi: float) -> float:
    """√(s²/4 + s²/4) for two rows of 4 seeds with sds 2a/√3."""
    return math.sqrt(sd_of(a_lo) ** 2 / 4 + sd_of(a_hi) ** 2 / 4)


@pytest.mark.parametrize("name, lower, upper, column", [
    ("projected_grows_less_than_adam", "adam_projected", "adam", "norm_growth"),  # Below: row under than
    ("projected_rotates_faster_than_adam", "adam", "adam_projected", "rotation_per_100_deg"),  # Above: row over than
])
def test_a_difference_must_exceed_two_standard_errors(name, lower, upper, column):
    c = claim(name)
    a_lo, a_hi = 0.2, 0.5
    gap = 2 * welch_se(a_lo, a_hi)

    def ev(diff: float) -> Evidence:
        return evidence({lower: {column: around(3.0, a_lo)}, upper: {column: around(3.0 + diff, a_hi)}})

    assert verdict(c, ev(gap * (1 + EPS))) == PASS and verdict(c, ev(gap * (1 - EPS))) == FAIL
    assert verdict(c, ev(-10 * gap)) == FAIL  # the other way round: the direction is the claim's
    # one seed a side: the sign alone
    one = lambda d: evidence({lower: {column: [3.0]}, upper: {column: [3.0 + d]}})  # noqa: E731
    assert verdict(c, one(1e-9)) == PASS and verdict(c, one(-1e-9)) == FAIL


# ----------------------------------------------------------------------------- NotBelow
@pytest.mark.parametrize("a", [0.02, 1e-6], ids=["two-standard-errors", "one-point-margin"])
def test_not_below_fails_just_below_its_tolerance_and_passes_above(a):
    """The small learning rate matches SGD: not below it by more than max(2 standard errors of the difference,
    1 point); being above SGD by any amount passes."""
    c = claim("small_learning_rate_matches_sgd")
    tol = max(2 * welch_se(a, a), 0.01)
    assert (tol > 0.01) == (a > 0.01)

    def ev(diff: float) -> Evidence:
        return evidence({"adam_lr3e-4": {"acc_eval_mode": around(0.95 + diff, a)},
                         "sgd": {"acc_eval_mode": around(0.95, a)}})

    assert verdict(c, ev(-tol * (1 - EPS))) == PASS and verdict(c, ev(-tol * (1 + EPS))) == FAIL
    assert verdict(c, ev(+tol * 3)) == PASS  # above SGD: matched, not failed


# ----------------------------------------------------------------------------- RankOrder, Ordering
def permutation_with_rho(n: int, rho: float) -> tuple[int, ...]:
    """An order of 0..n−1 whose Spearman ρ with 0..n−1 is ``rho`` (ρ = 1 − 6D/(n(n² − 1)), D = Σ(i − π(i))²)."""
    for p in itertools.permutations(range(n)):
        if math.isclose(1 - 6 * sum((i - j) ** 2 for i, j in enumerate(p)) / (n * (n * n - 1)), rho, abs_tol=1e-12):
            return p
    raise AssertionError(f"no order of {n} items has rho {rho}")


def ranked(rows: tuple[str, ...], column: str, rho: float) -> Evidence:
    """One seed per row: accuracy falls along ``rows``, ``column`` has Spearman ρ = ``rho`` with accuracy."""
    n = len(rows)
    order = permutation_with_rho(n, -rho)  # against the rank of accuracy, which falls along rows
    return evidence({row: {column: [float(order[i])], "acc_eval_mode": [1.0 - 0.1 * i]} for i, row in enumerate(rows)})


# Exact one-sided 5% critical values of Spearman's ρ without ties (Zar 1972, JASA 67:578, Table 1): n = 6, 0.829
# (D = 6 of 70 possible, ρ = 1 − 36/210); the next ρ the lattice allows inside the critical region is none, outside
# it 1 − 48/210 = 0.771. n = 4: only the perfect order (1 in 24 = 4.2%), ρ = 1; next 1 − 12/60 = 0.8.
RHO_6_INSIDE, RHO_6_OUTSIDE = -(1 - 36 / 210), -(1 - 48 / 210)
RHO_4_INSIDE, RHO_4_OUTSIDE = -1.0, -(1 - 12 / 60)


def test_a_rank_order_passes_at_the_critical_value_and_fails_one_step_short():
    c = claim("rotation_orders_accuracy")
    column = c.column
    assert verdict(c, ranked(PUBLISHED_ROWS, column, RHO_6_INSIDE)) == PASS
    assert verdict(c, ranked(PUBLISHED_ROWS, column, RHO_6_OUTSIDE)) == FAIL
    assert verdict(c, ranked(PUBLISHED_ROWS, column, -RHO_6_INSIDE)) == FAIL  # accuracy rising with rotation


def test_no_rank_order_fails_at_the_critical_value_and_passes_one_step_short():
    c = claim("norm_growth_does_not_order_accuracy")
    assert verdict(c, ranked(PUBLISHED_ROWS, c.column, RHO_6_INSIDE)) == FAIL
    assert verdict(c, ranked(PUBLISHED_ROWS, c.column, RHO_6_OUTSIDE)) == PASS


def test_a_rank_order_needs_four_of_the_six_rows():
    c = claim("rotation_orders_accuracy")
    ev = ranked(PUBLISHED_ROWS[:3], c.column, 1.0)
    assert verdict(c, ev) == NOT_RUN


def test_an_ordering_of_four_rows_passes_only_in_the_perfect_order():
    c = claim("resnet_rotation_orders_accuracy")
    assert verdict(c, ranked(carryover.ORDERED_ROWS, c.column, RHO_4_INSIDE)) == PASS
    assert verdict(c, ranked(carryover.ORDERED_ROWS, c.column, RHO_4_OUTSIDE)) == FAIL


# ----------------------------------------------------------------------------- RecoveryShare, RecoveryShareBeside
def shares(row: str, lost: str, reference: str, share: list[float], lost_acc=0.5, ref_acc=1.0) -> dict:
    """Per seed, accuracies that give ``row`` the share ``share`` of ``lost``'s loss against ``reference``."""
    n = len(share)
    return {row: {"acc_eval_mode": [lost_acc + s * (ref_acc - lost_acc) for s in share]},
            lost: {"acc_eval_mode": [lost_acc] * n}, reference: {"acc_eval_mode": [ref_acc] * n}}


# "most": a mean share above a half, and (two or more seeds) above 0 by 2 standard errors. Three shares m − c, m, m + c:
# sd c, se c/√3, so the second rule binds at c = m√3/2.
MEAN_SHARE = 0.9
C_LIMIT = MEAN_SHARE * math.sqrt(3) / 2


@pytest.mark.parametrize("name", ["window_test_recovers_most_accuracy", "resnet_window_test_recovers_most_accuracy"])
def test_a_recovery_share_must_be_above_half_and_above_zero_by_two_standard_errors(name):
    c = claim(name)
    rows = (c.row, c.lost, c.reference)

    def ev(share: list[float]) -> Evidence:
        values = shares(*rows, share)
        if getattr(c, "beside", ()):  # the study's network beside it: shown, not judged
            values.update(shares(*c.beside, [0.8, 0.8, 0.8]))
        return evidence(values)

    assert verdict(c, ev([0.5 * (1 + EPS)] * 3)) == PASS and verdict(c, ev([0.5 * (1 - EPS)] * 3)) == FAIL
    inside, outside = C_LIMIT * (1 - EPS), C_LIMIT * (1 + EPS)
    assert verdict(c, ev([MEAN_SHARE - inside, MEAN_SHARE, MEAN_SHARE + inside])) == PASS
    assert verdict(c, ev([MEAN_SHARE - outside, MEAN_SHARE, MEAN_SHARE + outside])) == FAIL


def test_a_recovery_share_beside_gives_no_verdict_when_nothing_is_lost():
    """Another network's Adam must lose accuracy against SGD by more than 2 standard errors before a share of the
    loss is judged."""
    c = claim("resnet_window_test_recovers_most_accuracy")
    a = 0.01
    gap = 2 * welch_se(a, a)

    def ev(loss: float) -> Evidence:
        values = {c.row: {"acc_eval_mode": around(0.99, a)}, c.lost: {"acc_eval_mode": around(0.99 - loss, a)},
                  c.reference: {"acc_eval_mode": around(0.99, a)}}
        return evidence(values)

    assert verdict(c, ev(gap * (1 - EPS))) == PRECONDITION_FAILED  # the runs are there: nothing lost to recover
    assert verdict(c, ev(gap * (1 + EPS))) == PASS  # the row at the reference's accuracy: all of the loss back


# ----------------------------------------------------------------------------- every kind is covered
def test_every_declared_kind_is_covered_by_a_boundary_case():
    """Every kind the registry declares claims with (all but bespoke checks, which carry their own rules) has a
    boundary case above; a new kind needs one too."""
    declared = {type(c) for c in registry.CLAIMS} - {kinds.Bespoke}
    assert declared - {type(claim(name)) for name in BOUNDARY_CASES} == set()
