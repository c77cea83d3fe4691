"""Where does the collapse live? The condition map's predictions, committed before any map run (issue 49; no torch).

The map (:mod:`bnrotation.study.condition_map`) turns one property of one task at a time towards the other task. For
each knob, the claim below states, *if that property is the cause of Adam's collapse on the templates*, in which
direction Adam's evaluation-mode accuracy moves along the knob: against SGD's (Adam's ``deficit``, SGD's
evaluation-mode accuracy minus Adam's, paired by seed) and against its own training mode (Adam's ``mode_gap``).
Each names the setting where the collapse should be deeper (``deeper``) and the one where it should be shallower
(``shallower``), the two ends of what the map runs; PASS when, at ``deeper``, both Adam's deficit and its mode gap
exceed those at ``shallower`` by more than :data:`.kinds.Z` standard errors of the difference (Welch, over seeds),
else FAIL. A FAIL is a finding: that property, turned alone over that range, does not move the collapse the way its
being the cause would. The runs live under ``<root>/map/`` (:data:`.ROOT`); NOT RUN until both ends have both rows at
every seed the sweep runs (:data:`..rows.SEEDS`), so that a map committed in batches is never judged on the seeds that
happen to be in. A diverged run counts as in; it is left out of every figure, as everywhere in the suite, and the
note names it. ``claims.md`` lists these under "Where does the collapse live? The
condition map" (:data:`.kinds.MAP`), with one more check fixed with them: that the map's shorter protocol still
tells the two tasks apart at their own settings (the templates collapse, Fashion-MNIST does not).

Two of the predictions pull against each other, on purpose: if fresh noise in every batch is the cause, a finite
template set (memorisable) should relieve the collapse; if a loss that flattens on a memorised set is the cause (the
condition the article names), a smaller Fashion-MNIST set should deepen it. At most one of the two can be the
mechanism the map finds.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

from ...condition_map import KNOBS, MAP_STEPS, ROOT, Knob
from ...rows import SEEDS
from ..formatting import spread
from ..results import count
from ..tables import map_report
from .evidence import Evidence
from .kinds import MAP, Z, Bespoke, Gap, Outcome, bespoke

__all__ = ["Prediction", "PREDICTIONS", "CHECKS", "map_points"]


@dataclass(frozen=True)
class Prediction:
    """One knob's prediction: if ``cause`` is what makes Adam collapse, the collapse is deeper at the setting
    ``deeper`` than at ``shallower`` (None: the task's own setting, its reference point); ``why`` gives the
    reasoning."""

    name: str
    knob: str  # condition_map.Knob.name: <task>.<key>
    deeper: float | None
    shallower: float | None
    cause: str
    why: str

    @property
    def turned(self) -> Knob:
        return next(k for k in KNOBS if k.name == self.knob)


PREDICTIONS = (
    Prediction("map_low_snr_deepens_the_collapse", "noisy_templates.template_scale", 0.15, 1.2,
               "the templates' low signal-to-noise ratio",
               "a sample is template_scale · template + unit noise: with less signal the batch statistics of every "
               "layer are more noise, the features that separate the classes a smaller shift against them, so the "
               "same lag of the running statistics costs more accuracy; with more signal the margin swallows it"),
    Prediction("map_a_finite_template_set_relieves_the_collapse", "noisy_templates.train_size", None, 1000,
               "fresh noise in every batch (the templates' infinite training set)",
               "with fresh noise every batch's statistics are a new draw and the loss never settles on the "
               "training samples, so Adam's normalised steps keep the weights turning; 1,000 samples drawn once "
               "(each seen about 380 times in 3,000 steps of 128) are memorised, the gradient vanishes on them and "
               "the same statistics recur: the running averages have a fixed target"),
    Prediction("map_pixel_noise_brings_the_collapse_to_real_images", "fashion_mnist.pixel_noise", 2.0, None,
               "fresh isotropic input noise in every batch",
               "Gaussian pixel noise of twice the pixel standard deviation, fresh at every draw, gives Fashion-MNIST "
               "the templates' isotropic, never-repeating input noise: if that is the cause, Adam's evaluation mode "
               "should fall away from SGD's and from its own training mode as on the templates"),
    Prediction("map_a_small_real_set_deepens_the_collapse", "fashion_mnist.train_size", 1000, None,
               "a loss that flattens on a memorised training set (the condition the article names)",
               "1,000 Fashion-MNIST images are memorised within the run, the loss goes flat, and Adam keeps rotating "
               "the scale-invariant weights at its normalised step size where SGD's steps shrink with the gradient: "
               "the running statistics then lag, as the article describes; all 60,000 images keep a loss to learn"),
    Prediction("map_more_classes_deepen_the_collapse", "noisy_templates.num_classes", 20, 2,
               "the number of classes",
               "with more classes the regions of the last layer's features that each class owns are narrower, so a "
               "given offset of the normalised activations crosses more decision boundaries; with two classes one "
               "boundary must be crossed. Both tasks have 10 classes, so this knob can move the collapse but cannot "
               "tell the two tasks apart"),
)


@functools.lru_cache(maxsize=4)
def _points(root: str, signature: tuple) -> tuple[list, list[str]]:
    runs, problems = map_report.load_map_runs(root)
    return (map_report.per_point(map_report.per_run(runs)) if runs else []), problems


def map_points(ev_root: Path) -> tuple[list, list[str], Path]:
    """The map's points (:func:`..tables.map_report.per_point`) under ``<ev_root>/map/``, the folders refused, and
    that folder; read once per state of its run folders."""
    root = Path(ev_root) / ROOT
    if not (root / "runs").is_dir():
        return [], [], root
    dirs = sorted(root.glob("runs/*/seed=*/DONE"))
    return (*_points(str(root), tuple((str(p), p.stat().st_mtime_ns) for p in dirs)), root)


def _find(points: list, knob: Knob, setting: float | None):
    """The point of ``knob`` at ``setting`` (None: its task's reference point), or None."""
    for p in points:
        if setting is None and p.point.knob is None and p.point.task == knob.task:
            return p
        if setting is not None and p.point.knob == knob.name and math.isclose(p.point.setting, setting):
            return p
    return None


def _setting(knob: Knob, setting: float | None) -> str:
    return f"its own setting ({knob.own})" if setting is None else f"{setting:,g}"


def _short(named: list[tuple[str, object]], after: str = "") -> str | None:
    """What keeps a check from being judged: for each ``(where, point)`` (a point of :func:`map_points` or None)
    without a finished run of both rows at every seed of :data:`..rows.SEEDS` (a diverged run counts as finished:
    :func:`..tables.map_report.seeds_in`), how many seeds it has (``after`` ends the line), or None when none is
    short."""
    have = {where: 0 if p is None else map_report.seeds_in(p) for where, p in named}
    short = [f"{n} of {len(SEEDS)} seeds at {where}" for where, n in have.items() if n < len(SEEDS)]
    return f"runs of both rows: {' and '.join(short)}{after}" if short else None


def _left_out(named: list[tuple[str, object]]) -> str:
    """The note's sentence naming the diverged runs at ``named``'s points (left out of every figure), or ``''``."""
    gone = [f"{', '.join(p.diverged)} at {where}" for where, p in named if p is not None and p.diverged]
    return f" Diverged, and left out: {'; '.join(gone)}." if gone else ""


def _points_words(g: Gap) -> str:
    """A :class:`.kinds.Gap` of fractions in points: ``'+45.6 points against 2 · SE = 2.5 points'``, or the sign
    alone with one seed on a side."""
    if math.isnan(g.se):
        return f"{g.difference * 100:+.1f} points; one seed on a side, so the sign alone (no spread)"
    return f"{g.difference * 100:+.1f} points against {Z:g} · SE = {Z * g.se * 100:.1f} points"


def _shared(p, where: str, deficit_failed: bool) -> str:
    """The note's sentence when both optimizers lose to stale statistics at ``p``
    (:func:`..tables.map_report.stale_for_both`); where the deficit half failed there, it adds that this is no sign
    the property is harmless, only that its effect is not Adam's alone. ``''`` otherwise."""
    if not map_report.stale_for_both(p):
        return ""
    return (f" At {where} both optimizers lose to stale statistics: SGD's mode gap "
            f"{p.sgd['mode_gap'].mean * 100:.1f} points, Adam's {p.adam['mode_gap'].mean * 100:.1f} (the map's "
            "Both stale)" + (", so what the property does there is not Adam's alone." if deficit_failed else "."))


def _judge(pred: Prediction, ev: Evidence) -> Outcome:
    knob = pred.turned
    points, problems, root = map_points(ev.root)
    deep, shallow = _find(points, knob, pred.deeper), _find(points, knob, pred.shallower)
    where = f"Runs under `{root}` (`make map RESULTS={root}`)."
    refused = f" {count(len(problems), 'folder')} refused: " + "; ".join(problems) if problems else ""
    tolerance = (f"at {_setting(knob, pred.deeper)} both Adam's deficit to SGD and Adam's mode gap above those at "
                 f"{_setting(knob, pred.shallower)} by more than {Z:g} standard errors of the difference (fixed "
                 "before the map's runs)")
    ends = [(_setting(knob, s), p) for s, p in ((pred.deeper, deep), (pred.shallower, shallow))]
    missing = _short(ends, f" of `task.{knob.key}` on {knob.task}")
    if missing:
        return Outcome(missing, tolerance, None, where + refused)
    deficit, gap = Gap(deep.deficit, shallow.deficit), Gap(deep.adam["mode_gap"], shallow.adam["mode_gap"])
    measured = "; ".join(
        f"at {_setting(knob, s)}: Adam − SGD {map_report.in_points(map_report.adam_minus_sgd(p), n=True)}, "
        f"Adam's mode gap {map_report.in_points(p.adam['mode_gap'], n=True)}, SGD's "
        f"{map_report.in_points(p.sgd['mode_gap'], n=True)}"
        for s, p in ((pred.deeper, deep), (pred.shallower, shallow)))
    fails = [what for what, g in (("Adam's deficit to SGD", deficit), ("Adam's mode gap", gap)) if not g.passed]
    at_deep, at_shallow = _setting(knob, pred.deeper), _setting(knob, pred.shallower)
    note = (f"If {pred.cause} is the cause: {pred.why}. At {at_deep} minus at {at_shallow}: Adam's deficit to SGD "
            f"(SGD's evaluation-mode accuracy − Adam's, paired by seed) {_points_words(deficit)}; Adam's mode gap "
            f"{_points_words(gap)}."
            + (f" Fails on: {' and '.join(fails)} not deeper at {at_deep}." if fails else "")
            + _shared(deep, at_deep, not deficit.passed) + _left_out(ends))
    return Outcome(measured, tolerance, deficit.passed and gap.passed, f"{note} {where}{refused}",
                   {"deficit_difference": deficit.difference, "mode_gap_difference": gap.difference})


def _claim(pred: Prediction) -> Bespoke:
    knob = pred.turned
    words = (f"If {pred.cause} is the cause of Adam's collapse, then along `task.{knob.key}` on "
             f"{map_report.TASK_WORDS[knob.task]} the collapse is deeper at {_setting(knob, pred.deeper)} than at "
             f"{_setting(knob, pred.shallower)}: Adam's evaluation-mode accuracy lower against SGD's and against its "
             "own training mode.")
    return Bespoke(pred.name, words, "beyond the article: issue 49's map, predicted before its runs",
                   lambda ev: _judge(pred, ev), (), MAP)


@bespoke(f"At the map's protocol (the article's cut at {MAP_STEPS:,} steps), the two tasks keep their own behaviour "
         "at their own settings: Adam collapses on the templates and does not on Fashion-MNIST (the map report's "
         f"collapse: Adam at least {spread(map_report.COLLAPSE_FLOOR, 'pct', digits=0)} below SGD and its mode gap as "
         f"far above SGD's, each beyond {Z:g} standard errors).",
         "beyond the article: at the full protocol, the templates' collapse and Fashion-MNIST's shared mode gap "
         "(claims above)", section=MAP)
def map_reference_points_keep_their_behaviour(ev: Evidence) -> Outcome:
    points, problems, root = map_points(ev.root)
    refs = {p.point.task: p for p in points if p.point.knob is None}
    where = f"Runs under `{root}`." + (f" {count(len(problems), 'folder')} refused." if problems else "")
    floor = spread(map_report.COLLAPSE_FLOOR, "pct", digits=0)
    tolerance = (f"map_report.collapses: deficit and excess mode gap each ≥ {floor} and > {Z:g} standard errors; "
                 "templates yes, Fashion-MNIST no (fixed before the map's runs)")
    ends = [(f"the reference point of {t}", refs.get(t)) for t in ("noisy_templates", "fashion_mnist")]
    missing = _short(ends)
    if missing:
        return Outcome(missing, tolerance, None, where)
    where += _left_out(ends)
    t, f = refs["noisy_templates"], refs["fashion_mnist"]
    measured = "; ".join(f"{map_report.TASK_WORDS[p.point.task]}: Adam − SGD "
                         f"{map_report.in_points(map_report.adam_minus_sgd(p), n=True)}, Adam's mode gap − SGD's "
                         f"{map_report.in_points(p.excess_gap)}" for p in (t, f))
    return Outcome(measured, tolerance, map_report.collapses(t) is True and map_report.collapses(f) is False, where)


CHECKS = (map_reference_points_keep_their_behaviour, *(_claim(p) for p in PREDICTIONS))
