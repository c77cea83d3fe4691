"""Words that never contradict the numbers beside them: the audit says the copy's buffers "fit" its weights only where
the worst median |lag| and E are under their thresholds, and a "not stale" of the check or the audit that has a
signal over its threshold names that signal and the half of the rule it lacks
(:meth:`bnrotation.staleness.Thresholds.short_of`). Found by a new user: the audit printed "the copy's buffers fit its
weights" at a median lag of 0.299σ, over the rule's 0.1σ, because the mode gap was under its own. Every threshold
here is read from :class:`Thresholds` or from the measured value it sits at or beside, never written out."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel

from bnrotation.audit import audit_averaged, format_audit
from bnrotation.check import check_checkpoint
from bnrotation.staleness import Thresholds

torch.set_num_threads(1)
FIT = "fit its weights"
LAG_OVER_GAP_UNDER = "|lag| is over its threshold, but the mode gap is under its own"
GAP_OVER_STATISTICS_UNDER = "the mode gap is over its threshold, but neither the worst median E nor |lag| is over"


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))


def _data(n: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (n, 3, 8, 8) whose class is the channel with the largest mean: a task a few Adam steps learn."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, 3, 8, 8, generator=g) + 0.5 * torch.randn(n, 3, 1, 1, generator=g)
    return x, x.mean((2, 3)).argmax(1)


def _probe() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _data()
    return x[96:], y[96:]


@pytest.fixture(scope="module")
def swa() -> tuple[nn.Module, AveragedModel]:
    """A raw network trained 40 Adam steps and its ``AveragedModel`` (buffers copied from the raw model at each
    update): averaged weights under the raw model's statistics, the new user's case."""
    raw = _net()
    copy = AveragedModel(raw)
    x, y = _data()
    opt = torch.optim.Adam(raw.parameters(), lr=0.03)
    raw.train()
    for step in range(40):
        i = (step * 32) % 64
        loss = F.cross_entropy(raw(x[i:i + 32]), y[i:i + 32])
        opt.zero_grad()
        loss.backward()
        opt.step()
        copy.update_parameters(raw)
    raw.eval()
    return raw, copy


def _last_line(report) -> str:
    return format_audit(report).splitlines()[-1]


# ----------------------------------------------------------------------------- the audit's "fit"
def test_an_audit_with_the_lag_over_its_threshold_and_the_gap_under_does_not_say_fit(swa):
    """The new user's case: the copy is not stale (its gap is under the threshold) while its worst median |lag| is
    over: the verdict names the lag and the gap, and does not say the buffers fit."""
    raw, copy = swa
    t = Thresholds()
    a = audit_averaged(raw, copy, _probe(), thresholds=t)
    assert not a.stale and not a.undetermined and a.mode_gap < t.mode_gap  # the case, measured, not assumed
    assert a.lag_sigma >= t.lag_sigma, a.lag_sigma
    line = _last_line(a)
    assert line.startswith("Not stale: ") and FIT not in line, line
    assert "the worst median E and |lag| are over their thresholds, but the mode gap is under its own" in line, line


def test_the_audits_fit_at_its_threshold_and_just_under_it(swa):
    """The lag exactly at the threshold is over it (the rule reads ≥): no "fit"; a threshold one float above the
    lag (and E's above E) leaves both under: "fit", and no signal is named."""
    raw, copy = swa
    measured = audit_averaged(raw, copy, _probe())
    lag, err = measured.lag_sigma, measured.copy.worst_median_eval_error_sigma
    at = Thresholds(lag_sigma=lag, eval_error_sigma=math.nextafter(err, math.inf))
    a = audit_averaged(raw, copy, _probe(), thresholds=at)
    assert (a.lag_sigma, a.stale, a.undetermined) == (lag, False, "")
    assert FIT not in _last_line(a) and LAG_OVER_GAP_UNDER in _last_line(a), _last_line(a)
    under = Thresholds(lag_sigma=math.nextafter(lag, math.inf), eval_error_sigma=math.nextafter(err, math.inf))
    b = audit_averaged(raw, copy, _probe(), thresholds=under)
    assert _last_line(b) == "Not stale: the copy's buffers fit its weights on this probe.", _last_line(b)


def test_an_audit_whose_e_alone_is_over_its_threshold_does_not_say_fit(swa):
    """The other signal of the statistics: |lag| under its threshold, E at its own: not "fit" either, and E is
    named."""
    raw, copy = swa
    measured = audit_averaged(raw, copy, _probe())
    lag, err = measured.lag_sigma, measured.copy.worst_median_eval_error_sigma
    a = audit_averaged(raw, copy, _probe(), thresholds=Thresholds(lag_sigma=math.nextafter(lag, math.inf),
                                                                  eval_error_sigma=err))
    line = _last_line(a)
    assert not a.stale and FIT not in line and "the worst median E is over its threshold" in line, line


# ----------------------------------------------------------------------------- "not stale" names the signal
def test_a_check_that_is_not_stale_with_the_lag_over_names_the_lag_and_the_missing_gap(swa):
    """The raw model's own statistics on averaged weights, checked: not stale, the gap under its threshold, E and
    |lag| over theirs; the verdict names them and the gap it lacks, not the generic words."""
    raw, copy = swa
    t = Thresholds()
    r = check_checkpoint(_net(), [_probe()], weights=copy.module.state_dict())
    assert not r.stale and not r.undetermined and r.mode_gap < t.mode_gap, r.summary
    assert r.worst_median_lag_sigma >= t.lag_sigma and r.worst_median_eval_error_sigma >= t.eval_error_sigma
    assert "the worst median E and |lag| are over their thresholds, but the mode gap is under its own" in r.summary
    assert "needed to warn" not in r.summary


def _wide_running_var(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose running σ is three times what it learnt, in every BatchNorm layer: evaluation mode
    shrinks every activation, and predictions change."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_var.mul_(3 ** 2)
    return model


def test_a_check_that_is_not_stale_with_the_gap_over_names_the_gap_and_the_statistics_under(swa):
    """A gap over its threshold with E and |lag| each one float under theirs: not stale, and the verdict says the
    gap is over and the statistics are not; at the generic words' own case (every signal under) they stay."""
    raw, _ = swa
    model = _wide_running_var(raw)
    measured = check_checkpoint(model, [_probe()])
    gap, lag, err = measured.mode_gap, measured.worst_median_lag_sigma, measured.worst_median_eval_error_sigma
    t = Thresholds(mode_gap=Thresholds().mode_gap, lag_sigma=math.nextafter(lag, math.inf),
                   eval_error_sigma=math.nextafter(err, math.inf))
    assert gap >= t.mode_gap, gap  # the case, measured
    r = check_checkpoint(model, [_probe()], thresholds=t)
    assert not r.stale and not r.undetermined, r.summary
    assert GAP_OVER_STATISTICS_UNDER in r.summary, r.summary
    quiet = check_checkpoint(model, [_probe()], thresholds=Thresholds(mode_gap=min(1.0, math.nextafter(gap, 2)),
                                                                      lag_sigma=t.lag_sigma,
                                                                      eval_error_sigma=t.eval_error_sigma))
    assert quiet.summary.endswith("(the gap and one of the others are needed to warn)."), quiet.summary


# ----------------------------------------------------------------------------- the words themselves
def test_short_of_reads_each_threshold_as_the_rule_does():
    """At its threshold a signal is over it (the rule reads ≥), one float under it is not; the words are empty when
    the rule fires or no signal is over, and an infinite threshold is not named as a signal that could be over."""
    t = Thresholds()
    below = {name: math.nextafter(getattr(t, name), 0) for name in ("mode_gap", "lag_sigma", "eval_error_sigma")}
    assert t.short_of(below["mode_gap"], below["lag_sigma"], below["eval_error_sigma"]) == ""
    assert t.short_of(t.mode_gap, t.lag_sigma, below["eval_error_sigma"]) == ""  # the rule fires
    assert t.short_of(t.mode_gap, below["lag_sigma"], below["eval_error_sigma"]).startswith(GAP_OVER_STATISTICS_UNDER)
    lag_only = t.short_of(below["mode_gap"], t.lag_sigma, below["eval_error_sigma"])
    assert lag_only.startswith("the worst median |lag| is over its threshold"), lag_only
    e_only = t.short_of(below["mode_gap"], below["lag_sigma"], t.eval_error_sigma)
    assert e_only.startswith("the worst median E is over its threshold"), e_only
    no_lag = Thresholds(lag_sigma=math.inf)
    assert no_lag.short_of(t.mode_gap, math.nan, below["eval_error_sigma"]).startswith(
        "the mode gap is over its threshold, but the worst median E is not over its own")
    assert t.short_of(below["mode_gap"], math.nan, math.nan) == ""  # NaN is never over
