"""The study's shared constants: the numbers both its training code (the runner, the zoo) and its torch-free
analysis read, kept below both so that no arrow runs from the training code up into the analysis (no torch here).
"""

from __future__ import annotations

__all__ = ["STALE_RECOVERY"]

# The truth's X, fixed before any data (issue 38): at an intervention point, the statistics are stale when
# re-estimating them on training data recovers at least this much held-out evaluation-mode accuracy (a fraction:
# 5 points). The calibration scores every signal against it; the zoo records its verdict with it.
STALE_RECOVERY = 0.05
