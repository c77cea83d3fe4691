"""The one statistics module: seed spread, Spearman's rho and its exact critical values, the cell formatter.

Closed forms, invariances and failures, as everywhere in the analysis; no torch.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from bnrotation.study.analysis import stats
from bnrotation.study.analysis.formatting import cell, seed_ranges, spread
from bnrotation.study.analysis.stats import (SeedStat, half_unit, over_seeds, rank_distance_counts, rho_at_or_beyond,
                                       se_of_difference, share_at_or_below, spearman_critical, spearman_rho,
                                       subset_means)


# ----------------------------------------------------------------------------- mean and sample sd over seeds
def test_sample_sd_of_three_seeds_has_its_closed_form():
    s = SeedStat((1.0, 2.0, 4.0), (0, 1, 2))
    # mean 7/3; squared deviations 16/9 + 1/9 + 25/9 = 42/9; over n - 1 = 2: 7/3 (ddof 0 would give 14/9)
    assert s.n == 3 and s.mean == pytest.approx(7 / 3)
    assert s.sd == pytest.approx(math.sqrt(7 / 3), rel=1e-12)
    assert s.se == pytest.approx(math.sqrt(7 / 3) / math.sqrt(3), rel=1e-12)
    assert s.describe("plain") == "2.33 ± 1.5 (n = 3 seeds)"


def test_seed_spread_is_invariant_to_order_and_shift_and_scales_with_the_values():
    values = (0.31, 0.62, 0.45, 0.58)
    base = SeedStat(values)
    assert SeedStat(tuple(reversed(values))).sd == pytest.approx(base.sd, rel=1e-12)
    assert SeedStat(tuple(v + 10.0 for v in values)).sd == pytest.approx(base.sd, rel=1e-9)
    assert SeedStat(tuple(3 * v for v in values)).sd == pytest.approx(3 * base.sd, rel=1e-12)


def test_one_seed_has_no_spread_and_missing_values_are_left_out():
    one = SeedStat((0.7,))
    assert one.mean == 0.7 and math.isnan(one.sd) and math.isnan(one.se)
    assert one.describe("pct") == "70.0% (n = 1 seed)"
    assert SeedStat(()).describe("pct") == "no runs" and math.isnan(SeedStat(()).mean)
    kept = SeedStat.of([1.0, math.nan, 4.0], seeds=[0, 1, 2])
    assert kept.values == (1.0, 4.0) and kept.seeds == (0, 2)


def test_over_seeds_columns_equal_the_seed_stat():
    frame = pd.DataFrame({"a": [1.0, 2.0, 4.0], "b": [5.0, math.nan, math.nan]})
    out = over_seeds(frame, ["a", "b"])
    assert list(out) == ["a_mean", "a_std", "b_mean", "b_std"]
    assert out["a_std"] == pytest.approx(math.sqrt(7 / 3), rel=1e-12)
    assert out["b_mean"] == 5.0 and math.isnan(out["b_std"])


def test_standard_error_of_a_difference():
    a, b = SeedStat((0.5, 0.6, 0.7)), SeedStat((0.1, 0.2, 0.4))
    assert se_of_difference(a, b) == pytest.approx(math.sqrt(0.01 / 3 + (0.07 / 3) / 3), rel=1e-9)
    assert math.isnan(se_of_difference(a, SeedStat((0.2,))))
    assert half_unit(2) == pytest.approx(0.005) and half_unit(0) == 0.5


# ----------------------------------------------------------------------------- Spearman's rho
def test_spearman_of_a_monotone_nonlinear_pair_is_one_where_pearson_is_not():
    x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    y = [1.0, 2.0, 4.0, 8.0, 16.0, 1000.0]  # increasing, far from a line
    assert np.corrcoef(x, y)[0, 1] < 0.8  # Pearson's r
    assert spearman_rho(x, y) == pytest.approx(1.0, abs=1e-12)
    assert spearman_rho(x, [-v for v in y]) == pytest.approx(-1.0, abs=1e-12)


def test_spearman_gives_ties_their_average_rank_as_scipy_does():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 5, 40).astype(float), rng.normal(size=40)  # many ties in a
    assert spearman_rho(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)
    # closed form with one tie: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4)
    r = np.array([1, 2.5, 2.5, 4])
    assert spearman_rho([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(np.corrcoef(r, [1, 2, 3, 4])[0, 1])


def test_spearman_pairs_by_position_whatever_the_index():
    x = pd.Series([3.0, 1.0, 2.0], index=[10, 11, 12])
    y = pd.Series([30.0, 10.0, 20.0], index=[0, 1, 2])
    assert spearman_rho(x, y) == pytest.approx(1.0)


def test_spearman_needs_three_pairs_and_varying_sides():
    assert math.isnan(spearman_rho([1, 2], [2, 1]))
    assert math.isnan(spearman_rho([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError, match="pairs"):
        spearman_rho([1, 2, 3], [1, 2])


def _enumerated_distances(n: int) -> list[int]:
    counts = [0] * (n * (n * n - 1) // 3 + 1)
    for p in itertools.permutations(range(n)):
        counts[sum((i - v) ** 2 for i, v in enumerate(p))] += 1
    return counts


def _enumerated_critical(n: int, alpha: float = 0.05) -> float:
    rhos = np.array([1 - 6 * sum((i - v) ** 2 for i, v in enumerate(p)) / (n * (n * n - 1))
                     for p in itertools.permutations(range(n))])
    crit = math.inf
    for r in sorted(set(np.round(rhos, 12)), reverse=True):
        if np.mean(rhos >= r - 1e-9) > alpha:
            break
        crit = float(r)
    return crit


@pytest.mark.parametrize("n", range(3, 9))
def test_rank_distance_distribution_equals_enumerating_every_order(n):
    assert list(rank_distance_counts(n)) == _enumerated_distances(n)
    assert spearman_critical(n) == pytest.approx(_enumerated_critical(n), abs=1e-9)


@pytest.mark.parametrize("n, published", [(5, 0.900), (6, 0.829), (7, 0.714), (8, 0.643), (9, 0.600), (10, 0.564)])
def test_critical_values_match_the_published_tables(n, published):
    """One-sided 5% critical values of Spearman's rho, as tabulated by Zar (1972, JASA 67:578, Table 1)."""
    assert round(spearman_critical(n), 3) == pytest.approx(published)


def test_critical_values_where_none_exists_or_out_of_range():
    assert math.isinf(spearman_critical(3))  # 3 items: each order has probability 1/6 > 5%
    assert spearman_critical(4) == pytest.approx(1.0)  # only the perfect order: 1/24 < 5%
    assert spearman_critical(6, alpha=0.01) == pytest.approx(0.943, abs=1e-3)
    for n in (2, 13):
        with pytest.raises(ValueError, match="3 <= n <= 12"):
            spearman_critical(n)
    assert sum(rank_distance_counts(10)) == math.factorial(10)


def test_a_rho_exactly_at_the_critical_value_reaches_it_despite_rounding():
    crit = spearman_critical(6)  # 1 - 6 * 6 / 210: D = 6 from the same order
    x = [1, 2, 3, 4, 5, 6]
    y = [4, 6, 5, 3, 2, 1]  # D = 9 + 16 + 4 + 1 + 9 + 25 = 64 = 70 - 6: rho = 1 - 6 * 64 / 210 = -crit
    rho = spearman_rho(x, y)
    assert rho == pytest.approx(-crit, abs=1e-12)
    assert rho_at_or_beyond(rho, -crit) and rho_at_or_beyond(-rho, crit)
    assert not rho_at_or_beyond(rho + 0.01, -crit)


# ----------------------------------------------------------------------------- the cell formatter
@pytest.mark.parametrize("value, unit, text", [
    (0.7037, "pct", "70.4%"), (6.494, "deg", "6.49°"), (5.8, "x", "5.80×"), (0.06271, "sigma", "0.0627σ"),
    (0.03708, "cos", "+0.0371"), (-0.8286, "rho", "-0.83"), (0.00187, "drift", "0.0019σ/step"),
    (1.5734, "plain", "1.57"), (math.nan, "pct", "–"), (None, "deg", "–")])
def test_cell_prints_each_unit(value, unit, text):
    assert cell(value, unit) == text


def test_cell_with_spread_digits_and_signs():
    assert cell(0.704, "pct", 0.122, n=3) == "70.4% ± 12.2 points (n = 3 seeds)"
    assert cell(0.71, "pct", 0.197, digits=0, spread_digits=1, spread_sign=False) == "71% ± 19.7"
    assert cell(6.49, "deg", 1.21, spread_sign=False) == "6.49° ± 1.21"
    assert cell(0.8123, "pct", 0.041, sign=False, spread_sign=False) == "81.2 ± 4.1"
    assert cell(0.0019, "plain", 0.00055, digits=4) == "0.0019 ± 0.0006"
    assert cell(0.7, "pct", math.nan) == "70.0%"  # no spread: left out
    assert cell(0.04, "cos", digits=2) == "+0.04" and cell(0.005, "cos", digits=3) == "+0.005"


def test_spread_alone():
    assert spread(0.122, "pct") == "12.2 points" and spread(0.00055, "drift") == "0.00055σ/step"
    assert spread(0.018, "sigma") == "0.018σ" and spread(0.0071, "cos") == "0.0071"
    assert spread(math.nan, "pct") == ""
    assert spread(0.01, "deg", sign=False) == "0.01"


def test_spearman_critical_value_beyond_the_exact_count():
    """The t-approximation: below the exact values where both exist (slightly liberal), close to them, and at 21
    items its level is 5% in a permutation simulation (200,000 orders: standard error 0.05 percentage points)."""
    for n in range(8, stats.SPEARMAN_EXACT_MAX_N + 1):
        exact, approx = stats.spearman_critical(n), stats.spearman_critical_t(n)
        assert exact - 0.025 < approx < exact, n
    assert stats.spearman_threshold(12) == (stats.spearman_critical(12), "exact")
    crit, method = stats.spearman_threshold(21)
    assert crit == pytest.approx(0.3687, abs=1e-4) and method.startswith("t-approximation")
    rng = np.random.default_rng(1)
    n, orders = 21, 200_000
    perms = np.argsort(rng.random((orders, n)), axis=1)
    rho = 1 - 6 * ((perms - np.arange(n)) ** 2).sum(1) / (n * (n * n - 1))
    assert abs(float((rho >= crit - stats.RHO_TOLERANCE).mean()) - 0.05) < 0.002
    with pytest.raises(ValueError, match="n >= 4"):
        stats.spearman_critical_t(3)


# ----------------------------------------------------------------------------- what a 3-seed mean could have been
def test_subset_means_of_four_seeds_are_the_four_leave_one_out_means():
    values = (0.5, 0.6, 0.8, 1.0)
    means = subset_means(values, 3)
    # C(4, 3) = 4 subsets, each leaving one seed out: (sum − v) / 3
    assert len(means) == math.comb(4, 3) == 4
    assert sorted(means) == pytest.approx(sorted((sum(values) - v) / 3 for v in values))
    # leaving out 0.6 gives the 2nd largest mean, 2.3 / 3: it and the two below it, 3 of 4
    assert share_at_or_below(means, (sum(values) - 0.6) / 3) == 0.75


def test_subset_means_enumerate_every_subset_whatever_the_order():
    values = [0.1, 0.9, 0.4, 0.7, 0.3, 0.2, 0.8]
    means = subset_means(values, 3)
    assert len(means) == math.comb(7, 3)
    assert sorted(subset_means(values[::-1], 3)) == pytest.approx(sorted(means))  # the seeds' order is irrelevant
    assert means.mean() == pytest.approx(np.mean(values))  # each value lies in the same number of subsets
    assert subset_means(values, len(values)) == pytest.approx([np.mean(values)])
    for k in (0, 8):
        with pytest.raises(ValueError, match="need 1 <= k <= n"):
            subset_means(values, k)


def test_share_at_or_below_counts_ties_and_is_nan_for_nothing():
    assert share_at_or_below([0.6, 0.6, 0.7, 0.5], 0.6) == 0.75
    assert share_at_or_below([0.6], 0.59) == 0.0 and math.isnan(share_at_or_below([], 0.5))


def test_seed_ranges():
    assert seed_ranges(range(10)) == "0–9"
    assert seed_ranges([8, 7, 0, 1, 2, 5]) == "0–2, 5, 7, 8"  # two consecutive seeds are listed, three are a range
    assert seed_ranges([3]) == "3" and seed_ranges([]) == "–"
