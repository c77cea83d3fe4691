"""The staleness zoo: timm architectures nobody here wrote, trained on Fashion-MNIST, with the monitor and the truth
at every check (issue 38, item 5).

One run is (architecture, optimizer, seed): a timm model built from code with random weights
(``timm.create_model(name, pretrained=False, in_chans=1, num_classes=10)``, its initialisation drawn from the run's
``init`` stream, :func:`.task.stream_seed`), with the model's own BatchNorm settings (timm's momentum 0.1, what a
practitioner gets), trained with SGD (momentum 0.9) or Adam at the study's learning rates (the ``sgd`` and ``adam``
rows of :data:`.rows.ROWS`: one place for them) on Fashion-MNIST (:class:`.task.FashionMNIST`). :data:`ARCHS` are
the BatchNorm architectures; :data:`CONTROL` is timm's resnet10t with GroupNorm (8 groups) in place of every
BatchNorm, which the monitor must refuse cleanly: the control trains and records its accuracies, and its
``run.json`` holds the monitor's one-line refusal.

**At every check** (step 0, every ``check_every`` steps and the last step):

* the monitor's record (:class:`.monitor.StalenessMonitor`, ``warn=False``) on the fixed probe set of training
  images: its ``checks`` line (the probe's training- and evaluation-mode accuracy, stored as
  ``probe_acc_train_mode`` and ``probe_acc_eval_mode``, ``mode_agreement``, ``mode_gap``, ``probe_size``), its
  ``layers`` table (every per-layer signal it records) and, with ``channels=true``, its ``channels`` table; the
  rule's verdict (``rule_stale``: the record's ``stale``; ``rule_flagged``: what it would announce, held back in
  the warm-up, ``warming_up``);
* evaluation- and training-mode accuracy on the held-out test images (:func:`.probes.accuracy`:
  ``acc_eval_mode``, ``acc_train_mode``);
* the truth: the running statistics re-estimated on a copy of the model (:func:`.bnstats.reestimate`, on
  ``reestimate_batches`` training batches from the run's ``reestimate`` stream) and the copy's evaluation-mode
  accuracy (``acc_eval_mode_reestimated``); ``recovered`` = that minus ``acc_eval_mode`` and ``stale`` =
  ``recovered >= stale_recovery`` (X, default :data:`STALE_RECOVERY`). The same two accuracies also go in an
  ``interventions`` table in the runner's layout (``none`` and ``reestimate``), so a reader of the runner's
  interventions reads the zoo's truth unchanged. The calibration rescores from the stored signals; the stored
  verdict is the rule of the code that ran.

**Channels.** The ``channels`` table is off by default (``channels=false``): it has one line per channel of every
BatchNorm layer per check, thousands to tens of thousands a check on these networks, so it would make the committed
zoo tens of times larger than the per-layer table, which already holds each layer's median and maximum of every
signal the monitor records. ``channels=true`` stores it (for a run looked at closely).

**The evaluation path.** ``evaluation_path=true`` has the monitor measure each layer's statistics with the network
upstream in evaluation mode too (:func:`.probes.evaluation_path_pass`), adding its ``eval_path_*`` columns to the
``layers`` table: the lag a layer meets at evaluation time beside its own. Off by default; the committed zoo ran
without it.

**Sizing** (the defaults below and in ``conf/zoo.yaml``): 16x16 images (Fashion-MNIST's 28x28 resized bilinearly
with antialiasing, :func:`.task._grey_images`), batches of 64, 1,200 steps and a check every 75 (17 checks a run,
for recall and lead time), so that the whole zoo (:func:`sweep_lists`) finishes in about 4 hours on 2 cores with 2
joblib workers of one thread each. :func:`costs` (``python -m bnrotation.study.zoo --costs``) measures what sets this: the
CPU seconds of a training step and of a check of each architecture at a given image and batch size
(``time.process_time`` of one thread: about a quiet core's wall time however loaded the machine is). On these small
networks, where a step is mostly per-layer overhead, a step and a check cost somewhat more at 28 pixels than at 16,
and a step about twice as much with batches of 128 as of 64; with the budget binding, the choice is batches of 64 and
16 pixels, to keep the steps: the staleness the zoo looks for builds over steps.

A run writes ``<results_root>/runs/<arch>-<optimizer>/seed=<s>/``: ``config.yaml``, ``run.json`` (what ran, read
back from the built objects: :func:`.provenance.describe_built`; the monitor's pairing or refusal; wall and CPU time;
status), ``checks.parquet``, ``layers.parquet``, ``interventions.parquet`` (and ``channels.parquet``), each
atomically, then ``DONE``: the suite's frame writes it (:func:`.rundir.run_in_folder` of :data:`EXPERIMENT`, this
schema, :func:`train` and the runner's tables). A finished run with the same config is skipped unless
``force=true``; a folder without ``DONE`` is rerun from scratch (:func:`.rundir.prepare_run_dir`). The analysis reads
the runs with its run reader, layout :data:`.analysis.results.ZOO`.

    python experiments/zoo.py arch=lcnet_050 optimizer=adam seed=0          # one run
    make zoo JOBS=2                                                         # the whole zoo, resumable
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from .. import records
from .constants import SECOND_ZOO, STALE_RECOVERY, SecondZoo  # the truth's X, fixed in sample before any zoo run
from ..bnstats import reestimate, running_stat_layers
from .config import SEED_MAX, ConfigError, OptimizerConfig, Schema, TaskConfig, choice, require
from ..evaluation import eval_chunk
from ..monitor import StalenessMonitor
from .optim import build_optimizer, cross_entropy_step
from ..probes import accuracy
from .provenance import describe_built
from .rows import ROWS
from .rundir import Experiment, Trained, run_in_folder
from .runtime import StepClock, measured_steps, resolve_threads
from .task import build_task, generator, stream_seed
from .thirdparty import torchvision_shim

if TYPE_CHECKING:
    from .cli import Outcome

__all__ = ["ARCHS", "CONTROL", "ZOO_ARCHS", "SecondZoo", "SECOND_ZOO", "OPTIMIZERS", "SEEDS", "STALE_RECOVERY", "ZooConfig", "register_zoo_config",
           "to_zoo_config", "optimizer_config", "build_zoo_network", "monitor_or_refusal", "check_steps", "train", "EXPERIMENT",
           "run", "run_task",
           "sweep_lists", "costs"]

# The BatchNorm architectures: timm's names, small variants of common families.
# The costliest first (:func:`costs`): the sweep starts its jobs in this order, so the last to finish is a short one.
ARCHS = ("efficientnet_b0", "resnet18d", "mnasnet_050", "mobilenetv3_small_100", "resnet10t", "ghostnet_050",
         "lcnet_050", "regnetx_002")
# The control: timm's resnet10t with GroupNorm of 8 groups for every BatchNorm (no running statistics).
CONTROL = "resnet10t_gn"
CONTROL_GROUPS = 8
ZOO_ARCHS = ARCHS + (CONTROL,)
OPTIMIZERS = ("sgd", "adam")  # the study's rows of these names give each its learning rate and settings
SEEDS = (0, 1, 2)


NUM_CLASSES = 10  # Fashion-MNIST's


def optimizer_config(name: str) -> OptimizerConfig:
    """The study's settings for ``name`` (``sgd``: lr 0.05, momentum 0.9; ``adam``: lr 3e-3), read from the row of
    that name (:data:`.rows.ROWS`)."""
    spec = ROWS[name]
    return OptimizerConfig(name=spec.optimizer, lr=spec.lr, weight_decay=spec.weight_decay, **spec.extra)


def _zoo_task() -> TaskConfig:
    return TaskConfig(name="fashion_mnist", image_size=16, batch_size=64, probe_size=256)


@dataclass
class ZooConfig:
    """One zoo run, checked before any work (:func:`to_zoo_config`; ``conf/zoo.yaml``).

    ``task`` is the suite's :class:`.config.TaskConfig` (``task.image_size``, ``task.batch_size``,
    ``task.probe_size``, ``task.data_dir``), ``optimizer`` its :class:`.config.OptimizerConfig`, picked by name
    (``optimizer=sgd`` composes ``conf/optimizer/sgd.yaml``) and held to the study's row of that name; the
    held-out set is ``heldout_size`` test images; a check every
    ``check_every`` steps (and at step 0 and the last step); the truth re-estimates on ``reestimate_batches`` batches
    of ``task.batch_size`` and calls a check stale when it recovers at least ``stale_recovery`` (a fraction).
    """

    arch: str = "resnet10t"  # one of ZOO_ARCHS
    optimizer: OptimizerConfig = field(default_factory=lambda: optimizer_config("adam"))  # conf/optimizer/<name>
    seed: int = 0
    steps: int = 1200
    check_every: int = 75
    heldout_size: int = 1000
    reestimate_batches: int = 20
    stale_recovery: float = STALE_RECOVERY
    channels: bool = False  # also store the monitor's channels table (large: see the module docstring)
    evaluation_path: bool = False  # the monitor's statistics along the evaluation path too (its eval_path_* columns)
    task: TaskConfig = field(default_factory=_zoo_task)
    results_root: str = "results/zoo"
    threads: int = 1  # torch intra-op threads (0: the launcher's or torch's default)
    force: bool = False  # rerun a finished run
    progress: bool = True  # one line per check on stderr

    def __post_init__(self) -> None:
        choice("arch", self.arch, ZOO_ARCHS + SECOND_ZOO.archs)
        choice("optimizer.name", self.optimizer.name, OPTIMIZERS)
        want = optimizer_config(self.optimizer.name)
        for key in vars(want):
            got, wanted = getattr(self.optimizer, key), getattr(want, key)
            require(got == wanted, f"optimizer.{key}",
                     f"{wanted!r}: the zoo trains with the study's {self.optimizer.name} settings (its row in "
                     "bnrotation.study.rows.ROWS)", got)
        require(0 <= self.seed <= SEED_MAX, "seed", f"an integer in 0..{SEED_MAX}", self.seed)
        require(self.steps >= 1, "steps", "an integer >= 1", self.steps)
        require(1 <= self.check_every <= self.steps, "check_every", f"an integer in 1..steps={self.steps}",
                 self.check_every)
        require(self.heldout_size >= 2, "heldout_size", "an integer >= 2", self.heldout_size)
        require(self.reestimate_batches >= 1, "reestimate_batches", "an integer >= 1", self.reestimate_batches)
        require(math.isfinite(self.stale_recovery) and 0 < self.stale_recovery <= 1, "stale_recovery",
                 "a fraction in (0, 1] (5 points: 0.05)", self.stale_recovery)
        require(self.threads >= 0, "threads", "an integer >= 0 (0: the launcher's or torch's default)", self.threads)
        choice("task.name", self.task.name, ("fashion_mnist",))

    @property
    def row(self) -> str:
        """``<arch>-<optimizer>``: the run folder's name (``runs/<row>/seed=<s>``)."""
        return f"{self.arch}-{self.optimizer.name}"


ZOO_SCHEMA = Schema("zoo_schema", ZooConfig)
register_zoo_config = ZOO_SCHEMA.register  # ZooConfig as zoo_schema in Hydra's ConfigStore
to_zoo_config = ZOO_SCHEMA.validate  # a composed config as a validated ZooConfig (ConfigError: one line)


def build_zoo_network(arch: str, seed: int) -> nn.Module:
    """The timm model ``arch`` (one of :data:`ZOO_ARCHS`) for 1-channel 10-class inputs, with random weights drawn
    from the run's ``init`` stream (under ``torch.random.fork_rng``: the global stream is left as it was), in
    training mode. :data:`CONTROL` is resnet10t with ``timm.layers.GroupNorm`` of :data:`CONTROL_GROUPS` groups.

    Raises:
        ValueError: for a name not in :data:`ZOO_ARCHS`.
    """
    if arch not in ZOO_ARCHS + SECOND_ZOO.archs:
        raise ValueError(f"arch: expected one of {', '.join(ZOO_ARCHS + SECOND_ZOO.archs)}, got {arch!r}")
    torchvision_shim()
    import timm

    name, kwargs = arch, {}
    if arch == CONTROL:
        name, kwargs = "resnet10t", {"norm_layer": functools.partial(timm.layers.GroupNorm, num_groups=CONTROL_GROUPS)}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed(seed, "init"))
        model = timm.create_model(name, pretrained=False, in_chans=1, num_classes=NUM_CLASSES, **kwargs)
    return model.train()


def monitor_or_refusal(model: nn.Module, probe: tuple[torch.Tensor, torch.Tensor], evaluation_path: bool = False
                       ) -> tuple[StalenessMonitor | None, str | None]:
    """``(monitor, None)``, or ``(None, refusal)`` where the monitor refuses the model (a model without BatchNorm
    running statistics: the control): ``refusal`` is the first line of its ``ValueError``. ``evaluation_path``:
    the monitor's option of that name (its ``eval_path_*`` columns)."""
    try:
        return StalenessMonitor(model, probe, warn=False, evaluation_path=evaluation_path), None
    except ValueError as err:
        return None, str(err).splitlines()[0]


def check_steps(cfg: ZooConfig) -> list[int]:
    """Step 0, every ``check_every`` steps, and the last step."""
    return sorted(set(range(0, cfg.steps + 1, cfg.check_every)) | {cfg.steps})


def _monitor_lines(monitor: StalenessMonitor | None, step: int) -> tuple[dict, pd.DataFrame | None,
                                                                       pd.DataFrame | None]:
    """The monitor's ``checks`` line at ``step`` as ``checks`` columns (the probe's accuracies renamed
    ``probe_acc_*``; NaN and no verdict for a refused model), its ``layers`` and ``channels`` tables."""
    if monitor is None:
        return ({"probe_acc_train_mode": math.nan, "probe_acc_eval_mode": math.nan, "mode_agreement": math.nan,
                 "mode_gap": math.nan, "probe_size": 0, "rule_stale": False, "rule_flagged": False,
                 "warming_up": False, "rule_undetermined": "no monitor"}, None, None)
    record = monitor(step)
    line = record.checks.iloc[0].drop("step").to_dict()
    line = {("probe_" + k if k.startswith("acc_") else k): v for k, v in line.items()}
    line.update(rule_stale=bool(record.stale), rule_flagged=bool(record.flagged), warming_up=bool(record.warming_up),
                rule_undetermined=record.undetermined)
    return line, record.layers, record.channels


def _truth(model: nn.Module, batches: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor, chunk: int,
           acc_stored: float, x_recovery: float) -> dict:
    """Re-estimation on a copy of ``model`` and its evaluation-mode accuracy on (x, y); NaN for a model without
    running statistics (nothing to re-estimate)."""
    if not running_stat_layers(model):
        return {"acc_eval_mode_reestimated": math.nan, "recovered": math.nan, "stale": False}
    fresh = copy.deepcopy(model)
    reestimate(fresh, batches)
    after = accuracy(fresh, x, y, "eval", chunk)
    return {"acc_eval_mode_reestimated": after, "recovered": after - acc_stored,
            "stale": bool(after - acc_stored >= x_recovery)}


def _set_up(cfg: ZooConfig) -> dict:
    """The process's threads for the run, and what ``run.json`` records at its start: the architecture, the
    optimizer's name and the threads."""
    return {"arch": cfg.arch, "optimizer_name": cfg.optimizer.name, "threads": resolve_threads(cfg.threads)}


def train(cfg: ZooConfig) -> Trained:
    """Train one zoo run, measuring at every check (module docstring), without its folder (:func:`run` is the frame
    that calls it).

    Returns:
        Its tables (``checks``, ``layers``, ``interventions``, and ``channels`` with ``channels=true``; long format
        with ``row`` and ``seed``), what ``run.json`` records of it (the built objects read back, the task, the
        monitor's pairing or refusal, timings in seconds) and its status (``diverged`` at a non-finite loss).

    Raises:
        DataError: Fashion-MNIST's files are missing or malformed.
    """
    cpu_started = time.process_time()
    task = build_task(cfg.task, cfg.seed)
    x_held, y_held = task.fixed_set(cfg.heldout_size, cfg.seed, "heldout")
    probe = task.fixed_set(cfg.task.probe_size, cfg.seed, "probe")
    chunk = eval_chunk(x_held.device, len(y_held))
    model = build_zoo_network(cfg.arch, cfg.seed)
    optimizer = build_optimizer(cfg.optimizer, model)
    monitor, refusal = monitor_or_refusal(model, probe, cfg.evaluation_path)
    g_train, g_re = generator(cfg.seed, "train"), generator(cfg.seed, "reestimate")
    tables = records.TableBuffer(cfg.row, cfg.seed)
    checks = set(check_steps(cfg))
    diverged_at, clock, t_checks = None, StepClock(), 0.0

    def train_step() -> torch.Tensor:
        return cross_entropy_step(model, optimizer, *task.sample(cfg.task.batch_size, g_train))

    for step, loss in measured_steps(cfg.steps, train_step, checks, clock):
        t0 = time.perf_counter()
        if step > 0 and not math.isfinite(loss):
            diverged_at = step
            break
        line, layers, channels = _monitor_lines(monitor, step)
        acc_eval = accuracy(model, x_held, y_held, "eval", chunk)
        acc_train = accuracy(model, x_held, y_held, "train")
        batches = [task.sample(cfg.task.batch_size, g_re)[0] for _ in range(cfg.reestimate_batches)]
        truth = _truth(model, batches, x_held, y_held, chunk, acc_eval, cfg.stale_recovery)
        t_check = time.perf_counter() - t0
        t_checks += t_check
        tables.add("checks", pd.DataFrame([{"step": step, "lr": optimizer.param_groups[0]["lr"], "loss": loss,
                                            "acc_train_mode": acc_train, "acc_eval_mode": acc_eval, **truth,
                                            **line, "check_seconds": t_check}]))
        tables.add("interventions", pd.DataFrame(
            {"step": step, "intervention": ["none", "reestimate"], "k": -1, "norm_layer": "",
             "acc_eval_mode": [acc_eval, truth["acc_eval_mode_reestimated"]]}))
        if layers is not None:
            tables.add("layers", layers)
            if cfg.channels:
                tables.add("channels", channels)
        if cfg.progress:
            print(f"{cfg.row} seed={cfg.seed} step {step}: loss {loss:.3f}, held-out eval {acc_eval:.3f} / "
                  f"train {acc_train:.3f}, re-estimated {truth['acc_eval_mode_reestimated']:.3f}"
                  + (f", rule {'STALE' if line['rule_flagged'] else 'quiet'}" if monitor else ""),
                  file=sys.stderr, flush=True)
    names = ("checks", "layers", "interventions") + (("channels",) if cfg.channels else ())
    info = {**describe_built(model, optimizer, None, torch.device("cpu")), "task": task.describe(),
            "bn_momenta": sorted({m.momentum for _, m in running_stat_layers(model)}, key=str),
            "monitor": _monitor_info(monitor, refusal), "stale_recovery": cfg.stale_recovery, "tables": list(names),
            "checks": len(tables.frames["checks"]), "diverged_at_step": diverged_at,
            "timings_s": {"train": round(clock.train_s, 3), "checks": round(t_checks, 3),
                          "cpu": round(time.process_time() - cpu_started, 3)},
            "ms_per_step": round(1e3 * clock.train_s / max(cfg.steps if diverged_at is None else diverged_at - 1, 1),
                                 2)}
    return Trained({name: tables.frame(name) for name in names}, info,
                   "diverged" if diverged_at is not None else "done")


# The zoo on the suite's frame (:func:`.rundir.run_in_folder`): its schema, its train function and its tables (the
# runner's, :data:`.records.TABLE_COLUMNS`: it writes ``checks``, ``layers``, ``interventions`` and ``channels``).
EXPERIMENT = Experiment(ZooConfig, train, records.TABLE_COLUMNS, _set_up)


def run(cfg: ZooConfig) -> Path | None:
    """Train one zoo run and write its folder (module docstring), ``DONE`` last, on the suite's frame
    (:func:`.rundir.run_in_folder` of :data:`EXPERIMENT`).

    Returns:
        The run folder, or None when it was finished already with the same config (skipped).

    Raises:
        rundir.RunExistsError: a finished run with another config is in the way (and ``force`` is off).
        rundir.RunBusyError: another process is training it now.
        DataError: Fashion-MNIST's files are missing or malformed.
    """
    return run_in_folder(cfg, EXPERIMENT)


def _monitor_info(monitor: StalenessMonitor | None, refusal: str | None) -> dict:
    """What ``run.json`` records of the monitor: its refusal, or its pairing, warm-up and thresholds."""
    if monitor is None:
        return {"refused": refusal}
    return {"refused": None, "paired": len(monitor.pairing.pairs), "unpaired": len(monitor.pairing.unpaired),
            "warmup_steps": monitor.warmup_steps, "thresholds": dataclasses.asdict(monitor.thresholds)}


def run_task(cfg) -> "Outcome":
    """Validate the composed config ``cfg``, train the run, report it on stderr and return its
    :class:`.cli.Outcome`, as the suite's entry points do (:func:`.cli.run_one`): a bad key or value is one line
    naming it, exit status 2, before any work; a finished run is skipped; a crash is ``failed``, status 1, and its
    folder, without ``DONE``, is rerun by the next sweep."""
    from .cli import run_one

    return run_one(cfg, to_zoo_config, run)


def sweep_lists(second: bool = False) -> str:
    """The whole zoo as Hydra sweep overrides: every architecture (the control too), both optimizers, every seed
    (``make zoo`` reads this line: ``python -m bnrotation.study.zoo``); with ``second``, the second zoo's
    (:data:`SECOND_ZOO`, ``make zoo2``: ``python -m bnrotation.study.zoo --second``), its length and checks too."""
    if second:
        z = SECOND_ZOO
        return (f"arch={','.join(z.archs)} optimizer={','.join(OPTIMIZERS)} seed={','.join(map(str, z.seeds))} "
                f"steps={z.steps} check_every={z.check_every}")
    return f"arch={','.join(ZOO_ARCHS)} optimizer={','.join(OPTIMIZERS)} seed={','.join(map(str, SEEDS))}"


def costs(image_size: int, batch_size: int, archs=ZOO_ARCHS, cfg: ZooConfig | None = None) -> pd.DataFrame:
    """What a zoo run costs, per architecture: ``step_cpu_ms`` (a training step of ``batch_size`` images of
    ``image_size`` pixels, mean of 3 after one), ``check_cpu_s`` (one check at ``cfg``'s held-out, probe and
    re-estimation sizes) and ``run_cpu_s`` (``cfg.steps`` steps and :func:`check_steps` checks), all CPU seconds
    of this process (``time.process_time``, one torch thread). Shapes alone set the cost, so random tensors stand
    in for the images."""
    cfg = cfg or ZooConfig()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    shape = (1, image_size, image_size)
    lines = []
    for arch in archs:
        model = build_zoo_network(arch, 0)
        optimizer = build_optimizer(optimizer_config("adam"), model)
        x, y = torch.randn(batch_size, *shape, generator=g), torch.randint(0, NUM_CLASSES, (batch_size,), generator=g)
        spent = []
        for _ in range(4):
            t0 = time.process_time()
            cross_entropy_step(model, optimizer, x, y)
            spent.append(time.process_time() - t0)
        xh, yh = torch.randn(cfg.heldout_size, *shape, generator=g), torch.randint(0, NUM_CLASSES, (cfg.heldout_size,))
        probe = (torch.randn(cfg.task.probe_size, *shape, generator=g),
                 torch.randint(0, NUM_CLASSES, (cfg.task.probe_size,)))
        monitor, _ = monitor_or_refusal(model, probe)
        if monitor is not None:
            monitor(0)  # the first call has no rotation to measure
        chunk = eval_chunk(xh.device, len(yh))
        t0 = time.process_time()
        _monitor_lines(monitor, 1)
        acc = accuracy(model, xh, yh, "eval", chunk)
        accuracy(model, xh, yh, "train")
        batches = [torch.randn(batch_size, *shape, generator=g) for _ in range(cfg.reestimate_batches)]
        _truth(model, batches, xh, yh, chunk, acc, cfg.stale_recovery)
        check = time.process_time() - t0
        step = sum(spent[1:]) / 3
        lines.append({"arch": arch, "image_size": image_size, "batch_size": batch_size,
                      "step_cpu_ms": round(1e3 * step, 1), "check_cpu_s": round(check, 2),
                      "run_cpu_s": round(cfg.steps * step + len(check_steps(cfg)) * check, 1)})
    return pd.DataFrame(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--costs"]:  # python -m bnrotation.study.zoo --costs [image_size batch_size]
        size, batch = (int(v) for v in (sys.argv[2:4] or (ZooConfig().task.image_size, ZooConfig().task.batch_size)))
        table = costs(size, batch)
        print(table.to_string(index=False))
        runs = len(OPTIMIZERS) * len(SEEDS)
        print(f"the zoo ({runs} runs an architecture): {runs * table['run_cpu_s'].sum() / 3600:.2f} CPU hours")
    else:
        print(sweep_lists(second=sys.argv[1:2] == ["--second"]))
