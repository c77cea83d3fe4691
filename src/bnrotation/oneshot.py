"""A model measured at one moment: the monitor's record of it, before and after re-estimation, and a report's fields.

A training loop keeps one :class:`bnrotation.monitor.StalenessMonitor` and calls it at every log step; a tool that
judges a model as it stands (the checkpoint check, :mod:`bnrotation.check`; gated re-estimation,
:mod:`bnrotation.refresh`; the averaged-copy audit, :mod:`bnrotation.audit`; the study's frozen backbone) measures it
once. :func:`one_shot_monitor` is that measurement's one monitor: it never warns at the call (the tool words its own
verdict), and silences the setup warnings the tool reports itself. :func:`measure_once` is its one record;
:func:`measure_reestimated` re-estimates the running statistics and asks the same monitor again, so the record
before and the record after come from one pairing, one lint and one reading of the probe. :func:`record_field`
makes a report's numbers the record's own.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable

import torch.nn as nn

from .bnstats import ReestimationReport, reestimate
from .monitor import MonitorRecord, MonitorSetupWarning, StalenessMonitor
from .staleness import Thresholds

__all__ = ["one_shot_monitor", "measure_once", "measure_reestimated", "record_field"]


def one_shot_monitor(model: nn.Module, probe, *, thresholds: Thresholds = Thresholds(), input_key: str | None = "input",
                     target_key: str = "target", warmup_steps: int | None = None,
                     quiet: bool | str = False) -> StalenessMonitor:
    """The monitor of a measurement at one moment: :class:`monitor.StalenessMonitor` with ``warn=False`` (a call
    never warns: the record's ``stale`` and ``undetermined`` are the tool's to word).

    Args:
        model, probe, thresholds, input_key, target_key, warmup_steps: as the monitor takes them; ``probe`` may be a
            :class:`.probe_batch.CheckedProbe`, which the monitor takes as it is for the model it was checked on.
        quiet: which :class:`monitor.MonitorSetupWarning` lines the construction keeps to itself: none (False),
            every one (True: a tool that reports the pairing, the lint and the probe size itself), or those whose
            message matches this regular expression.

    Raises:
        TypeError, ValueError: as :class:`monitor.StalenessMonitor`.
    """
    with warnings.catch_warnings():
        if quiet is True:
            warnings.simplefilter("ignore", MonitorSetupWarning)
        elif quiet:
            warnings.filterwarnings("ignore", quiet, MonitorSetupWarning)
        return StalenessMonitor(model, probe, input_key=input_key, target_key=target_key, thresholds=thresholds,
                                warn=False, warmup_steps=warmup_steps)


def measure_once(model: nn.Module, probe, *, step: int = 0, thresholds: Thresholds = Thresholds(),
                 input_key: str | None = "input", target_key: str = "target", warmup_steps: int | None = None,
                 quiet: bool | str = False) -> MonitorRecord:
    """The monitor's record of ``model`` on ``probe`` at ``step`` (the optimizer step it stands at, 0 when none
    says): :func:`one_shot_monitor`'s one call. No rotation or drift: they need a previous call.

    Raises:
        TypeError, ValueError: as :class:`monitor.StalenessMonitor` and its ``measure``.
    """
    monitor = one_shot_monitor(model, probe, thresholds=thresholds, input_key=input_key, target_key=target_key,
                               warmup_steps=warmup_steps, quiet=quiet)
    return monitor(step)


def measure_reestimated(monitor: StalenessMonitor, batches: Iterable, before: MonitorRecord | None = None,
                        **reestimation) -> tuple[MonitorRecord, MonitorRecord, ReestimationReport]:
    """The monitor's records of its model before and after :func:`bnstats.reestimate` on ``batches``, in place.

    Args:
        monitor: the monitor of the model (:func:`one_shot_monitor`); its model's running statistics are replaced.
            Save them first (:class:`bnstats.SavedBuffers`) to put them back.
        batches: the re-estimation batches (:func:`bnstats.reestimate`).
        before: the record already measured before (a gate reads it to decide), else measured here at step 0.
        reestimation: :func:`bnstats.reestimate`'s keyword arguments (``input_key``, ``device``, ``max_batches``,
            ``skip_frozen``, ``layers``).

    Returns:
        ``(before, after, report)``: ``after`` measured by the same monitor at the step after ``before``'s (its
        rotation and drift over that call: the weights did not move, so 0 where measured), and
        :func:`bnstats.reestimate`'s report.

    Raises:
        what :func:`bnstats.reestimate` raises (the buffers are then left as they were) and what the monitor's
        ``measure`` raises.
    """
    before = monitor(0) if before is None else before
    report = reestimate(monitor.model, batches, **reestimation)
    return before, monitor(before.step + 1), report


def record_field(record: str, name: str, convert: Callable | None = None) -> property:
    """A read-only property that reads ``name`` of the :class:`MonitorRecord` held in the attribute ``record``,
    for the reports built on the monitor's records (:class:`bnrotation.check.CheckReport`,
    :class:`bnrotation.audit.AuditReport`): one definition of each number, the monitor's, and its docstring.

    Args:
        record: the attribute that holds the record (``"before"``, ``"copy"``).
        name: the record's attribute or property to read (``"mode_gap"``, ``"stale"``).
        convert: applied to the value read (``bool``), or None to return it as it is.
    """
    def get(self):
        value = getattr(getattr(self, record), name)
        return value if convert is None else convert(value)

    attr = getattr(MonitorRecord, name, None)
    own = attr.__doc__ if isinstance(attr, property) else None
    doc = f"``{record}.{name}`` (:attr:`monitor.MonitorRecord.{name}`)" + (f": {own}" if own else ".")
    return property(get, doc=doc)
