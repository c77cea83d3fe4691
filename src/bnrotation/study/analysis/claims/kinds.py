"""The kinds of claim ``make claims`` checks, and the verdict each gives (no torch).

A claim is declared once, in :data:`.registry.CLAIMS`, as one of these small
frozen dataclasses; :meth:`Claim.check` weighs it against the evidence
(:class:`.evidence.Evidence`) and returns a :class:`Check`: the published
figure, the measured one (mean ± sample standard deviation over seeds, with n),
the tolerance and why, and a verdict, PASS, FAIL, NOT RUN when the runs it
needs are missing, or PRECONDITION FAILED when the runs exist but what the claim
presupposes does not hold on them (:data:`PRECONDITION_FAILED`).

- :class:`MatchesPublished`: a row's mean against the article's figure, within
  ``2 · s · √(1/n + 1/3)``, two standard errors of the difference of two means
  (the article's are 3-seed means), the measured seed spread s standing in for
  the article's; never tighter than half a unit of the published figure's last
  digit. One seed gives no spread, so no verdict.
- :class:`Below` / :class:`Above`: one row's mean below (above) another's by
  more than two standard errors of the difference (Welch); with one seed per
  side, by the sign alone, and the check says so.
- :class:`RankOrder`: a Spearman rank correlation with evaluation-mode accuracy
  across the article's rows, beyond (or not) the exact one-sided 5% critical
  value for that many rows (:func:`..stats.spearman_critical`).
- :class:`RecoveryShare`: the share of the accuracy one row loses against
  another that a third wins back, paired by seed; "most" is more than half.
- :class:`Bespoke`: any other check, a function registered with
  :func:`bespoke`.
- :class:`Ordering`: a Spearman rank correlation with evaluation-mode accuracy
  across named rows of another network (the ResNet-20 rows), every one needed.
- :class:`RecoveryShareBeside`: :class:`RecoveryShare` on another network's
  rows, with the study's share beside it.

Every claim belongs to a section of ``claims.md`` (``section``: :data:`ARTICLE`,
the article's claims, :data:`RESNET`, "Does it carry over? ResNet-20",
:data:`FASHION_MNIST`, "Does it happen on real images? Fashion-MNIST",
:data:`FROZEN`, "Beyond the article: a frozen backbone", :data:`CALIBRATION`, "The monitor's rule out of
sample", :data:`MAP`, "Where does the collapse live? The condition map", or :data:`WHY`, "Why do fresh samples keep
Adam rotating? The data swap").
An *exploratory* claim (``exploratory=True``) measures without a tolerance fixed
in advance: it gives MEASURED, never PASS or FAIL (NOT RUN when its runs are
missing).

The article's figures come from :mod:`bnrotation.study.rows` (its table) and
:mod:`bnrotation.study.article` (its text), through :func:`published`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ... import article
from ...article import Figure
from ...rows import PUBLISHED_DECIMALS, PUBLISHED_ROWS, PUBLISHED_SEEDS, ROWS
from ..formatting import cell, decimals_shown, seed_ranges, spread
from ..stats import (Z, SeedStat, half_unit, rho_at_or_beyond, se_of_difference,  # Z: every claim imports it here
                     spearman_critical, spearman_rho)
from ..tables.table import COLUMNS as TABLE_COLUMNS
from .evidence import Evidence, recovery_share

PASS, FAIL, NOT_RUN = "PASS", "FAIL", "NOT RUN"
NOT_JUDGED = "not judged at this scale"  # runs below the article's scale: measured, weighed against nothing
MEASURED = "MEASURED"  # the verdict of an exploratory claim with runs: measured, no PASS or FAIL
# The runs exist, but what the claim presupposes does not hold on them (a row that loses nothing has nothing to
# recover): weighed against nothing, and not NOT RUN, whose runs are missing.
PRECONDITION_FAILED = "PRECONDITION FAILED"
# The sections of claims.md a claim belongs to.
ARTICLE, RESNET, FASHION_MNIST, FROZEN = "article", "resnet", "fashion_mnist", "frozen"
CALIBRATION = "calibration"  # the monitor's rule out of sample (analysis/claims/outofsample.py)
MAP = "map"  # where does the collapse live? the condition map's predictions (analysis/claims/condition_map.py)
WHY = "why"  # why do fresh samples keep Adam rotating? the data swap's predictions (analysis/claims/why.py)
ALPHA = 0.05  # one-sided level of an ordering across rows
MIN_RANK_ROWS = 4  # an ordering needs at least this many of the article's rows (4 rows: 1 order in 24 is 4%)
MOST = 0.5  # "most" of the accuracy lost: more than half of it

# Where the article gives the figure of each measured column: its table (rows.Published, by attribute) ...
TABLE_FIGURES = {col.key: col.published for col in TABLE_COLUMNS if col.published}
# ... or its text (article.py, by row).
TEXT_FIGURES = {"update_cos": article.UPDATE_COSINE, "drift_mid": article.MIDDLE_DRIFT,
                "predicted_lag_mid": article.PREDICTED_LAG, "abs_mean_over_std_mid": article.ABS_MEAN_OVER_STD,
                "drift_mid_at_age": article.MIDDLE_DRIFT, "predicted_lag_mid_at_age": article.PREDICTED_LAG}


def published(row: str, column: str) -> Figure | None:
    """The article's figure for measured ``column`` of ``row``, with the decimals it prints it with; None
    where the article gives none (no published row, a NaN cell, a column it does not report)."""
    if column in TABLE_FIGURES:
        spec = ROWS.get(row)
        attr = TABLE_FIGURES[column]
        value = getattr(spec.published, attr) if spec and spec.published else math.nan
        return None if math.isnan(value) else Figure(value, PUBLISHED_DECIMALS[attr])
    return TEXT_FIGURES.get(column, {}).get(row)


def said(figure: Figure, unit: str, digits: int | None = None) -> str:
    """A published figure as the article prints it (its own decimals), or rounded to ``digits`` decimals
    of the printed unit as a sentence quotes it: ``said(Figure(0.306, 3), "pct", 0)`` is ``'31%'``."""
    return cell(figure.value, unit, digits=decimals_shown(figure.decimals, unit) if digits is None else digits)


def table_figure(row: str, column: str) -> Figure:
    """:func:`published`, for a figure a claim's wording quotes.

    Raises:
        KeyError: naming the row and column, if the article gives no such figure.
    """
    figure = published(row, column)
    if figure is None:
        raise KeyError(f"the article gives no figure for {column!r} of row {row!r}")
    return figure


@dataclass
class Check:
    """One named claim weighed: the article's figure, the measured one, the tolerance and the verdict."""

    name: str
    claim: str
    published: str
    measured: str
    tolerance: str
    verdict: str
    note: str = ""
    section: str = ARTICLE  # ARTICLE, RESNET, FASHION_MNIST or FROZEN: where claims.md lists it
    exploratory: bool = False  # measured without a tolerance fixed in advance: MEASURED, never PASS or FAIL
    figures: dict[str, float] = field(default_factory=dict)  # the numbers its verdict rests on (Outcome.figures)


@dataclass(frozen=True)
class Outcome:
    """What a claim's evidence says, in words: the measured figure, the tolerance and why, ``passed`` (None: no
    verdict, NOT RUN) and a note; ``figures``, the numbers the verdict rests on (name → value in the claim's
    unit, from the kind's numbers' :meth:`figures`; empty for a bespoke check that keeps its numbers to itself);
    ``unmet``, with ``passed`` None: the runs are there but the claim's precondition fails on them
    (:data:`PRECONDITION_FAILED`, not NOT RUN)."""

    measured: str
    tolerance: str
    passed: bool | None
    note: str = ""
    figures: Mapping[str, float] = field(default_factory=dict)
    unmet: bool = False


class Claim:
    """What every kind of claim has: ``name``, ``claim`` (the article's statement), the rows it needs, the
    published figure as text, and :meth:`outcome`; ``section`` (:data:`ARTICLE` unless a kind says otherwise)
    and ``exploratory``. :meth:`check` gives NOT RUN when a needed row has no run.

    A declared kind splits :meth:`outcome` in two: :meth:`judge` computes the numbers and the verdict from the
    evidence (a frozen dataclass with ``passed`` and ``figures()``: :class:`Match`, :class:`Gap`, :class:`Rank`,
    :class:`Share`, :class:`NotBelowBy`), and :meth:`words`, the kind's one template, writes them as text. A
    :class:`Bespoke` check gives its :class:`Outcome` directly."""

    name: str
    claim: str
    section: str = ARTICLE
    exploratory: bool = False

    def rows_needed(self) -> tuple[str, ...]:
        return ()

    def published_text(self) -> str:
        raise NotImplementedError

    def judge(self, ev: Evidence):
        """The numbers the verdict rests on and the verdict (``passed``), no text."""
        raise NotImplementedError

    def words(self, ev: Evidence, numbers) -> Outcome:
        """:meth:`judge`'s ``numbers`` as the kind's sentences (``ev`` for the seeds and rows they name)."""
        raise NotImplementedError

    def outcome(self, ev: Evidence) -> Outcome:
        return self.words(ev, self.judge(ev))

    def check(self, ev: Evidence) -> Check:
        published_text = self.published_text()
        missing = [r for r in self.rows_needed() if not ev.has(r)]
        if missing:
            return Check(self.name, self.claim, published_text,
                         f"missing runs of {', '.join(f'`{r}`' for r in missing)}", "–", NOT_RUN,
                         section=self.section, exploratory=self.exploratory)
        o = self.outcome(ev)
        if self.exploratory:  # ``passed`` only says whether there was anything to measure (None: nothing)
            verdict = NOT_RUN if o.passed is None else MEASURED
        else:
            verdict = NOT_RUN if o.passed is None else PASS if o.passed else FAIL
        if o.passed is None and o.unmet:
            verdict = PRECONDITION_FAILED
        return Check(self.name, self.claim, published_text, o.measured, o.tolerance, verdict, o.note,
                     section=self.section, exploratory=self.exploratory, figures=dict(o.figures))


# ----------------------------------------------------------------------------- numbers and verdicts, no text
def match_tolerance(s: SeedStat, figure: Figure) -> float:
    """How far a measured mean may lie from a published one and still match it: max(2 · s · √(1/n + 1/3),
    half a unit of the figure's last digit), two standard errors of the difference of two means (the article's
    are 3-seed means, the measured seed spread s standing in for its), never tighter than its rounding. NaN
    for n < 2 (no spread)."""
    if s.n < 2:
        return math.nan
    return max(Z * s.sd * math.sqrt(1 / s.n + 1 / PUBLISHED_SEEDS), half_unit(figure.decimals))


def matches(s: SeedStat, figure: Figure) -> bool | None:
    """Whether ``s``'s mean matches ``figure`` within :func:`match_tolerance`; None for n < 2."""
    return Match(s, figure).passed


@dataclass(frozen=True)
class Match:
    """A row's per-seed values ``stat`` against a published ``figure`` (:class:`MatchesPublished`):
    ``off`` = |mean − published| within ``tolerance`` (:func:`match_tolerance`; ``floor``, its rounding part)."""

    stat: SeedStat
    figure: Figure

    @property
    def floor(self) -> float:
        return half_unit(self.figure.decimals)

    @property
    def tolerance(self) -> float:
        return match_tolerance(self.stat, self.figure)

    @property
    def off(self) -> float:
        return abs(self.stat.mean - self.figure.value)

    @property
    def passed(self) -> bool | None:
        """None for n < 2: one seed gives no spread to set the tolerance."""
        return None if self.stat.n < 2 else self.off <= self.tolerance

    def figures(self) -> dict[str, float]:
        return {"mean": self.stat.mean, "sd": self.stat.sd, "n": self.stat.n, "published": self.figure.value,
                "tolerance": self.tolerance, "off": self.off}


@dataclass(frozen=True)
class Gap:
    """``upper``'s mean above ``lower``'s by more than :data:`Z` standard errors of the difference (Welch,
    :func:`..stats.se_of_difference`); with one seed on a side (no spread), by the sign alone."""

    upper: SeedStat
    lower: SeedStat

    @property
    def difference(self) -> float:
        return self.upper.mean - self.lower.mean

    @property
    def se(self) -> float:
        return se_of_difference(self.upper, self.lower)

    @property
    def passed(self) -> bool:
        return self.difference > Z * self.se if not math.isnan(self.se) else self.difference > 0

    def figures(self) -> dict[str, float]:
        return {"upper_mean": self.upper.mean, "lower_mean": self.lower.mean, "difference": self.difference,
                "se": self.se}

    def words(self) -> str:
        """``'difference +0.283 against 2 · SE = 0.0484'``, or the sign alone with one seed on a side."""
        if not math.isnan(self.se):
            return f"difference {self.difference:+.3g} against {Z:g} · SE = {Z * self.se:.3g}"
        return f"difference {self.difference:+.3g}; one seed on a side, so the sign alone (no spread)"


def above(a: SeedStat, b: SeedStat) -> tuple[bool, str]:
    """Whether a's mean exceeds b's by more than :data:`Z` standard errors of the difference
    (:class:`Gap`); with one seed on a side, whether it exceeds it at all. Also the sentence that says so."""
    gap = Gap(a, b)
    return gap.passed, gap.words()


@dataclass(frozen=True)
class NotBelowBy:
    """``row``'s mean not below ``than``'s by more than max(:data:`Z` standard errors of the difference,
    ``margin``) (``margin`` alone with one seed on a side): "matches" where only falling short counts."""

    row: SeedStat
    than: SeedStat
    margin: float

    @property
    def tolerance(self) -> float:
        se = se_of_difference(self.row, self.than)
        return max(Z * se, self.margin) if not math.isnan(se) else self.margin

    @property
    def passed(self) -> bool:
        return self.row.mean - self.than.mean >= -self.tolerance

    def figures(self) -> dict[str, float]:
        return {"row_mean": self.row.mean, "than_mean": self.than.mean, "tolerance": self.tolerance}


@dataclass(frozen=True)
class Rank:
    """Spearman's ``rho`` of a column against evaluation-mode accuracy over ``n_rows`` row means, against the
    exact one-sided :data:`ALPHA` ``critical`` value: ``ordered`` when ρ ≤ −critical; ``passed`` is
    ``ordered`` when the claim says the column ``orders`` accuracy, ``not ordered`` when it says it does not.
    No verdict with fewer than ``min_rows`` rows. ``per_seed``: ρ within each seed of ``seeds`` (described,
    not tested)."""

    rho: float
    n_rows: int
    orders: bool
    per_seed: tuple[float, ...] = ()
    seeds: tuple[int, ...] = ()
    min_rows: int = MIN_RANK_ROWS

    @property
    def critical(self) -> float:
        return spearman_critical(self.n_rows, ALPHA) if self.n_rows >= self.min_rows else math.nan

    @property
    def ordered(self) -> bool:
        return rho_at_or_beyond(self.rho, -self.critical)

    @property
    def passed(self) -> bool | None:
        if self.n_rows < self.min_rows:
            return None
        return self.ordered if self.orders else not self.ordered

    def figures(self) -> dict[str, float]:
        return {"rho": self.rho, "n_rows": self.n_rows, "critical": self.critical}


@dataclass(frozen=True)
class Share:
    """The per-seed ``share`` of the accuracy one row loses against another that a third wins back
    (:func:`.evidence.recovery_share`): "most" is a mean above :data:`MOST` and, with two or more seeds, above 0
    by :data:`Z` standard errors. No verdict when no seed has all three rows."""

    share: SeedStat

    @property
    def passed(self) -> bool | None:
        s = self.share
        if s.n == 0:
            return None
        return s.mean > MOST and (s.n < 2 or s.mean - Z * s.se > 0)

    def figures(self) -> dict[str, float]:
        return {"share_mean": self.share.mean, "share_se": self.share.se, "n": self.share.n}


# ----------------------------------------------------------------------------- the kinds: judge and template
NEEDS_TWO_SEEDS = "needs ≥ 2 seeds: with one there is no seed spread to set the tolerance"


def match_words(m: Match, unit: str) -> tuple[str, str]:
    """The template of :class:`MatchesPublished`: (measured, tolerance) of ``m`` in ``unit``."""
    if m.passed is None:
        return m.stat.describe(unit), NEEDS_TWO_SEEDS
    return m.stat.describe(unit), (f"|measured − published| ≤ {spread(m.tolerance, unit)} = max({Z:g} · s · "
                                   f"√(1/{m.stat.n} + 1/{PUBLISHED_SEEDS}), {spread(m.floor, unit)} rounding); off "
                                   f"by {spread(m.off, unit)}")


@dataclass(frozen=True)
class MatchesPublished(Claim):
    """``row``'s mean of ``column`` (in ``unit``) against the article's figure (:func:`published`), within
    max(2 · s · √(1/n + 1/3), half a unit of the figure's last digit). ``note``, if given, adds a note."""

    name: str
    claim: str
    row: str
    column: str
    unit: str
    note: Callable[[Evidence, MatchesPublished], str] | None = None

    def figure(self) -> Figure:
        return table_figure(self.row, self.column)

    def rows_needed(self) -> tuple[str, ...]:
        return (self.row,)

    def published_text(self) -> str:
        return cell(self.figure().value, self.unit)

    def judge(self, ev: Evidence) -> Match:
        return Match(ev.stat(self.row, self.column), self.figure())

    def words(self, ev: Evidence, m: Match) -> Outcome:
        measured, tolerance = match_words(m, self.unit)
        return Outcome(measured, tolerance, m.passed, self.note(ev, self) if self.note else "", m.figures())


@dataclass(frozen=True)
class Below(Claim):
    """``row``'s mean of ``column`` lies below ``than``'s by more than 2 standard errors of the difference
    ("the projected row grows less than Adam"). Published: the article's two figures, ``row``'s first."""

    name: str
    claim: str
    row: str
    than: str
    column: str
    unit: str

    def lower_upper(self) -> tuple[str, str]:
        return self.row, self.than

    def rows_needed(self) -> tuple[str, ...]:
        return self.lower_upper()

    def published_text(self) -> str:
        return (f"{said(table_figure(self.row, self.column), self.unit)} against "
                f"{said(table_figure(self.than, self.column), self.unit)}")

    def judge(self, ev: Evidence) -> Gap:
        lower, upper = self.lower_upper()
        return Gap(ev.stat(upper, self.column), ev.stat(lower, self.column))

    def words(self, ev: Evidence, g: Gap) -> Outcome:
        lower, upper = self.lower_upper()
        return Outcome(f"`{lower}` {g.lower.describe(self.unit)}; `{upper}` {g.upper.describe(self.unit)}",
                       f"`{lower}` below `{upper}` by more than {Z:g} standard errors of the difference: {g.words()}",
                       g.passed, figures=g.figures())


@dataclass(frozen=True)
class Above(Below):
    """``row``'s mean of ``column`` lies above ``than``'s by more than 2 standard errors of the difference."""

    def lower_upper(self) -> tuple[str, str]:
        return self.than, self.row


@dataclass(frozen=True)
class NotBelow(Below):
    """``row``'s mean of ``column`` is not below ``than``'s by more than max(2 standard errors of the difference,
    ``margin``) (:class:`NotBelowBy`); ``margin_words``, the margin as the tolerance's text names it (default:
    :func:`..formatting.spread` of it). Published: the article's two figures, ``row``'s first."""

    margin: float = 0.0
    margin_words: str = ""

    def judge(self, ev: Evidence) -> NotBelowBy:
        return NotBelowBy(ev.stat(self.row, self.column), ev.stat(self.than, self.column), self.margin)

    def words(self, ev: Evidence, b: NotBelowBy) -> Outcome:
        margin = self.margin_words or spread(self.margin, self.unit)
        return Outcome(f"`{self.row}` {b.row.describe(self.unit)}, `{self.than}` {b.than.describe(self.unit)}",
                       f"not below {ROWS[self.than].short} by more than {spread(b.tolerance, self.unit)} = max({Z:g} "
                       f"standard errors of the difference, {margin})", b.passed, figures=b.figures())


@dataclass(frozen=True)
class RankOrder(Claim):
    """Spearman's ρ between ``column`` and evaluation-mode accuracy over the article's rows that have runs:
    with ``orders`` the accuracy must fall in the column's order (ρ at or below minus the exact one-sided
    critical value), without it it must not (:class:`Rank`). Published: ρ over the article's own figures."""

    name: str
    claim: str
    column: str
    orders: bool

    def published_text(self) -> str:
        x = [table_figure(r, self.column).value for r in PUBLISHED_ROWS]
        acc = [table_figure(r, "acc_eval_mode").value for r in PUBLISHED_ROWS]
        return f"rho = {cell(spearman_rho(x, acc), 'rho')} over the six rows of the article's table"

    def rows_with_runs(self, ev: Evidence) -> list[str]:
        return [r for r in PUBLISHED_ROWS if ev.has(r)]

    def judge(self, ev: Evidence) -> Rank:
        rows = self.rows_with_runs(ev)
        if len(rows) < MIN_RANK_ROWS:
            return Rank(math.nan, len(rows), self.orders)
        runs = ev.per_run[ev.per_run["row"].isin(rows)]
        means = runs.groupby("row")[[self.column, "acc_eval_mode"]].mean()
        full = {seed: g for seed, g in runs.groupby("seed") if g["row"].nunique() == len(rows)}
        return Rank(spearman_rho(means[self.column], means["acc_eval_mode"]), len(rows), self.orders,
                    tuple(spearman_rho(g[self.column], g["acc_eval_mode"]) for g in full.values()), tuple(full))

    def words(self, ev: Evidence, r: Rank) -> Outcome:
        rows = self.rows_with_runs(ev)
        if r.passed is None:
            return Outcome(f"{len(rows)} of the six rows have runs", f"needs ≥ {MIN_RANK_ROWS} of the six rows",
                           None)
        seeds = (f"; per seed {', '.join(cell(x, 'rho') for x in r.per_seed)} (seeds {seed_ranges(r.seeds)}, those "
                 f"all {len(rows)} rows ran)" if r.per_seed else "")
        measured = f"rho = {cell(r.rho, 'rho')} over row means of {len(rows)} rows ({ev.seeds_per_row(rows)}){seeds}"
        level = cell(ALPHA, "pct", digits=0)
        if self.orders:
            tol = f"rho ≤ −{r.critical:.2f}, the exact one-sided {level} critical value for {len(rows)} rows"
        else:
            tol = (f"rho > −{r.critical:.2f}: no ordering significant at the one-sided {level} level for "
                   f"{len(rows)} rows (the exact critical value)")
        note = "" if len(rows) == len(PUBLISHED_ROWS) else f"only {len(rows)} of the six rows have runs"
        return Outcome(measured, tol, r.passed, note, r.figures())


@dataclass(frozen=True)
class RecoveryShare(Claim):
    """``row`` wins back most (more than half, and more than 0 by 2 standard errors) of the evaluation-mode
    accuracy ``lost`` gives up against ``reference``, per seed (:func:`.evidence.recovery_share`,
    :class:`Share`)."""

    name: str
    claim: str
    row: str
    lost: str
    reference: str

    def rows_needed(self) -> tuple[str, ...]:
        return self.row, self.lost, self.reference

    def published_text(self) -> str:
        pub, p_lost, p_ref = (table_figure(r, "acc_eval_mode").value for r in self.rows_needed())
        share = (pub - p_lost) / (p_ref - p_lost)
        return (f"{cell(pub, 'pct')} against {ROWS[self.lost].short}'s {cell(p_lost, 'pct')} and "
                f"{ROWS[self.reference].short}'s {cell(p_ref, 'pct')}: {cell(share, 'pct', digits=0)} of the loss "
                "recovered")

    def judge(self, ev: Evidence) -> Share:
        return Share(recovery_share(ev, self.row, self.lost, self.reference))

    def tolerance_words(self) -> str:
        return (f"\"most\": the mean share recovered above {cell(MOST, 'pct', digits=0)}, and above 0 by {Z:g} "
                "standard errors (paired by seed; one seed: the mean alone)")

    def words(self, ev: Evidence, s: Share) -> Outcome:
        if s.passed is None:
            return Outcome("no seed has all three rows", "–", None)
        return Outcome(f"`{self.row}` {ev.stat(self.row, 'acc_eval_mode').describe('pct')}; share of "
                       f"{ROWS[self.lost].short}'s loss against {ROWS[self.reference].short} recovered, per seed: "
                       f"{s.share.describe('plain')}", self.tolerance_words(), s.passed, figures=s.figures())


class DeclaredRows:
    """For a kind of claim that declares its ``rows`` and its ``published`` text as fields."""

    def rows_needed(self) -> tuple[str, ...]:
        return self.rows

    def published_text(self) -> str:
        return self.published


@dataclass(frozen=True)
class Bespoke(DeclaredRows, Claim):
    """A check of its own: ``evaluate`` weighs the evidence (it runs only when every row of ``rows`` has
    runs) and gives the :class:`Outcome`, text and verdict together. Declared with :func:`bespoke`."""

    name: str
    claim: str
    published: str
    evaluate: Callable[[Evidence], Outcome]
    rows: tuple[str, ...] = ()
    section: str = ARTICLE
    exploratory: bool = False

    def outcome(self, ev: Evidence) -> Outcome:
        return self.evaluate(ev)


def bespoke(claim: str, published: str, rows: tuple[str, ...] = (), *, section: str = ARTICLE,
            exploratory: bool = False) -> Callable[[Callable], Bespoke]:
    """Decorator: the function becomes a :class:`Bespoke` claim named after it, ready for the registry
    (``section`` and ``exploratory``: see :class:`Claim`)."""
    def declare(evaluate: Callable[[Evidence], Outcome]) -> Bespoke:
        return Bespoke(evaluate.__name__, claim, published, evaluate, tuple(rows), section, exploratory)
    return declare


@dataclass(frozen=True)
class Ordering(DeclaredRows, Claim):
    """Spearman's ρ between ``column`` and evaluation-mode accuracy over the row means of ``rows`` (every one
    needed): accuracy must fall in the column's order, ρ at or below minus the exact one-sided :data:`ALPHA`
    critical value for that many rows (:func:`..stats.spearman_critical`, :class:`Rank`). ``published`` says what
    the article has to compare (it ran one network)."""

    name: str
    claim: str
    rows: tuple[str, ...]
    column: str
    published: str
    section: str = RESNET
    exploratory: bool = False

    def means(self, ev: Evidence):
        runs = ev.per_run[ev.per_run["row"].isin(self.rows)]
        return runs.groupby("row")[[self.column, "acc_eval_mode"]].mean().reindex(list(self.rows))

    def judge(self, ev: Evidence) -> Rank:
        runs = ev.per_run[ev.per_run["row"].isin(self.rows)]
        means = self.means(ev)
        per_seed = tuple(spearman_rho(g.set_index("row").loc[list(self.rows), self.column],
                                      g.set_index("row").loc[list(self.rows), "acc_eval_mode"])
                         for _, g in runs.groupby("seed") if set(self.rows) <= set(g["row"]))
        return Rank(spearman_rho(means[self.column], means["acc_eval_mode"]), len(self.rows), True, per_seed,
                    min_rows=3)

    def words(self, ev: Evidence, r: Rank) -> Outcome:
        means = self.means(ev)
        orders = math.factorial(r.n_rows)
        seeds = f"; per seed {', '.join(cell(x, 'rho') for x in r.per_seed)}" if r.per_seed else ""
        order = " > ".join(f"`{row}` {cell(means.loc[row, 'acc_eval_mode'], 'pct')}"
                           for row in means.sort_values("acc_eval_mode", ascending=False).index)
        return Outcome(f"rho = {cell(r.rho, 'rho')} over the row means of {r.n_rows} rows{seeds}; by accuracy: "
                       f"{order}",
                       f"rho ≤ −{r.critical:.2f}, the exact one-sided {cell(ALPHA, 'pct', digits=0)} critical value "
                       f"for {r.n_rows} rows" + (f" (only the perfect order: 1 of {orders} orders, "
                                                 f"{cell(1 / orders, 'pct')} under chance)" if r.critical >= 1 else ""),
                       r.passed, figures=r.figures())


@dataclass(frozen=True)
class Beside:
    """:class:`RecoveryShareBeside`'s numbers: whether ``lost`` loses anything against ``reference`` at all
    (``loses``, a :class:`Gap`), the share recovered on this network (``share``) and the study's network's
    (``study``, shown, not judged). No verdict when nothing is lost."""

    loses: Gap
    share: Share
    study: SeedStat

    @property
    def passed(self) -> bool | None:
        return self.share.passed if self.loses.passed else None

    def figures(self) -> dict[str, float]:
        return {**self.loses.figures(), **self.share.figures(), "study_share_mean": self.study.mean}


@dataclass(frozen=True)
class RecoveryShareBeside(RecoveryShare):
    """:class:`RecoveryShare` for ``row``, ``lost`` and ``reference`` of another network, with the same rule
    ("most": above half, and above 0 by 2 standard errors, paired by seed), and beside it the study's
    network's share for the rows ``beside`` (row, lost, reference): the article's figure as published, and the
    share its runs measure where present (no verdict on that). No verdict when ``lost`` loses nothing against
    ``reference`` (not below it by more than 2 standard errors): there is nothing to recover (:class:`Beside`)."""

    beside: tuple[str, str, str] = ()
    section: str = RESNET
    exploratory: bool = False

    def published_text(self) -> str:
        return f"beyond the article (it ran one network); its network: {RecoveryShare.published_text(self._study())}"

    def _study(self) -> RecoveryShare:
        row, lost, reference = self.beside
        return RecoveryShare(self.name, self.claim, row, lost, reference)

    def judge(self, ev: Evidence) -> Beside:
        loses = Gap(ev.stat(self.reference, "acc_eval_mode"), ev.stat(self.lost, "acc_eval_mode"))
        return Beside(loses, super().judge(ev), recovery_share(ev, *self.beside))

    def words(self, ev: Evidence, b: Beside) -> Outcome:
        lost_stat, ref_stat, share, study = b.loses.lower, b.loses.upper, b.share.share, b.study
        how = b.loses.words()
        row, lost, reference = self.beside
        beside = (f"The study's network measured here: `{row}` recovers {study.describe('plain')} of "
                  f"`{lost}`'s loss against `{reference}` (no verdict on it: the rule was fixed after those runs "
                  "existed)." if study.n else "")
        if not b.loses.passed:
            return Outcome(f"`{self.lost}` {lost_stat.describe('pct')}, `{self.reference}` "
                           f"{ref_stat.describe('pct')}: nothing lost to recover ({how})",
                           f"needs `{self.lost}` below `{self.reference}` by more than {Z:g} standard errors", None,
                           beside, b.figures(), unmet=True)
        measured, tolerance = "no seed has all three rows", "–"
        if share.n:  # the rows by name: they share their optimizer's short name across networks
            measured = (f"`{self.row}` {ev.stat(self.row, 'acc_eval_mode').describe('pct')}, `{self.lost}` "
                        f"{lost_stat.describe('pct')}, `{self.reference}` {ref_stat.describe('pct')}; share of "
                        f"`{self.lost}`'s loss against `{self.reference}` recovered, per seed: "
                        f"{share.describe('plain')}")
            tolerance = (f"{self.tolerance_words()}; run only where `{self.lost}` is below `{self.reference}` by "
                         f"more than {Z:g} standard errors: {how}")
        se = se_of_difference(share, study)
        diff = (f" This network's share minus the study's: {share.mean - study.mean:+.2f}"
                + (f" ({Z:g} standard errors of the difference: {Z * se:.2f})." if not math.isnan(se) else ".")
                if study.n and share.n else "")
        return Outcome(measured, tolerance, b.passed, (beside + diff).strip(), b.figures())


def withhold_verdicts(checks: list[Check]) -> None:
    """Below the article's scale a verdict against its figures means nothing: every PASS, FAIL or
    :data:`PRECONDITION_FAILED` becomes :data:`NOT_JUDGED` ("not judged at this scale"), the verdict it would have
    had kept in the check's note."""
    for c in checks:
        if c.verdict in (PASS, FAIL, PRECONDITION_FAILED):
            c.note = (c.note + " " if c.note else "") + (f"Not at the article's scale: no verdict (at this scale "
                                                         f"it would read {c.verdict}).")
            c.verdict = NOT_JUDGED
