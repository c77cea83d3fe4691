"""The article's figures outside its table, typed once (no torch: the analysis imports this module).

Pradeep (2026), *Batch norm's running statistics describe a network that has
already moved*; the numbers are those of ``docs/PROTOCOL.md`` ("Measured
quantities", "Diagnosis and fixes"). The figures of the article's table, row by
row, are :class:`bnrotation.rows.Published`; every report and figure reads the
article's numbers from these two places only.

Each :class:`Figure` keeps the value in the suite's units (fractions 0..1 for
accuracies, σ for standard deviations of a channel's fresh statistics, σ per
step for drift) and the decimals the article prints it with in those units,
which set the rounding tolerance of a comparison (half a unit of the last
digit).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One published number: ``value`` in the suite's unit and the ``decimals`` it is printed with (in that
    unit: 0.82 printed as 82% has 2)."""

    value: float
    decimals: int


# A check fails when its evaluation-mode accuracy is below this fraction: the table's "Checks below 90%",
# and the accuracy a fix must reach to count as recovering (``interventions.smallest_k``).
FAIL_BELOW = 0.90
