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
