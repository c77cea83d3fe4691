"""The staleness monitor as a Hugging Face ``Trainer`` callback (an optional extra:
``pip install 'bnrotation[transformers]'``).

::

    from bnrotation.integrations.transformers import StalenessCallback

    probe = next(iter(trainer.get_train_dataloader()))  # or any fixed batch: {"pixel_values": ..., "labels": ...}
    trainer = Trainer(model, args, train_dataset=..., callbacks=[StalenessCallback(probe, every_n_steps=50)])

Importing this module imports ``transformers`` and ``accelerate``; importing :mod:`bnrotation` or
:mod:`bnrotation.integrations` does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

try:
    import transformers
    from accelerate.utils import send_to_device
except ImportError as e:
    raise ImportError("bnrotation.integrations.transformers needs transformers and accelerate: "
                      "pip install 'bnrotation[transformers]'") from e

import torch
import torch.nn as nn

# the hooks around optimizer.step() this callback measures at; without them it would never measure
_HOOKS = ("on_pre_optimizer_step", "on_optimizer_step")
if not all(hasattr(transformers.TrainerCallback, hook) for hook in _HOOKS):
    raise ImportError(f"bnrotation.integrations.transformers needs a transformers whose TrainerCallback has "
                      f"{' and '.join(_HOOKS)}; found {transformers.__version__}: "
                      "pip install 'bnrotation[transformers]'")

from ..monitor import MonitorRecord
from . import MonitorSession, SessionView

__all__ = ["StalenessCallback", "ModelLogits", "STATE_FILE"]

# The monitor's state in a Trainer checkpoint folder (written at on_save, read when a run resumes from it).
STATE_FILE = "bnrotation_monitor.pt"


class ModelLogits(nn.Module):
    """A Trainer's model seen as the monitor calls it: tensor in, logits out.

    ``forward(x)`` calls ``model(**{input_key: x})``, or ``model(**x)`` when ``x`` is a mapping (a monitor
    that takes a mapping probe whole as the input), as the Trainer calls it with a batch, and returns the
    logits (N, classes, ...): ``output[logits_key]`` of a mapping or ``ModelOutput``, ``output[0]`` of a tuple
    (``return_dict=False``; without labels the first entry is the logits), the output itself when it is a
    tensor. The model is the submodule ``model``, so the monitor's layer names start with ``model.``.
    """

    def __init__(self, model: nn.Module, input_key: str, logits_key: str = "logits"):
        super().__init__()
        self.model, self.input_key, self.logits_key = model, input_key, logits_key

    def forward(self, x: torch.Tensor | Mapping) -> torch.Tensor:
        out = self.model(**x) if isinstance(x, Mapping) else self.model(**{self.input_key: x})
        if isinstance(out, torch.Tensor):
            return out
        if isinstance(out, Mapping):
            return out[self.logits_key]
        return out[0]


class StalenessCallback(SessionView, transformers.TrainerCallback):
    """Calls :class:`bnrotation.monitor.StalenessMonitor` every ``every_n_steps`` optimizer steps of
    ``Trainer.train`` and logs the study's three signals (mode gap and accuracies, rotation per 100 steps,
    running-mean lag; :func:`bnrotation.integrations.record_metrics`) with the Trainer's own logs.

    Steps are ``state.global_step``, the optimizer steps taken, so ``gradient_accumulation_steps`` changes
    nothing: the monitor is attached at ``on_train_begin`` and measures there (step 0, or the step a resumed
    run starts from); the weights are kept at ``on_pre_optimizer_step`` of a step that will be measured;
    the call comes at ``on_optimizer_step``, after ``optimizer.step()`` and before the Trainer zeroes the
    gradients (so the gradient cosine sees the step's gradient), as step ``state.global_step + 1``, the
    count the Trainer reaches right after. A step already measured is skipped.

    Logging: at ``on_step_end`` of a measured step the callback sets ``control.should_log``, so the
    Trainer logs at that step, and at ``on_log`` it adds the metrics to that step's ``logs`` and to its line
    of ``state.log_history``. The Trainer passes ``logs`` to its callbacks in order, and those of
    ``report_to`` (TensorBoard, W&B, ...) come before the ones given to ``Trainer(callbacks=...)``: to
    have them report the metrics too, put this callback first,
    ``trainer.callback_handler.callbacks.insert(0, callback)``. The call at the start is kept as its own
    line of ``state.log_history`` (``{..., "step": 0}``). In a multi-process run every process measures its
    own copy of the model, in step with the others, and only the main process
    (``state.is_world_process_zero``) logs and writes ``save_dir``; each keeps its own records.

    Resuming: at ``on_save`` the monitor's state is written into the checkpoint folder just saved
    (:data:`STATE_FILE`), and a run resumed from that checkpoint reads it at ``on_train_begin``, so its next
    rotation is measured against the last call before the checkpoint and that call's step is not measured
    again; without the file a resumed run starts a fresh monitor (``docs/integrations.md``, "Resuming").

    Which model it measures: the raw training model the Trainer passes to its callbacks (``model``, not
    the DDP wrapper), through :class:`ModelLogits`. ``transformers`` has no weight-averaging callback of
    its own; an average kept elsewhere is not measured.

    Args:
        probe: a fixed probe batch: a mapping as the Trainer's data collator makes it (the input under
            ``input_key``, labels, optional, under ``target_key``), or a tensor or an ``(x, y)`` tuple; on any
            device, moved to the model's at ``on_train_begin``.
        every_n_steps: optimizer steps between calls (an int >= 1).
        input_key: the model's keyword for the input (``pixel_values`` for the library's vision models).
        target_key: the probe's key for the labels.
        logits_key: the key of the logits in the model's output.
        prefix: put before each logged metric's name.
        per_layer: also log each norm layer's rotation and median lag.
        measure_at_start: measure at the step training starts from.
        keep_records: keep each call's :class:`bnrotation.monitor.MonitorRecord` in :attr:`records`.
        save_dir: write the records' tables there as parquet at ``on_train_end`` (main process); needs pyarrow
            (``pip install pyarrow`` or ``'bnrotation[suite]'``), checked at construction.
        monitor_kwargs: passed to :class:`bnrotation.monitor.StalenessMonitor` unchanged.

    Raises:
        ValueError, TypeError: as :class:`bnrotation.integrations.MonitorSession` for the arguments; as the
            monitor (at ``on_train_begin``, before the first optimizer step) for a probe or model it cannot
            measure.
        ImportError: at construction, for a ``save_dir`` when pyarrow does not import, in one line.
    """

    def __init__(self, probe, every_n_steps: int = 50, *, input_key: str = "pixel_values", target_key: str = "labels",
                 logits_key: str = "logits", prefix: str = "bnrotation/", per_layer: bool = False,
                 measure_at_start: bool = True, keep_records: bool = True, save_dir: str | Path | None = None,
                 **monitor_kwargs: Any):
        self.session = MonitorSession(probe, every_n_steps, measure_at_start=measure_at_start,
                                      keep_records=keep_records, save_dir=save_dir,
                                      monitor_kwargs={"input_key": input_key, "target_key": target_key,
                                                      **monitor_kwargs})
        self.input_key, self.logits_key = input_key, logits_key
        self.prefix, self.per_layer = prefix, per_layer
        self._unlogged: MonitorRecord | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        device = next(model.parameters()).device
        saved = self._state_file(args, state.global_step)
        if state.global_step > 0 and saved.is_file():  # resumed from this checkpoint: go on from its last call
            self.session.load_state_dict(torch.load(saved, map_location="cpu", weights_only=True))
        record = self.session.start(ModelLogits(model, self.input_key, self.logits_key), state.global_step,
                                    lambda probe: send_to_device(probe, device))
        if record is not None:
            if state.is_world_process_zero:
                state.log_history.append({**self.metrics(record), "step": record.step})
            self.on_record(state, record)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.session.before_optimizer_step(state.global_step)

    def on_optimizer_step(self, args, state, control, **kwargs):
        record = self.session.after_optimizer_step(state.global_step + 1)
        if record is not None:
            self._unlogged = record
            self.on_record(state, record)

    def on_step_end(self, args, state, control, **kwargs):
        if self._unlogged is not None and self._unlogged.step == state.global_step:
            control.should_log = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        record, self._unlogged = self._unlogged, None
        if record is None or record.step != state.global_step or not state.is_world_process_zero:
            return
        metrics = self.metrics(record)
        if logs is not None:
            logs.update(metrics)
        if state.log_history and state.log_history[-1].get("step") == record.step:
            state.log_history[-1].update(metrics)

    def on_save(self, args, state, control, **kwargs):
        """Beside the checkpoint the Trainer has just written (``<output_dir>/checkpoint-<step>``), the monitor's
        state (:meth:`bnrotation.integrations.MonitorSession.state_dict`) as :data:`STATE_FILE`, which a run
        resumed from that checkpoint reads at ``on_train_begin``: a ``TrainerCallback`` has no hook of its own
        in the checkpoint (``ExportableState`` keeps JSON, not weights)."""
        folder = self._state_file(args, state.global_step).parent
        if state.is_world_process_zero and folder.is_dir() and self.session.monitor is not None:
            torch.save(self.session.state_dict(), folder / STATE_FILE)

    @staticmethod
    def _state_file(args, step: int) -> Path:
        return Path(args.output_dir) / f"{transformers.trainer_utils.PREFIX_CHECKPOINT_DIR}-{step}" / STATE_FILE

    def on_train_end(self, args, state, control, **kwargs):
        self.session.finish(write=state.is_world_process_zero)

    def on_record(self, state, record: MonitorRecord) -> None:
        """Called in every process with each call's record; does nothing. Override it to act on a record."""
