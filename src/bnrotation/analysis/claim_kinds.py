"""The kinds of claim ``make claims`` checks, and the verdict each gives (no torch).

A claim is declared once, in :data:`.registry.CLAIMS`, as one of these small
frozen dataclasses; :meth:`Claim.check` weighs it against the evidence
(:class:`.evidence.Evidence`) and returns a :class:`Check`: the published
figure, the measured one (mean ± sample standard deviation over seeds, with n),
the tolerance and why, and a verdict, PASS, FAIL, or NOT RUN when the runs it
needs are missing.

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
  value for that many rows (:func:`.stats.spearman_critical`).
- :class:`RecoveryShare`: the share of the accuracy one row loses against
  another that a third wins back, paired by seed; "most" is more than half.
- :class:`Bespoke`: any other check, a function registered with
  :func:`bespoke`.
- :class:`Ordering`: a Spearman rank correlation with evaluation-mode accuracy
  across named rows of another network (the ResNet-20 rows), every one needed.
- :class:`RecoveryShareBeside`: :class:`RecoveryShare` on another network's
  rows, with the study's share beside it.

Every claim belongs to a section of ``claims.md`` (``section``: :data:`ARTICLE`,
the article's claims, :data:`RESNET`, "Does it carry over? ResNet-20", or
:data:`FROZEN`, "Beyond the article: a frozen backbone").
An *exploratory* claim (``exploratory=True``) measures without a tolerance fixed
in advance: it gives MEASURED, never PASS or FAIL (NOT RUN when its runs are
missing).

The article's figures come from :mod:`bnrotation.rows` (its table) and
:mod:`bnrotation.article` (its text), through :func:`published`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .. import article
from ..article import Figure
from ..rows import PUBLISHED_DECIMALS, PUBLISHED_ROWS, PUBLISHED_SEEDS, ROWS
from .evidence import Evidence, recovery_share
from .stats import (SeedStat, cell, decimals_shown, half_unit, rho_at_or_beyond, se_of_difference, seed_ranges,
                    spearman_critical, spearman_rho, spread)
from .table import COLUMNS as TABLE_COLUMNS

PASS, FAIL, NOT_RUN = "PASS", "FAIL", "NOT RUN"
NOT_JUDGED = "not judged at this scale"  # runs below the article's scale: measured, weighed against nothing
MEASURED = "MEASURED"  # the verdict of an exploratory claim with runs: measured, no PASS or FAIL
ARTICLE, RESNET, FROZEN = "article", "resnet", "frozen"  # the sections of claims.md a claim belongs to
Z = 2.0  # standard errors a difference must exceed
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
    section: str = ARTICLE  # ARTICLE or RESNET: where claims.md lists it
    exploratory: bool = False  # measured without a tolerance fixed in advance: MEASURED, never PASS or FAIL


@dataclass(frozen=True)
class Outcome:
    """What a claim's evidence says: the measured figure, the tolerance and why, ``passed`` (None: no
    verdict, NOT RUN) and a note."""

    measured: str
    tolerance: str
    passed: bool | None
    note: str = ""


class Claim:
    """What every kind of claim has: ``name``, ``claim`` (the article's statement), the rows it needs, the
    published figure as text, and :meth:`outcome`; ``section`` (:data:`ARTICLE` unless a kind says otherwise)
    and ``exploratory``. :meth:`check` gives NOT RUN when a needed row has no run."""

    name: str
    claim: str
    section: str = ARTICLE
    exploratory: bool = False

    def rows_needed(self) -> tuple[str, ...]:
        return ()

    def published_text(self) -> str:
        raise NotImplementedError

    def outcome(self, ev: Evidence) -> Outcome:
        raise NotImplementedError

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
        return Check(self.name, self.claim, published_text, o.measured, o.tolerance, verdict, o.note,
                     section=self.section, exploratory=self.exploratory)


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
    tol = match_tolerance(s, figure)
    return None if math.isnan(tol) else abs(s.mean - figure.value) <= tol


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

    def outcome(self, ev: Evidence) -> Outcome:
        s, fig = ev.stat(self.row, self.column), self.figure()
        note = self.note(ev, self) if self.note else ""
        if s.n < 2:
            return Outcome(s.describe(self.unit), "needs ≥ 2 seeds: with one there is no seed spread to set the "
                           "tolerance", None, note)
        floor = half_unit(fig.decimals)
        tol = match_tolerance(s, fig)
        off = abs(s.mean - fig.value)
        return Outcome(s.describe(self.unit),
                       f"|measured − published| ≤ {spread(tol, self.unit)} = max({Z:g} · s · √(1/{s.n} + "
                       f"1/{PUBLISHED_SEEDS}), {spread(floor, self.unit)} rounding); off by {spread(off, self.unit)}",
                       off <= tol, note)


def above(a: SeedStat, b: SeedStat) -> tuple[bool, str]:
    """Whether a's mean exceeds b's by more than :data:`Z` standard errors of the difference
    (:func:`.stats.se_of_difference`); with one seed on a side, whether it exceeds it at all. Also the
    sentence that says so."""
    diff = a.mean - b.mean
    se = se_of_difference(a, b)
    if not math.isnan(se):
        return diff > Z * se, f"difference {diff:+.3g} against {Z:g} · SE = {Z * se:.3g}"
    return diff > 0, f"difference {diff:+.3g}; one seed on a side, so the sign alone (no spread)"


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

    def outcome(self, ev: Evidence) -> Outcome:
        lower, upper = self.lower_upper()
        lo, hi = ev.stat(lower, self.column), ev.stat(upper, self.column)
        ok, how = above(hi, lo)
        return Outcome(f"`{lower}` {lo.describe(self.unit)}; `{upper}` {hi.describe(self.unit)}",
                       f"`{lower}` below `{upper}` by more than {Z:g} standard errors of the difference: {how}", ok)


@dataclass(frozen=True)
class Above(Below):
    """``row``'s mean of ``column`` lies above ``than``'s by more than 2 standard errors of the difference."""

    def lower_upper(self) -> tuple[str, str]:
        return self.than, self.row


@dataclass(frozen=True)
class RankOrder(Claim):
    """Spearman's ρ between ``column`` and evaluation-mode accuracy over the article's rows that have runs:
    with ``orders`` the accuracy must fall in the column's order (ρ at or below minus the exact one-sided
    critical value), without it it must not. Published: ρ over the article's own figures."""

    name: str
    claim: str
    column: str
    orders: bool

    def published_text(self) -> str:
        x = [table_figure(r, self.column).value for r in PUBLISHED_ROWS]
        acc = [table_figure(r, "acc_eval_mode").value for r in PUBLISHED_ROWS]
        return f"rho = {cell(spearman_rho(x, acc), 'rho')} over the six rows of the article's table"

    def outcome(self, ev: Evidence) -> Outcome:
        rows = [r for r in PUBLISHED_ROWS if ev.has(r)]
        if len(rows) < MIN_RANK_ROWS:
            return Outcome(f"{len(rows)} of the six rows have runs", f"needs ≥ {MIN_RANK_ROWS} of the six rows", None)
        runs = ev.per_run[ev.per_run["row"].isin(rows)]
        means = runs.groupby("row")[[self.column, "acc_eval_mode"]].mean()
        rho = spearman_rho(means[self.column], means["acc_eval_mode"])
        full = {seed: g for seed, g in runs.groupby("seed") if g["row"].nunique() == len(rows)}
        per_seed = [spearman_rho(g[self.column], g["acc_eval_mode"]) for g in full.values()]
        crit = spearman_critical(len(rows), ALPHA)
        seeds = (f"; per seed {', '.join(cell(r, 'rho') for r in per_seed)} (seeds {seed_ranges(full)}, those all "
                 f"{len(rows)} rows ran)" if per_seed else "")
        measured = f"rho = {cell(rho, 'rho')} over row means of {len(rows)} rows ({ev.seeds_per_row(rows)}){seeds}"
        ordered = rho_at_or_beyond(rho, -crit)
        level = cell(ALPHA, "pct", digits=0)
        if self.orders:
            tol = f"rho ≤ −{crit:.2f}, the exact one-sided {level} critical value for {len(rows)} rows"
        else:
            tol = (f"rho > −{crit:.2f}: no ordering significant at the one-sided {level} level for {len(rows)} rows "
                   "(the exact critical value)")
        note = "" if len(rows) == len(PUBLISHED_ROWS) else f"only {len(rows)} of the six rows have runs"
        return Outcome(measured, tol, ordered if self.orders else not ordered, note)


@dataclass(frozen=True)
class RecoveryShare(Claim):
    """``row`` wins back most (more than half, and more than 0 by 2 standard errors) of the evaluation-mode
    accuracy ``lost`` gives up against ``reference``, per seed (:func:`.evidence.recovery_share`)."""

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

    def outcome(self, ev: Evidence) -> Outcome:
        share = recovery_share(ev, self.row, self.lost, self.reference)
        if share.n == 0:
            return Outcome("no seed has all three rows", "–", None)
        ok = share.mean > MOST and (share.n < 2 or share.mean - Z * share.se > 0)
        return Outcome(f"`{self.row}` {ev.stat(self.row, 'acc_eval_mode').describe('pct')}; share of "
                       f"{ROWS[self.lost].short}'s loss against {ROWS[self.reference].short} recovered, per seed: "
                       f"{share.describe('plain')}",
                       f"\"most\": the mean share recovered above {cell(MOST, 'pct', digits=0)}, and above 0 by "
                       f"{Z:g} standard errors (paired by seed; one seed: the mean alone)", ok)


class DeclaredRows:
    """For a kind of claim that declares its ``rows`` and its ``published`` text as fields."""

    def rows_needed(self) -> tuple[str, ...]:
        return self.rows

    def published_text(self) -> str:
        return self.published


@dataclass(frozen=True)
class Bespoke(DeclaredRows, Claim):
    """A check of its own: ``evaluate`` weighs the evidence (it runs only when every row of ``rows`` has
    runs). Declared with :func:`bespoke`."""

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
    critical value for that many rows (:func:`.stats.spearman_critical`). ``published`` says what the article
    has to compare (it ran one network)."""

    name: str
    claim: str
    rows: tuple[str, ...]
    column: str
    published: str
    section: str = RESNET
    exploratory: bool = False

    def outcome(self, ev: Evidence) -> Outcome:
        runs = ev.per_run[ev.per_run["row"].isin(self.rows)]
        means = runs.groupby("row")[[self.column, "acc_eval_mode"]].mean().reindex(list(self.rows))
        rho = spearman_rho(means[self.column], means["acc_eval_mode"])
        per_seed = [spearman_rho(g.set_index("row").loc[list(self.rows), self.column],
                                 g.set_index("row").loc[list(self.rows), "acc_eval_mode"])
                    for _, g in runs.groupby("seed") if set(self.rows) <= set(g["row"])]
        n = len(self.rows)
        crit = spearman_critical(n, ALPHA)
        orders = math.factorial(n)
        seeds = f"; per seed {', '.join(cell(r, 'rho') for r in per_seed)}" if per_seed else ""
        order = " > ".join(f"`{r}` {cell(means.loc[r, 'acc_eval_mode'], 'pct')}"
                           for r in means.sort_values("acc_eval_mode", ascending=False).index)
        return Outcome(f"rho = {cell(rho, 'rho')} over the row means of {n} rows{seeds}; by accuracy: {order}",
                       f"rho ≤ −{crit:.2f}, the exact one-sided {cell(ALPHA, 'pct', digits=0)} critical value for "
                       f"{n} rows" + (f" (only the perfect order: 1 of {orders} orders, "
                                      f"{cell(1 / orders, 'pct')} under chance)" if crit >= 1 else ""),
                       rho_at_or_beyond(rho, -crit))


@dataclass(frozen=True)
class RecoveryShareBeside(RecoveryShare):
    """:class:`RecoveryShare` for ``row``, ``lost`` and ``reference`` of another network, with the same rule
    ("most": above half, and above 0 by 2 standard errors, paired by seed), and beside it the study's
    network's share for the rows ``beside`` (row, lost, reference): the article's figure as published, and the
    share its runs measure where present (no verdict on that). No verdict when ``lost`` loses nothing against
    ``reference`` (not below it by more than 2 standard errors): there is nothing to recover."""

    beside: tuple[str, str, str] = ()
    section: str = RESNET
    exploratory: bool = False

    def published_text(self) -> str:
        return f"beyond the article (it ran one network); its network: {RecoveryShare.published_text(self._study())}"

    def _study(self) -> RecoveryShare:
        row, lost, reference = self.beside
        return RecoveryShare(self.name, self.claim, row, lost, reference)

    def outcome(self, ev: Evidence) -> Outcome:
        lost_stat, ref_stat = ev.stat(self.lost, "acc_eval_mode"), ev.stat(self.reference, "acc_eval_mode")
        loses, how = above(ref_stat, lost_stat)
        row, lost, reference = self.beside
        study = recovery_share(ev, row, lost, reference)
        beside = (f"The study's network measured here: `{row}` recovers {study.describe('plain')} of "
                  f"`{lost}`'s loss against `{reference}` (no verdict on it: the rule was fixed after those runs "
                  "existed)." if study.n else "")
        if not loses:
            return Outcome(f"`{self.lost}` {lost_stat.describe('pct')}, `{self.reference}` "
                           f"{ref_stat.describe('pct')}: nothing lost to recover ({how})",
                           f"needs `{self.lost}` below `{self.reference}` by more than {Z:g} standard errors", None,
                           beside)
        o = super().outcome(ev)
        share = recovery_share(ev, self.row, self.lost, self.reference)
        if share.n:  # the rows by name: they share their optimizer's short name across networks
            o = Outcome(f"`{self.row}` {ev.stat(self.row, 'acc_eval_mode').describe('pct')}, `{self.lost}` "
                        f"{lost_stat.describe('pct')}, `{self.reference}` {ref_stat.describe('pct')}; share of "
                        f"`{self.lost}`'s loss against `{self.reference}` recovered, per seed: "
                        f"{share.describe('plain')}",
                        f"{o.tolerance}; run only where `{self.lost}` is below `{self.reference}` by more than "
                        f"{Z:g} standard errors: {how}", o.passed)
        se = se_of_difference(share, study)
        diff = (f" This network's share minus the study's: {share.mean - study.mean:+.2f}"
                + (f" ({Z:g} standard errors of the difference: {Z * se:.2f})." if not math.isnan(se) else ".")
                if study.n and share.n else "")
        return Outcome(o.measured, o.tolerance, o.passed, (beside + diff).strip())


def withhold_verdicts(checks: list[Check]) -> None:
    """Below the article's scale a verdict against its figures means nothing: every PASS or FAIL becomes
    :data:`NOT_JUDGED` ("not judged at this scale"), the verdict it would have had kept in the check's note."""
    for c in checks:
        if c.verdict in (PASS, FAIL):
            c.note = (c.note + " " if c.note else "") + (f"Not at the article's scale: no verdict (at this scale "
                                                         f"it would read {c.verdict}).")
            c.verdict = NOT_JUDGED
