"""The condition map (issue 49): where between the template task and real images does Adam's collapse live?

On the templates (:class:`.task.NoisyTemplates`) Adam's evaluation-mode accuracy collapses while SGD's holds; on
Fashion-MNIST (:class:`.task.FashionMNIST`) at the same protocol it does not. The map moves one property of one task
at a time towards the other, each a key of the task's config (:data:`.config.TASK_KNOBS`), and trains the study's
``sgd`` and ``adam`` rows (their Fashion-MNIST twins on real images) at every setting:

* ``task.template_scale`` on the templates: the inputs' signal-to-noise ratio (a sample is
  ``template_scale · template[y] + N(0, 1)``);
* ``task.train_size`` on the templates: a finite training set of N samples drawn once, against a fresh sample at
  every draw (the templates' infinite set);
* ``task.pixel_noise`` on Fashion-MNIST: fresh isotropic Gaussian noise on every image of every draw, as the
  templates have;
* ``task.train_size`` on Fashion-MNIST: N of its 60,000 training images, memorised sooner;
* ``task.num_classes`` on the templates: the number of classes (10 in both tasks, so it cannot tell them apart, but
  it may move the collapse: more classes, finer margins).

Every other setting is the row's own. Each task's own setting of every knob (its default, :class:`.config.TaskConfig`)
is its reference point, run at the map's protocol too, so that both tasks' reference points are measured beside the
map. This module is torch-free: it holds the knobs, the map's protocol and the sweep (``python -m
bnrotation.study.condition_map`` prints it, one Hydra multirun a line; ``make map`` runs them); the runs are the
suite's runner's (``experiments/train.py``), the report :mod:`.analysis.tables.map_report`'s.

**The protocol** (:data:`PROTOCOL`): the article's, cut at :data:`MAP_STEPS` steps, checks every 100 steps from
step 2,000 (11 checks), without weight averaging (it feeds nothing back into training: a third of a run's time).
The committed reference runs justify the cut: over their first 11
checks (steps 2,000-3,000) Adam's mode gap on the templates is already many times SGD's, with a share of checks below
90% far above SGD's, at about half the depth it reaches by step 6,000, while on Fashion-MNIST both rows' mode gaps are
within a point of their whole window's; ``map.md`` recomputes these figures from the committed runs
(:func:`.analysis.tables.map_report.protocol_evidence`). A row's first 3,000 steps are the same computation at either
length (constant schedules, and nothing measured feeds back): on one machine, a run of 200 steps logs the same
weights, bit for bit, as the map's run of 3,000 does at steps 100 and 200. Across machines they are not: the map's
reference runs were trained on another CPU than the committed runs (``results/kernel-paths``), and their trajectories
part within the first 100 steps, so they are another draw of the same seeds (Adam's evaluation mode at a given check
can differ by tens of points), to be compared with the committed runs through the spread over seeds, not check by
check.

**A run's name** is ``map_<row>+<knob><setting>`` (``map_adam+template_scale0.3``, ``map_fmnist_sgd+pixel_noise2.0``)
or ``map_<row>+reference``, ``<row>`` the registered row whose settings it keeps (:data:`.rows.ROWS`): a setting is
filed apart from the row itself, and the report reads the base row back from the name (:func:`base_row`) to check
each run against it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .config import TASK_KNOBS, TaskConfig
from .fashion_mnist import OFFICIAL_COUNTS
from .rows import FASHION_MNIST_PREFIX, SEEDS, TASKS

__all__ = ["Knob", "KNOBS", "REFERENCE", "MAP_PREFIX", "MAP_STEPS", "PROTOCOL", "OPTIMIZERS", "ROOT", "base_row",
           "map_row", "reference_line", "runs_in_map", "sweep_lines", "main"]

MAP_PREFIX = "map_"  # every map run's row name starts so
REFERENCE = "reference"  # the row-name suffix of a task's reference point (every knob at the task's default)
MAP_STEPS = 3000  # the map's runs: the article's protocol cut here (the module docstring says why)
# The map's protocol, as the overrides every line of the sweep carries (scale.name says it is not the article's).
PROTOCOL = ("scale.name=map", f"scale.steps={MAP_STEPS}", "averaging.enabled=false")
OPTIMIZERS = ("sgd", "adam")  # the study's rows of these names (and their Fashion-MNIST twins) at every point
ROOT = "map"  # the committed runs: results/reference/map/runs/<row>/seed=<s>/


@dataclass(frozen=True)
class Knob:
    """One property of one task, turned by one key of the task's config.

    ``key`` is the key under ``task.`` (one of :data:`.config.TASK_KNOBS`), ``task`` the task it turns
    (``task.name``), ``settings`` the map's settings other than the task's own (its reference), ``property`` what the
    knob stands for, in words, and ``unit`` how a setting is written (``""``: as it is)."""

    key: str
    task: str
    settings: tuple[float | int, ...]
    property: str
    unit: str = ""

    def __post_init__(self) -> None:
        if self.key not in TASK_KNOBS:
            raise ValueError(f"{self.key!r} is not a task knob; expected one of {', '.join(TASK_KNOBS)}")

    @property
    def name(self) -> str:
        """``<task>.<key>``: the knob's one name in the report and the claims (``fashion_mnist.train_size``)."""
        return f"{self.task}.{self.key}"

    @property
    def reference(self) -> float | int:
        """The task's own setting: the default of ``task.<key>`` (:class:`.config.TaskConfig`)."""
        return getattr(TaskConfig(name=self.task), self.key)

    @property
    def own(self) -> str:
        """The task's own setting in words: the default, or for ``train_size`` (whose default 0 means the task's
        own set) the set it means: fresh samples (the templates), every training image (Fashion-MNIST)."""
        if self.key != "train_size":
            return f"{self.reference:,g}"
        return ("fresh samples at every draw" if self.task == "noisy_templates"
                else f"all {OFFICIAL_COUNTS['train']:,} images")

    def line(self) -> str:
        """This knob's Hydra multirun: the two rows, every setting, every seed, each run under its own name."""
        return " ".join((_experiments(self.task), f"task.{self.key}={','.join(map(str, self.settings))}",
                         f"row={_row_prefix(self.task)}+{self.key}${{task.{self.key}}}", *_common()))


KNOBS = (
    Knob("template_scale", "noisy_templates", (0.15, 0.3, 1.2), "the inputs' signal-to-noise ratio"),
    Knob("train_size", "noisy_templates", (1000, 4000, 16000),
         "a finite training set, drawn once (the templates' own is infinite: fresh noise in every batch)", "samples"),
    Knob("pixel_noise", "fashion_mnist", (0.5, 1.0, 2.0), "fresh isotropic input noise in every batch",
         "pixel σ"),
    Knob("train_size", "fashion_mnist", (1000, 4000, 16000),
         "a smaller training set, memorised sooner (Fashion-MNIST's own has 60,000 images)", "images"),
    Knob("num_classes", "noisy_templates", (2, 5, 20), "the number of classes (10 in both tasks)", "classes"),
)


def _row_prefix(task: str) -> str:
    """``map_${optimizer.name}`` (the templates) or ``map_fmnist_${optimizer.name}``: the row name's start, which
    Hydra resolves per run."""
    return MAP_PREFIX + (FASHION_MNIST_PREFIX if task == "fashion_mnist" else "") + "${optimizer.name}"


def _experiments(task: str) -> str:
    """``experiment=sgd,adam`` or ``experiment=fmnist_sgd,fmnist_adam``: the registered rows the map runs on
    ``task``."""
    prefix = FASHION_MNIST_PREFIX if task == "fashion_mnist" else ""
    return "experiment=" + ",".join(prefix + o for o in OPTIMIZERS)


def _common() -> tuple[str, ...]:
    return (f"seed={','.join(map(str, SEEDS))}", *PROTOCOL)


def reference_line(task: str) -> str:
    """The Hydra multirun of ``task``'s reference point: the two rows at every knob's default."""
    return " ".join((_experiments(task), f"row={_row_prefix(task)}+{REFERENCE}", *_common()))


def sweep_lines() -> list[str]:
    """The whole map, one Hydra multirun of ``experiments/train.py`` a line (``make map`` runs them in turn): each
    task's reference point, then every knob's settings (:data:`KNOBS`)."""
    return [reference_line(task) for task in TASKS] + [k.line() for k in KNOBS]


def runs_in_map() -> int:
    """How many runs the map holds: (each task's reference point + every knob's settings) × rows × seeds."""
    points = len(TASKS) + sum(len(k.settings) for k in KNOBS)
    return points * len(OPTIMIZERS) * len(SEEDS)


def map_row(base: str, knob: Knob | None = None, setting: float | int | None = None) -> str:
    """A map run's row name: ``map_<base>+<key><setting>``, or ``map_<base>+reference`` without a knob (as the
    sweep's interpolation writes it: a setting as Python prints it, ``0.3``, ``1000``)."""
    return f"{MAP_PREFIX}{base}+{REFERENCE if knob is None else f'{knob.key}{setting}'}"


def base_row(row: str) -> str:
    """The registered row a map run keeps the settings of: ``map_fmnist_adam+pixel_noise2.0`` -> ``fmnist_adam``.

    Raises:
        ValueError: for a name that is not a map run's (:data:`MAP_PREFIX` ... ``+`` ...).
    """
    if not row.startswith(MAP_PREFIX) or "+" not in row:
        raise ValueError(f"{row!r} is not a condition-map run's row name (map_<row>+<knob><setting>)")
    return row[len(MAP_PREFIX):].split("+", 1)[0]


def main(argv: list[str]) -> int:
    """``python -m bnrotation.study.condition_map`` prints :func:`sweep_lines`; ``--count`` the number of runs."""
    if argv == ["--count"]:
        print(runs_in_map())
    elif not argv:
        print("\n".join(sweep_lines()))
    else:
        print("usage: python -m bnrotation.study.condition_map [--count]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
