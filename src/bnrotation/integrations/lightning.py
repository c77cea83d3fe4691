"""The staleness monitor as a Lightning callback (an optional extra: ``pip install 'bnrotation[lightning]'``).

::

    from bnrotation.integrations.lightning import StalenessCallback

    trainer = lightning.pytorch.Trainer(callbacks=[StalenessCallback((x_probe, y_probe), every_n_steps=50)])
    trainer.fit(module, loader)

Importing this module imports Lightning (``lightning.pytorch``, else the older ``pytorch_lightning``
package); importing :mod:`bnrotation` or :mod:`bnrotation.integrations` does not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    import lightning.pytorch as pl
    from lightning.fabric.utilities.apply_func import move_data_to_device
except ImportError:  # the package's older name
    try:
        import pytorch_lightning as pl
        from lightning_fabric.utilities.apply_func import move_data_to_device
    except ImportError as e:
        raise ImportError("bnrotation.integrations.lightning needs Lightning: pip install 'bnrotation[lightning]' "
                          "(or lightning>=2.0)") from e

import torch.nn as nn

from ..monitor import MonitorRecord
from . import MonitorSession, SessionView

__all__ = ["StalenessCallback"]


class StalenessCallback(SessionView, pl.Callback):
    """Calls :class:`bnrotation.monitor.StalenessMonitor` every ``every_n_steps`` optimizer steps of
    ``Trainer.fit`` and logs the study's three signals (mode gap and accuracies, rotation per 100 steps,
    running-mean lag; :func:`bnrotation.integrations.record_metrics`) to every logger of the trainer.

    Steps are ``trainer.global_step``, the optimizer steps taken. The monitor is attached at
    ``on_train_start`` and measures there (step 0, or the step a resumed fit starts from), then at
    ``on_train_batch_end`` once ``global_step`` reaches the next multiple of ``every_n_steps``; the weights
    are kept at ``on_before_optimizer_step`` of a step that will be measured, for its update and gradient
    cosines. With ``accumulate_grad_batches=k`` the trainer ends ``k`` batches at the same global step: the
    callback measures once and skips the others (a callback that passes every batch's global step to the
    monitor stops ``fit`` with ``ValueError: step n is not after the previous call's step n``).

    It logs through ``logger.log_metrics(metrics, step=global_step)`` of each of ``trainer.loggers``, so a
    metric lands at the step it was measured at (``LightningModule.log`` would hold it back to the
    trainer's ``log_every_n_steps``). In a multi-process run (DDP) every rank measures its own copy of the
    model, in step with the others (a ``SyncBatchNorm`` layer's training-mode forward is a collective
    call that every rank must make), and only global rank 0 (``trainer.is_global_zero``) logs and writes
    ``save_dir``; each rank keeps its own records.

    Resuming: the monitor's state (its last call's step, the paired weights then, the fresh means) is saved in
    every checkpoint through the ``state_dict`` / ``load_state_dict`` hooks, so ``fit(ckpt_path=...)``
    measures its next rotation against the last call before the checkpoint and does not measure that call's
    step again (``docs/integrations.md``, "Resuming").

    Which model it measures: the raw training model, ``pl_module`` (or its submodule ``model``), never a
    DDP wrapper. Lightning's ``WeightAveraging`` (and ``EMAWeightAveraging``) keeps its average in an
    ``AveragedModel`` and swaps it into ``pl_module`` only from ``on_validation_epoch_start`` to
    ``on_validation_epoch_end`` and, at ``on_train_end``, for good; this callback measures at training-batch
    ends, when the training weights are in place, whatever the order of the callbacks; the averaged model is
    not measured (attach a monitor to it yourself, or to ``pl_module`` after ``fit``). The exception is
    ``StochasticWeightAveraging``: it copies its average into ``pl_module`` for an extra last epoch of
    forward passes that recompute the BatchNorm statistics, in which ``global_step`` stays put until the
    epoch's last batch (Lightning 2.6.6 counts one step there); a call due at that step measures the average.

    Args:
        probe: a fixed probe batch (a tensor, an ``(x, y)`` tuple or a mapping, as the monitor takes it, on
            any device; moved to the module's device at ``on_train_start``).
        every_n_steps: optimizer steps between calls (an int >= 1).
        model: the dotted name of the submodule to measure (``pl_module.get_submodule(model)``, e.g. ``"net"``
            when the LightningModule's forward does not return logits); ``None``: ``pl_module`` itself. It
            must return (N, classes) on the probe inputs.
        prefix: put before each logged metric's name.
        per_layer: also log each norm layer's rotation and median lag.
        measure_at_start: measure at the step ``fit`` starts from.
        keep_records: keep each call's :class:`bnrotation.monitor.MonitorRecord` in :attr:`records`.
        save_dir: write the records' tables there as parquet at ``on_train_end`` (rank 0).
        monitor_kwargs: passed to :class:`bnrotation.monitor.StalenessMonitor` unchanged.

    Attributes:
        records: the kept records; :meth:`frames` gives them as the monitor's three tables.
        monitor: the monitor, from ``on_train_start`` on.

    Raises:
        ValueError, TypeError: as :class:`bnrotation.integrations.MonitorSession` for the arguments; as the
            monitor (at ``on_train_start``, before the first optimizer step) for a probe or model it cannot
            measure; ``AttributeError`` naming ``model`` when ``pl_module`` has no such submodule.
    """

    def __init__(self, probe, every_n_steps: int = 50, *, model: str | None = None, prefix: str = "bnrotation/",
                 per_layer: bool = False, measure_at_start: bool = True, keep_records: bool = True,
                 save_dir: str | Path | None = None, **monitor_kwargs: Any):
        self.session = MonitorSession(probe, every_n_steps, measure_at_start=measure_at_start,
                                      keep_records=keep_records, save_dir=save_dir, monitor_kwargs=monitor_kwargs)
        self.model_name, self.prefix, self.per_layer = model, prefix, per_layer

    def measured_model(self, pl_module: pl.LightningModule) -> nn.Module:
        """The module the monitor measures: ``pl_module`` or its submodule named ``model``."""
        return pl_module if self.model_name is None else pl_module.get_submodule(self.model_name)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        record = self.session.start(self.measured_model(pl_module), trainer.global_step,
                                    lambda probe: move_data_to_device(probe, pl_module.device))
        self._log(trainer, record)

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer) -> None:
        self.session.before_optimizer_step(trainer.global_step)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        self._log(trainer, self.session.after_optimizer_step(trainer.global_step))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.session.finish(write=trainer.is_global_zero)

    @property
    def state_key(self) -> str:
        """The key of this callback's state in a checkpoint: one per measured model and interval, the same for a
        subclass (one that overrides :meth:`on_record` resumes from the base class's checkpoint, and back)."""
        return f"StalenessCallback{repr({'model': self.model_name, 'every_n_steps': self.session.every_n_steps})}"

    def state_dict(self) -> dict[str, Any]:
        """Saved in every checkpoint: :meth:`bnrotation.integrations.MonitorSession.state_dict` (the monitor's
        last call: its step, the paired weights then, the fresh means)."""
        return self.session.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restored by ``Trainer.fit(ckpt_path=...)`` before ``on_train_start``, which resumes the monitor from
        it (:meth:`bnrotation.integrations.MonitorSession.start`)."""
        self.session.load_state_dict(state_dict)

    def on_record(self, trainer: pl.Trainer, record: MonitorRecord) -> None:
        """Called on every rank with each call's record, after it is logged; does nothing. Override it to act
        on a record (stop, re-estimate, print ``record.summary``)."""

    def _log(self, trainer: pl.Trainer, record: MonitorRecord | None) -> None:
        if record is None:
            return
        if trainer.is_global_zero:
            metrics = self.metrics(record)
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=record.step)
        self.on_record(trainer, record)
