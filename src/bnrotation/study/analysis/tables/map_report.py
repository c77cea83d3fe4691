"""The condition map's report (issue 49; no torch): ``map.md``, ``map.png`` and the sentence that says where Adam's
collapse lives.

Reads the finished runs of ``make map`` (:mod:`bnrotation.study.condition_map`) under ``<root>/runs/map_<row>+.../``
with the analysis's run reader (:func:`..results.load_run`, layout :data:`MAP`: each run checked against the registered
row its name keeps, :func:`bnrotation.study.condition_map.base_row`, and against the knob setting its name says)::

    python -m bnrotation.study.analysis.tables.map_report --results results/reference/map

A run's place on the map, its :class:`Point`, is read from its ``config.yaml``: the task, and the one task knob
(:data:`bnrotation.study.config.TASK_KNOBS`) away from the task's default, or none (the task's reference point).
Per run, over its check window (the map's protocol: :data:`bnrotation.study.condition_map.PROTOCOL`):

* ``acc_eval_mode``, ``acc_train_mode``: the mean of its checks' evaluation- and training-mode accuracy on the
  held-out set (:func:`..measures.metrics.acc_eval_mode`); ``mode_gap`` = training − evaluation mode;
* ``recovered``: what re-estimating every running statistic wins back, the mean over the intervention steps of
  re-estimated minus stored evaluation-mode accuracy (:func:`..measures.midrun.reestimated_at_every_step`);
* the mechanism: per norm layer, the medians over its channels and the window's logged steps of E, |d| (the mean
  part) and |log s| (the variance part), :func:`bnrotation.staleness.channel_signals` on the run's fresh and
  running statistics with the layer's eps (``run.json``); the rotation per 100 steps and the norm growth of the last
  conv layer (:func:`..measures.metrics.rotation_per_100_deg`, :func:`..measures.metrics.norm_growth`); the training
  loss at the last check.

Per point, SGD and Adam are paired by seed (the same data, templates and initial weights): ``deficit`` = SGD's
evaluation-mode accuracy − Adam's, and ``excess_gap`` = Adam's mode gap − SGD's. The collapse lives at a point
(:func:`collapses`) when both exceed :data:`COLLAPSE_FLOOR` and :data:`..stats.Z` standard errors of their
mean over seeds (one seed: the floor alone). :func:`where_sentence` says, from the runs, at which settings of each
knob it lives; :func:`headline` is that sentence for a front page, or None while the map is incomplete.

``map.md`` also recomputes, from the committed reference runs (``--reference``, ``results/reference``), why the map
may stop at :data:`bnrotation.study.condition_map.MAP_STEPS` steps (:func:`protocol_evidence`). Exit status 2 with
one line when the root has no finished map run; 1 when a folder was refused (named on stderr); else 0.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.stats

from .... import records
from ...condition_map import KNOBS, MAP_STEPS, REFERENCE, SEEDS, Knob, base_row, runs_in_map
from ...config import TASK_KNOBS, TaskConfig
from ...rows import ROWS, TASKS, check_against_row
from ..formatting import cell, listed, seed_ranges, spread
from ..measures import metrics, midrun
from ..results import SCALE_KEYS, BadRunError, Layout, Run, count, find_run_dirs, load_run, say_refused
from ..stats import Z, SeedStat, spearman_rho
from . import sensitivity
from ....helptext import plain

__all__ = ["MAP", "COLLAPSE_FLOOR", "Point", "load_map_runs", "point_of", "per_run", "per_point", "seeds_in",
           "on_sweep", "sweep_points", "complete", "collapses", "stale_for_both", "adam_minus_sgd", "in_points",
           "table_markdown", "mechanism_markdown", "where_sentence", "headline", "protocol_evidence", "report_text",
           "cost_of_staleness",
           "figure", "main", "SENTENCE_BLOCK"]

# The collapse: Adam's evaluation mode at least this far below SGD's and its mode gap at least this far above SGD's
# (fractions: 5 points). On the committed runs the templates' reference is far beyond it and Fashion-MNIST's is at
# 0 (both rows lose the same few points to stale statistics), so the floor tells the two apart with room each side.
COLLAPSE_FLOOR = 0.05
SENTENCE_BLOCK = "where_the_collapse_lives"  # the marker of the sentence's generated block in map.md
TASK_WORDS = {"noisy_templates": "the templates", "fashion_mnist": "Fashion-MNIST"}
OPTIMIZERS = ("sgd", "adam")
OPTIMIZER_WORDS = {"sgd": "SGD", "adam": "Adam"}  # as the report writes them


def _knob_named(row: str) -> tuple[str, str] | None:
    """``(key, setting as written)`` from a map run's name (``map_adam+train_size1000`` -> ``("train_size",
    "1000")``), or None for a reference point."""
    suffix = row.split("+", 1)[1]
    if suffix == REFERENCE:
        return None
    for key in sorted(TASK_KNOBS, key=len, reverse=True):
        if suffix.startswith(key):
            return key, suffix[len(key):]
    return None


def _contradicts_base_row(info: dict) -> list[str]:
    """A map run against the registered row it keeps (:func:`check_against_row`) and against the knob setting its
    name says (``run.json``'s read-back task)."""
    try:
        base = base_row(info["row"])
    except ValueError as err:
        return [str(err)]
    if base not in ROWS:
        return [f"keeps row {base!r}, which is not a registered row"]
    problems = check_against_row(info, ROWS[base])
    named = _knob_named(info["row"])
    if named is None and info["row"].split("+", 1)[1] != REFERENCE:
        problems.append(f"the name says no knob of {', '.join(TASK_KNOBS)} and is not {REFERENCE!r}")
    elif named is not None:
        key, written = named
        got = (info.get("task") or {}).get(key)
        if got is None or not math.isclose(float(got), float(written)):
            problems.append(f"task.{key} read back as {got!r}, the name says {written}")
    return problems


MAP = Layout(records.TABLE_COLUMNS, records.REQUIRED_TABLES, SCALE_KEYS, _contradicts_base_row)


@dataclass(frozen=True)
class Point:
    """A place on the map: ``task`` (``task.name``), ``knob`` (:attr:`bnrotation.study.condition_map.Knob.name`,
    None for the task's reference point) and ``setting`` (the knob's value; NaN at the reference)."""

    task: str
    knob: str | None
    setting: float

    def words(self) -> str:
        """``template_scale 0.3`` or ``reference``."""
        return REFERENCE if self.knob is None else f"{self.knob.split('.', 1)[1]} {self.setting:,g}"


def load_map_runs(root: str | Path) -> tuple[list[Run], list[str]]:
    """The finished map runs under ``root/runs/`` (layout :data:`MAP`, with every table the runner writes that
    the report reads), and one line per folder refused (or one saying ``root`` has no ``runs/`` folder)."""
    if not (Path(root) / "runs").is_dir():
        return [], [f"{root}: no runs/ folder"]
    runs, problems = [], []
    for path in find_run_dirs(root):
        try:
            run = load_run(path, ("checks", "layers", "channels", "interventions"), MAP)
            missing = [c for c in MECHANISM_COLUMNS if c not in run.tables["channels"].columns]
            if missing:
                raise BadRunError(f"{path / 'channels.parquet'}: no {', '.join(missing)} column; the mechanism "
                                  f"reads {', '.join(MECHANISM_COLUMNS)} per norm layer")
            point_of(run)
            runs.append(run)
        except BadRunError as err:
            problems.append(str(err))
    return runs, problems


def point_of(run: Run) -> Point:
    """The run's :class:`Point`, from its ``config.yaml``: the task knob away from the task's default, its setting
    the sweep's own where it is that within float rounding (so that one point is one group).

    Raises:
        BadRunError: naming the run when it turns more than one knob.
    """
    task_cfg, defaults = run.config.get("task") or {}, TaskConfig(name=run.task)
    moved = [k for k in TASK_KNOBS if k in task_cfg and not math.isclose(float(task_cfg[k]),
                                                                         float(getattr(defaults, k)))]
    if len(moved) > 1:
        raise BadRunError(f"{run.path}: turns {', '.join(f'task.{k}' for k in moved)}; a map run turns one knob")
    if not moved:
        return Point(run.task, None, math.nan)
    name, value = f"{run.task}.{moved[0]}", float(task_cfg[moved[0]])
    swept = next((k.settings for k in KNOBS if k.name == name), ())
    return Point(run.task, name, next((float(x) for x in swept if math.isclose(x, value)), value))


MECHANISM_COLUMNS = ("norm_layer", "running_mean", "running_var", "fresh_mean", "fresh_var")  # channels table


def _layer_signals(run: Run) -> pd.DataFrame:
    """Per norm layer, over the window's logged steps and the layer's channels: the medians of E, |d| and
    |log s| (:func:`.sensitivity.layer_signals`)."""
    return sensitivity.layer_signals(run, metrics.in_window(run, run.tables["channels"]))


def per_run(runs: list[Run]) -> pd.DataFrame:
    """One line per run: ``row``, ``base``, ``optimizer`` (``sgd``/``adam``), ``seed``, ``task``, ``knob``,
    ``setting``, ``diverged`` (its loss went non-finite: the runner stopped it and kept what it had logged) with
    ``diverged_at_step``, ``train_set`` (the distinct training samples, inf for fresh ones), ``acc_eval_mode``,
    ``acc_train_mode``, ``mode_gap``, ``recovered`` (fractions), ``rotation_per_100_deg`` (degrees), ``norm_growth``
    (×), ``loss_last`` (the training loss at the last check), and the mechanism: every norm layer's ``e:<layer>``,
    ``mean_part:<layer>`` and ``var_part:<layer>`` (:data:`PARTS`, :func:`_layer_signals`; σ of the running
    statistics, and |log s|), and the worst layer's (``worst_layer``, by median E) as ``e``, ``mean_part``,
    ``var_part``."""
    lines = []
    for r in runs:
        point, base = point_of(r), base_row(r.row)
        checks = metrics.in_window(r, r.tables["checks"]).sort_values("step")
        reest = midrun.reestimated_at_every_step(r)
        layers = _layer_signals(r)
        worst = layers.loc[layers["e"].idxmax()] if len(layers) and layers["e"].notna().any() else None
        trained = (r.info.get("task") or {}).get("train_size")
        lines.append({
            "row": r.row, "base": base, "optimizer": ROWS[base].optimizer, "seed": r.seed, "task": point.task,
            "knob": point.knob, "setting": point.setting, "diverged": r.diverged,
            "diverged_at_step": r.info.get("diverged_at_step") if r.diverged else None,
            "train_set": math.inf if trained is None else float(trained),
            "acc_eval_mode": metrics.acc_eval_mode(r), "acc_train_mode": metrics.acc_train_mode(r),
            "mode_gap": metrics.acc_train_mode(r) - metrics.acc_eval_mode(r),
            "recovered": float((reest["reestimated"] - reest["stored"]).mean()) if len(reest) else math.nan,
            "rotation_per_100_deg": metrics.rotation_per_100_deg(r), "norm_growth": metrics.norm_growth(r),
            "loss_last": float(checks["loss"].iloc[-1]) if len(checks) else math.nan,
            "worst_layer": None if worst is None else worst["norm_layer"],
            **{k: (math.nan if worst is None else float(worst[k])) for k in PARTS},
            **{f"{k}:{line['norm_layer']}": float(line[k]) for _, line in layers.iterrows() for k in PARTS}})
    return pd.DataFrame(lines)


@dataclass(frozen=True)
class PointStats:
    """One point's per-seed figures: ``sgd``/``adam`` (each a dict of column → :class:`SeedStat`), and the paired
    ``deficit`` (SGD's evaluation-mode accuracy − Adam's) and ``excess_gap`` (Adam's mode gap − SGD's), over the
    seeds that have both rows. A diverged run is left out of every figure, as everywhere in the suite; ``diverged``
    names it (``Adam seed 2 (step 1,200)``), and ``finished`` lists the seeds with a finished run of both rows,
    diverged or not: what the map's completeness counts (:func:`seeds_in`)."""

    point: Point
    sgd: dict
    adam: dict
    deficit: SeedStat
    excess_gap: SeedStat
    diverged: tuple[str, ...] = ()
    finished: tuple[int, ...] = ()


PARTS = ("e", "mean_part", "var_part")  # E and its mean and variance parts (_layer_signals), per layer "<part>:<layer>"
COLUMNS = ("acc_eval_mode", "acc_train_mode", "mode_gap", "recovered", "rotation_per_100_deg", "norm_growth",
           "loss_last", "e", "mean_part", "var_part")


def per_point(frame: pd.DataFrame) -> list[PointStats]:
    """:class:`PointStats` of every point of :func:`per_run`'s ``frame``, the reference points first, then the
    knobs in :data:`bnrotation.study.condition_map.KNOBS`' order, settings ascending."""
    order = {k.name: i for i, k in enumerate(KNOBS)}
    keys = frame[["task", "knob", "setting"]].drop_duplicates()
    keys = keys.assign(rank=[(-1 if k is None or (isinstance(k, float) and math.isnan(k)) else order.get(k, len(order)),
                              list(TASKS).index(t) if t in TASKS else len(TASKS))
                             for t, k in zip(keys["task"], keys["knob"])])
    out = []
    for _, key in keys.sort_values(["rank", "setting"]).iterrows():
        knob = None if key["knob"] is None or (isinstance(key["knob"], float) and math.isnan(key["knob"])) \
            else key["knob"]
        here = frame[(frame["task"] == key["task"]) & (frame["knob"].isna() if knob is None
                                                       else frame["knob"] == knob)]
        if knob is not None:
            here = here[np.isclose(here["setting"], key["setting"])]
        finished = tuple(sorted(set(here.loc[here["optimizer"] == "sgd", "seed"])
                                & set(here.loc[here["optimizer"] == "adam", "seed"])))
        gone = here[here["diverged"]].sort_values(["optimizer", "seed"], ascending=[False, True])
        diverged = tuple(f"{OPTIMIZER_WORDS[o]} seed {seed}"
                         + (f" (step {int(step):,})" if step is not None and not pd.isna(step) else "")
                         for o, seed, step in zip(gone["optimizer"], gone["seed"], gone["diverged_at_step"]))
        here = here[~here["diverged"]]
        by = {o: here[here["optimizer"] == o].set_index("seed").sort_index() for o in OPTIMIZERS}
        stats = {o: {c: SeedStat.of(by[o][c], by[o].index) for c in COLUMNS} for o in OPTIMIZERS}
        both = sorted(set(by["sgd"].index) & set(by["adam"].index))
        deficit = SeedStat.of(by["sgd"].loc[both, "acc_eval_mode"] - by["adam"].loc[both, "acc_eval_mode"], both)
        excess = SeedStat.of(by["adam"].loc[both, "mode_gap"] - by["sgd"].loc[both, "mode_gap"], both)
        out.append(PointStats(Point(key["task"], knob, float(key["setting"])), stats["sgd"], stats["adam"], deficit,
                              excess, diverged, finished))
    return out


def seeds_in(p: PointStats) -> int:
    """How many seeds of the sweep (:data:`..rows.SEEDS`) have a finished run of both rows at ``p``, a diverged
    run counting as finished (it ran to its end: a rerun would diverge again)."""
    return len(set(p.finished) & set(SEEDS))


def on_sweep(point: Point) -> bool:
    """Whether the sweep (:func:`bnrotation.study.condition_map.sweep_lines`) runs ``point``: a task's reference
    point, or a setting of :data:`..condition_map.KNOBS`."""
    return (point.knob is None and point.task in TASKS
            or any(k.name == point.knob and any(math.isclose(s, point.setting) for s in k.settings) for k in KNOBS))


def sweep_points(points: list[PointStats]) -> list[PointStats]:
    """The points among ``points`` that the sweep runs (:func:`on_sweep`)."""
    return [p for p in points if on_sweep(p.point)]


def complete(points: list[PointStats]) -> bool:
    """Whether ``points`` hold the whole map: every point of the sweep (:func:`sweep_points`), each with a finished
    run of both rows at every seed (:func:`seeds_in`). Runs off the sweep count for nothing."""
    swept = sweep_points(points)
    wanted = len(TASKS) + sum(len(k.settings) for k in KNOBS)
    return len(swept) == wanted and all(seeds_in(p) == len(SEEDS) for p in swept)


def beyond(stat: SeedStat, floor: float) -> bool | None:
    """Whether ``stat``'s mean is at least ``floor`` and above 0 by more than :data:`Z` standard errors (one seed:
    the floor alone); None without a value."""
    if stat.n == 0:
        return None
    return stat.mean >= floor and (stat.n < 2 or stat.mean > Z * stat.se)


def collapses(p: PointStats) -> bool | None:
    """Whether the collapse lives at ``p``: Adam's evaluation mode below SGD's and its mode gap above SGD's, each by
    at least :data:`COLLAPSE_FLOOR` and :data:`Z` standard errors of the paired mean (:func:`beyond`); None when no
    seed has both rows."""
    a, b = beyond(p.deficit, COLLAPSE_FLOOR), beyond(p.excess_gap, COLLAPSE_FLOOR)
    return None if a is None or b is None else a and b


def undecided(p: PointStats) -> bool:
    """Whether the collapse rule cannot tell at ``p``: :func:`collapses` is False, yet both paired means (the deficit
    and the excess mode gap) pass :data:`COLLAPSE_FLOOR`; they fail only the :data:`Z` standard errors, which with a
    few seeds that disagree is a lack of power, not an absence (the sentence says "undecided", never "not")."""
    if collapses(p) is not False:
        return False
    return p.deficit.mean >= COLLAPSE_FLOOR and p.excess_gap.mean >= COLLAPSE_FLOOR


def adam_minus_sgd(p: PointStats) -> SeedStat:
    """Adam's evaluation-mode accuracy minus SGD's at ``p``, seed by seed (fractions): the deficit with its sign
    turned, as the map's table and the claims' measured lines print it."""
    return SeedStat(tuple(-v for v in p.deficit.values), p.deficit.seeds)


def stale_for_both(p: PointStats) -> bool | None:
    """Whether both optimizers lose to stale statistics at ``p``: SGD's mode gap and Adam's each at least
    :data:`COLLAPSE_FLOOR` and beyond :data:`Z` standard errors over their seeds (:func:`beyond`), whatever the
    difference between them; None when either row has no seed. Not the collapse (:func:`collapses`), which is
    Adam's alone."""
    a, b = beyond(p.sgd["mode_gap"], COLLAPSE_FLOOR), beyond(p.adam["mode_gap"], COLLAPSE_FLOOR)
    return None if a is None or b is None else a and b


def _setting_words(knob: Knob | None, p: PointStats) -> str:
    """A point's setting in words: the knob's value, or the task's own (:attr:`..condition_map.Knob.own`)."""
    if p.point.knob is None:
        return f"{knob.own} (its own)" if knob else REFERENCE
    return f"{p.point.setting:,g}"


def where_sentence(points: list[PointStats], frame: pd.DataFrame) -> str:
    """One sentence, from the runs, saying where the collapse lives: per task, per knob, the settings (the task's
    own among them) at which it does and at which it does not (:func:`collapses`)."""
    verdict = {(p.point.task, p.point.knob, p.point.setting if p.point.knob else None): collapses(p) for p in points}
    parts = []
    for task in TASKS:
        ref = next((v for (t, k, _), v in verdict.items() if t == task and k is None), None)
        own = next((p for p in points if p.point.task == task and p.point.knob is None), None)
        clauses = []
        for knob in (k for k in KNOBS if k.task == task):
            here = [(p, verdict[(task, knob.name, p.point.setting)]) for p in points if p.point.knob == knob.name]
            along = f"along {knob.key.replace('_', ' ')}"
            if not here:  # a map half run: no run of this knob yet
                clauses.append(f"{along} not yet run")
                continue
            settings = ([(axis_position(knob, task, frame, None), f"its own ({knob.own})", ref, own)]
                        if ref is not None else []) \
                + [(p.point.setting, f"{p.point.setting:,g}", v, p) for p, v in here]
            settings = sorted(settings, key=lambda t: t[0])
            pending = [s for _, s, v, _ in settings if v is None]  # a map half run: a row without its twin
            settings = [(s, v, undecided(p)) for _, s, v, p in settings if v is not None]
            yes = [s for s, v, _ in settings if v]
            no = [s for s, v, u in settings if not v and not u]
            unsure = [s for s, v, u in settings if not v and u]
            wait = f", not yet judged at {listed(pending)}" if pending else ""
            if not settings:
                clauses.append(f"{along} not yet judged ({listed(pending)})")
            elif yes and not no and not unsure:
                clauses.append(f"{along} at every setting judged: {listed(yes)}{wait}")
            elif no and not yes and not unsure:
                clauses.append(f"{along} at none of the settings judged: {listed(no)}{wait}")
            else:
                said = [f"{how}{listed(these)}" for how, these in (("at ", yes), ("not at ", no),
                                                                  ("undecided at ", unsure)) if these]
                clauses.append(f"{along} {', '.join(said)}{wait}")
        if all(c.endswith(" not yet run") for c in clauses) and ref is not None:  # its reference point alone
            clauses.insert(0, "at its own settings" if ref else "not at its own settings")
        if clauses and not all(c.endswith(" not yet run") for c in clauses):
            parts.append(f"on {TASK_WORDS[task]} {'; '.join(clauses)}")
    if not parts:
        return "The map has no point with both SGD and Adam yet."
    floor = spread(COLLAPSE_FLOOR, 'pct', digits=0)
    return (f"Adam's collapse (its evaluation-mode accuracy at least {floor} below SGD's and its mode gap at least "
            f"{floor} above SGD's, each mean more than {Z:g} standard errors from zero, paired by seed; undecided "
            f"where both differences are past {floor} but one or both stay within {Z:g} standard errors) lives "
            + "; ".join(parts) + ". " + _both_sentence(points, frame))


def _both_sentence(points: list[PointStats], frame: pd.DataFrame) -> str:
    """Where both optimizers lose to stale statistics (:func:`stale_for_both`), per task, in the order of
    :func:`where_sentence`, naming the points where Adam's collapse (:func:`collapses`) comes on top of it."""
    parts = []
    for task in TASKS:
        here = [p for p in points if p.point.task == task and stale_for_both(p)]
        own = [p for p in here if p.point.knob is None]
        on_own = " (with Adam's collapse on top)" if own and collapses(own[0]) else ""
        words = [f"at its own settings{on_own}"] if own else []
        for knob in (k for k in KNOBS if k.task == task):
            mine = sorted((p for p in here if p.point.knob == knob.name), key=lambda p: p.point.setting)
            if mine:
                on_top = [f"{p.point.setting:,g}" for p in mine if collapses(p)]
                words.append(f"along {knob.key.replace('_', ' ')} at {listed([f'{p.point.setting:,g}' for p in mine])}"
                             + (f" (at {listed(on_top)} with Adam's collapse on top)" if on_top else ""))
        if words:  # "and" within a task, ";" between tasks: "along train size" after "on Fashion-MNIST" is its own
            parts.append(f"on {TASK_WORDS[task]} {listed(words)}")
    floor = spread(COLLAPSE_FLOOR, 'pct', digits=0)
    if not parts:
        return (f"At no point judged does each optimizer's mode gap reach {floor} (its evaluation-mode accuracy that "
                "far below its training-mode accuracy).")
    return (f"Both optimizers' evaluation-mode accuracies fall at least {floor} below their training-mode accuracies "
            f"(each optimizer's mode gap, its mean over seeds more than {Z:g} standard errors from zero) "
            + "; ".join(parts) + ".")


def headline(root: str | Path) -> str | None:
    """The sentence for a front page (README, docs/results.md, the report page): :func:`where_sentence` of the
    map's runs under ``root``, or None unless every point of :data:`bnrotation.study.condition_map.KNOBS` and both
    reference points have both rows at every seed the sweep runs (:func:`complete`: no sentence from a map half
    run, and runs off the sweep stand in for none of its points)."""
    return _headline_of(*load_map_runs(root))


def _headline_of(runs: list[Run], problems: list[str]) -> str | None:
    """:func:`headline` of runs already read (:func:`load_map_runs`): the sentence of the sweep's points alone."""
    from ...condition_map import OPTIMIZERS as ROWS_RUN

    if problems or not runs or len(ROWS_RUN) != len(OPTIMIZERS):
        return None
    frame = per_run(runs)
    points = per_point(frame)
    return where_sentence(sweep_points(points), frame) if complete(points) else None


def front_line(root: str | Path) -> str:
    """What the front pages (the README, docs/results.md, the report page) say of the map under ``root``: its
    :func:`headline` when every point has every seed, else how many of its runs are in (runs off the sweep not
    counted; and how many folders were refused) and that the sentence waits for the rest (a map half run says
    nothing about where the collapse lives). The runs are read once."""
    runs, problems = load_map_runs(root)
    sentence = _headline_of(runs, problems)
    if sentence is not None:
        return f"Where the collapse lives, from the condition map's {count(runs_in_map(), 'run')}: {sentence}"
    refused = [p for p in problems if not p.endswith("no runs/ folder")]
    swept = sum(on_sweep(point_of(r)) for r in runs)
    return (f"Where the collapse lives: the condition map (`make map`) has {swept} of its {runs_in_map()} runs "
            f"under `{root}`" + (f" ({count(len(refused), 'folder')} refused: `make map` says why)" if refused else "")
            + "; its sentence is written here once every point has every seed.")


# ----------------------------------------------------------------------------- tables
def _pct(s: SeedStat) -> str:
    """An accuracy's mean ± sd over seeds: ``'98.9% ± 1.7 points'``; ``'–'`` without a seed."""
    return "–" if s.n == 0 else cell(s.mean, "pct", s.sd)


def in_points(s: SeedStat, n: bool = False) -> str:
    """A difference of accuracies (a mode gap, Adam − SGD, what re-estimation wins back), its mean ± sd over seeds in
    points: ``'28.3 ± 10.1 points'``, a rounded zero unsigned, with ``' (n = 3 seeds)'`` when ``n``; ``'–'``
    without a seed."""
    if s.n == 0:
        return "–"
    mean, sd = round(s.mean * 100, 1) + 0.0, s.sd  # + 0.0: no "-0.0"
    return (f"{mean:.1f}" + ("" if math.isnan(sd) else f" ± {sd * 100:.1f}") + " points"
            + (f" (n = {count(s.n, 'seed')})" if n else ""))


def _seeds(p: PointStats) -> str:
    """The seeds a point pairs; the runs that diverged there (left out); each row's own count where they are not all
    paired otherwise (a map half run)."""
    sgd = p.sgd["acc_eval_mode"].n + sum(d.startswith("SGD ") for d in p.diverged)
    adam = p.adam["acc_eval_mode"].n + sum(d.startswith("Adam ") for d in p.diverged)
    notes = [f"{'; '.join(p.diverged)} diverged"] if p.diverged else []
    if not sgd == adam == len(p.finished):  # a run without its twin
        notes.append(f"SGD {sgd}, Adam {adam}")
    return f"{p.deficit.n}" + (f" ({'; '.join(notes)})" if notes else "")


def _yes_no(verdict: bool | None) -> str:
    return "–" if verdict is None else "yes" if verdict else "no"


def table_markdown(points: list[PointStats], frame: pd.DataFrame) -> str:
    """The map's table: one line per point, SGD and Adam side by side (mean ± sd over seeds, n), the paired
    deficit and excess mode gap, and whether the collapse lives there. "Seeds" counts the seeds with both rows
    (and each row's own where they differ)."""
    head = ("| Task | Knob | Setting | Paired seeds | SGD eval. | Adam eval. | Adam − SGD eval. (paired) | "
            "SGD mode gap | "
            "Adam mode gap | Adam − SGD mode gap (paired) | Adam's collapse | Both stale | SGD recovered by "
            "re-estimation | Adam recovered by re-estimation |")
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|"]
    for p in points:
        knob = next((k for k in KNOBS if k.name == p.point.knob), None)
        verdict = collapses(p)
        lines.append(f"| {TASK_WORDS[p.point.task]} | {p.point.knob.split('.', 1)[1] if p.point.knob else '–'} | "
                     f"{_setting_words(knob, p)} | {_seeds(p)} | "
                     f"{_pct(p.sgd['acc_eval_mode'])} | {_pct(p.adam['acc_eval_mode'])} | "
                     f"{in_points(adam_minus_sgd(p))} | {in_points(p.sgd['mode_gap'])} | "
                     f"{in_points(p.adam['mode_gap'])} | {in_points(p.excess_gap)} | "
                     f"{'undecided' if undecided(p) else _yes_no(verdict)} | "
                     f"{_yes_no(stale_for_both(p))} | {in_points(p.sgd['recovered'])} | "
                     f"{in_points(p.adam['recovered'])} |")
    return "\n".join(lines)


def mechanism_markdown(points: list[PointStats], frame: pd.DataFrame) -> str:
    """Per point and optimizer: every norm layer's median E with its mean part |d| and variance part |log s| (means
    over seeds), the last conv layer's rotation and norm growth, the last training loss; then, over the points with
    an Adam run, Spearman's ρ of Adam's mode gap with its rotation, its norm growth and its last loss (which tracks
    the collapse)."""
    layers = sorted(c.split(":", 1)[1] for c in frame.columns if c.startswith("e:"))
    head = (["Task", "Point", "Optimizer"] + [f"{layer}: E (\\|d\\|, \\|log s\\|)" for layer in layers]
            + ["Rotation per 100 steps", "Norm growth", "Loss, last check"])
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|" + "---:|" * (len(layers) + 3)]
    for p in points:
        for o, stats in (("SGD", p.sgd), ("Adam", p.adam)):
            rows = frame[(frame["task"] == p.point.task) & (frame["optimizer"] == o.lower())
                         & (frame["knob"].isna() if p.point.knob is None else frame["knob"] == p.point.knob)]
            if p.point.knob is not None:
                rows = rows[np.isclose(rows["setting"], p.point.setting)]
            parts = [f"{cell(rows[f'e:{layer}'].mean(), 'sigma')} ({cell(rows[f'mean_part:{layer}'].mean(), 'sigma')}, "
                     f"{cell(rows[f'var_part:{layer}'].mean(), 'plain')})" for layer in layers]
            lines.append("| " + " | ".join([TASK_WORDS[p.point.task], p.point.words(), o, *parts,
                                            cell(stats["rotation_per_100_deg"].mean, "deg"),
                                            cell(stats["norm_growth"].mean, "x"),
                                            cell(stats["loss_last"].mean, "plain")]) + " |")
    ran = [p for p in points if p.adam["mode_gap"].n]  # a map half run: the points with an Adam run
    gap = [p.adam["mode_gap"].mean for p in ran]
    tracks = []
    for what, col in (("rotation", "rotation_per_100_deg"), ("norm growth", "norm_growth"), ("last loss", "loss_last")):
        other = [p.adam[col].mean for p in ran]
        rho = spearman_rho(gap, other)
        p_value = scipy.stats.spearmanr(gap, other).pvalue if math.isfinite(rho) else math.nan
        tracks.append(f"ρ(Adam's mode gap, its {what}) = {cell(rho, 'rho')} (p = {cell(p_value, 'plain')})")
    out = "\n".join(lines)
    if len(ran) >= 3:
        out += (f"\n\nSpearman's ρ over the {count(len(ran), 'point')} with an Adam run (both tasks; each point's "
                f"means over seeds; two-sided p from the t approximation, `scipy.stats.spearmanr`, rough at so few "
                f"points; exploratory: fixed after the runs, and not corrected for its three tests): "
                + "; ".join(tracks) + ".")
    return out


def protocol_evidence(reference: str | Path) -> str:
    """Why the map may stop at :data:`MAP_STEPS` steps, recomputed from the committed runs under ``reference``
    (``runs/{sgd,adam,fmnist_sgd,fmnist_adam}``): per row, the mode gap and the share of checks whose mode gap
    exceeds 1 − :data:`..article.FAIL_BELOW` (on the templates, where training mode is 100%, the article's checks
    below 90%; on real images, where it is about 90%, the checks that lose as much), over the checks up to
    :data:`MAP_STEPS` against the whole window (its checks, to the runs' last step); then a sentence saying
    whether the cut keeps the contrast the map looks for: Adam's mode gap on the templates above SGD's by at least
    :data:`COLLAPSE_FLOOR`, and Fashion-MNIST's two rows within it of each other. ``''`` when those runs are not
    there."""
    from ..results import load_run as load
    from ...article import FAIL_BELOW

    lines, gaps, last = [], {}, 0
    big = 1 - FAIL_BELOW
    for row in ("sgd", "adam", "fmnist_sgd", "fmnist_adam"):
        paths = sorted(Path(reference).glob(f"runs/{row}/seed=*"))
        runs = []
        for path in paths:
            try:
                runs.append(load(path, ("checks",)))
            except BadRunError:
                continue
        if not runs:
            continue
        checks = pd.concat([metrics.in_window(r, r.tables["checks"]) for r in runs])
        last = max(last, int(checks["step"].max()))
        cut = checks[checks["step"] <= MAP_STEPS]
        gaps[row] = float((cut["acc_train_mode"] - cut["acc_eval_mode"]).mean())

        def gap(c):
            return spread(float((c["acc_train_mode"] - c["acc_eval_mode"]).mean()), "pct")

        def losing(c):
            return cell(float(((c["acc_train_mode"] - c["acc_eval_mode"]) > big + 1e-12).mean()), "pct", digits=0)

        lines.append(f"| `{row}` | {len(runs)} | {gap(cut)} ({cut['step'].nunique()} checks) | {losing(cut)} | "
                     f"{gap(checks)} ({checks['step'].nunique()} checks) | {losing(checks)} |")
    if not lines:
        return ""
    over = f"Checks with a mode gap over {spread(big, 'pct', digits=0)}"
    table = "\n".join([f"| Row (committed runs) | Seeds | Mode gap to step {MAP_STEPS:,} | {over}, to step "
                       f"{MAP_STEPS:,} | Mode gap, whole window (to step {last:,}) | {over}, whole window |",
                       "|---|---:|---:|---:|---:|---:|", *lines])
    if not all(r in gaps for r in ("sgd", "adam", "fmnist_sgd", "fmnist_adam")):
        return table
    floor = spread(COLLAPSE_FLOOR, "pct", digits=0)
    templates, real = gaps["adam"] - gaps["sgd"], abs(gaps["fmnist_adam"] - gaps["fmnist_sgd"])
    keeps = templates >= COLLAPSE_FLOOR and real < COLLAPSE_FLOOR
    return table + (f"\n\nTo step {MAP_STEPS:,}, Adam's mode gap on the templates is {spread(templates, 'pct')} "
                    f"above SGD's, and Fashion-MNIST's two rows are {spread(real, 'pct')} apart: the cut "
                    + ("keeps" if keeps else "does not keep")
                    + f" the contrast the map looks for (at least {floor} on the templates, less on real images).")


def draw_comparison(reference: str | Path, points: list[PointStats]) -> str:
    """The map's reference points beside the committed runs of the same seeds (:data:`..rows.SEEDS`) cut at
    :data:`MAP_STEPS`: per row, the evaluation-mode accuracy over the checks to that step, the committed runs' and
    the map's own (another draw: :mod:`..condition_map`), so that a reader sees how far the two draws differ.
    ``''`` without the committed runs or the map's reference points."""
    from ..results import load_run as load

    refs = {p.point.task: p for p in points if p.point.knob is None}
    pairs, alike = [], []
    for task, prefix in (("noisy_templates", ""), ("fashion_mnist", "fmnist_")):
        if task not in refs:
            continue
        for o in OPTIMIZERS:
            accs, whole, gaps = [], [], []
            for folder in sorted((Path(reference) / "runs" / f"{prefix}{o}").glob("seed=*")):
                try:
                    run = load(folder, ("checks",))
                except (BadRunError, FileNotFoundError):
                    continue
                whole.append(metrics.acc_eval_mode(run))
                gaps.append(metrics.acc_train_mode(run) - metrics.acc_eval_mode(run))
                if run.seed in SEEDS:
                    c = metrics.in_window(run, run.tables["checks"])
                    accs.append(float(c.loc[c["step"] <= MAP_STEPS, "acc_eval_mode"].mean()))
            mine = refs[task].sgd if o == "sgd" else refs[task].adam
            if accs and mine["acc_eval_mode"].n:
                ours = cell(mine['acc_eval_mode'].mean, 'pct')
                pairs.append(f"`{prefix}{o}` {cell(float(np.mean(accs)), 'pct')} committed against {ours} in the map")
                if cell(float(np.mean(whole)), 'pct') == ours:  # two readers took the one for a copy of the other
                    gap = f"{100 * mine['mode_gap'].mean:.1f}"
                    alike.append(f"`{prefix}{o}`'s {ours}" + (f" (and so its mode gap, {gap} points)"
                                                              if gap == f"{100 * float(np.mean(gaps)):.1f}" else "")
                                 + f" equals, at this rounding, the committed runs' figure over all their "
                                 f"{count(len(whole), 'seed')} and the whole window (the front pages'): another "
                                 "quantity, the same digits by chance")
    if not pairs:
        return ""
    return (f"The same seeds ({seed_ranges(SEEDS)}), evaluation-mode accuracy over the checks to step "
            f"{MAP_STEPS:,}: " + "; ".join(pairs) + ". The map's runs are another draw of those seeds (another "
            "CPU), so its reference points differ from the committed runs' by what a draw moves."
            + "".join(f" In the map, {a}." for a in alike))


def _partial(runs: list[Run], points: list[PointStats]) -> list[str]:
    """map.md's warning while the map is half run (runs still to come, or a point short of a seed): the sentence
    above is then read from the seeds that are in, and the front pages and the claims wait for the rest."""
    if complete(points):
        return []
    return [f"**This map is partial: it reads {len(runs)} of its {runs_in_map()} runs.** The sentence above reads "
            "the seeds that are in (the table's Paired seeds column); the front pages' sentence waits for every "
            "seed of every point, and each of the map's claims for every seed of the points it compares "
            "(`make claims` judges a claim once both its ends are in).\n"]


def _steps_words(runs: list[Run]) -> str:
    """The intervention steps inside the check window, over ``runs``, in words ("steps 2,000, 2,500 and 3,000")."""
    steps = sorted({int(s) for r in runs for s in midrun.reestimated_at_every_step(r)["step"]})
    if not steps:
        return "none logged"
    return ("step " if len(steps) == 1 else "steps ") + listed([f"{s:,}" for s in steps])


def report_text(runs: list[Run], reference: str | Path | None = None) -> str:
    """``map.md``: what the map is, the sentence (in its marked block), the table, the mechanism and the protocol's
    evidence."""
    frame = per_run(runs)
    points = per_point(frame)
    knobs = "; ".join(f"`task.{k.key}` on {TASK_WORDS[k.task]} ({k.property}): "
                      + ", ".join(f"{s:,g}" for s in k.settings) for k in KNOBS)
    scale = runs[0].scale
    out = ["# Where does the collapse live? The condition map\n",
           f"Generated by `python -m bnrotation.study.analysis.tables.map_report` from {count(len(runs), 'run')} "
           f"(`make map`; `bnrotation.study.condition_map`). Knobs: {knobs}; each task's own setting is its reference "
           f"point. Rows: SGD and Adam (the study's `sgd` and `adam`, their Fashion-MNIST twins on real images), "
           f"{scale['steps']:,} steps, checks every {scale['check_every']} steps from step {scale['check_start']:,} "
           f"on {scale['heldout_size']:,} held-out samples. Means ± sd over seeds; SGD and Adam paired by seed. "
           f"A run's *mode gap* is its training-mode accuracy minus its evaluation-mode accuracy (running "
           f"statistics) on the same held-out samples, averaged over the checks (the window, steps "
           f"{scale['check_start']:,}–{scale['steps']:,}); *re-estimation* recomputes the running statistics from "
           f"training batches (docs/PROTOCOL.md, 're-estimation', with the rules below).\n",
           f"<!-- generated by map_report: {SENTENCE_BLOCK} -->", where_sentence(points, frame), "<!-- end -->\n",
           *_partial(runs, points),
           "## The map\n", table_markdown(points, frame), "",
           f"Accuracies are in %, their differences (mode gaps, Adam − SGD, what re-estimation wins back) in "
           f"points; each ± is the sd over seeds, of the paired differences where the header says paired. "
           f"**Adam's collapse** is the sentence's rule: Adam − SGD at most "
           f"−{spread(COLLAPSE_FLOOR, 'pct', digits=0)}"
           f" and Adam − SGD mode gap at least {spread(COLLAPSE_FLOOR, 'pct', digits=0)}, each beyond {Z:g} "
           f"standard errors of the paired mean (one seed: the floor alone); **undecided** where both paired "
           f"differences are past the floor but one or both stay within {Z:g} standard errors (seeds that "
           f"disagree). **Both stale**: each optimizer's mode "
           f"gap at least {spread(COLLAPSE_FLOOR, 'pct', digits=0)} and beyond {Z:g} standard errors over its "
           f"seeds, whatever Adam − SGD. The re-estimation columns are measured at the steps where the runner "
           f"intervenes ({_steps_words(runs)}), not at every check, so they can exceed the mode gap, which averages "
           f"every check. The map's runs are a draw of their own, on another CPU than the committed runs "
           f"(`bnrotation.study.condition_map` says why), so its reference points need not repeat the committed "
           f"runs' first {scale['steps']:,} steps (\"Why {MAP_STEPS:,} steps\" sets them side by side).\n",
           "![The condition map](map.png)\n",
           "## The mechanism\n",
           "Per norm layer, the medians over channels and the window's logged steps of E and of its mean part |d| "
           "and variance part |log s| (`bnrotation.staleness.channel_signals`), means over seeds: d is the fresh "
           "mean's distance from the running mean and s the fresh σ over the running σ, so E, the error the running "
           "statistics make in evaluation mode, and |d| are in running σ, and |log s| has no unit. Each median is "
           "taken apart, so E is not rebuilt from the two beside it. Rotation: the median channel's angle per 100 "
           "steps of the last conv layer, averaged over the window; norm growth: that layer's weight norm at the "
           "last step over its first; the training loss at the last check.\n",
           mechanism_markdown(points, frame), ""]
    evidence = protocol_evidence(reference) if reference else ""
    if evidence:
        out += [f"## Why {MAP_STEPS:,} steps\n",
                f"The committed runs at the article's protocol (`{reference}`; not the map's own), their checks up to "
                f"step {MAP_STEPS:,} against the whole window:\n", evidence, ""]
        draws = draw_comparison(reference, points)
        if draws:
            out += [draws, ""]
        out += cost_of_staleness(reference)
    out += ["## What a run costs\n", cost_markdown(runs), ""]
    return "\n".join(out) + "\n"


def cost_of_staleness(reference: str | Path) -> list[str]:
    """map.md's section on what stale statistics cost, layer by layer (:mod:`.sensitivity`), from the committed runs
    under ``reference`` over the map's window and every seed that has it: the map's own reference points are one
    draw of three seeds, these the most seeds that share the window. Empty without those runs."""
    runs, _ = sensitivity.load_reference(reference)
    table = sensitivity.sensitivity_table(runs)
    if table.empty:
        return []
    return ["## What stale statistics cost, layer by layer\n",
            f"The committed runs at the article's protocol (`{reference}`), steps {sensitivity.WINDOW[0]:,}–"
            f"{sensitivity.WINDOW[1]:,}, every seed (tables/sensitivity.py defines E, the cost and the points per "
            "unit of E).\n", sensitivity.sentence(table) + "\n", sensitivity.markdown(table), ""]


def cost_markdown(runs: list[Run]) -> str:
    """What a map run costs, from each ``run.json``: per task, the median and range of ``wall_seconds`` over the
    runs that ran start to end in one process (a resumed run's wall time is not one run's), with the share of it
    spent training (``timings_s``) and the threads each used; then the runs still to come
    (each task's points × rows × seeds, less those in) at its task's median, in hours one at a time."""
    lines = ["| Task | Runs timed (not resumed) | Wall time per run, median (range) | Training's share | Threads |",
             "|---|---:|---:|---:|---:|"]
    medians = {}
    for task in TASKS:
        timed = [r.info for r in runs if r.task == task and not r.info.get("resumes")
                 and isinstance(r.info.get("wall_seconds"), (int, float))]
        if not timed:
            continue
        wall = np.array([float(i["wall_seconds"]) for i in timed])
        train = np.array([float((i.get("timings_s") or {}).get("train", math.nan)) for i in timed])
        medians[task] = float(np.median(wall))
        threads = sorted({str(i.get("threads", "?")) for i in timed})
        lines.append(f"| {TASK_WORDS[task]} | {len(timed)} | {medians[task]:,.0f} s ({wall.min():,.0f}–{wall.max():,.0f}"
                     f" s) | {cell(float(np.nanmedian(train / wall)), 'pct', digits=0)} | {', '.join(threads)} |")
    if not medians:
        return "No run here ran start to end in one process, so none is timed."
    wanted = {t: (1 + sum(len(k.settings) for k in KNOBS if k.task == t)) * len(OPTIMIZERS) * len(SEEDS)
              for t in TASKS}
    have = {t: sum(on_sweep(point_of(r)) and r.task == t for r in runs) for t in TASKS}
    left = sum(wanted.values()) - sum(have.values())
    typical = float(np.median(list(medians.values())))
    hours = sum((wanted[t] - have[t]) * medians.get(t, typical) for t in TASKS) / 3600
    tail = (f"{count(left, 'run')} still to come: about {hours:.1f} hours at each task's median, one at a "
            f"time (`make map JOBS=2` runs two at once, on two cores about half that)." if left > 0
            else "Every run of the map is in.")
    return "\n".join(lines) + f"\n\nWall time includes the checks, probes and interventions. {tail}"


# ----------------------------------------------------------------------------- the figure
def axis_position(knob: Knob, task: str, frame: pd.DataFrame, setting: float | None) -> float:
    """A setting's place on ``knob``'s axis; the task's own (``setting`` None) at its default, or for
    ``train_size`` at the size its reference runs read back (fresh samples: beyond the largest, at 4×)."""
    if setting is not None:
        return setting
    if knob.key != "train_size":
        return float(knob.reference)
    size = _own_train_set(task, frame)
    return 4 * max(knob.settings) if math.isinf(size) else size


def _own_train_set(task: str, frame: pd.DataFrame) -> float:
    """The distinct training samples of ``task``'s reference runs as ``run.json`` reads them back (inf: fresh
    samples at every draw); NaN without a reference run."""
    ref = frame[(frame["task"] == task) & frame["knob"].isna()]["train_set"]
    return float(ref.iloc[0]) if len(ref) else math.nan


def figure(points: list[PointStats], frame: pd.DataFrame, path: Path) -> Path:
    """``path`` (``.png``, and its ``.pdf`` twin): one column per knob; on top Adam's evaluation-mode accuracy minus
    SGD's, below each optimizer's mode gap, along the knob (mean ± sd over seeds), the knob's own task's reference
    point marked with a star, and both tasks' reference values as horizontal lines (templates dotted, Fashion-MNIST
    dashed; below, one per optimizer in its colour), each in the panel's legend; its title says how many of the
    map's runs it draws while the map is partial (:func:`complete`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .figures import apply_style, save

    apply_style()
    refs = {p.point.task: p for p in points if p.point.knob is None}
    styles = {"noisy_templates": ":", "fashion_mnist": "--"}
    fig, axes = plt.subplots(2, len(KNOBS), figsize=(3.2 * len(KNOBS), 5.6), constrained_layout=True, squeeze=False,
                             sharex="col")
    colours = {"sgd": ROWS["sgd"].colour, "adam": ROWS["adam"].colour}
    for j, knob in enumerate(KNOBS):
        top, bottom = axes[0, j], axes[1, j]
        if j == 0:
            top.set_ylabel("Adam − SGD, eval.-mode accuracy\n(points; below 0: Adam worse)")
            bottom.set_ylabel("mode gap,\ntraining − eval. (points)")
        mine = [p for p in points if p.point.knob == knob.name]
        own = refs.get(knob.task)
        along = ([(own, axis_position(knob, knob.task, frame, None))] if own else []) + \
            [(p, axis_position(knob, knob.task, frame, p.point.setting)) for p in mine]
        along.sort(key=lambda t: t[1])
        xs = [x for _, x in along]
        if not xs:  # a map half run: this knob has no finished run yet
            for ax in (top, bottom):
                ax.text(0.5, 0.5, "no finished run yet", ha="center", va="center", transform=ax.transAxes,
                        fontsize=8, color="grey")
                ax.set_xticks([])
                ax.set_yticks([])
            top.set_title(f"{TASK_WORDS[knob.task]}: {knob.key}", fontsize=9)
            bottom.set_xlabel(f"task.{knob.key}" + (f" ({knob.unit})" if knob.unit else ""))
            continue
        top.errorbar(xs, [-100 * p.deficit.mean for p, _ in along], yerr=[100 * p.deficit.sd for p, _ in along],
                     color=colours["adam"], marker="o", capsize=2, label="Adam − SGD")
        for o in OPTIMIZERS:
            bottom.errorbar(xs, [100 * getattr(p, o)["mode_gap"].mean for p, _ in along],
                            yerr=[100 * getattr(p, o)["mode_gap"].sd for p, _ in along], color=colours[o],
                            marker="o", capsize=2, label=f"{OPTIMIZER_WORDS[o]} mode gap")
        if own:
            x = axis_position(knob, knob.task, frame, None)
            top.plot([x], [-100 * own.deficit.mean], marker="*", ms=13, color="black", ls="none",
                     label=f"{TASK_WORDS[knob.task]}: its own setting")
            for o in OPTIMIZERS:
                bottom.plot([x], [100 * getattr(own, o)["mode_gap"].mean], marker="*", ms=13, color="black", ls="none")
        for task, ref in refs.items():
            top.axhline(-100 * ref.deficit.mean, ls=styles.get(task, "-"), lw=0.8, color="grey",
                        label=f"{TASK_WORDS[task]} reference")
            for o in OPTIMIZERS:
                bottom.axhline(100 * getattr(ref, o)["mode_gap"].mean, ls=styles.get(task, "-"), lw=0.8,
                               color=colours[o], alpha=0.6,
                               label=f"{TASK_WORDS[task]} reference, {OPTIMIZER_WORDS[o]}")
        if knob.key == "train_size":
            fresh = own is not None and math.isinf(_own_train_set(knob.task, frame))  # labelled ∞
            ticks = sorted(set(knob.settings) | ({axis_position(knob, knob.task, frame, None)} if own else set()))
            labels = ["∞ (fresh)" if fresh and t > max(knob.settings) else f"{t:,g}" for t in ticks]
            for ax in (top, bottom):
                ax.set_xscale("log")
                ax.set_xlim(min(xs) / 1.6, max(xs) * 1.6)  # set, not read from the data: a half-run map's may be NaN
                ax.set_xticks(ticks, labels, fontsize=7)
                ax.minorticks_off()
        top.axhline(0, lw=0.5, color="black")
        top.axhline(-100 * COLLAPSE_FLOOR, lw=0.8, ls=(0, (1, 3)), color=colours["adam"],
                    label=f"collapse floor (−{spread(COLLAPSE_FLOOR, 'pct', digits=0)})")
        top.set_title(f"{TASK_WORDS[knob.task]}: {knob.key}", fontsize=9)
        bottom.set_xlabel(f"task.{knob.key}" + (f" ({knob.unit})" if knob.unit else ""))
        top.legend(fontsize=6)
        bottom.legend(fontsize=6)
    partial = "" if complete(points) else f" (partial: {len(frame)} of the map's {runs_in_map()} runs)"
    fig.suptitle(f"Where does the collapse live? Mean ± sd over seeds (map.md gives each point's n){partial}",
                 fontsize=10)
    save(fig, path.parent, path.stem)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """Write ``<results>/map.md`` and ``map.png`` (or under ``--out``) and say the sentence; ``--sentence`` prints
    :func:`headline` alone (nothing, exit 1, while the map is incomplete). Exit status as the module docstring
    says."""
    p = argparse.ArgumentParser(description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default="results/map", help="the map's results root, holding runs/map_<row>+.../")
    p.add_argument("--out", default=None, help="where to write map.md and map.png (default: the results root)")
    p.add_argument("--reference", default="results/reference",
                   help="the committed runs whose first checks justify the map's length (map.md's last section)")
    p.add_argument("--sentence", action="store_true", help="print the front page's sentence, or nothing (exit 1)")
    args = p.parse_args(argv)
    root = Path(args.results)
    if args.sentence:
        sentence = headline(root)
        if sentence:
            print(sentence)
        return 0 if sentence else 1
    runs, problems = load_map_runs(root)
    if say_refused(problems, runs, f"--results {root}: no finished map run (expected "
                                   "<root>/runs/map_<row>+<knob><setting>/seed=<s>/)"):
        return 2
    frame, out = per_run(runs), Path(args.out) if args.out else root
    records.atomic_write_text(out / "map.md", report_text(runs, args.reference))
    figure(per_point(frame), frame, out / "map.png")
    print(f"{where_sentence(per_point(frame), frame)}\nwrote {out / 'map.md'} and {out / 'map.png'} from "
          f"{count(len(runs), 'run')}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
