"""The one formatter of numbers in every report: :func:`cell` (a value, optionally with its spread and n) and
:func:`spread` (a spread, tolerance or difference alone), both driven by one table of units, :data:`UNITS`;
:func:`seed_ranges` (seeds as ranges), :func:`schema_versions` (the runs' schema versions, for a header) and
:func:`decimals_shown` (no torch).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Unit:
    """How a number of one unit is printed: ``scale`` multiplies it first (100 for a fraction shown in %);
    ``value`` and ``spread_format`` are format specs for a value and for a spread (an sd, a tolerance, a
    difference); ``sign`` and ``spread_sign`` follow them."""

    scale: float
    value: str
    spread_format: str
    sign: str
    spread_sign: str

    def spec(self, digits: int | None, spread: bool = False) -> str:
        """The format spec, with ``digits`` fixed decimals (in the printed unit) if given."""
        spec = self.spread_format if spread else self.value
        return spec if digits is None else ("+" if spec.startswith("+") else "") + f".{digits}f"


UNITS = {
    "pct": Unit(100.0, ".1f", ".1f", "%", " points"),  # a fraction 0..1, printed in % (spreads in points)
    "deg": Unit(1.0, ".2f", ".2f", "°", "°"),  # degrees
    "x": Unit(1.0, ".2f", ".2f", "×", "×"),  # a ratio
    "sigma": Unit(1.0, ".3g", ".2g", "σ", "σ"),  # standard deviations of a channel's fresh statistics
    "cos": Unit(1.0, "+.4f", ".4f", "", ""),  # a cosine, signed
    "rho": Unit(1.0, "+.2f", ".2g", "", ""),  # a rank correlation, signed
    "drift": Unit(1.0, ".2g", ".2g", "σ/step", "σ/step"),  # σ per step
    "plain": Unit(1.0, ".3g", ".2g", "", ""),  # anything else: three significant digits
}


def _missing(value) -> bool:
    return value is None or (isinstance(value, numbers.Real) and math.isnan(value))


def spread(sd: float, unit: str = "plain", *, digits: int | None = None, sign: bool = True) -> str:
    """A spread, tolerance or difference alone, in ``unit`` (:data:`UNITS`): ``'12.2 points'``, ``'0.04×'``;
    ``''`` for NaN. ``digits`` fixes the decimals; ``sign=False`` leaves the unit sign off."""
    if _missing(sd):
        return ""
    u = UNITS[unit]
    return f"{sd * u.scale:{u.spec(digits, spread=True)}}" + (u.spread_sign if sign else "")


def cell(value: float, unit: str = "plain", sd: float | None = None, *, n: int | None = None,
         digits: int | None = None, spread_digits: int | None = None, sign: bool = True,
         spread_sign: bool = True) -> str:
    """One number of a report in ``unit`` (:data:`UNITS`), with its spread and n when given.

    ``cell(0.704, "pct")`` is ``'70.4%'``; ``cell(0.704, "pct", 0.122, n=3)`` is
    ``'70.4% ± 12.2 points (n = 3 seeds)'``; ``cell(6.49, "deg", 1.21, spread_sign=False)`` is
    ``'6.49° ± 1.21'``. A missing value (None or NaN) is ``'–'``, a missing spread is left out.
    ``digits`` fixes the value's decimals in the printed unit (``digits=0``: ``'70%'``), ``spread_digits``
    the spread's (default: ``digits``); ``sign`` and ``spread_sign`` keep or drop the unit signs.
    """
    if _missing(value):
        return "–"
    u = UNITS[unit]
    text = f"{value * u.scale:{u.spec(digits)}}" + (u.sign if sign else "")
    if not _missing(sd):
        text += " ± " + spread(sd, unit, digits=digits if spread_digits is None else spread_digits,
                               sign=spread_sign)
    if n is not None:
        text += f" (n = {n} seed{'s' * (n != 1)})"
    return text


def listed(words: list[str]) -> str:
    """``words`` as a list in prose: ``'a'``, ``'a and b'``, ``'a, b and c'``.

    Raises:
        IndexError: no words.
    """
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def seed_ranges(seeds: Iterable[int]) -> str:
    """Seeds as a reader scans them: three or more consecutive seeds as a range, ``'0–9'``, ``'0–2, 5, 7, 8'``;
    ``'–'`` for none."""
    seeds = sorted({int(s) for s in seeds})
    runs: list[list[int]] = []
    for s in seeds:
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    parts = [f"{r[0]}–{r[-1]}" if len(r) >= 3 else ", ".join(map(str, r)) for r in runs]
    return ", ".join(parts) if parts else "–"


def schema_versions(versions: Iterable[int | str]) -> str:
    """The schema versions some runs were written with (each ``run.json``'s ``schema_version``), for a report's
    header: ``'schema version 1'``, ``'schema versions 1 and 2'`` for runs of several read together,
    ``'schema version ?'`` for none (None, a run not read from a folder, is skipped). A report prints its runs' versions, not the suite's
    (:data:`bnrotation.records.SCHEMA_VERSION`): the reader reads every older schema (:func:`.results.read_table`),
    and a report says what its runs hold."""
    found = sorted({int(v) for v in versions if v is not None})
    if len(found) <= 1:
        return f"schema version {found[0] if found else '?'}"
    return f"schema versions {', '.join(map(str, found[:-1]))} and {found[-1]}"


def decimals_shown(decimals: int, unit: str) -> int:
    """Decimals of a figure in its printed unit, given its decimals as stored (``0.306`` with 3 decimals is
    ``30.6%``, 1 decimal in %)."""
    return max(decimals - round(math.log10(UNITS[unit].scale)), 0)
