"""The finding, one sentence per task, said the same wherever it is shown (no torch).

:func:`finding` writes it from the runs: the console's last lines (:func:`.command.console_summary`), ``claims.md``
(:func:`.report.to_markdown`), docs/results.md's headline (:func:`.command.results_blocks`) and the write-up page's
first paragraph (:mod:`..webpage`) all print its sentences, so that no two of them can rank the rows differently.
"""

from __future__ import annotations

from ...rows import ROWS, TASKS
from ..formatting import cell
from ..measures import metrics
from ..results import count
from ..stats import SeedStat
from . import real_images
from .evidence import Evidence
from .kinds import above
from .real_images import EDGE, RECOVERY_MARGIN
from .registry import ACC, ADAM, SGD, WINDOW

TEMPLATES = "noisy_templates"  # the article's task (a key of rows.TASKS)
# Each task as the finding names it, and its Adam, SGD and window-test rows.
WHERE = {TEMPLATES: f"the synthetic task ({TASKS[TEMPLATES]})", "fashion_mnist": f"{real_images.NAME} (real images)"}
TASK_ROWS = {TEMPLATES: (ADAM, SGD, WINDOW),
             "fashion_mnist": (real_images.F_ADAM, real_images.F_SGD, real_images.F_WINDOW)}


def mode_gap(ev: Evidence, row: str) -> SeedStat:
    """Per seed, ``row``'s training-mode minus evaluation-mode accuracy, each the mean of the run's checks in the
    window (fraction; a positive gap: evaluation mode trails)."""
    g = ev.per_run[ev.per_run["row"] == row].sort_values("seed")
    return SeedStat.of(g["acc_train_mode"] - g["acc_eval_mode"], g["seed"])


def _loss(ev: Evidence, row: str) -> str:
    """``row``'s fall from training to evaluation mode as the finding says it: ``'4.5 points, from training mode's
    90.0% to evaluation mode's 85.5% ± 0.4 points (n = 3 seeds)'``. The points are the difference of the two percentages as shown (one
    decimal each), so that the sentence's own numbers add up."""
    train, evaluation = ev.stat(row, "acc_train_mode").mean, ev.stat(row, ACC)
    points = round(train * 100, 1) - round(evaluation.mean * 100, 1)
    return (f"{points:.1f} points, from training mode's {cell(train, 'pct')} to evaluation mode's "
            f"{evaluation.describe('pct')}")


def _label(task: str, row: str) -> str:
    """The row's label, without the task's name where the sentence has already said it (``Fashion-MNIST, Adam, lr
    3e-3`` -> ``Adam, lr 3e-3``)."""
    return ROWS[row].label if task == TEMPLATES else ROWS[row].label.split(", ", 1)[1]


def finding(ev: Evidence, task: str = TEMPLATES) -> str:
    """The finding on ``task`` (a key of :data:`TASK_ROWS`) in one sentence, the same wherever it
    is shown (the console's last lines, ``claims.md``, docs/results.md's headline, the write-up page):
    the task's Adam row (lr 3e-3) loses so many points from training to evaluation mode (means over its checks
    and seeds, evaluation mode ± the sample standard deviation over seeds, with n), down to its lowest check
    (seed and step); the SGD row's loss beside it, "as much" unless the two differ by more than :data:`.kinds.Z`
    standard errors (:func:`.kinds.above`, over the per-seed gaps of :func:`mode_gap`); the window test's where it
    ran; and where the rows logged interventions, their accuracy after re-estimation at the last step, which
    "brings both back" where each is within :data:`.real_images.RECOVERY_MARGIN` of its training mode. Empty without
    runs of the task's Adam row."""
    adam, sgd, window = TASK_ROWS[task]
    runs = ev.runs_of(adam)
    if not runs:
        return ""
    checks = metrics.tidy(runs, "checks").query("in_window")
    lowest = checks.loc[checks[ACC].idxmin()]
    seed = f"seed {lowest['seed']}, " if len(runs) > 1 else ""
    gap = mode_gap(ev, adam)
    text = (f"On {WHERE[task]}, {_label(task, adam)} (`{adam}`) loses {_loss(ev, adam)}, down to "
            f"{cell(float(lowest[ACC]), 'pct')} at one check ({seed}step {int(lowest['step']):,})")
    others = []
    if ev.has(sgd):
        sgd_gap = mode_gap(ev, sgd)
        word = "less" if above(gap, sgd_gap)[0] else "more" if above(sgd_gap, gap)[0] else "as much"
        others.append(f"{_label(task, sgd)} (`{sgd}`) loses {word}, {_loss(ev, sgd)}")
    if ev.has(window):
        others.append(f"the window test (`{window}`, running statistics that forget faster) "
                      f"loses {_loss(ev, window)}")
    if others:
        text += "; " + ", and ".join(others)
    rows = [r for r in (adam, sgd) if ev.has(r) and ev.stat(r, "acc_reestimated_final").n]
    if rows:
        after = [ev.stat(r, "acc_reestimated_final").mean for r in rows]
        back = all(a >= ev.stat(r, "acc_train_mode").mean - RECOVERY_MARGIN - EDGE for r, a in zip(rows, after))
        text += (f"; re-estimating the running statistics brings {'both' if len(rows) > 1 else 'it'} "
                 f"{'back ' if back else ''}to {' and '.join(cell(a, 'pct') for a in after)} at the last step")
    return text + "."


def findings(ev: Evidence) -> list[str]:
    """:func:`finding` on each task whose Adam row has runs, the templates first."""
    return [sentence for sentence in (finding(ev, task) for task in TASK_ROWS) if sentence]


def headline(ev: Evidence) -> str:
    """docs/results.md's headline and the write-up page's first paragraph: how many runs, then :func:`findings`, one
    sentence per task, and a sentence saying the real-image rows are not run yet while they have no runs."""
    sentences = findings(ev)
    if not finding(ev, "fashion_mnist"):
        sentences.append(f"The same rows on {real_images.NAME} (real images, rows `fmnist_*`) are not run yet.")
    return f"From {count(len(ev.runs), 'run')} under `{ev.root}`: " + " ".join(sentences)
