"""What each row of the study means, independently of the config files.

``conf/experiment/<row>.yaml`` says how to run a row; this registry says what
the row *is* (optimizer, learning rate, schedule, BatchNorm momentum, ...) and
what the article published for it. The table compares every run's read-back
``run.json`` with this registry (:func:`check_against_row`; the runner asks the
same before its first step), so a config edit that never reached the run
(the article's window-test mistake) cannot go unnoticed. A test checks that
every experiment file composes to the settings declared here.

No torch here: the analysis imports this module.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field

from .names import ARCH_CLASSES, OPTIMIZER_CLASSES, PROJECTION_MODES, SCHEDULE_CLASSES


@dataclass(frozen=True)
class Published:
    """One row of the article's table (steps 2,000-6,000, :data:`PUBLISHED_SEEDS` seeds). NaN where the
    article gives no figure. Its figures outside the table are :mod:`bnrotation.study.article`'s."""

    rotation_deg_per_100: float  # degrees per 100 steps
    norm_growth: float  # ||W(end)|| / ||W(0)||
    acc_eval_mode: float  # fraction, 0..1
    checks_below_90: float  # fraction of checks, 0..1


PUBLISHED_SEEDS = 3  # each published row is a mean over this many seeds
# Decimals the article's table prints each column with, in Published's units (0.306 = 30.6%: 3).
PUBLISHED_DECIMALS = {"rotation_deg_per_100": 2, "norm_growth": 2, "acc_eval_mode": 3, "checks_below_90": 2}


@dataclass(frozen=True)
class RowSpec:
    """The settings that define a row, as read back from the built objects."""

    label: str
    optimizer: str  # config name: sgd | adam | adamw | adam_projected | adamp
    lr: float
    schedule: str = "constant"
    bn_momentum: float = 0.03
    weight_decay: float = 0.0
    norm: str = "batch"  # batch | group | layer (model.norm)
    arch: str = "convnet"  # convnet | resnet20 (model.arch)
    task: str = "noisy_templates"  # noisy_templates | fashion_mnist (task.name)
    image_size: int = 32  # task.image_size its experiment file sets (a size, not checked against run.json)
    published: Published | None = None
    extra: dict = field(default_factory=dict)  # further optimizer param-group settings the row fixes
    colour: str | None = None  # the row's colour in every figure (hex); None: one is picked for it

    @property
    def short(self) -> str:
        """The optimizer's name as the label starts: ``Adam``, ``SGD``, ``AdamW``."""
        return self.label.split(",")[0]


# One colour per row (tab10 hues; grey is left for training mode): related rows far apart (Adam red, its window
# test pink, AdamW orange, projected Adam purple, official AdamP indigo).
ROWS: dict[str, RowSpec] = {
    "sgd": RowSpec("SGD, lr 0.05, momentum 0.9", "sgd", 0.05,
                   published=Published(0.46, 1.16, 0.992, 0.01), colour="#1f77b4"),
    "adam_lr3e-4": RowSpec("Adam, lr 3e-4", "adam", 3e-4,
                           published=Published(1.29, 1.11, 0.999, 0.01), colour="#17becf"),
    "adam_cosine": RowSpec("Adam, lr 3e-3, cosine decay to 0", "adam", 3e-3, schedule="cosine",
                           published=Published(1.78, 2.16, 0.967, 0.11), colour="#2ca02c"),
    "adamw": RowSpec("AdamW, lr 3e-3, decay 0.05", "adamw", 3e-3, weight_decay=0.05,
                     published=Published(5.65, 3.35, 0.826, 0.38), colour="#ff7f0e"),
    "adam": RowSpec("Adam, lr 3e-3", "adam", 3e-3,
                    published=Published(7.73, 5.96, 0.600, 0.71), colour="#d62728"),
    "adam_projected": RowSpec("Adam, lr 3e-3, radial part projected out", "adam_projected", 3e-3,
                              published=Published(24.29, 2.08, 0.306, 0.96), colour="#9467bd"),
    # Heo et al.'s published optimizer (arXiv:2006.08217), beside the study's always-projected variant:
    # projection only where |cos(grad, w)| < delta / sqrt(dim), no weight decay.
    "adamp": RowSpec("AdamP, lr 3e-3, delta 0.1, wd_ratio 0.1", "adamp", 3e-3,
                     extra={"delta": 0.1, "wd_ratio": 0.1}, colour="#393b79"),
    # The window test: the article gives rotation, accuracy and checks below 90%, not the norm.
    "adam_bn_m0.3": RowSpec("Adam, lr 3e-3, BatchNorm momentum 0.3", "adam", 3e-3, bn_momentum=0.3,
                            published=Published(6.94, float("nan"), 0.932, 0.18), colour="#e377c2"),
    # Beyond the article: norms without running statistics, so no train/eval difference to go stale.
    "adam_groupnorm": RowSpec("Adam, lr 3e-3, GroupNorm (8 groups)", "adam", 3e-3, norm="group",
                              colour="#bcbd22"),
    "adam_layernorm": RowSpec("Adam, lr 3e-3, LayerNorm (GroupNorm, 1 group)", "adam", 3e-3, norm="layer",
                              colour="#8c564b"),
    # Beyond the article: does it carry over to a residual network (ResNet-20 on 16x16 images)? Same colours as
    # the convnet's rows of the same optimizer, told apart by marker and line style in the figures.
    "resnet20_sgd": RowSpec("ResNet-20, SGD, lr 0.05, momentum 0.9", "sgd", 0.05, arch="resnet20", image_size=16,
                            colour="#1f77b4"),
    "resnet20_adam_cosine": RowSpec("ResNet-20, Adam, lr 3e-3, cosine decay to 0", "adam", 3e-3, schedule="cosine",
                                    arch="resnet20", image_size=16, colour="#2ca02c"),
    "resnet20_adamw": RowSpec("ResNet-20, AdamW, lr 3e-3, decay 0.05", "adamw", 3e-3, weight_decay=0.05,
                              arch="resnet20", image_size=16, colour="#ff7f0e"),
    "resnet20_adam": RowSpec("ResNet-20, Adam, lr 3e-3", "adam", 3e-3, arch="resnet20", image_size=16,
                             colour="#d62728"),
    "resnet20_adam_bn_m0.3": RowSpec("ResNet-20, Adam, lr 3e-3, BatchNorm momentum 0.3", "adam", 3e-3,
                                     bn_momentum=0.3, arch="resnet20", image_size=16, colour="#e377c2"),
}

# Rows of the article's table, in the article's order.
PUBLISHED_ROWS = ("sgd", "adam_lr3e-4", "adam_cosine", "adamw", "adam", "adam_projected")
# The article's table with its window test: the rows run again on real images.
ARTICLE_ROWS = (*PUBLISHED_ROWS, "adam_bn_m0.3")
# What a table's Task column calls each task (RowSpec.task, task.name), and the prefix of its rows' names.
TASKS = {"noisy_templates": "noisy templates", "fashion_mnist": "Fashion-MNIST"}
FASHION_MNIST_PREFIX = "fmnist_"


def on_fashion_mnist(row: str) -> str:
    """The name of ``row``'s twin on Fashion-MNIST (``adam`` -> ``fmnist_adam``)."""
    return FASHION_MNIST_PREFIX + row


# Beyond the article: the same rows on real images (Fashion-MNIST, 28x28 grey, the official split), each the
# synthetic row's twin in every setting but the task; the article's figures are the synthetic task's, so none.
ROWS.update({on_fashion_mnist(name): dataclasses.replace(
    ROWS[name], label=f"Fashion-MNIST, {ROWS[name].label}", task="fashion_mnist", image_size=28, published=None)
    for name in ARTICLE_ROWS})
# Every row of the default full sweep: the article's network on the templates (the ResNet-20 rows and the
# Fashion-MNIST rows are named sets of their own).
SWEEP_ROWS = tuple(name for name, spec in ROWS.items() if spec.arch == "convnet" and spec.task == "noisy_templates")
RESNET_ROWS = tuple(name for name, spec in ROWS.items() if spec.arch == "resnet20")
FASHION_MNIST_ROWS = tuple(name for name, spec in ROWS.items() if spec.task == "fashion_mnist")
# What a table's Network column and a figure's key call each network (RowSpec.arch, model.arch).
NETWORKS = {"convnet": "the study's ConvNet", "resnet20": "ResNet-20"}
SEEDS = (0, 1, 2)
# The rows the contested claims compare, run at seven more seeds; their dense windows measure drift below
# the 100-step log interval (start steps: early, middle and end of the check window). Weight averaging, the
# study network's open question answered by seeds 0-2, is off there: it would add a third to each run's time.
TEN_SEED_ROWS = ("sgd", "adam", "adamw", "adam_cosine")
DENSE_WINDOWS = (2000, 4000, 5800)


@dataclass(frozen=True)
class Sweep:
    """The rows, seeds and extra Hydra overrides of one `make sweep` (``scales``: the scales it is for)."""

    rows: tuple[str, ...]
    seeds: tuple[int, ...]
    overrides: tuple[str, ...] = ()
    scales: tuple[str, ...] = ("full", "quick", "smoke")


# `make sweep` per scale (the Makefile reads them: `python -m bnrotation.study.rows <scale>`). `quick` shows the
# headline contrast on a laptop CPU: SGD, Adam, and the window test, without weight averaging (a third of a
# run's time, and not the headline).
SWEEPS = {"full": Sweep(SWEEP_ROWS, SEEDS),
          "quick": Sweep(("sgd", "adam", "adam_bn_m0.3"), (0,), ("averaging.enabled=false",)),
          "smoke": Sweep(SWEEP_ROWS, (0,))}
# Named sets beyond the default sweep: `make sweep SET=<name>` (`python -m bnrotation.study.rows <scale> <name>`).
# Fashion-MNIST: the article's seven rows at three seeds without weight averaging (the study network's question,
# answered on the templates; a third of a run's time); `fashion_mnist_quick` is the quick look on it.
SETS = {"resnet": Sweep(RESNET_ROWS, SEEDS),
        "fashion_mnist": Sweep(FASHION_MNIST_ROWS, SEEDS, ("averaging.enabled=false",), ("full", "smoke")),
        "fashion_mnist_quick": Sweep(tuple(map(on_fashion_mnist, SWEEPS["quick"].rows)), SWEEPS["quick"].seeds,
                                     SWEEPS["quick"].overrides, ("quick",)),
        "ten_seeds": Sweep(TEN_SEED_ROWS, tuple(range(3, 10)),
                           (f"scale.dense_windows=[{','.join(map(str, DENSE_WINDOWS))}]", "averaging.enabled=false"),
                           ("full",))}


# The frozen-backbone experiment (bnrotation.study.frozen; `make frozen`): pre-trained with SGD as the `sgd` row, then every
# backbone parameter frozen and a new head fine-tuned on the task with noisier samples, in one of three BatchNorm
# modes. Not rows of the table: their runs live under a root of their own (FROZEN_ROOT) with tables of their own.
@dataclass(frozen=True)
class FrozenRow:
    """One BatchNorm mode of the frozen-backbone experiment."""

    label: str
    mode: str  # bn_train | norm_eval | reestimate (bnrotation.study.frozen.MODES)
    colour: str


FROZEN_ROWS: dict[str, FrozenRow] = {
    "frozen_bn_train": FrozenRow("Frozen backbone, BatchNorm in training mode", "bn_train", "#d62728"),
    "frozen_norm_eval": FrozenRow("Frozen backbone, BatchNorm in evaluation mode (norm_eval)", "norm_eval",
                                  "#1f77b4"),
    "frozen_reestimate": FrozenRow("Frozen backbone, statistics re-estimated on the new data", "reestimate",
                                   "#2ca02c"),
}
FROZEN_MODES = tuple(r.mode for r in FROZEN_ROWS.values())
FROZEN_SEEDS = SEEDS
FROZEN_ROOT = "frozen"  # the committed runs: results/reference/frozen/runs/<row>/seed=<s>/
# The tables a frozen-backbone run writes, each with the columns it must have (more may follow): the analysis's run
# reader refuses a run without them (bnrotation.study.analysis.results.FROZEN).
FROZEN_TABLES = {
    "accuracy": ("row", "seed", "step", "task", "acc_eval_mode", "acc_train_mode", "loss"),
    "statistics": ("row", "seed", "step", "norm_layer", "drift_sigma_per_100", "displacement_sigma",
                   "mean_displacement_sigma", "std_displacement_sigma"),
    "monitor": ("row", "seed", "step", "probe", "norm_layer", "stale", "mode_gap", "lag_median_abs_sigma"),
}


# The tables every zoo run (bnrotation.study.zoo) writes, with the runner's columns; `channels` is optional
# (channels=true): the analysis's run reader refuses a run without these (bnrotation.study.analysis.results.ZOO).
ZOO_REQUIRED = ("checks", "layers", "interventions")


def frozen_row(mode: str) -> str:
    """The row name of a frozen-backbone BatchNorm mode (:data:`FROZEN_ROWS`).

    Raises:
        KeyError: for a mode no row has.
    """
    for name, spec in FROZEN_ROWS.items():
        if spec.mode == mode:
            return name
    raise KeyError(f"no frozen-backbone row has mode {mode!r}; expected one of {', '.join(FROZEN_MODES)}")


def check_against_frozen_row(info: dict) -> list[str]:
    """What a frozen-backbone run's ``run.json`` says that contradicts its row (:data:`FROZEN_ROWS`): a row that
    is not one of them, or another BatchNorm mode than the row's.

    Returns:
        One line per contradiction; empty when the run is what its row says.
    """
    spec = FROZEN_ROWS.get(info.get("row"))
    if spec is None:
        return [f"row {info.get('row')!r} is not a frozen-backbone row ({', '.join(FROZEN_ROWS)})"]
    return [] if info.get("mode") == spec.mode else [f"mode {info.get('mode')!r}, the row means {spec.mode!r}"]


def network_label(arch: str) -> str:
    """The network ``arch`` (``model.arch``) names, in words (:data:`NETWORKS`); an unknown one as it is."""
    return NETWORKS.get(arch, arch)


def expected_seeds(row: str, scale: str = "full") -> tuple[int, ...]:
    """The seeds ``make sweep`` runs for ``row`` at ``scale``: those of the default sweep (:data:`SWEEPS`) and
    of every named set (:data:`SETS`) that holds the row at that scale, ascending (``sgd`` at full scale: 0-2
    from the default sweep and 3-9 from ``ten_seeds``). Empty for a row no sweep runs (a variant of one's
    own). A scale name :data:`SWEEPS` does not know counts as ``full``."""
    scale = scale if scale in SWEEPS else "full"
    sweeps = [SWEEPS[scale], *(s for s in SETS.values() if scale in s.scales)]
    return tuple(sorted({seed for s in sweeps if row in s.rows for seed in s.seeds}))


def row_order(name: str) -> tuple[int, str]:
    """Sort key: registry order first, unknown (user-made) rows after, by name."""
    names = list(ROWS)
    return (names.index(name), name) if name in ROWS else (len(names), name)


def check_against_row(info: dict, spec: RowSpec) -> list[str]:
    """What ``run.json`` (read back from the built objects) says that contradicts the row's meaning.

    Returns:
        One line per contradiction; empty when the run is what its row says.
    """
    unknown = [f"the row's {what} {name!r} has no entry in bnrotation/study/names.py {table_name} (known: "
               f"{', '.join(table)}); add the class it builds there"
               for what, name, table, table_name in (
                   ("optimizer", spec.optimizer, OPTIMIZER_CLASSES, "OPTIMIZER_CLASSES"),
                   ("schedule", spec.schedule, SCHEDULE_CLASSES, "SCHEDULE_CLASSES"))
               if name not in table]
    if unknown:
        return unknown
    problems = _against_optimizer(info, spec)
    modes = info.get("projection", {}).get("mode", [])
    want_modes = sorted(set(PROJECTION_MODES.get(spec.optimizer, ())))
    if sorted(modes) != want_modes:
        problems.append(f"projection modes {modes}, the row means {want_modes}")
    sched = info.get("schedule")
    got_sched = sched.get("class") if isinstance(sched, dict) else None
    if got_sched != SCHEDULE_CLASSES[spec.schedule]:
        problems.append(f"schedule {got_sched!r}, the row means {spec.schedule!r}")
    task = (info.get("task") or {}).get("name", "noisy_templates")  # absent from runs made before the second task
    if task != spec.task:
        problems.append(f"task {task!r}, the row means {spec.task!r}")
    model_class = info.get("model", {}).get("class")  # absent from runs made before the suite had two networks
    if model_class is not None and model_class != ARCH_CLASSES.get(spec.arch):
        problems.append(f"network {model_class!r}, the row means {ARCH_CLASSES.get(spec.arch)!r}")
    norms = info.get("norm_layers", {})
    if not norms:
        problems.append("no norm layer read back")
    for name, n in norms.items():
        if spec.norm == "batch":
            if n.get("class") != "BatchNorm2d":
                problems.append(f"{name} is {n.get('class')}, the row means BatchNorm2d")
            elif not math.isclose(float(n.get("momentum") or math.nan), spec.bn_momentum, rel_tol=1e-9):
                problems.append(f"{name} ran with BatchNorm momentum {n.get('momentum')}, "
                                f"the row means {spec.bn_momentum}")
        else:
            groups = {"group": 8, "layer": 1}[spec.norm]
            if n.get("class") != "GroupNorm" or n.get("num_groups") != groups:
                problems.append(f"{name} is {n.get('class')} with {n.get('num_groups')} groups, "
                                f"the row means GroupNorm with {groups}")
    return problems


def _against_optimizer(info: dict, spec: RowSpec) -> list[str]:
    """What ``run.json``'s optimizer (its class and every param group's settings) says against ``spec``'s: one line
    per contradiction. ``spec.optimizer`` must be a name of :data:`OPTIMIZER_CLASSES`."""
    problems = []
    opt = info.get("optimizer", {})
    want_cls = OPTIMIZER_CLASSES[spec.optimizer]
    if opt.get("class") != want_cls:
        problems.append(f"optimizer class {opt.get('class')!r}, the row means {want_cls!r}")
    for g in opt.get("param_groups", []):
        if not math.isclose(float(g.get("lr", math.nan)), spec.lr, rel_tol=1e-9):
            problems.append(f"learning rate {g.get('lr')} in group {g.get('name')!r}, the row means {spec.lr}")
        if not math.isclose(float(g.get("weight_decay", 0.0)), spec.weight_decay, rel_tol=1e-9, abs_tol=0.0):
            problems.append(f"weight decay {g.get('weight_decay')} in group {g.get('name')!r}, "
                            f"the row means {spec.weight_decay}")
        for key, want in spec.extra.items():  # e.g. AdamP's delta and wd_ratio
            got = g.get(key)
            if not isinstance(got, (int, float)) or not math.isclose(float(got), float(want), rel_tol=1e-9):
                problems.append(f"{key} {got!r} in group {g.get('name')!r}, the row means {want}")
    return problems


def check_against_zoo_row(info: dict) -> list[str]:
    """What a zoo run's ``run.json`` (:mod:`bnrotation.study.zoo`) says that contradicts its row
    ``<arch>-<optimizer>``: a row that is not the architecture and optimizer it names (``arch``,
    ``optimizer_name``), an optimizer that is not one of the study's rows, or one read back with other settings
    than that row's (class, learning rate, weight decay: the zoo trains with the study's ``sgd`` and ``adam``).

    Returns:
        One line per contradiction; empty when the run is what its row says.
    """
    arch, name = info.get("arch"), info.get("optimizer_name")
    if info.get("row") != f"{arch}-{name}":
        return [f"run.json says arch {arch!r} and optimizer {name!r}, which is not the row"]
    if name not in ROWS or ROWS[name].optimizer not in OPTIMIZER_CLASSES:
        return [f"optimizer {name!r} is not one of the study's rows"]
    return _against_optimizer(info, ROWS[name])


def main(argv: list[str]) -> int:
    """``python -m bnrotation.study.rows <scale> [<set>]`` prints the sweep's rows and seeds, comma-separated, then its
    extra overrides, for make; exit status 2 with a message naming the scale or set when it is unknown."""
    if not 1 <= len(argv) <= 2 or argv[0] not in SWEEPS or (len(argv) == 2 and argv[1] not in SETS):
        print(f"usage: python -m bnrotation.study.rows {{{'|'.join(SWEEPS)}}} [{'|'.join(SETS)}]; got {' '.join(argv)}",
              file=sys.stderr)
        return 2
    sweep = SETS[argv[1]] if len(argv) == 2 else SWEEPS[argv[0]]
    if argv[0] not in sweep.scales:
        print(f"SET={argv[1]} runs at SCALE={'|'.join(sweep.scales)} only, not {argv[0]}", file=sys.stderr)
        return 2
    print(",".join(sweep.rows), ",".join(map(str, sweep.seeds)), *sweep.overrides)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
