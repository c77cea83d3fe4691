"""Adapters from the training loops people use to the staleness monitor (:class:`bnrotation.monitor.StalenessMonitor`).

One module per framework, each an optional extra of the same name, each importing its framework only when
it is imported itself (``import bnrotation.integrations`` imports neither):

- :mod:`bnrotation.integrations.lightning`: ``StalenessCallback``, a ``lightning.pytorch.Callback``;
- :mod:`bnrotation.integrations.transformers`: ``StalenessCallback``, a ``transformers.TrainerCallback``.

An adapter translates the framework's events into monitor calls and the monitor's records into the
framework's logger; it measures nothing itself. What they share lives here, free of any framework:
:class:`MonitorSession` (when to measure, in optimizer steps; the snapshot before a measured step; the records
kept for the user and their parquet files) and :func:`record_metrics` (the scalars a logger receives).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from pathlib import Path

import pandas as pd
import torch
import torch.nn as nn

from ..monitor import MonitorRecord, StalenessMonitor
from ..probe_batch import split_probe

__all__ = ["MonitorSession", "SessionView", "record_metrics", "TABLES"]

# The monitor's tables (MonitorRecord attributes), one parquet file each.
TABLES = ("checks", "layers", "channels")


def record_metrics(record: MonitorRecord, prefix: str = "bnrotation/", per_layer: bool = False) -> dict[str, float]:
    """The scalars a framework's logger receives for one monitor call: the study's three signals.

    Keys (after ``prefix``):

    - ``acc_train_mode``, ``acc_eval_mode`` (fractions; only with probe labels), ``mode_agreement`` (share
      of probe samples predicted alike in both modes) and ``mode_gap`` (training- minus evaluation-mode
      accuracy, or 1 - agreement without labels): the mode check (``record.checks``);
    - ``rotation_deg_per_100``: degrees per 100 optimizer steps since the previous call, the median over
      layers of each layer's median over channels (as in ``record.summary``);
    - ``lag_median_abs_sigma``: the worst layer's median |running-mean lag|, in σ (what
      :class:`bnrotation.monitor.Thresholds` compares with ``lag_sigma``), and ``lag_max_abs_sigma``,
      the largest |lag| of any channel;
    - ``stale``: 1.0 when the call told the user the statistics are stale (``record.flagged``: the monitor's
      ``StaleStatisticsWarning`` and ``STALE`` in ``record.summary``), else 0.0. During the monitor's warm-up
      (steps below ``monitor.warmup_steps``) it is 0.0 unless a running statistic is NaN or infinite;
    - ``stale_rule``: 1.0 when the monitor's rule fired (``record.stale``: the mode gap and the lag over their
      thresholds, or non-finite running statistics), warm-up or not, else 0.0;
    - ``undetermined``: 1.0 when the rule could not judge the call (``record.undetermined``: a probe too small
      for the gap threshold, no gap measured, no finite lag or E), so that a 0.0 of ``stale`` is never read as
      "not stale" where nothing was judged, else 0.0;
    - with ``per_layer``, also ``<norm layer>/rotation_deg_per_100`` and ``<norm layer>/lag_median_abs_sigma``.

    A value the call did not measure (rotation at the first call, accuracies without labels, the lag of a
    layer whose statistics are NaN) is left out rather than logged as NaN; ``stale``, ``stale_rule`` and
    ``undetermined`` are always there.
    """
    checks = record.checks.iloc[0]
    layers = record.layers
    out = {k: float(checks[k]) for k in ("acc_train_mode", "acc_eval_mode", "mode_agreement", "mode_gap")}
    rotation, lag = layers["rotation_deg_per_100"], layers["lag_median_abs_sigma"]
    out["rotation_deg_per_100"] = float(rotation.median()) if rotation.notna().any() else math.nan
    out["lag_median_abs_sigma"] = float(lag.max()) if lag.notna().any() else math.nan
    lag_max = layers["lag_max_abs_sigma"]
    out["lag_max_abs_sigma"] = float(lag_max.max()) if lag_max.notna().any() else math.nan
    if per_layer:
        for line in layers.itertuples():
            out[f"{line.norm_layer}/rotation_deg_per_100"] = float(line.rotation_deg_per_100)
            out[f"{line.norm_layer}/lag_median_abs_sigma"] = float(line.lag_median_abs_sigma)
    metrics = {prefix + k: v for k, v in out.items() if math.isfinite(v)}
    metrics[prefix + "stale"] = float(record.flagged)
    metrics[prefix + "stale_rule"] = float(record.stale)
    metrics[prefix + "undetermined"] = float(bool(record.undetermined))
    return metrics


def _require_pyarrow() -> None:
    """Refuse a ``save_dir`` in one line when pyarrow, which writes its parquet files, does not import: at
    construction, before any training, not at the end of it.

    Raises:
        ImportError: naming ``save_dir``, pyarrow and the two ways out (install it, or pass ``save_dir=None``).
    """
    try:
        import pyarrow  # noqa: F401 - only whether it imports
    except ImportError as err:
        raise ImportError(f"save_dir: writing the monitor's tables as parquet needs pyarrow, which does not import "
                          f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no message'}): "
                          "pip install pyarrow (or 'bnrotation[suite]'), or pass save_dir=None") from None


class MonitorSession:
    """The framework-free half of an adapter: one monitor, called every ``every_n_steps`` optimizer steps.

    An adapter calls :meth:`start` once the model is on its device, :meth:`before_optimizer_step` just
    before each ``optimizer.step()``, :meth:`after_optimizer_step` after it, and :meth:`finish` at the end.
    Steps are the framework's count of optimizer steps (``trainer.global_step``, ``state.global_step``): 0
    before the first, ``n`` after the ``n``-th. Under gradient accumulation a framework reports the same
    step at several micro-batches; a step already measured (or not yet due) is skipped, never passed to the
    monitor twice, which would raise ``ValueError: step n is not after the previous call's step n``.

    Args:
        probe: the fixed probe batch, as :class:`bnrotation.monitor.StalenessMonitor` takes it (a tensor, an
            ``(x, y)`` tuple or a mapping); moved to the model's device at :meth:`start`.
        every_n_steps: measure at every optimizer step that is a multiple of it (an int >= 1); when a
            framework skips past a multiple (several optimizers stepping per batch) the next step after it.
        measure_at_start: also measure at the step training starts from (0, or the resumed step), so the
            first logged rotation already covers an interval.
        keep_records: keep every :class:`bnrotation.monitor.MonitorRecord` in :attr:`records`.
        save_dir: a folder to write ``checks.parquet``, ``layers.parquet`` and ``channels.parquet`` to at
            :meth:`finish` (the monitor's columns; needs pyarrow, which is checked here, at construction);
            ``None``: write nothing, and need no pyarrow.
        monitor_kwargs: passed to :class:`bnrotation.monitor.StalenessMonitor` unchanged (``input_key``,
            ``target_key``, ``thresholds``, ``warn``, ``modes``, and options it gains later).

    Raises:
        ValueError: for ``every_n_steps`` that is not an int >= 1, a ``save_dir`` that cannot be written or
            is given with ``keep_records=False``;
            a probe the monitor cannot use raises at :meth:`start`, before the first optimizer step.
        TypeError: for a probe :func:`bnrotation.probe_batch.split_probe` cannot read.
        ImportError: for a ``save_dir`` when pyarrow does not import (one line: install it, or pass None).
    """

    def __init__(self, probe, every_n_steps: int = 50, *, measure_at_start: bool = True, keep_records: bool = True,
                 save_dir: str | Path | None = None, monitor_kwargs: Mapping | None = None):
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, numbers.Integral) or every_n_steps < 1:
            raise ValueError(f"every_n_steps: expected the number of optimizer steps between calls, an int >= 1, "
                             f"got {every_n_steps!r}")
        self.monitor_kwargs = dict(monitor_kwargs or {})
        split_probe(probe, self.monitor_kwargs.get("input_key", "input"), self.monitor_kwargs.get("target_key",
                                                                                                  "target"))
        if save_dir is not None and not keep_records:
            raise ValueError("save_dir: the records are written from those kept; keep_records=False keeps none")
        if save_dir is not None:
            _require_pyarrow()
            from ..records import folder_problem  # imports pyarrow: only when records are written
            problem = folder_problem(save_dir)
            if problem:
                raise ValueError(f"save_dir: cannot write the monitor's tables to {save_dir}: {problem}")
        self.probe, self.every_n_steps = probe, int(every_n_steps)
        self.measure_at_start, self.keep_records = measure_at_start, keep_records
        self.save_dir = Path(save_dir) if save_dir is not None else None
        self.monitor: StalenessMonitor | None = None
        self.records: list[MonitorRecord] = []
        self.last_step: int | None = None  # the last step measured
        self._next = every_n_steps  # the next step due
        self._snapshot: tuple[int, dict[str, torch.Tensor]] | None = None  # (the step it is for, weights)
        self._restored: dict | None = None  # a checkpoint's state_dict(), applied at start()

    def start(self, model: nn.Module, step: int, to_device: Callable) -> MonitorRecord | None:
        """Attach the monitor to ``model`` (the raw training model, on its device) with the probe moved by
        ``to_device(probe)``, at ``step`` (0, or the step a resumed run starts from); measure there if
        ``measure_at_start``. The next call is due at the first multiple of ``every_n_steps`` after it.

        After :meth:`load_state_dict` the monitor resumes from the checkpoint's last call: the next rotation
        and drift are measured against it, and the start is not measured again when that call was at
        ``step`` itself (as it is when the checkpoint was written at a measured step).

        Raises:
            ValueError: when the restored state's last call is after ``step`` (a checkpoint of another run),
                or its weights are not this model's (:meth:`StalenessMonitor.load_state_dict`).
        """
        self.monitor = StalenessMonitor(model, to_device(self.probe), **self.monitor_kwargs)
        self._snapshot, self.last_step = None, None
        self._next = self._next_multiple(step)
        restored, self._restored = self._restored, None
        if restored and restored.get("monitor"):
            last = int(restored["monitor"]["step"])
            if last > step:
                raise ValueError(f"the checkpoint's monitor state is from step {last}, after the step {step} "
                                 "training resumes from: a checkpoint of another run?")
            self.monitor.load_state_dict(restored["monitor"])
            self.last_step = last
            if last == step:
                return None
        return self._measure(step) if self.measure_at_start else None

    def state_dict(self) -> dict:
        """What a resumed run needs to go on measuring as if it had not stopped: the monitor's
        :meth:`StalenessMonitor.state_dict` (the last call's step, the paired weights then, the fresh means)
        and ``every_n_steps``. Not the records kept so far: a resumed run's records start after the resume."""
        return {"every_n_steps": self.every_n_steps,
                "monitor": self.monitor.state_dict() if self.monitor is not None else {}}

    def load_state_dict(self, state: Mapping) -> None:
        """Keep ``state`` (:meth:`state_dict`'s output) for the next :meth:`start`, which attaches the monitor.

        Raises:
            ValueError: for a state that is not :meth:`state_dict`'s output.
        """
        if not isinstance(state, Mapping) or not {"every_n_steps", "monitor"} <= set(state):
            got = sorted(map(str, state)) if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"monitor session state: expected the keys 'every_n_steps' and 'monitor' "
                             f"(MonitorSession.state_dict), got {got}")
        self._restored = dict(state)

    def _next_multiple(self, step: int) -> int:
        return (step // self.every_n_steps + 1) * self.every_n_steps

    def due(self, step: int) -> bool:
        """Whether ``step`` is to be measured: at or past the next multiple of ``every_n_steps`` after the
        last step measured (or the start); so never the same step twice."""
        return self.monitor is not None and step >= self._next

    def before_optimizer_step(self, step: int) -> None:
        """Keep the paired weights (:meth:`StalenessMonitor.snapshot`) when the step about to be taken, the
        ``step + 1``-th, will be measured: its update and gradient cosines need them."""
        if self.due(step + 1):
            self._snapshot = (step + 1, self.monitor.snapshot())

    def after_optimizer_step(self, step: int) -> MonitorRecord | None:
        """Measure at ``step`` (optimizer steps taken so far) if it is due, else None."""
        return self._measure(step) if self.due(step) else None

    def _measure(self, step: int) -> MonitorRecord:
        before = self._snapshot[1] if self._snapshot is not None and self._snapshot[0] == step else None
        self._snapshot = None
        record = self.monitor(step, before)
        self.last_step, self._next = step, self._next_multiple(step)
        if self.keep_records:
            self.records.append(record)
        return record

    def frames(self) -> dict[str, pd.DataFrame]:
        """The kept records as the monitor's three long-format tables, ``{"checks", "layers", "channels"}``,
        one line per call, per layer and per channel (empty frames before the first call)."""
        return {name: pd.concat([getattr(r, name) for r in self.records], ignore_index=True) if self.records
                else pd.DataFrame() for name in TABLES}

    def finish(self, write: bool = True) -> list[Path]:
        """Write the kept records to ``save_dir`` when one was given and ``write`` (an adapter passes
        whether this process is the one that logs). Returns the files written.

        Raises:
            ValueError: when ``save_dir`` is set but ``keep_records`` is not (nothing to write).
        """
        if self.save_dir is None or not write:
            return []
        if not self.keep_records:
            raise ValueError("save_dir: the monitor's records were not kept (keep_records=False); nothing to write")
        from ..records import write_table
        paths = []
        for name, frame in self.frames().items():
            path = self.save_dir / f"{name}.parquet"
            write_table(frame, path, f"monitor_{name}")
            paths.append(path)
        return paths


class SessionView:
    """What both callbacks show of their :class:`MonitorSession` (``self.session``) and how they turn a record
    into metrics (``self.prefix``, ``self.per_layer``; :func:`record_metrics`)."""

    session: MonitorSession
    prefix: str
    per_layer: bool

    @property
    def records(self) -> list[MonitorRecord]:
        """Each call's record, in order (with ``keep_records``)."""
        return self.session.records

    @property
    def monitor(self) -> StalenessMonitor | None:
        """The monitor, once training has started."""
        return self.session.monitor

    def frames(self) -> dict[str, pd.DataFrame]:
        """See :meth:`MonitorSession.frames`."""
        return self.session.frames()

    def metrics(self, record: MonitorRecord) -> dict[str, float]:
        """:func:`record_metrics` with this callback's ``prefix`` and ``per_layer``."""
        return record_metrics(record, self.prefix, self.per_layer)
