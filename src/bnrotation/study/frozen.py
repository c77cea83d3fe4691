"""The frozen-backbone experiment: freeze the convolutions, fine-tune a new head, and watch BatchNorm.

Freezing a layer's parameters (``requires_grad=False``) does not freeze its
BatchNorm: a BatchNorm layer in training mode updates its running mean and
variance on every forward pass, whatever its parameters do. The public threads
pytorch/pytorch#86590, Lightning-AI/pytorch-lightning#15062 and
lightly-ai/lightly#1438 report it. This module measures it on the study's task
and network in two phases:

1. **Pre-training** (once per seed, cached): the study's ConvNet on the
   study's task (:mod:`.task`, PROTOCOL.md) with SGD and momentum, as the
   ``sgd`` row, which leaves running statistics that describe the final
   weights (fresh), so the only staleness later is the frozen-backbone one.
2. **Fine-tuning**: every backbone parameter (convolutions and BatchNorm
   affine) frozen, the pre-trained head kept aside for the original task, a new
   linear head trained on a *shifted* task, in one of three BatchNorm modes
   (:data:`MODES`):

   * ``bn_train``: the model in training mode, BatchNorm too (the common mistake);
   * ``norm_eval``: BatchNorm layers in evaluation mode inside the training model
     (mmcv's ``norm_eval=True``): their running statistics stay the pre-trained ones;
   * ``reestimate``: the running statistics re-estimated once on the shifted
     data (:func:`.bnstats.reestimate`; AdaBN, Li et al. 2016, arXiv:1603.04779),
     then held in evaluation mode as in ``norm_eval``.

**The shift**: the same templates (so the same ten classes) with the noise's
standard deviation raised from 1 to ``shift.noise_std``: a sample is
``template_scale * template[y] + noise_std * N(0, 1)``. A noise level moves
every BatchNorm layer's statistics: the first convolution's output variance per
channel is ``||w_c||^2 noise_std^2`` plus the template part, so it grows by
about ``noise_std^2``, and deeper layers follow. Other templates, drawn i.i.d.
N(0, 1) as the study's are, would leave the first layer's statistics where they
were up to the draw (every template has the same distribution) and test the head
more than BatchNorm.

Every random stream of the shifted task (its training batches, held-out and
probe sets, re-estimation batches, the new head's initialisation) is the
suite's stream of the same name (:func:`.task.generator`) at the seed
:func:`shifted_seed`, so it is independent of the original task's streams.

**Measured at each log point** (``finetune.log_every`` steps, from step 0, which
is after the mode's set-up and before the first fine-tuning step):

* ``statistics``: per BatchNorm layer, the drift of the running statistics in
  σ per 100 steps (:func:`running_drift`: the moves of the running mean and of
  the running standard deviation, in the channel's σ) and their displacement
  from the pre-trained statistics in σ;
* ``accuracy``: the original task (pre-trained head) and the shifted task (new
  head), each in evaluation mode (running statistics) and training mode (batch
  statistics of the whole held-out set, :func:`.probes.accuracy`);
* ``monitor``: :class:`.monitor.StalenessMonitor`'s record on the shifted probe
  and on the original probe: its verdict (``stale``), mode gap and lag per layer.

Every backbone parameter is compared with its pre-trained value at every log
point and must be equal, bit for bit (:func:`assert_backbone_unchanged`).

**On the suite's frame.** The config is ``conf/frozen.yaml``, checked against :class:`FrozenConfig` (Hydra's
ConfigStore, struct mode); a run is one (mode, seed), in the folder ``<results_root>/runs/<row>/seed=<s>/``
(:func:`.records.run_dir`; the rows are :data:`.rows.FROZEN_ROWS`). The experiment is a plug-in of the suite's frame
(:data:`EXPERIMENT`: this schema, :func:`finetune` and the tables of :data:`.rows.FROZEN_TABLES`), which owns the folder
(:func:`.rundir.run_in_folder`: the lock, the policy of :func:`.rundir.prepare_run_dir`, under which a finished run
with the same config is skipped, one with another refused unless ``force=true``, a folder without ``DONE`` rerun from
scratch). It holds ``config.yaml``, ``run.json``, ``accuracy.parquet``, ``statistics.parquet`` and
``monitor.parquet``, each written atomically, then ``DONE``. The sweep is Hydra's multirun with the joblib launcher
(:func:`sweep_lists`); the analysis reads the runs with its run reader (:mod:`.analysis.tables.frozen`).

    python experiments/frozen.py mode=norm_eval seed=1 finetune.steps=100 results_root=/tmp/f   # one run
    make frozen JOBS=2 RESULTS=results/reference/frozen                # every mode and seed, resumable
"""

from __future__ import annotations

import copy
import dataclasses
import fcntl
import io
import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
import yaml

from .. import records
from ..bnstats import reestimate, running_stat_layers
from ..evaluation import eval_chunk
from ..monitor import StalenessMonitor
from ..oneshot import measure_once
from ..probes import accuracy
from .provenance import describe_built, git_state
from .config import ModelConfig, OptimizerConfig, Schema, TaskConfig, choice, require, semantic_dict
from .model import ConvNet, build_network
from .optim import build_optimizer, cross_entropy_step
from .rows import FROZEN_MODES, FROZEN_SEEDS, FROZEN_TABLES, frozen_row
from .rundir import Experiment, Trained, run_in_folder
from .runtime import StepClock, measured_steps, resolve_threads
from .task import NoisyTemplates, generator, stream_seed

if TYPE_CHECKING:
    from .cli import Outcome

__all__ = ["FrozenConfig", "PretrainConfig", "FinetuneConfig", "ShiftConfig", "MODES", "register_frozen_config",
           "to_frozen_config", "shifted_seed", "ShiftedTemplates", "task_data", "shifted_batches", "pretrain",
           "pretrained_backbone", "finetune_model", "set_bn_mode", "backbone_parameters", "assert_backbone_unchanged",
           "statistics_move", "running_drift", "EXPERIMENT", "run", "run_task", "sweep_lists"]

MODES = FROZEN_MODES  # bn_train | norm_eval | reestimate
SHIFT_SEED_OFFSET = 1 << 40  # the shifted task's streams: the suite's streams at seed + 2**40
CACHE = Path("checkpoints") / "pretrained"  # under the results root; checkpoints/ folders are gitignored


# ----------------------------------------------------------------------------- config
def _steps_and_lr(prefix: str, steps: int, lr: float, momentum: float) -> None:
    require(steps >= 1, f"{prefix}.steps", "an integer >= 1", steps)
    require(math.isfinite(lr) and lr > 0, f"{prefix}.lr", "a finite float > 0", lr)
    require(0 <= momentum < 1, f"{prefix}.momentum", "a float in [0, 1)", momentum)


@dataclass
class PretrainConfig:
    """Phase 1: the whole network on the original task, SGD with momentum (the ``sgd`` row's optimizer)."""

    steps: int = 1000
    lr: float = 0.05
    momentum: float = 0.9
    reestimate_batches: int = 50  # then the running statistics re-estimated on the original task (precise)

    def __post_init__(self) -> None:
        _steps_and_lr("pretrain", self.steps, self.lr, self.momentum)
        require(self.reestimate_batches >= 1, "pretrain.reestimate_batches", "an integer >= 1",
                 self.reestimate_batches)


@dataclass
class FinetuneConfig:
    """Phase 2: the new head on the shifted task, backbone frozen; a log point every ``log_every`` steps."""

    steps: int = 400
    lr: float = 0.05
    momentum: float = 0.9
    log_every: int = 20

    def __post_init__(self) -> None:
        _steps_and_lr("finetune", self.steps, self.lr, self.momentum)
        require(1 <= self.log_every <= self.steps, "finetune.log_every",
                 f"an integer in [1, finetune.steps={self.steps}]", self.log_every)


@dataclass
class ShiftConfig:
    """The shifted task: the original templates and template scale, noise of standard deviation ``noise_std``
    (the original task's is 1)."""

    noise_std: float = 2.0

    def __post_init__(self) -> None:
        require(math.isfinite(self.noise_std) and self.noise_std > 0 and self.noise_std != 1.0, "shift.noise_std",
                 "a finite float > 0 other than 1 (1 is the original task)", self.noise_std)


@dataclass
class FrozenConfig:
    """One frozen-backbone run (one mode, one seed), checked before any work (:func:`to_frozen_config`;
    ``conf/frozen.yaml``). ``task`` and ``model`` are the suite's :class:`.config.TaskConfig` (the noisy
    templates) and :class:`.config.ModelConfig` (the ConvNet with BatchNorm)."""

    mode: str = "bn_train"  # bn_train | norm_eval | reestimate
    seed: int = 0
    task: TaskConfig = field(default_factory=lambda: TaskConfig(image_size=16, probe_size=256))
    model: ModelConfig = field(default_factory=ModelConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    shift: ShiftConfig = field(default_factory=ShiftConfig)
    heldout_size: int = 2000  # per task: the original and the shifted held-out sets
    reestimate_batches: int = 50  # batches of task.batch_size for the reestimate mode
    results_root: str = "results/frozen"
    threads: int = 1  # torch intra-op threads (0: torch's default)
    force: bool = False  # rerun a finished run
    progress: bool = True  # a line per log point on stderr

    def __post_init__(self) -> None:
        choice("mode", self.mode, MODES)
        require(0 <= self.seed < SHIFT_SEED_OFFSET, "seed", "an integer in [0, 2**40)", self.seed)
        choice("task.name", self.task.name, ("noisy_templates",))
        require(self.model.arch == "convnet" and self.model.norm == "batch", "model",
                 "the study's ConvNet with BatchNorm (model.arch=convnet, model.norm=batch)",
                 f"arch={self.model.arch}, norm={self.model.norm}")
        for key in ("heldout_size", "reestimate_batches"):
            require(getattr(self, key) >= 1, key, "an integer >= 1", getattr(self, key))
        require(self.threads >= 0, "threads", "an integer >= 0", self.threads)

    @property
    def row(self) -> str:
        """The row of this mode (:data:`.rows.FROZEN_ROWS`)."""
        return frozen_row(self.mode)


FROZEN_SCHEMA = Schema("frozen_schema", FrozenConfig)
register_frozen_config = FROZEN_SCHEMA.register  # FrozenConfig as frozen_schema in Hydra's ConfigStore
to_frozen_config = FROZEN_SCHEMA.validate  # a composed config as a validated FrozenConfig (ConfigError: one line)


# ----------------------------------------------------------------------------- the shifted task
def shifted_seed(seed: int) -> int:
    """The seed of the shifted task's random streams: ``seed + 2**40`` (:data:`SHIFT_SEED_OFFSET`), whose
    streams (:func:`.task.stream_seed`) are independent of every run seed below 2**40."""
    return seed + SHIFT_SEED_OFFSET


class ShiftedTemplates(NoisyTemplates):
    """The original task's templates with noise of standard deviation ``noise_std``: a sample of class y is
    ``template_scale * template[y] + noise_std * N(0, 1)``.

    Drawn as ``noise_std * (N(0, 1) + (template_scale / noise_std) * template[y])``, i.e. the suite's sampler
    (:meth:`.task.NoisyTemplates.sample`) at template scale ``template_scale / noise_std``, scaled.
    """

    noise_std: float = 1.0

    @classmethod
    def of(cls, task: NoisyTemplates, noise_std: float) -> "ShiftedTemplates":
        cfg = dataclasses.replace(task.cfg, template_scale=task.cfg.template_scale / noise_std)
        shifted = cls(cfg, task.templates)
        shifted.noise_std = noise_std
        return shifted

    def sample(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` samples: x (n, 3, S, S), y (n,) int64."""
        x, y = super().sample(n, gen)
        return x.mul_(self.noise_std), y

    def fixed_set(self, n: int, seed: int, stream: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A fixed set from its own stream, scaled as :meth:`sample` (the experiment's templates live on the
        CPU): x (n, 3, S, S), y (n,)."""
        return self.sample(n, generator(seed, stream))


@dataclass
class _Data:
    """The fixed sets of one seed: held-out and probe sets of the original and the shifted task, (N, 3, S, S)
    in channels-last, with labels (N,)."""

    original: NoisyTemplates
    shifted: ShiftedTemplates
    held: dict[str, tuple[torch.Tensor, torch.Tensor]]  # task -> (x, y)
    probe: dict[str, tuple[torch.Tensor, torch.Tensor]]


def _channels_last(xy: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return xy[0].contiguous(memory_format=torch.channels_last), xy[1]


def task_data(cfg: FrozenConfig) -> _Data:
    """Both tasks of ``cfg.seed`` and their fixed sets (the original's from the run seed's streams, the
    shifted one's from :func:`shifted_seed`'s)."""
    original = NoisyTemplates.build(cfg.task, cfg.seed)
    shifted = ShiftedTemplates.of(original, cfg.shift.noise_std)
    s2 = shifted_seed(cfg.seed)
    held = {"original": _channels_last(original.fixed_set(cfg.heldout_size, cfg.seed, "heldout")),
            "shifted": _channels_last(shifted.fixed_set(cfg.heldout_size, s2, "heldout"))}
    probe = {"original": _channels_last(original.fixed_set(cfg.task.probe_size, cfg.seed, "probe")),
             "shifted": _channels_last(shifted.fixed_set(cfg.task.probe_size, s2, "probe"))}
    return _Data(original, shifted, held, probe)


# ----------------------------------------------------------------------------- phase 1: pre-training
def _sgd(lr: float, momentum: float) -> OptimizerConfig:
    return OptimizerConfig(name="sgd", lr=lr, momentum=momentum, weight_decay=0.0)


def pretrain(cfg: FrozenConfig, data: _Data | None = None) -> tuple[ConvNet, dict]:
    """Train the study's ConvNet on the original task for ``pretrain.steps`` SGD steps (the run seed's
    ``init`` and ``train`` streams; every row of the experiment starts from this network at a seed), then
    re-estimate its running statistics on ``pretrain.reestimate_batches`` batches of the original task (the run
    seed's ``reestimate`` stream; :func:`.bnstats.reestimate`), so that they describe the final weights exactly
    as the SGD row's nearly do, and the only staleness later is the frozen-backbone one.

    Returns:
        The network (training mode) and what was measured at the end: ``acc_eval_mode`` and
        ``acc_train_mode`` on the original held-out set (fractions), the monitor's largest per-layer median
        |lag| (σ) on the original probe (``lag_median_abs_sigma``: how fresh the statistics are), ``seconds``.
    """
    data = data or task_data(cfg)
    t0 = time.perf_counter()
    model = build_network(cfg.model, cfg.task.num_classes, cfg.seed)
    optimizer = build_optimizer(_sgd(cfg.pretrain.lr, cfg.pretrain.momentum), model)
    g = generator(cfg.seed, "train")
    model.train()
    for _ in range(cfg.pretrain.steps):
        x, y = data.original.sample(cfg.task.batch_size, g)
        loss = cross_entropy_step(model, optimizer, x.contiguous(memory_format=torch.channels_last), y)
    g_re = generator(cfg.seed, "reestimate")
    reestimate(model, (data.original.sample(cfg.task.batch_size, g_re)[0].contiguous(memory_format=torch.channels_last)
                       for _ in range(cfg.pretrain.reestimate_batches)))
    x_held, y_held = data.held["original"]
    chunk = eval_chunk(x_held.device, len(y_held))
    record = measure_once(model, data.probe["original"], step=cfg.pretrain.steps)
    return model, {"acc_eval_mode": accuracy(model, x_held, y_held, "eval", chunk),
                   "acc_train_mode": accuracy(model, x_held, y_held, "train"),
                   "lag_median_abs_sigma": float(record.layers["lag_median_abs_sigma"].max()),
                   "final_loss": float(loss.detach()), "seconds": round(time.perf_counter() - t0, 3)}


def _pretrain_key(cfg: FrozenConfig) -> dict:
    """What the pre-trained network depends on: seed, task, model and pre-training settings."""
    d = semantic_dict(cfg)
    return {k: d[k] for k in ("seed", "task", "model", "pretrain")}


def pretrained_backbone(cfg: FrozenConfig, data: _Data | None = None) -> tuple[ConvNet, dict]:
    """The pre-trained network of ``cfg.seed``, from the cache ``<results_root>/checkpoints/pretrained/
    seed=<s>.pt`` when it holds the same pre-training (:func:`_pretrain_key`), else trained (:func:`pretrain`)
    and cached, atomically. A file lock beside the cache makes a second process wait for the first's
    pre-training instead of repeating it.

    Returns:
        The network and the pre-training's measurements (:func:`pretrain`), with ``cached`` (bool).
    """
    path = Path(cfg.results_root) / CACHE / f"seed={cfg.seed}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    key = _pretrain_key(cfg)
    with open(path.with_suffix(".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            saved = torch.load(path, weights_only=True)
            if yaml.safe_load(saved["key"]) == key:
                model = build_network(cfg.model, cfg.task.num_classes, cfg.seed)
                model.load_state_dict(saved["model"])
                return model.train(), {**yaml.safe_load(saved["info"]), "cached": True}
        model, info = pretrain(cfg, data)
        buf = io.BytesIO()
        torch.save({"key": yaml.safe_dump(key), "info": yaml.safe_dump(info), "model": model.state_dict()}, buf)
        records.atomic_write_bytes(path, buf.getvalue())
    return model, {**info, "cached": False}


# ----------------------------------------------------------------------------- phase 2: the fine-tuning model
def backbone_parameters(model: ConvNet) -> dict[str, nn.Parameter]:
    """Every parameter but the head's (``fc``): the convolutions' weights and the BatchNorm affine."""
    return {n: p for n, p in model.named_parameters() if not n.startswith("fc.")}


def set_bn_mode(model: ConvNet, mode: str) -> ConvNet:
    """Put ``model`` in training mode with its BatchNorm layers as ``mode`` says: in training mode
    (``bn_train``) or in evaluation mode (``norm_eval``, ``reestimate``). Call it after every
    ``model.train()``, as mmcv's ``norm_eval`` does in its ``train()``.

    Raises:
        ValueError: for a mode not in :data:`MODES`.
    """
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    model.train()
    if mode != "bn_train":
        for _, m in running_stat_layers(model):
            m.eval()
    return model


def finetune_model(cfg: FrozenConfig, backbone: ConvNet | None = None) -> tuple[ConvNet, nn.Linear]:
    """The fine-tuning phase's model of ``cfg.mode``, without training: a copy of ``backbone`` (default: the
    untrained network of ``cfg.seed``, for a quick look at the set-up, e.g. by a lint) with every backbone
    parameter frozen (``requires_grad=False``), a new head (``fc``, Linear(C3 -> K), initialised from the
    shifted task's ``init`` stream) and its BatchNorm layers in the mode's state (:func:`set_bn_mode`). No
    statistic is re-estimated here (the ``reestimate`` mode's set-up needs data: :func:`run`).

    Returns:
        ``(model, original_head)``: the model, in training mode, and a copy of the backbone's own head.
    """
    base = backbone if backbone is not None else build_network(cfg.model, cfg.task.num_classes, cfg.seed)
    model = copy.deepcopy(base)
    original_head = copy.deepcopy(model.fc)
    for p in backbone_parameters(model).values():
        p.requires_grad_(False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed(shifted_seed(cfg.seed), "init"))
        model.fc = nn.Linear(model.fc.in_features, model.fc.out_features)
    return set_bn_mode(model, cfg.mode), original_head


def shifted_batches(cfg: FrozenConfig, data: _Data) -> Iterator[torch.Tensor]:
    """The ``reestimate`` mode's ``reestimate_batches`` inputs (task.batch_size, 3, S, S) of the shifted task,
    drawn from its ``reestimate`` stream (:func:`shifted_seed`), channels-last."""
    g = generator(shifted_seed(cfg.seed), "reestimate")
    for _ in range(cfg.reestimate_batches):
        yield data.shifted.sample(cfg.task.batch_size, g)[0].contiguous(memory_format=torch.channels_last)


def assert_backbone_unchanged(model: ConvNet, reference: dict[str, torch.Tensor]) -> None:
    """Every backbone parameter equal, bit for bit, to ``reference`` (``{name: tensor}``).

    Raises:
        RuntimeError: naming each parameter that changed and its largest absolute change.
    """
    changed = {n: float((p.detach() - reference[n]).abs().max()) for n, p in backbone_parameters(model).items()
               if not torch.equal(p.detach(), reference[n])}
    if changed:
        raise RuntimeError("frozen backbone moved: " + ", ".join(f"{n} by up to {v:.3g}" for n, v in changed.items()))


@contextmanager
def head(model: ConvNet, other: nn.Linear) -> Iterator[ConvNet]:
    """``model`` with ``other``'s weights in its head for the duration of the block; the head restored after."""
    saved = copy.deepcopy(model.fc.state_dict())
    with torch.no_grad():
        model.fc.load_state_dict(other.state_dict())
    try:
        yield model
    finally:
        with torch.no_grad():
            model.fc.load_state_dict(saved)


# ----------------------------------------------------------------------------- measurements
def statistics_move(now: tuple[torch.Tensor, torch.Tensor], before: tuple[torch.Tensor, torch.Tensor]
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """How far one BatchNorm layer's running statistics moved from ``before`` to ``now`` (each a pair
    ``(running_mean, running_var)`` of (C,) buffers), per channel, in the channel's earlier σ
    (``σ_c = sqrt(running_var_c)`` of ``before``):

    * the mean's move ``|μ_c(now) − μ_c(before)| / σ_c``;
    * the standard deviation's move ``|σ_c(now) − σ_c(before)| / σ_c``.

    Their sum bounds, to first order, how much the layer's evaluation-mode output ``(x − μ) / σ`` changes for an
    input one standard deviation from the mean (``z = ±1``: ``Δμ/σ + z Δσ/σ``), in the output's own unit.

    Returns:
        ``(mean_move, std_move)``, each (C,) float64, in σ.

    Raises:
        ValueError: for buffers of different shapes.
    """
    (m1, v1), (m0, v0) = now, before
    if not (m1.shape == m0.shape == v1.shape == v0.shape):
        raise ValueError(f"statistics_move: shapes {tuple(m1.shape)}, {tuple(v1.shape)}, {tuple(m0.shape)}, "
                         f"{tuple(v0.shape)} differ")
    sd0 = v0.double().sqrt()  # (C,)
    return (m1.double() - m0.double()).abs() / sd0, (v1.double().sqrt() - sd0).abs() / sd0


def running_drift(now: tuple[torch.Tensor, torch.Tensor], before: tuple[torch.Tensor, torch.Tensor],
                  steps: int) -> float:
    """The running-statistics drift of one BatchNorm layer, in σ per 100 steps: the mean over channels of
    ``(|Δμ_c| + |Δσ_c|) / σ_c(before)`` (:func:`statistics_move`, mean and standard deviation moves summed)
    times ``100 / Δ``, where Δ = ``steps`` is the number of optimizer steps between the two readings of the
    running mean μ and running standard deviation σ = sqrt(running var). With ``steps=100`` it is the
    displacement itself, in σ.

    Raises:
        ValueError: for ``steps`` < 1 or buffers of different shapes.
    """
    if isinstance(steps, bool) or steps < 1:
        raise ValueError(f"running_drift: steps must be an integer >= 1, got {steps!r}")
    mean_move, std_move = statistics_move(now, before)
    return float((mean_move + std_move).mean()) * 100.0 / steps


def _statistics_lines(model: ConvNet, step: int, previous: tuple[int, dict] | None, pretrained: dict) -> list[dict]:
    """One line per BatchNorm layer at ``step``: drift since the previous log point (:func:`running_drift`, σ per
    100 steps; NaN at the first), and the displacement from the pre-trained statistics in σ, with its mean and
    standard-deviation parts (:func:`statistics_move`, means over channels)."""
    lines = []
    for name, m in running_stat_layers(model):
        now = (m.running_mean.detach(), m.running_var.detach())
        drift = (running_drift(now, previous[1][name], step - previous[0]) if previous is not None else math.nan)
        mean_move, std_move = statistics_move(now, pretrained[name])
        lines.append({"step": step, "norm_layer": name, "drift_sigma_per_100": drift,
                      "displacement_sigma": float((mean_move + std_move).mean()),
                      "mean_displacement_sigma": float(mean_move.mean()),
                      "std_displacement_sigma": float(std_move.mean()),
                      "num_batches_tracked": int(m.num_batches_tracked)})
    return lines


def _accuracy_lines(model: ConvNet, original_head: nn.Linear, data: _Data, step: int, loss: float) -> list[dict]:
    """Accuracy on each task's held-out set in evaluation and training mode: the shifted task with the new head,
    the original task with the pre-trained head."""
    lines = []
    for task in ("original", "shifted"):
        x, y = data.held[task]
        chunk = eval_chunk(x.device, len(y))
        if task == "original":
            with head(model, original_head):
                acc_eval, acc_train = accuracy(model, x, y, "eval", chunk), accuracy(model, x, y, "train")
        else:
            acc_eval, acc_train = accuracy(model, x, y, "eval", chunk), accuracy(model, x, y, "train")
        lines.append({"step": step, "task": task, "acc_eval_mode": acc_eval, "acc_train_mode": acc_train,
                      "loss": loss})
    return lines


def _monitor_lines(monitors: dict[str, StalenessMonitor], step: int) -> list[pd.DataFrame]:
    """The monitors' records at ``step``: one line per (probe, norm layer) with the record's verdict."""
    frames = []
    for probe, monitor in monitors.items():
        record = monitor.measure(step)
        c = record.checks.iloc[0]
        frames.append(record.layers.assign(probe=probe, stale=bool(record.stale), mode_gap=float(c["mode_gap"]),
                                           probe_acc_train_mode=float(c["acc_train_mode"]),
                                           probe_acc_eval_mode=float(c["acc_eval_mode"])))
    return frames




# ----------------------------------------------------------------------------- one run
def finetune(cfg: FrozenConfig) -> tuple[dict[str, pd.DataFrame], dict]:
    """The experiment of one run, without its folder (:func:`run` is the frame that calls it): the pre-trained
    network of ``cfg.seed`` (cached, :func:`pretrained_backbone`), frozen, its new head trained for
    ``finetune.steps`` SGD steps on the shifted task in BatchNorm mode ``cfg.mode``, measured at step 0, every
    ``finetune.log_every`` steps and the last step.

    Returns:
        The tables (:data:`.rows.FROZEN_TABLES`' names → long-format frames with ``row`` and ``seed``) and what
        ``run.json`` records of the run (the built objects, the trainable parameters, the pre-training's and the
        re-estimation's reports, the BatchNorm layers' training flags, timings in seconds).

    Raises:
        RuntimeError: a backbone parameter changed during fine-tuning (:func:`assert_backbone_unchanged`).
    """
    data = task_data(cfg)
    backbone, pre_info = pretrained_backbone(cfg, data)
    model, original_head = finetune_model(cfg, backbone)
    reference = {n: p.detach().clone() for n, p in backbone_parameters(model).items()}
    pretrained = {n: (m.running_mean.detach().clone(), m.running_var.detach().clone())
                  for n, m in running_stat_layers(model)}
    g_train = generator(shifted_seed(cfg.seed), "train")
    report = reestimate(model, shifted_batches(cfg, data)) if cfg.mode == "reestimate" else None
    optimizer = build_optimizer(_sgd(cfg.finetune.lr, cfg.finetune.momentum), model)
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    monitors = {probe: StalenessMonitor(model, data.probe[probe], warn=False) for probe in ("shifted", "original")}
    buffers = {t: [] for t in FROZEN_TABLES}
    previous = None
    log = set(range(0, cfg.finetune.steps + 1, cfg.finetune.log_every)) | {cfg.finetune.steps}
    clock, t_measure = StepClock(), 0.0

    def train_step() -> torch.Tensor:
        x, y = data.shifted.sample(cfg.task.batch_size, g_train)
        return cross_entropy_step(model, optimizer, x.contiguous(memory_format=torch.channels_last), y)

    for step, loss in measured_steps(cfg.finetune.steps, train_step, log, clock):
        t0 = time.perf_counter()
        assert_backbone_unchanged(model, reference)
        buffers["statistics"] += _statistics_lines(model, step, previous, pretrained)
        previous = (step, {n: (m.running_mean.detach().clone(), m.running_var.detach().clone())
                           for n, m in running_stat_layers(model)})
        buffers["accuracy"] += _accuracy_lines(model, original_head, data, step, loss)
        buffers["monitor"] += _monitor_lines(monitors, step)
        t_measure += time.perf_counter() - t0
        if cfg.progress:
            acc = pd.DataFrame(buffers["accuracy"][-2:]).set_index("task")["acc_eval_mode"]
            stats = pd.DataFrame(buffers["statistics"][-3:])
            print(f"{cfg.row} seed={cfg.seed} step {step}: eval acc original {acc['original']:.3f} shifted "
                  f"{acc['shifted']:.3f}; displacement {stats['displacement_sigma'].max():.3f}σ",
                  file=sys.stderr, flush=True)
    tables = {}
    for name in FROZEN_TABLES:
        frame = pd.concat(buffers[name], ignore_index=True) if name == "monitor" else pd.DataFrame(buffers[name])
        frame.insert(0, "seed", np.int64(cfg.seed))
        frame.insert(0, "row", cfg.row)
        tables[name] = frame
    return tables, {"built": describe_built(model, optimizer, None, torch.device("cpu")),
                    "trainable_parameters": trainable, "backbone_unchanged": True, "pretrained": pre_info,
                    "reestimation": dataclasses.asdict(report) if report is not None else None,
                    "bn_training_flags": {n: m.training for n, m in running_stat_layers(model)},
                    "timings_s": {"finetune_steps": round(clock.train_s, 3), "measurements": round(t_measure, 3)}}


def _set_up(cfg: FrozenConfig) -> dict:
    """The process's threads for the run, and what ``run.json`` records at its start: the mode, the threads and the
    code's commit (:func:`.provenance.git_state`)."""
    return {"mode": cfg.mode, "threads": resolve_threads(cfg.threads), **git_state()}


def _train(cfg: FrozenConfig) -> Trained:
    return Trained(*finetune(cfg))


# The frozen backbone on the suite's frame (:func:`.rundir.run_in_folder`): its schema, its train function and its
# tables (:data:`.rows.FROZEN_TABLES`, which the run reader's layout reads too).
EXPERIMENT = Experiment(FrozenConfig, _train, FROZEN_TABLES, _set_up)


def run(cfg: FrozenConfig) -> Path | None:
    """One frozen-backbone run in its folder, on the suite's frame (:func:`.rundir.run_in_folder` of
    :data:`EXPERIMENT`): the run's lock, the folder's policy, ``config.yaml`` and ``run.json`` first, then the
    experiment (:func:`finetune`), its tables, ``run.json`` again and ``DONE`` last, each written atomically.

    Returns:
        The run folder, or None when it was finished already with the same config (skipped).

    Raises:
        rundir.RunExistsError: a finished run with another config is in the way (and ``force`` is off).
        rundir.RunBusyError: another process is running it now.
        RuntimeError: a backbone parameter changed during fine-tuning (:func:`assert_backbone_unchanged`).
    """
    return run_in_folder(cfg, EXPERIMENT)


def run_task(cfg) -> "Outcome":
    """What ``experiments/frozen.py`` does with its composed config: validate it, train the run, report it
    (:func:`.cli.run_one`: a bad key is one line, exit status 2, before any work; a finished run is skipped)."""
    from .cli import run_one

    return run_one(cfg, to_frozen_config, run)


def sweep_lists() -> str:
    """Every mode and seed as Hydra sweep overrides, mode by mode (the last key varies fastest), so that parallel
    workers pre-train different seeds in the first mode and the later modes find the cached backbones
    (``make frozen`` reads this line: ``python -m bnrotation.study.frozen``)."""
    return f"mode={','.join(MODES)} seed={','.join(map(str, FROZEN_SEEDS))}"


if __name__ == "__main__":
    print(sweep_lists())
