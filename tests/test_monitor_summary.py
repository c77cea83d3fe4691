"""The summary during the monitor's warm-up: it says the verdict is held back, how many steps are left, and
whether the rule would fire; past the warm-up it starts with ``STALE`` when the rule fires (README, "The monitor,
in a loop of your own")."""

from __future__ import annotations

import torch
import torch.nn as nn

from bnrotation.bnstats import reestimate
from bnrotation.monitor import StalenessMonitor, default_warmup_steps

torch.set_num_threads(1)


def _model_and_probe(stale: bool) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """A small network whose running statistics were re-estimated on the probe (they fit), or then moved by 2σ in
    every channel of its BatchNorm layer (stale); labels: its evaluation-mode predictions before the move."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3, bias=False))
    x = torch.randn(32, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    reestimate(model, [x])
    with torch.no_grad():
        y = model.eval()(x).argmax(1)
        if stale:
            model[1].running_mean += 2.0 * model[1].running_var.sqrt()
    return model, (x, y)


def _summaries(stale: bool, steps: list[int]) -> tuple[StalenessMonitor, list]:
    model, probe = _model_and_probe(stale)
    monitor = StalenessMonitor(model, probe, warn=False)
    return monitor, [monitor(step) for step in steps]


def test_during_the_warm_up_the_summary_says_the_rule_would_fire():
    monitor, records = _summaries(True, [10, 43])
    assert monitor.warmup_steps == default_warmup_steps([monitor.model[1]]) == 44  # momentum 0.1, PyTorch's default
    words = (f"warming up, {monitor.warmup_steps - 10} steps left", "warming up, 1 step left")  # steps 10 and 43
    for record, said in zip(records, words):
        assert record.stale and not record.flagged
        assert record.summary.startswith(f"{said}; the rule would fire | train 100.0% / eval "), record.summary


def test_during_the_warm_up_a_rule_that_holds_not_is_said_without_it():
    monitor, (record,) = _summaries(False, [10])
    assert not record.stale and not record.flagged
    assert record.summary.startswith(f"warming up, {monitor.warmup_steps - 10} steps left | train 100.0% / eval "
                                     "100.0%"), record.summary
    assert "would fire" not in record.summary and "STALE" not in record.summary


def test_after_the_warm_up_the_summary_starts_with_stale_when_the_rule_fires_and_says_nothing_of_it():
    monitor, (stale,) = _summaries(True, [44])
    _, (fitting,) = _summaries(False, [44])
    assert monitor.warmup_steps == 44
    assert stale.flagged and stale.summary.startswith("STALE train 100.0% / eval ")
    assert not fitting.flagged and fitting.summary.startswith("train 100.0% / eval 100.0%")
    assert "warming up" not in stale.summary + fitting.summary
