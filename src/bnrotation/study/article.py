"""The article's figures outside its table, typed once (no torch: the analysis imports this module).

Pradeep (2026), *Batch norm's running statistics describe a network that has
already moved*; the numbers are those of ``docs/PROTOCOL.md`` ("Measured
quantities", "Diagnosis and fixes"). The figures of the article's table, row by
row, are :class:`bnrotation.study.rows.Published`; every report and figure reads the
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

# Per row, from the article's text (middle layer = conv2 → bn2; cosines of the last conv layer, conv3):
MIDDLE_DRIFT = {"adam": Figure(0.0074, 4), "sgd": Figure(0.0010, 4)}  # median drift of the fresh means, σ/step
PREDICTED_LAG = {"adam": Figure(0.24, 2), "sgd": Figure(0.03, 2)}  # median drift · (1 − m) / m, σ
UPDATE_COSINE = {"adam": Figure(0.04, 2), "sgd": Figure(0.005, 3)}  # cos(update, w), mean over the window
ABS_MEAN_OVER_STD = {"adam": Figure(1.7, 1)}  # median |fresh mean| / fresh std of the middle layer's channels

# About checks and interventions rather than a row mean:
TRAINING_MODE = Figure(1.00, 2)  # training-mode accuracy at every check, every run (100%)
GRADIENT_COSINE = Figure(0.0, 4)  # |cos(∇L, w)| of a conv weight behind BatchNorm: "0.0000"
LOWEST_CHECK = Figure(0.10, 2)  # lowest evaluation-mode check under Adam: 10%, chance for ten classes
STALE_CHANNEL = Figure(2.0, 0)  # |lag| of the worst middle-layer channel at one failing Adam checkpoint, σ
REESTIMATED = Figure(1.00, 2)  # accuracy of every final checkpoint after re-estimation (100%)
MIDDLE_LIFT = (Figure(0.82, 2), Figure(1.00, 2))  # failing checks with fresh bn2 statistics alone: 82–100%
# "re-running the same code later gave Adam at 3e-3 an average of 66% instead of 60.0%" (What I still don't
# know): a second draw of the Adam row's mean evaluation-mode accuracy (the article's table averages 3 seeds).
ADAM_RERUN_ACC_EVAL = Figure(0.66, 2)
