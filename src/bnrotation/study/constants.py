"""The study's shared constants: the numbers both its training code (the runner, the zoo) and its torch-free
analysis read, kept below both so that no arrow runs from the training code up into the analysis (no torch here).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["STALE_RECOVERY", "SecondZoo", "SECOND_ZOO"]

# The truth's X, fixed before any data (issue 38): at an intervention point, the statistics are stale when
# re-estimating them on training data recovers at least this much held-out evaluation-mode accuracy (a fraction:
# 5 points). The calibration scores every signal against it; the zoo records its verdict with it.
STALE_RECOVERY = 0.05


@dataclass(frozen=True)
class SecondZoo:
    """The second zoo (issue 48): the rule, its thresholds, the scoring, the forecasters and their claims were
    committed before its first run, so that it scores them on data none of them was chosen on. Eight timm BatchNorm
    architectures not in the first zoo's (:data:`bnrotation.study.zoo.ARCHS`) (other families, or other members of one), new seeds, and runs four times
    as long as the first zoo's, so that staleness may arrive late. The costliest first."""

    archs: tuple[str, ...] = ("resnet14t", "repvgg_a0", "mnasnet_small", "regnetx_004", "semnasnet_050",
                              "regnety_002", "tinynet_e", "mobilenetv2_050")
    seeds: tuple[int, ...] = (10, 11, 12)
    steps: int = 4800
    check_every: int = 200  # 25 checks a run
    optimizers: int = 2  # sgd and adam (bnrotation.study.zoo.OPTIMIZERS)

    @property
    def runs(self) -> int:
        """The runs of the whole second zoo: architectures x optimizers x seeds."""
        return len(self.archs) * self.optimizers * len(self.seeds)


SECOND_ZOO = SecondZoo()
