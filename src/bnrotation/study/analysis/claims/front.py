"""The README's first screen as five sections (no torch): the article's rows, the same rows on real images, where
the collapse lives on the condition map, the verdicts per section of ``claims.md``, and why fresh samples keep Adam
rotating (the data swap's mechanisms, :data:`.why.WHY_SECTION`).

Each table function reads what another module already computes: the rows from :func:`..tables.table.build_table`,
the map's points from :mod:`..tables.map_report` (its collapse, undecided and both-stale rules), the verdicts from
the weighed checks (:func:`.command.weigh`). None computes a figure a second way; :mod:`..report.section` rounds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pandas as pd

from ...condition_map import KNOBS, SEEDS
from ...rows import ARTICLE_ROWS, FASHION_MNIST_ROWS
from .evidence import Evidence
from .finding import TASK_ROWS, mode_gap
from .kinds import ARTICLE, FAIL, MEASURED, NOT_JUDGED, NOT_RUN, PASS, PRECONDITION_FAILED, Check, above
from .outofsample import SUPERSEDED
from .report import SECTIONS
from .why import WHY_SECTION
from ..results import Run, count
from ..tables import map_report
from ..tables.table import build_table, seeds_cell
from ..report.section import Column, Section

__all__ = ["ARTICLE_SECTION", "FRONT", "MAP_SECTION", "REAL_IMAGES_SECTION", "VERDICTS_SECTION", "collapse_by_knob",
           "collapsed", "opening", "row_table", "verdict_table"]

CHECKS_HEADING = "Checks"  # docs/PROTOCOL.md's headings that define the columns
MEASURED_HEADING = "Measured quantities"
FIXES_HEADING = "Diagnosis and fixes"
PUBLISHED_HEADING = "The published table (steps 2,000–6,000, 3 seeds)"
MAP_HEADING = "Task knobs: the condition map *(beyond the article: issue 49)*"
JUDGING_HEADING = "Judging a replication"


# ----------------------------------------------------------------------------- the article's rows
def row_table(runs: list[Run], rows: Sequence[str]) -> pd.DataFrame:
    """One line per row of ``rows`` that has runs, in ``rows``' order, from :func:`..tables.table.build_table`
    (means and sample standard deviations over the row's finished runs; a diverged run left out and counted):
    ``row`` (label and name), ``seeds`` (:func:`..tables.table.seeds_cell`, with the diverged seeds),
    ``acc_train_mode``, ``acc_eval_mode`` and their ``_sd``, ``acc_eval_mode_published``, ``mode_gap`` (training-
    minus evaluation-mode mean, from the unrounded means), ``acc_reestimated_final`` (NaN where the row logged no
    re-estimation), ``rotation_per_100_deg`` with ``_sd`` and ``_published``. Accuracies are fractions, rotation
    in degrees per 100 steps."""
    table = build_table(runs)
    keys = ["row", "seeds", "acc_train_mode", "acc_train_mode_sd", "acc_eval_mode", "acc_eval_mode_sd",
            "acc_eval_mode_published", "mode_gap", "acc_reestimated_final", "rotation_per_100_deg",
            "rotation_per_100_deg_sd", "rotation_per_100_deg_published"]
    if table.empty:
        return pd.DataFrame(columns=keys)
    table = table.set_index("row")
    lines = []
    for row in (r for r in rows if r in table.index):
        t = table.loc[row]
        diverged = f"; diverged: seed{'s' * int(t['diverged'] > 1)} {t['diverged_seeds']}" if t["diverged"] else ""
        lines.append({"row": f"{t['label']} (`{row}`)", "seeds": seeds_cell(t) + diverged,
                      **{f"{k}{suffix}": t[f"{k}{part}"] for k in ("acc_train_mode", "acc_eval_mode",
                                                                    "rotation_per_100_deg")
                         for suffix, part in (("", "_mean"), ("_sd", "_std"))},
                      "acc_eval_mode_published": t["acc_eval_mode_published"],
                      "mode_gap": t["acc_train_mode_mean"] - t["acc_eval_mode_mean"],
                      "acc_reestimated_final": t["acc_reestimated_final_mean"],
                      "rotation_per_100_deg_published": t["rotation_per_100_deg_published"]})
    return pd.DataFrame(lines, columns=keys)


ROW_COLUMNS = (
    Column("row", "Row", PUBLISHED_HEADING),
    Column("seeds", "Seeds (n)", MEASURED_HEADING),
    Column("acc_train_mode", "Training mode", CHECKS_HEADING, "pct", 1, sd="acc_train_mode_sd"),
    Column("acc_eval_mode", "Evaluation mode", CHECKS_HEADING, "pct", 1, sd="acc_eval_mode_sd"),
    Column("acc_eval_mode_published", "Published", PUBLISHED_HEADING, "pct", 1),
    Column("mode_gap", "Mode gap", MEASURED_HEADING, "pct", 1, difference=True),
    Column("acc_reestimated_final", "Re-estimated", FIXES_HEADING, "pct", 1),
    Column("rotation_per_100_deg", "Rotation per 100 steps", MEASURED_HEADING, "deg", 2,
           sd="rotation_per_100_deg_sd"),
    Column("rotation_per_100_deg_published", "Published rotation", PUBLISHED_HEADING, "deg", 2),
)

ARTICLE_SECTION = Section(
    "The article's rows", lambda runs: row_table(runs, ARTICLE_ROWS),
    "Noisy templates, the article's protocol: accuracies are means over the check window and seeds ± sd; "
    "re-estimated accuracy at the last step.", ROW_COLUMNS)
REAL_IMAGES_SECTION = Section(
    "The same rows on real images", lambda runs: row_table(runs, FASHION_MNIST_ROWS),
    "Fashion-MNIST, the same network and protocol; the article publishes no figure for it.", ROW_COLUMNS)


# ----------------------------------------------------------------------------- where the collapse lives
MARKS = ("collapse", "undecided", "both stale", "no", "pending")  # a setting's marks, one column each


def _marks(p: map_report.PointStats) -> list[str]:
    """A point's marks (:data:`MARKS`): ``collapse`` (:func:`..tables.map_report.collapses`), ``undecided``
    (:func:`..tables.map_report.undecided`), ``both stale`` (:func:`..tables.map_report.stale_for_both`, beside
    the collapse where both hold), ``no`` where none holds, ``pending`` where a row has no seed yet."""
    verdict = map_report.collapses(p)
    if verdict is None:
        return ["pending"]
    marks = ["collapse"] * bool(verdict) + ["undecided"] * map_report.undecided(p) \
        + ["both stale"] * bool(map_report.stale_for_both(p))
    return marks or ["no"]


def collapse_by_knob(frame: pd.DataFrame) -> pd.DataFrame:
    """One line per knob of :data:`bnrotation.study.condition_map.KNOBS` with a point among the map's runs
    (``frame``: :func:`..tables.map_report.per_run`; points off the sweep left out): ``task``, ``knob``, and per
    mark of :data:`MARKS` the settings so marked, ascending, the task's own as ``'<own> (own)'``. A setting with
    fewer finished seeds than the sweep runs reads ``'0.3 (2 of 3 seeds)'``."""
    columns = ["task", "knob", *MARKS]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    points = map_report.sweep_points(map_report.per_point(frame))
    lines = []
    for knob in KNOBS:
        here = [p for p in points if p.point.knob == knob.name]
        if not here:
            continue
        own = [p for p in points if p.point.task == knob.task and p.point.knob is None]
        placed = sorted([(map_report.axis_position(knob, knob.task, frame, None), f"{knob.own} (own)", p) for p in own]
                        + [(p.point.setting, f"{p.point.setting:,g}", p) for p in here], key=lambda t: t[0])
        line = {"task": map_report.TASK_WORDS[knob.task], "knob": knob.key.replace("_", " ")} | {m: [] for m in MARKS}
        for _, words, p in placed:
            short = map_report.seeds_in(p) < len(SEEDS)
            words += f" ({map_report.seeds_in(p)} of {len(SEEDS)} seeds)" if short else ""
            for mark in _marks(p):
                line[mark].append(words)
        lines.append({k: ", ".join(v) if isinstance(v, list) else v for k, v in line.items()})
    return pd.DataFrame(lines, columns=columns)


def _map_table(root) -> pd.DataFrame:
    """:func:`collapse_by_knob` of the map's runs under ``root`` (:func:`..tables.map_report.load_map_runs`)."""
    runs, _ = map_report.load_map_runs(root)
    return collapse_by_knob(map_report.per_run(runs) if runs else pd.DataFrame())


MAP_SECTION = Section(
    "Where the collapse lives", _map_table,
    "The condition map turns one property of one task at a time; each setting is marked by the map's rules, SGD "
    "and Adam paired by seed.",
    (Column("task", "Task", MAP_HEADING), Column("knob", "Knob", MAP_HEADING),
     *(Column(mark, mark.capitalize(), MAP_HEADING) for mark in MARKS)))


# ----------------------------------------------------------------------------- the verdicts
VERDICT_WORDS = (PASS, FAIL, NOT_RUN, PRECONDITION_FAILED, MEASURED, NOT_JUDGED)
SUPERSEDED_WORD = "superseded"
TABLE_CELLS_SECTION = "The article's table, cell by cell"


def _counts(title: str, checks: Iterable[Check]) -> dict:
    """One line of :func:`verdict_table`: how many of ``checks`` have each verdict, a superseded check
    (:data:`.outofsample.SUPERSEDED`) counted as superseded and under no verdict."""
    checks = list(checks)
    current = [c for c in checks if c.name not in SUPERSEDED]
    return {"section": title, **{v: sum(c.verdict == v for c in current) for v in VERDICT_WORDS},
            SUPERSEDED_WORD: len(checks) - len(current)}


def verdict_table(checks: list[Check], cells: list[tuple[str, str, Check]]) -> pd.DataFrame:
    """One line per section of ``claims.md`` with a check: the article's claims, its table cell by cell (``cells``,
    where any), then each section of :data:`.report.SECTIONS`; per verdict of :data:`VERDICT_WORDS` the
    count of its checks, and ``superseded``, the checks a later one replaces, counted there alone."""
    lines = [_counts("The article's claims", (c for c in checks if c.section == ARTICLE))]
    if cells:
        lines.append(_counts(TABLE_CELLS_SECTION, (c for _, _, c in cells)))
    lines += [_counts(SECTIONS[s][0], these) for s in SECTIONS if (these := [c for c in checks if c.section == s])]
    return pd.DataFrame(lines, columns=["section", *VERDICT_WORDS, SUPERSEDED_WORD])


VERDICTS_SECTION = Section(
    "The verdicts", verdict_table,
    "Each claim of claims.md, counted by verdict in its section; a superseded claim, scored the old way, counts "
    "under superseded alone.",
    (Column("section", "Section", JUDGING_HEADING),
     *(Column(v, v, JUDGING_HEADING, "count") for v in (*VERDICT_WORDS, SUPERSEDED_WORD))))

FRONT = (ARTICLE_SECTION, REAL_IMAGES_SECTION, MAP_SECTION, VERDICTS_SECTION, WHY_SECTION)  # the first screen, in order


# ----------------------------------------------------------------------------- the opening sentence
def collapsed(ev: Evidence, task: str) -> bool | None:
    """Whether Adam's evaluation mode collapsed on ``task`` (a key of :data:`.finding.TASK_ROWS`) at the
    article's settings: its mode gap (:func:`.finding.mode_gap`) above SGD's by at least
    :data:`..tables.map_report.COLLAPSE_FLOOR` and by more than :data:`..stats.Z` standard errors of the
    difference (:func:`.kinds.above`); None without runs of both rows."""
    adam, sgd, _ = TASK_ROWS[task]
    if not (ev.has(adam) and ev.has(sgd)):
        return None
    gap, sgd_gap = mode_gap(ev, adam), mode_gap(ev, sgd)
    return gap.mean - sgd_gap.mean >= map_report.COLLAPSE_FLOOR and above(gap, sgd_gap)[0]


def opening(ev: Evidence, map_root) -> str:
    """The README's second sentence, from the runs: how many runs, on which tasks Adam's evaluation mode collapsed
    at the article's settings (:func:`collapsed`), and at how many of the condition map's points under
    ``map_root`` the map's rule finds it (:func:`..tables.map_report.collapses`; once every point has every seed)."""
    verdict = {task: collapsed(ev, task) for task in TASK_ROWS}
    yes = [map_report.TASK_WORDS[t] for t, v in verdict.items() if v]
    no = [map_report.TASK_WORDS[t] for t, v in verdict.items() if v is False]
    text = (f"In {count(len(ev.runs), 'run')}, Adam's evaluation mode collapsed "
            + (f"on {' and '.join(yes)}" if yes else "on no task") + " at the article's settings"
            + (f", not on {' or '.join(no)}" if no and yes else ""))
    runs, problems = map_report.load_map_runs(map_root)
    points = map_report.per_point(map_report.per_run(runs)) if runs and not problems else []
    if not points or not map_report.complete(points):
        return text + "; the condition map is not complete yet."
    swept = map_report.sweep_points(points)
    found = [p for p in swept if map_report.collapses(p)]
    tasks = {map_report.TASK_WORDS[p.point.task] for p in found}
    where = f", all on {tasks.pop()}" if len(tasks) == 1 else ""
    return text + f"; on the condition map, at {len(found)} of {len(swept)} points{where}."
