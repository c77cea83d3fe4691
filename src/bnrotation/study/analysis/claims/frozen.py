"""The frozen-backbone claim (no torch): its test on the runs (:func:`judge`) and its entry in the registry
(:data:`CHECKS`); :mod:`.frozen_report` writes ``frozen.md``, the runs' table with the verdict under it.

Beyond the article (:mod:`bnrotation.study.frozen`), fixed before its runs. The runs live under ``<root>/frozen/``
(:data:`bnrotation.study.rows.FROZEN_ROOT`): ``norm_eval``'s statistics exactly still (no evaluation-mode pass
writes a buffer: tolerance 0); ``bn_train``'s displacement from the pre-trained statistics at least the monitor's
lag threshold (:data:`DISPLACEMENT_FLOOR_SIGMA`) after subtracting :data:`.kinds.Z` standard errors over seeds; the
original task's evaluation-mode accuracy down by at least :data:`DROP_FLOOR` and by more than :data:`.kinds.Z`
standard errors over seeds (paired within each run: same weights, same held-out set). ``claims.md`` lists it in a
section of its own, after the ResNet-20 checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...rows import FROZEN_ROOT
from ..formatting import cell
from ..results import Run
from ..tables.frozen import load_frozen_runs, per_run, seed_stat
from .evidence import Evidence
from .kinds import FROZEN, Z, Outcome, bespoke

__all__ = ["DISPLACEMENT_FLOOR_SIGMA", "DROP_FLOOR", "FrozenVerdict", "judge", "CHECKS"]

# The claim's floors, fixed before the runs (Z, the standard errors a difference must exceed, is every claim's):
DISPLACEMENT_FLOOR_SIGMA = 0.1  # σ: the monitor's default lag threshold (monitor.Thresholds.lag_sigma)
DROP_FLOOR = 0.01  # "degrades": at least 1 point of evaluation-mode accuracy on the original task


@dataclass
class FrozenVerdict:
    """The claim's test on the runs (:func:`judge`): ``passed`` (None: too few runs to judge), the measured
    figures and the tolerance, in words."""

    passed: bool | None
    measured: str
    tolerance: str
    note: str = ""


def judge(runs: list[Run], problems: tuple[str, ...] | list[str] = ()) -> FrozenVerdict:
    """The frozen-backbone claim: freezing a layer does not freeze its BatchNorm, and evaluation on the
    original task degrades when the statistics follow the new data. PASS when all of these hold:

    1. ``norm_eval``: every running statistic stays the pre-trained one exactly (displacement 0 at every log
       point of every run: no forward pass in evaluation mode writes a buffer), and so does its original-task
       accuracy;
    2. ``bn_train``: the mean displacement over seeds minus :data:`.kinds.Z` standard errors is at least
       :data:`DISPLACEMENT_FLOOR_SIGMA` (the monitor's lag threshold: a move the suite counts as stale);
    3. ``bn_train``: the original task's evaluation-mode accuracy drops from step 0 to the end by at least
       :data:`DROP_FLOOR` and by more than :data:`.kinds.Z` standard errors over seeds (the drop is paired within a
       run: the same held-out set, the same weights).

    Every run asserted its backbone unchanged at each log point (``run.json``: ``backbone_unchanged``); one that
    did not is a FAIL. Fewer than two seeds of ``bn_train`` or of ``norm_eval``: no verdict (None).
    """
    train, evalm = "frozen_bn_train", "frozen_norm_eval"
    frame = per_run(runs)
    have = {row: sorted(frame.loc[frame["row"] == row, "seed"]) if len(frame) else [] for row in (train, evalm)}
    tolerance = (f"norm_eval: displacement exactly 0σ and original-task accuracy unchanged; bn_train: mean "
                 f"displacement − {Z:g} SE ≥ {cell(DISPLACEMENT_FLOOR_SIGMA, 'sigma')} (the monitor's lag "
                 f"threshold) and original-task drop ≥ {cell(DROP_FLOOR, 'pct', digits=0)} and > {Z:g} SE over seeds")
    note = ("; ".join(problems) + ". ") if problems else ""
    if any(len(s) < 2 for s in have.values()):
        return FrozenVerdict(None, f"runs: {have[train]} seeds of `{train}`, {have[evalm]} of `{evalm}`", tolerance,
                             note + "Fewer than two seeds of a row: no spread, no verdict.")
    disp, drop = seed_stat(frame, train, "displacement_sigma"), seed_stat(frame, train, "acc_original_drop")
    still = frame[frame["row"] == evalm]
    eval_max_disp = float(still["max_displacement_sigma"].max())
    eval_drop = float(still["acc_original_drop"].abs().max())
    unchanged = all(r.info.get("backbone_unchanged") is True for r in runs)
    moves = disp.mean - Z * disp.se >= DISPLACEMENT_FLOOR_SIGMA
    degrades = drop.mean >= DROP_FLOOR and drop.mean - Z * drop.se > 0
    stays = eval_max_disp == 0.0 and eval_drop == 0.0
    measured = (f"bn_train: displacement {disp.describe('sigma')}, original-task accuracy drop "
                f"{drop.describe('pct')}; norm_eval: largest displacement {cell(eval_max_disp, 'sigma')}, largest "
                f"accuracy change {cell(eval_drop, 'pct')}; backbone unchanged in every run: {unchanged}")
    failed = [what for what, ok in (("norm_eval statistics moved", stays), ("bn_train statistics did not move "
              "enough", moves), ("original task did not degrade enough", degrades), ("a backbone moved", unchanged))
              if not ok]
    if failed:
        note += "Fails on: " + "; ".join(failed) + "."
    return FrozenVerdict(bool(stays and moves and degrades and unchanged), measured, tolerance, note.strip())


@bespoke("Freezing a layer does not freeze its BatchNorm: with every backbone parameter frozen and BatchNorm left in "
         "training mode while a new head is fine-tuned on noisier data, the running statistics follow the new data "
         "though no weight moves, and evaluation-mode accuracy on the original task degrades; with BatchNorm in "
         "evaluation mode (norm_eval) they stay the pre-trained ones.",
         "beyond the article; pytorch/pytorch#86590, Lightning-AI/pytorch-lightning#15062, lightly-ai/lightly#1438",
         section=FROZEN)
def frozen_backbone_batchnorm_follows_new_data(ev: Evidence) -> Outcome:
    root = ev.root / FROZEN_ROOT
    runs, problems = load_frozen_runs(root) if (root / "runs").is_dir() else ([], [])
    verdict = judge(runs, problems)
    where = f"Runs under `{root}` (`python -m bnrotation.study.analysis.claims.frozen_report --results {root}`)."
    return Outcome(verdict.measured, verdict.tolerance, verdict.passed, f"{where} {verdict.note}".strip())


CHECKS = (frozen_backbone_batchnorm_follows_new_data,)
