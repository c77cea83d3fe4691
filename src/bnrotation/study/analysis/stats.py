"""Statistics over seeds and Spearman's rank correlation: numbers only, no text (no torch).

Every mean ± spread in ``table.md``, ``lag.md``, ``averaging.md`` and
``claims.md`` comes from :class:`SeedStat` (or :func:`over_seeds`, its
column-wise form): the mean over seeds and the *sample* standard deviation
(Bessel's correction, n − 1 in the denominator), which is NaN with fewer than
two finite values. Every rank correlation is :func:`spearman_rho`. How the
numbers are printed is :mod:`.formatting`'s.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from .formatting import cell

Z = 2.0  # standard errors a difference must exceed: every verdict's rule (claims.kinds, the map's collapse)


# ----------------------------------------------------------------------------- per-seed values
@dataclass(frozen=True)
class SeedStat:
    """Per-seed values of one quantity for one row (one value per seed, in the quantity's own unit).

    ``mean`` is the arithmetic mean; ``sd`` the sample standard deviation
    (ddof = 1), NaN for n < 2; ``se`` the standard error of the mean, sd / √n.
    ``seeds`` names the seed of each value, where known.
    """

    values: tuple[float, ...]
    seeds: tuple[int, ...] = ()

    @classmethod
    def of(cls, values: Iterable[float], seeds: Iterable[int] = ()) -> SeedStat:
        """The values of ``values`` with their ``seeds`` (if given), NaN values left out with their seeds."""
        values, seeds = [float(v) for v in values], [int(s) for s in seeds]
        keep = [i for i, v in enumerate(values) if not math.isnan(v)]
        return cls(tuple(values[i] for i in keep), tuple(seeds[i] for i in keep) if seeds else ())

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.values else math.nan

    @property
    def sd(self) -> float:
        """Sample standard deviation, √(Σ(x − mean)² / (n − 1)); NaN for n < 2."""
        return float(np.std(self.values, ddof=1)) if self.n > 1 else math.nan

    @property
    def se(self) -> float:
        """Standard error of the mean, sd / √n; NaN for n < 2."""
        return self.sd / math.sqrt(self.n) if self.n > 1 else math.nan

    def describe(self, unit: str) -> str:
        """``'60.3% ± 4.1 points (n = 3 seeds)'``; ``'no runs'`` for n = 0 (see :func:`cell`)."""
        return "no runs" if self.n == 0 else cell(self.mean, unit, self.sd, n=self.n)


def over_seeds(frame: pd.DataFrame, keys: Sequence[str]) -> dict[str, float]:
    """``<key>_mean`` and ``<key>_std`` of each column ``key`` of ``frame`` (one line per seed), as
    :class:`SeedStat` gives them (NaN left out; the spread NaN with fewer than two values)."""
    out = {}
    for key in keys:
        stat = SeedStat.of(frame[key])
        out[f"{key}_mean"], out[f"{key}_std"] = stat.mean, stat.sd
    return out


def se_of_difference(a: SeedStat, b: SeedStat) -> float:
    """Standard error of the difference of two independent means, √(s_a²/n_a + s_b²/n_b) (Welch 1947,
    Biometrika 34:28); NaN unless both sides have two or more values."""
    return math.sqrt(a.sd ** 2 / a.n + b.sd ** 2 / b.n) if a.n > 1 and b.n > 1 else math.nan


def subset_means(values: Sequence[float], k: int) -> np.ndarray:
    """The mean of every k-element subset of ``values`` (one value per seed), exactly: all C(n, k) subsets,
    in :func:`itertools.combinations` order, no random resampling. What a k-seed mean could have been, drawn
    from these n seeds without replacement.

    Returns:
        (C(n, k),) array of means, in the values' unit.

    Raises:
        ValueError: for k < 1 or k > n.
    """
    v = np.asarray(values, dtype=float)
    if not 1 <= k <= len(v):
        raise ValueError(f"subset_means: k = {k} seeds out of n = {len(v)}; need 1 <= k <= n")
    return np.array([v[list(c)].mean() for c in itertools.combinations(range(len(v)), k)])


def share_at_or_below(values: Sequence[float], x: float) -> float:
    """The share (0..1) of ``values`` at or below ``x``: the empirical distribution function at x. NaN when
    ``values`` is empty."""
    v = np.asarray(values, dtype=float)
    return float(np.mean(v <= x)) if len(v) else math.nan


def half_unit(decimals: int) -> float:
    """Half a unit of the last digit of a figure printed with ``decimals`` decimals: its rounding."""
    return 0.5 * 10.0 ** (-decimals)


# ----------------------------------------------------------------------------- Spearman's rank correlation
def spearman_rho(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation ρ (Spearman 1904, Am. J. Psychol. 15:72): Pearson's correlation of the
    ranks of ``x`` and of ``y``, tied values given their average rank. Pairs are matched by position.

    Returns:
        ρ in [−1, 1]; NaN with fewer than 3 pairs or when either side is constant.
    """
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(a) != len(b):
        raise ValueError(f"spearman_rho needs pairs: {len(a)} x values against {len(b)} y values")
    if len(a) < 3:
        return math.nan
    return float(pd.Series(a).rank().corr(pd.Series(b).rank()))


SPEARMAN_EXACT_MAX_N = 12  # the exact null distribution below is computed up to this many items


@lru_cache(maxsize=None)
def rank_distance_counts(n: int) -> tuple[int, ...]:
    """How many of the n! orders of n items give each value of D = Σ (i − π(i))², D = 0, 1, …, n(n² − 1)/3.

    A dynamic programme over the set of ranks already placed: the item at position i (the number of
    ranks placed so far) takes a free rank r and adds (i − r)² to D. Exact integer counts.

    Raises:
        ValueError: for n < 1 or n > :data:`SPEARMAN_EXACT_MAX_N`.
    """
    if not 1 <= n <= SPEARMAN_EXACT_MAX_N:
        raise ValueError(f"exact rank distances are computed for 1 <= n <= {SPEARMAN_EXACT_MAX_N}, got {n}")
    d_max = n * (n * n - 1) // 3
    counts = np.zeros((1 << n, d_max + 1), dtype=np.int64)  # (placed-rank set, D)
    counts[0, 0] = 1
    for placed in range(1 << n):  # a set is reached only from its subsets, which are smaller numbers
        here = counts[placed]
        if not here.any():
            continue
        position = bin(placed).count("1")
        for rank in range(n):
            if not placed >> rank & 1:
                step = (position - rank) ** 2
                counts[placed | 1 << rank, step:] += here[: d_max + 1 - step]
    return tuple(int(c) for c in counts[-1])


@lru_cache(maxsize=None)
def spearman_critical(n: int, alpha: float = 0.05) -> float:
    """Exact one-sided critical value of Spearman's ρ for n items without ties: the smallest r with
    P(ρ ≥ r) ≤ ``alpha`` when all n! orders are equally likely (:func:`rank_distance_counts`, ρ = 1 − 6D /
    (n(n² − 1))). 0.900 for n = 5, 0.829 for 6, 0.714 for 7, 0.643 for 8 (Zar 1972, JASA 67:578, Table 1).
    ``inf`` where no order is rare enough (n = 3 at 5%: each order has probability 1/6).

    Raises:
        ValueError: for n < 3 or n > :data:`SPEARMAN_EXACT_MAX_N`.
    """
    if not 3 <= n <= SPEARMAN_EXACT_MAX_N:
        raise ValueError(f"exact Spearman critical values are computed for 3 <= n <= {SPEARMAN_EXACT_MAX_N}, "
                         f"got {n}")
    counts = rank_distance_counts(n)
    total, below, largest = math.factorial(n), 0, None
    for d, c in enumerate(counts):  # P(ρ ≥ r) = P(D ≤ d) for r = 1 − 6d / (n(n² − 1))
        below += c
        if below > alpha * total:
            break
        largest = d if c else largest
    return math.inf if largest is None else 1.0 - 6.0 * largest / (n * (n * n - 1))


def spearman_critical_t(n: int, alpha: float = 0.05) -> float:
    """Approximate one-sided critical value of Spearman's ρ for n items without ties, for n beyond the exact
    count (:data:`SPEARMAN_EXACT_MAX_N`): ρ is referred to Student's t with n − 2 degrees of freedom,
    t = ρ √((n − 2) / (1 − ρ²)), so r = t₁₋α / √(n − 2 + t₁₋α²) (Zar 1972, JASA 67:578, compares it with the
    exact values). Close above n = 10: 0.497 against the exact 0.503 at n = 12, 0.369 at n = 21 (tests check it
    against the exact count and a permutation simulation).

    The quantile t₁₋α is ``scipy.special.stdtrit``, what ``scipy.stats.t.ppf`` computes, without the half second
    that importing ``scipy.stats`` takes.

    Raises:
        ValueError: for n < 4 (t needs n − 2 ≥ 2 degrees of freedom) or ``alpha`` outside (0, 0.5).
    """
    from scipy.special import stdtrit

    if n < 4 or not 0 < alpha < 0.5:
        raise ValueError(f"the t-approximation needs n >= 4 and 0 < alpha < 0.5, got n = {n}, alpha = {alpha}")
    q = float(stdtrit(n - 2, 1 - alpha))
    return q / math.sqrt(n - 2 + q * q)


def spearman_threshold(n: int, alpha: float = 0.05) -> tuple[float, str]:
    """The one-sided ``alpha`` critical value of Spearman's ρ for n items and how it was found: exact
    (:func:`spearman_critical`) up to :data:`SPEARMAN_EXACT_MAX_N` items, the t-approximation
    (:func:`spearman_critical_t`) above. Returns (value, ``'exact'`` or ``'t-approximation, n − 2 = 19 degrees
    of freedom'``).

    Raises:
        ValueError: for n < 3.
    """
    if n <= SPEARMAN_EXACT_MAX_N:
        return spearman_critical(n, alpha), "exact"
    return spearman_critical_t(n, alpha), f"t-approximation, n − 2 = {n - 2} degrees of freedom"


RHO_TOLERANCE = 1e-9  # ρ from data is a float; the critical values sit on the lattice 1 − 6D / (n(n² − 1))


def rho_at_or_beyond(rho: float, critical: float) -> bool:
    """Whether |ρ| reaches the critical value in ρ's direction: ρ ≥ c for c > 0, ρ ≤ c for c < 0, up to
    float rounding (:data:`RHO_TOLERANCE`)."""
    return rho >= critical - RHO_TOLERANCE if critical > 0 else rho <= critical + RHO_TOLERANCE
