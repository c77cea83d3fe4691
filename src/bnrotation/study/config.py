"""Structured configs: the schema every Hydra config is checked against.

Each dataclass is registered in Hydra's ConfigStore, so that Hydra itself
rejects an unknown key (struct mode) or a value of the wrong type, naming the
key. Ranges and choices are checked in ``__post_init__``, which runs when
:func:`to_run_config` turns the composed ``DictConfig`` into these objects,
before any tensor is made. Every error is a :class:`ConfigError` whose message
names the full key (``optimizer.lr``) and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

OPTIMIZERS = ("sgd", "adam", "adamw", "adam_projected", "adamp")
SCHEDULES = ("constant", "cosine")
NORMS = ("batch", "group", "layer")
ARCHS = ("convnet", "resnet20")
TASKS = ("noisy_templates", "fashion_mnist")
DEVICES = ("auto", "cpu", "cuda")
AVERAGING_AT = ("interventions", "checks", "last")
EVAL_BACKENDS = ("auto", "compiled", "eager")
# Floating-point type of a run's weights, data and statistics. float32 is the study's; float64 is for tests that
# compare two orders of the same arithmetic (batched vs separate seeds), where float32's rounding, which depends
# on the CPU's kernels, would set the tolerance.
DTYPES = ("float32", "float64")
# eval_backend=auto compiles at this many steps and more (quick and full scale, not smoke): a compile pays for itself
# after a number of evaluation passes (`make bench`, section (d), times both); a full run makes hundreds of passes
# (checks, every swap of the interventions, every averaged model), a smoke run a handful.
EVAL_COMPILED_MIN_STEPS = 1000
# A row name becomes a folder name: letters, digits, "_", ".", "+", "-", starting with a letter or digit
# (so "..", "a/b" or "" cannot send a run outside runs/<row>/).
ROW_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
SEED_MAX = 2**63 - 1  # seeds are stored in an int64 parquet column
# The task's keys that morph one task towards the other: the condition map's knobs (bnrotation.study.condition_map).
TASK_KNOBS = ("template_scale", "num_classes", "train_size", "pixel_noise")


class ConfigError(ValueError):
    """A config value is missing, of the wrong kind or out of range.

    The message names the full key (for example ``model.bn_momentum``) and
    what is allowed.
    """


def require(ok: bool, key: str, allowed: str, got: Any) -> None:
    """Refuse a config value in one line that names its key: ``key: expected <allowed>, got <got>``.

    Args:
        ok: whether the value passes (the caller's test).
        key: the full key, as a user types it (``model.bn_momentum``).
        allowed: what is allowed, in words (``a float in (0, 1]``).
        got: the value given, shown with ``repr``.

    Raises:
        ConfigError: when ``ok`` is false.
    """
    if not ok:
        raise ConfigError(f"{key}: expected {allowed}, got {got!r}")


def choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    """Refuse ``value`` unless it is one of the names ``allowed``, as :func:`require` words it.

    Raises:
        ConfigError: naming ``key`` and every allowed name.
    """
    require(value in allowed, key, "one of " + ", ".join(allowed), value)


@dataclass
class TaskConfig:
    """The data a run trains and is checked on: the noisy-template task of PROTOCOL.md ("Task: noisy
    templates") or Fashion-MNIST ("Task: Fashion-MNIST"), by ``name``.

    ``template_scale`` is the synthetic task's alone; ``data_dir`` Fashion-MNIST's (where its idx files are,
    which says where the data is read from, not what it is: it is not part of a run's identity).

    Two knobs of the condition map (:mod:`bnrotation.study.condition_map`) morph one task towards the other, each
    off by default (the protocol's tasks, bit for bit):

    * ``train_size``: 0, the task's own training set (the templates' infinite one, a fresh sample at every draw;
      Fashion-MNIST's 60,000 images); N > 0, a finite set of N training samples drawn once per seed from the
      ``trainset`` stream (templates: N samples of the task; Fashion-MNIST: N distinct training images), from
      which every training batch, the probe set and the re-estimation batches are drawn.
    * ``pixel_noise``: Fashion-MNIST's alone: the standard deviation of i.i.d. Gaussian noise added to every pixel
      of every image drawn (training batches, held-out and probe sets, re-estimation batches), fresh at every draw
      and drawn from the draw's own stream; in units of the normalised images' pixel standard deviation (1).
    """

    name: str = "noisy_templates"  # noisy_templates | fashion_mnist
    num_classes: int = 10
    image_size: int = 32  # side of the square images (Fashion-MNIST's 28x28 are resized to it when it differs)
    template_scale: float = 0.6  # sample = template_scale * template[y] + N(0, 1)
    batch_size: int = 128
    probe_size: int = 512  # fresh statistics and drift (held-out size is a scale key)
    data_dir: str = "/usr/share/datasets/fashion-mnist"  # Fashion-MNIST's idx files (Debian's dataset-fashion-mnist)
    train_size: int = 0  # 0: the task's own training set; N > 0: N training samples drawn once, then reused
    pixel_noise: float = 0.0  # Fashion-MNIST: std of the Gaussian noise added to each pixel at each draw (pixel std)
    # The data swap (bnrotation.study.why): 0, none; S > 0, the training batches change source after step S, to
    # swap_to (finite: fresh samples up to step S, then the finite set; fresh: the finite set, then fresh samples)
    swap_step: int = 0
    swap_to: str = "finite"  # finite | fresh

    def __post_init__(self) -> None:
        choice("task.name", self.name, TASKS)
        require(self.num_classes >= 2, "task.num_classes", "an integer >= 2", self.num_classes)
        if self.name == "fashion_mnist":
            require(self.num_classes == 10, "task.num_classes", "10 (Fashion-MNIST's classes)", self.num_classes)
        require(self.image_size >= 4, "task.image_size", "an integer >= 4", self.image_size)
        require(math.isfinite(self.template_scale) and self.template_scale >= 0, "task.template_scale",
                 "a finite float >= 0", self.template_scale)
        for key in ("batch_size", "probe_size"):
            value = getattr(self, key)
            require(value >= 2, f"task.{key}", "an integer >= 2 (BatchNorm needs two samples)", value)
        require(self.train_size == 0 or self.train_size >= self.probe_size, "task.train_size",
                 f"0 (the task's own training set) or an integer >= task.probe_size={self.probe_size} (the probe "
                 "set is drawn from it)", self.train_size)
        require(math.isfinite(self.pixel_noise) and self.pixel_noise >= 0, "task.pixel_noise",
                 "a finite float >= 0", self.pixel_noise)
        choice("task.swap_to", self.swap_to, ("finite", "fresh"))
        require(self.swap_step >= 0, "task.swap_step", "an integer >= 0 (0: no swap)", self.swap_step)
        if self.swap_step:
            require(self.name == "noisy_templates" and self.train_size > 0, "task.swap_step",
                     "0 unless task.name=noisy_templates with task.train_size > 0 (the finite set it swaps with)",
                     self.swap_step)
        if self.name != "fashion_mnist":
            require(self.pixel_noise == 0, "task.pixel_noise", "0.0 on noisy_templates (its noise is set by "
                     "task.template_scale; pixel_noise is Fashion-MNIST's)", self.pixel_noise)

    @property
    def in_channels(self) -> int:
        """Input channels of the task's images: 3 for the templates, 1 for Fashion-MNIST's grey levels."""
        return 1 if self.name == "fashion_mnist" else 3


@dataclass
class ModelConfig:
    """The network: the study's three-block convnet (PROTOCOL.md, "Network") or a CIFAR-style ResNet-20.

    ``channels`` are the three blocks' widths (convnet) or the three stages' widths (resnet20).
    """

    arch: str = "convnet"  # convnet | resnet20
    norm: str = "batch"  # batch | group (GroupNorm) | layer (GroupNorm with one group)
    channels: list[int] = field(default_factory=lambda: [32, 64, 64])
    bn_momentum: float = 0.03  # PyTorch convention: running = (1 - m) running + m batch
    bn_eps: float = 1e-5
    group_norm_groups: int = 8
    channels_last: bool = True  # memory format; numerically equivalent, faster on CPU

    def __post_init__(self) -> None:
        choice("model.arch", self.arch, ARCHS)
        choice("model.norm", self.norm, NORMS)
        require(len(self.channels) == 3 and all(c >= 1 for c in self.channels),
                 "model.channels", "three positive integers", list(self.channels))
        require(0.0 < self.bn_momentum <= 1.0, "model.bn_momentum", "a float in (0, 1]", self.bn_momentum)
        require(math.isfinite(self.bn_eps) and self.bn_eps > 0, "model.bn_eps", "a finite float > 0", self.bn_eps)
        if self.norm == "group":
            require(self.group_norm_groups >= 1 and all(c % self.group_norm_groups == 0 for c in self.channels),
                     "model.group_norm_groups", f"a divisor of every entry of model.channels {list(self.channels)}",
                     self.group_norm_groups)


@dataclass
class OptimizerConfig:
    """Optimizer and its hyper-parameters (PROTOCOL.md, "Training")."""

    name: str = "adam"  # sgd | adam | adamw | adam_projected | adamp
    lr: float = 3e-3
    momentum: float = 0.9  # SGD only
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    # AdamP only (Heo et al. 2021): projection when |cos(grad, w)| < delta / sqrt(dim).
    delta: float = 0.1
    wd_ratio: float = 0.1

    def __post_init__(self) -> None:
        choice("optimizer.name", self.name, OPTIMIZERS)
        require(math.isfinite(self.lr) and self.lr > 0, "optimizer.lr", "a finite float > 0", self.lr)
        require(0.0 <= self.momentum < 1.0, "optimizer.momentum", "a float in [0, 1)", self.momentum)
        require(0.0 <= self.beta1 < 1.0, "optimizer.beta1", "a float in [0, 1)", self.beta1)
        require(0.0 <= self.beta2 < 1.0, "optimizer.beta2", "a float in [0, 1)", self.beta2)
        require(math.isfinite(self.eps) and self.eps > 0, "optimizer.eps", "a finite float > 0", self.eps)
        require(math.isfinite(self.weight_decay) and self.weight_decay >= 0,
                 "optimizer.weight_decay", "a finite float >= 0", self.weight_decay)
        require(self.delta > 0, "optimizer.delta", "a float > 0 (inf: always project)", self.delta)
        require(0.0 <= self.wd_ratio <= 1.0, "optimizer.wd_ratio", "a float in [0, 1]", self.wd_ratio)
        if self.name == "adam_projected":
            require(self.weight_decay == 0.0, "optimizer.weight_decay",
                     "0.0 for adam_projected (the study's variant has no weight decay)", self.weight_decay)


@dataclass
class ScheduleConfig:
    """Learning-rate schedule, stepped once per optimizer step."""

    name: str = "constant"  # constant | cosine (decay to 0 over all steps)

    def __post_init__(self) -> None:
        choice("schedule.name", self.name, SCHEDULES)


@dataclass
class ScaleConfig:
    """How long a run is and when it is measured.

    ``steps`` optimizer steps; probes every ``log_every`` steps from step 0;
    accuracy checks every ``check_every`` steps from ``check_start`` to
    ``steps`` inclusive; interventions every ``intervene_every`` steps inside
    the check window and at the last step.
    """

    name: str = "full"
    steps: int = 6000
    log_every: int = 100
    check_start: int = 2000
    check_every: int = 100
    heldout_size: int = 4000
    reestimate_batches: int = 200
    intervene_every: int = 500
    # Dense windows: the fresh and running statistics of every norm layer at every step from each start to
    # start + dense_length inclusive (the `dense` table), to measure drift at intervals below log_every.
    dense_windows: list[int] = field(default_factory=list)
    dense_length: int = 128
    # The optimizer-state log (bnrotation.study.mechanism): every mechanism_every steps; 0, off
    mechanism_every: int = 0

    def __post_init__(self) -> None:
        require(self.steps >= 1, "scale.steps", "an integer >= 1", self.steps)
        for key in ("log_every", "check_every", "intervene_every", "reestimate_batches"):
            value = getattr(self, key)
            require(value >= 1, f"scale.{key}", "an integer >= 1", value)
        require(self.steps % self.log_every == 0, "scale.log_every",
                 f"a divisor of scale.steps={self.steps}, so that every probe interval is log_every steps",
                 self.log_every)
        require(0 <= self.check_start <= self.steps, "scale.check_start",
                 f"a step inside the run, 0..scale.steps={self.steps}", self.check_start)
        require(self.heldout_size >= 2, "scale.heldout_size", "an integer >= 2", self.heldout_size)
        require(self.dense_length >= 1, "scale.dense_length", "an integer >= 1", self.dense_length)
        require(self.mechanism_every >= 0, "scale.mechanism_every", "an integer >= 0 (0: off)", self.mechanism_every)
        require(all(0 <= w and w + self.dense_length <= self.steps for w in self.dense_windows)
                 and len(set(self.dense_windows)) == len(self.dense_windows), "scale.dense_windows",
                 f"distinct start steps w with 0 <= w and w + scale.dense_length <= scale.steps={self.steps}",
                 list(self.dense_windows))


@dataclass
class AveragingConfig:
    """Weight averaging evaluated during a run (:mod:`bnrotation.averaging`).

    An EMA of the weights per decay in ``ema_decays`` (one update per
    optimizer step, the first update copies), and a tail average of the
    snapshots taken every ``tail_every`` steps within the last ``tail_steps``
    steps (``tail_steps: 0`` turns it off). Each is evaluated under every
    BatchNorm buffer policy at the steps ``at`` names: ``interventions`` (the
    runner's intervention steps: every ``scale.intervene_every`` steps inside
    the check window and the last step), ``checks`` (every check step; slow on
    a CPU) or ``last`` (the last step only).
    """

    enabled: bool = True
    ema_decays: list[float] = field(default_factory=lambda: [0.99, 0.999])
    tail_steps: int = 1000
    tail_every: int = 100
    at: str = "interventions"  # interventions | checks | last

    def __post_init__(self) -> None:
        require(all(isinstance(d, float) and 0.0 < d < 1.0 for d in self.ema_decays)
                 and len(set(self.ema_decays)) == len(self.ema_decays),
                 "averaging.ema_decays", "distinct floats in (0, 1)", list(self.ema_decays))
        require(self.tail_every >= 1, "averaging.tail_every", "an integer >= 1", self.tail_every)
        require(self.tail_steps >= 0 and self.tail_steps % self.tail_every == 0, "averaging.tail_steps",
                 f"0 (off) or a positive multiple of averaging.tail_every={self.tail_every}", self.tail_steps)
        choice("averaging.at", self.at, AVERAGING_AT)


@dataclass
class RunConfig:
    """One run: a row of the table at one seed, at one scale."""

    row: str = "???"
    seed: int = 0
    device: str = "auto"  # auto: CUDA when present, else CPU
    threads: int = 0  # torch intra-op threads; 0: SLURM_CPUS_PER_TASK under SLURM, else torch's default
    deterministic: bool = False  # torch.use_deterministic_algorithms + cuDNN flags (GPU runs; recorded in run.json)
    # How the evaluation-mode passes run (checks, interventions, averaging, the monitor): compiled (torch.compile,
    # one graph per network; bnrotation.evaluation.CompiledEvaluation) | eager | auto (compiled for a CPU run of at
    # least EVAL_COMPILED_MIN_STEPS steps, where the passes outweigh the compile). An execution setting.
    eval_backend: str = "auto"
    dtype: str = "float32"  # float32 | float64 (DTYPES): weights, data, statistics; changes the results
    results_root: str = "results"
    force: bool = False  # rerun even when a finished run with the same config exists
    progress: bool = True  # tqdm bar
    interventions: bool = True  # re-estimation and statistic swaps at intervention steps
    save_checkpoints: bool = True
    # Train these seeds of the row together, in this process, as one batched model (bnrotation.study.ensemble); each
    # still writes, skips and resumes its own folder. Empty: the one run `seed`. An execution setting.
    batch_seeds: list[int] = field(default_factory=list)
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    averaging: AveragingConfig = field(default_factory=AveragingConfig)

    def __post_init__(self) -> None:
        require(ROW_NAME.fullmatch(self.row) is not None,
                 "row", "a row name of letters, digits, _ . + - (it names the results folder): "
                 "pick one with experiment=<row> (see conf/experiment/)", self.row)
        require(0 <= self.seed <= SEED_MAX, "seed", f"an integer in 0..{SEED_MAX}", self.seed)
        choice("device", self.device, DEVICES)
        choice("eval_backend", self.eval_backend, EVAL_BACKENDS)
        choice("dtype", self.dtype, DTYPES)
        require(self.threads >= 0, "threads", "an integer >= 0 (0: the launcher's or torch's default)", self.threads)
        require(all(0 <= s <= SEED_MAX for s in self.batch_seeds) and len(set(self.batch_seeds)) ==
                 len(self.batch_seeds), "batch_seeds", f"distinct integers in 0..{SEED_MAX} (empty: just `seed`)",
                 list(self.batch_seeds))


# conf/hydra/launcher/*.yaml carry the launcher plugins' own names, so that `hydra/launcher=joblib` picks
# them up; Hydra then validates each against the plugin's schema of that name and warns about it in every
# process that composes a config (the launchers' workers too, which import this module first).
warnings.filterwarnings("ignore", message=r"(?s).*hydra/launcher/.*validated against ConfigStore schema")


@dataclass(frozen=True)
class Schema:
    """A run config's dataclass ``node`` under its ``name`` in Hydra's ConfigStore (``defaults: [<name>]`` in its
    YAML), for each entry point: the suite's runs, the frozen backbone, the zoo.

    ``register()`` stores it (idempotent); ``validate(cfg)`` is :func:`to_config` with it (raises ConfigError, one
    line naming the first bad key and what it expects)."""

    name: str
    node: type

    def register(self) -> None:
        ConfigStore.instance().store(name=self.name, node=self.node)

    def validate(self, cfg: DictConfig | dict):
        return to_config(cfg, self.node)


RUN_SCHEMA = Schema("run_schema", RunConfig)
register_configs = RUN_SCHEMA.register  # the suite's RunConfig as run_schema (experiments/train.py)


# Keys that say where and how a run is executed, not what it computes.
# `deterministic` is one of them: it picks kernels (bitwise reproducible on a GPU, slower), not the experiment;
# so is `batch_seeds`, which trains several seeds at once (the same runs up to the order of float sums).
NON_SEMANTIC_KEYS = ("results_root", "force", "progress", "threads", "deterministic", "batch_seeds", "eval_backend")


def unknown_keys(given: Any, schema: Any, prefix: str = "") -> list[str]:
    """Dotted keys present in ``given`` (a plain nested dict) that ``schema`` (the schema as a plain dict)
    lacks; mappings are compared key by key, recursively."""
    if not isinstance(given, dict) or not isinstance(schema, dict):
        return []
    out = []
    for key, value in given.items():
        if key not in schema:
            out.append(f"{prefix}{key}")
        else:
            out += unknown_keys(value, schema[key], f"{prefix}{key}.")
    return out


@functools.cache
def structured_schema(schema: type = RunConfig) -> DictConfig:
    """The schema (a dataclass: :class:`RunConfig`, or another entry point's, such as the zoo's) as a structured
    config, built once: ``OmegaConf.merge`` copies it, never changes it."""
    return OmegaConf.structured(schema)


@functools.cache
def _schema(schema: type = RunConfig) -> dict:
    """The schema's keys and defaults as a plain nested dict, built once (read, never changed)."""
    return OmegaConf.to_container(structured_schema(schema))


def _reject_unknown_keys(cfg: DictConfig, schema: type = RunConfig) -> None:
    """Hydra lets ``+key=value`` append a key even in struct mode, and the structured merge drops it without a
    word; every key must be one of the schema's."""
    check_known_keys({k: v for k, v in OmegaConf.to_container(cfg, resolve=False).items() if k != "hydra"}, schema)


def check_known_keys(given: dict, schema: type = RunConfig) -> None:
    """Refuse a key of ``given`` (a plain nested dict) that ``schema`` (a dataclass) lacks.

    Raises:
        ConfigError: one line naming the first such dotted key and the closest key of its section.
    """
    keys = _schema(schema)
    unknown = unknown_keys(given, keys)
    if unknown:
        key = unknown[0]
        parent, _, leaf = key.rpartition(".")
        siblings = keys
        for part in parent.split(".") if parent else []:
            siblings = siblings[part]
        close = difflib.get_close_matches(leaf, list(siblings), n=1)
        hint = f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else ""
        more = f"; also {', '.join(unknown[1:])}" if len(unknown) > 1 else ""
        raise ConfigError(f"{key}: not a key of the config{hint}{more}; keys are listed in "
                          "bnrotation/study/config.py and conf/")


def to_config(cfg: DictConfig | dict, schema: type, before=None):
    """Turn a composed config into a validated instance of the dataclass ``schema`` (its ``__post_init__`` checks
    ranges and choices). ``before(cfg)``, if given, checks the composed config first (raising ConfigError).

    Raises:
        ConfigError: naming the first key that is not in the schema (also one appended with ``+key=value``),
            missing, of the wrong type or out of range.
    """
    try:
        if isinstance(cfg, dict):
            cfg = OmegaConf.create(cfg)
        _reject_unknown_keys(cfg, schema)
        if before is not None:
            before(cfg)
        out = OmegaConf.to_object(OmegaConf.merge(structured_schema(schema), cfg))
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - omegaconf's type and syntax errors; most carry the key as full_key
        key = getattr(err, "full_key", None) or "config"
        raise ConfigError(f"{key}: {str(err).splitlines()[0]}") from err
    assert isinstance(out, schema)
    return out


def _row_given(cfg: DictConfig) -> None:
    if "row" not in cfg or OmegaConf.is_missing(cfg, "row"):
        raise ConfigError("row: expected a row name: pick one with experiment=<row> (see conf/experiment/)")


def to_run_config(cfg: DictConfig | dict) -> RunConfig:
    """Turn a composed config into a validated :class:`RunConfig` (:func:`to_config`).

    Raises:
        ConfigError: naming the first key that is not in the schema (also one
            appended with ``+key=value``), missing, or out of range.
    """
    return to_config(cfg, RunConfig, _row_given)


def check_row(cfg: RunConfig) -> None:
    """Refuse a config that keeps a registered row's name but changes what the row means.

    A row name names a results folder and a definition (:data:`bnrotation.study.rows.ROWS`): optimizer, learning
    rate, schedule, weight decay, task, network, norm, BatchNorm momentum and the optimizer settings the row fixes
    (the task's and the network's sizes are not: the tests run every row at a toy size). A
    variant (``optimizer.lr=0.001`` on ``experiment=adam``) needs a row name of its own, else its results
    would be filed, and refused by ``make table``, as the row's. Unregistered row names are not checked.

    Raises:
        ConfigError: naming the first key that contradicts the row and saying to pass ``row=<name>``.
    """
    from .rows import ROWS  # no torch

    if cfg.scale.mechanism_every and len(set(cfg.batch_seeds)) > 1:
        raise ConfigError("scale.mechanism_every: the optimizer-state log reads each seed's own optimizer; expected "
                          "0 with batch_seeds of several seeds, or run the seeds one by one (seed=...)")
    if cfg.task.swap_step >= cfg.scale.steps:
        raise ConfigError(f"task.swap_step: expected a step before scale.steps={cfg.scale.steps} (the swap must "
                          f"happen inside the run), got {cfg.task.swap_step}")
    spec = ROWS.get(cfg.row)
    if spec is None:
        return
    wanted = {"task.name": spec.task,
              "optimizer.name": spec.optimizer, "optimizer.lr": spec.lr, "schedule.name": spec.schedule,
              "optimizer.weight_decay": spec.weight_decay, "model.norm": spec.norm, "model.arch": spec.arch,
              **{f"optimizer.{k}": v for k, v in spec.extra.items()}}
    if spec.norm == "batch":
        wanted["model.bn_momentum"] = spec.bn_momentum
    for key, want in wanted.items():
        got = functools.reduce(getattr, key.split("."), cfg)
        same = math.isclose(got, want, rel_tol=1e-9) if isinstance(want, float) else got == want
        if not same:
            raise ConfigError(f"{key}: {got!r} changes what row {cfg.row!r} means ({key}={want!r}); give the "
                              f"variant a row name of its own, e.g. row={cfg.row}_variant, so that its results "
                              "are filed apart")


def semantic_dict(cfg: RunConfig | DictConfig) -> dict:
    """The config (a :class:`RunConfig`, another schema's dataclass, or a ``DictConfig``) as a plain dict, without
    keys that do not change the results (:data:`NON_SEMANTIC_KEYS`, ``task.data_dir``)."""
    d = OmegaConf.to_container(OmegaConf.structured(cfg) if dataclasses.is_dataclass(cfg) else cfg, resolve=True)
    for key in NON_SEMANTIC_KEYS:
        d.pop(key, None)
    d.get("task", {}).pop("data_dir", None)  # where the files are read from, not what they hold
    d.pop("hydra", None)
    return d
