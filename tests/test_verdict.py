"""Never silently "not stale" (issue 48, item 5): a wrapper that hides the model's mode, an autocast context, a
probe too small to decide the gap, and every other path where the rule reads a quantity that is NaN or zero by
construction. Each case is built on the wrappers people use (timm's ``ModelEmaV3`` as timm leaves it,
``torch.optim.swa_utils.AveragedModel``) and on one of our own, and each was seen failing before its fix."""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

from bnrotation import StalenessMonitor
from bnrotation.bnstats import frozen_layers
from bnrotation.check import check_checkpoint, main as check_main
from bnrotation.monitor import MonitorSetupWarning
from bnrotation.probe_batch import smallest_probe
from bnrotation.staleness import Thresholds

from thirdparty import import_timm


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8 * 8 * 8, 4))


def _probe(n: int = 64, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 8, 8, generator=g)
    return x, torch.randint(0, 4, (n,), generator=g)


def _stale(model: nn.Module) -> nn.Module:
    """``model`` with running statistics that describe another network: evaluation mode is far off, training mode
    (batch statistics) is not."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.fill_(3.0)
                m.running_var.fill_(0.05)
    return model


def _labels_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Labels that training mode (batch statistics) gets right on ``x``: a gap is then evaluation mode's loss."""
    from bnrotation.bnstats import batch_statistics
    with torch.no_grad(), batch_statistics(model):
        return model(x).argmax(1)


def _quiet(model, probe, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MonitorSetupWarning)
        return StalenessMonitor(model, probe, warn=False, warmup_steps=0, **kw)


# ----------------------------------------------------------------------------- wrappers that hide the mode
class Shadow(nn.Module):
    """A wrapper of our own in the ModelEmaV3 pattern: the wrapper as built (training mode), its copy in
    evaluation mode."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.shadow = copy.deepcopy(model).eval()

    def forward(self, x):
        return self.shadow(x)


def _reference_gap(inner: nn.Module, probe) -> float:
    """The gap measured on the inner model put in evaluation mode: what the wrapper must give."""
    return _quiet(copy.deepcopy(inner).eval(), probe)(0).mode_gap


@pytest.mark.parametrize("wrap", ["timm_ema_v3", "shadow"])
def test_a_wrapper_in_training_mode_over_an_evaluation_mode_copy_is_measured_as_that_copy(wrap):
    """ModelEmaV3 leaves the wrapper in training mode and its ``module`` in evaluation mode: every BatchNorm layer
    then looks frozen, and before the fix the training-mode pass used the running statistics too (gap 0.000, not
    stale, on an evaluation mode at chance)."""
    model = _stale(_net())
    x, _ = _probe()
    y = _labels_of(model, x)
    if wrap == "timm_ema_v3":
        timm = import_timm()
        wrapper = timm.utils.ModelEmaV3(model, decay=0.9)
        assert wrapper.training and not wrapper.module.training  # as timm leaves it
        inner = wrapper.module
    else:
        wrapper = Shadow(model)
        inner = wrapper.shadow
    record = _quiet(wrapper, (x, y))(0)
    want = _reference_gap(inner, (x, y))
    assert want >= 0.5  # the case is a stale one
    assert record.mode_gap == pytest.approx(want, abs=1e-12)
    assert record.stale and not record.undetermined
    assert wrapper.training and not inner.training  # the flags are left as they were


def test_averaged_model_is_measured_in_its_own_mode():
    """``AveragedModel``'s module follows the model it copied: in training mode the gap is the batch- against the
    running-statistics one, and it is the same as the plain model's."""
    from torch.optim.swa_utils import AveragedModel

    model = _stale(_net())
    x, _ = _probe()
    y = _labels_of(model, x)
    avg = AveragedModel(model)
    assert _quiet(avg, (x, y))(0).mode_gap == pytest.approx(_quiet(model, (x, y))(0).mode_gap, abs=1e-12)
    assert _quiet(avg, (x, y))(0).stale


def test_one_frozen_layer_beside_a_training_one_stays_frozen():
    """The second case: a fine-tune that freezes some BatchNorm layers, not all, keeps them frozen (they normalise
    with running statistics in its own training steps)."""
    model = _net().train()
    model[1].eval()
    assert [n for n, _ in frozen_layers(model)] == ["1"]
    model[4].eval()  # every BatchNorm layer, its convolutions still training: a fine-tune that freezes them all
    assert [n for n, _ in frozen_layers(model)] == ["1", "4"]
    model.eval()
    model.training = True  # the root alone training: a wrapper's pattern, every other module in evaluation mode
    assert frozen_layers(model) == []
    model[-1].train()  # a head training beside an evaluation-mode backbone (a linear probe): frozen layers
    assert [n for n, _ in frozen_layers(model)] == ["1", "4"]
    wrapped = Shadow(_net())  # the same one level down: the copy holding every layer is in evaluation mode
    assert wrapped.training and frozen_layers(wrapped) == []


# ----------------------------------------------------------------------------- autocast
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_monitor_measures_in_float32_inside_an_autocast_context(dtype):
    model = _stale(_net())
    for m in model.modules():  # a lag that the rounding of bf16 would move
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.fill_(0.01)
                m.running_var.fill_(1.0)
    x, y = _probe()
    outside = _quiet(copy.deepcopy(model), (x, y))(0)
    with torch.autocast("cpu", dtype=dtype):
        inside = _quiet(copy.deepcopy(model), (x, y))(0)
    cols = ["lag_median_abs_sigma", "eval_error_median_sigma", "mean_shift_max_abs_sigma"]
    assert (inside.layers[cols].to_numpy() == outside.layers[cols].to_numpy()).all()
    assert inside.mode_gap == outside.mode_gap


def test_the_check_measures_in_float32_inside_an_autocast_context():
    model = _stale(_net())
    x, y = _probe()
    outside = check_checkpoint(copy.deepcopy(model), [(x, y)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = check_checkpoint(copy.deepcopy(model), [(x, y)])
    assert inside.worst_median_lag_sigma == outside.worst_median_lag_sigma
    assert inside.worst_median_eval_error_sigma == outside.worst_median_eval_error_sigma


# ----------------------------------------------------------------------------- probes too small to decide
def test_below_the_smallest_probe_the_verdict_is_undetermined():
    model = _stale(_net())
    n = smallest_probe(Thresholds().mode_gap) - 1  # 19 at the default 5%: the boundary, one below
    x, _ = _probe(n)
    record = _quiet(model, (x, _labels_of(model, x)))(0)
    assert record.undetermined and "probe" in record.undetermined
    assert not record.stale and not record.flagged
    assert record.summary.startswith("UNDETERMINED")
    x, _ = _probe(n + 1)  # at the smallest probe the rule judges
    record = _quiet(model, (x, _labels_of(model, x)))(0)
    assert not record.undetermined and record.stale


def test_the_check_of_a_probe_too_small_exits_2(tmp_path, capsys):
    """8 unlabelled samples: a gap of 1/8 per sample. Before the fix the check reported a verdict and exited 1."""
    model = _stale(_net())
    torch.save(model.state_dict(), tmp_path / "w.pt")
    x, _ = _probe(8)
    torch.save(x, tmp_path / "b.pt")
    (tmp_path / "mynet.py").write_text(
        "import torch.nn as nn, torch\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),\n"
        "        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),\n"
        "        nn.Flatten(), nn.Linear(8 * 8 * 8, 4))\n")
    import sys
    sys.path.insert(0, str(tmp_path))
    try:
        rc = check_main(["--model", "mynet:make", "--weights", str(tmp_path / "w.pt"), "--batches",
                         str(tmp_path / "b.pt")])
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mynet", None)
    out = capsys.readouterr().out
    assert rc == 2
    assert "Undetermined" in out and "probe" in out


# ----------------------------------------------------------------------------- the second case: other NaN paths
def test_without_the_mode_check_the_verdict_is_undetermined():
    """``modes=False`` measures no gap: the rule, which needs it, cannot fire, so it must not read "not stale"."""
    model = _stale(_net())
    x, y = _probe()
    record = _quiet(model, (x, y), modes=False)(0)
    assert math.isnan(record.mode_gap)
    assert record.undetermined and "gap" in record.undetermined
    assert not record.stale


def test_a_model_without_running_statistics_measured_by_choice_is_undetermined():
    """``running_statistics_only=False`` on a GroupNorm network: every lag and E is NaN by construction."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 4))
    x, y = _probe()
    record = _quiet(model, (x, y), running_statistics_only=False)(0)
    assert record.undetermined and not record.stale


def test_the_gated_reestimation_never_reads_an_undetermined_verdict_as_not_stale():
    """The second case of the small probe, in the tool built on the monitor: ``reestimate_if_stale`` with a probe
    too small to judge. Before the fix it said "not stale ...: nothing re-estimated" on stale statistics; an
    undetermined verdict cannot rule staleness out, and re-estimation costs seconds, so it re-estimates and says
    why."""
    from bnrotation import reestimate_if_stale

    model = _stale(_net())
    x, _ = _probe(8)
    batches = [_probe(32, seed=s)[0] for s in range(3)]
    gate = reestimate_if_stale(model, batches, (x, _labels_of(model, x)))
    assert gate.before.undetermined and gate.fired
    assert gate.summary.startswith("undetermined") and "re-estimated" in gate.summary
    gate.restore()
    x, _ = _probe(64)  # a probe that can judge: the rule fires on its own
    gate = reestimate_if_stale(model, batches, (x, _labels_of(model, x)))
    assert not gate.before.undetermined and gate.fired and gate.summary.startswith("stale")


def test_the_audit_of_an_averaged_copy_never_reads_an_undetermined_verdict_as_not_stale():
    """The same case in the audit: the copy judged on a probe too small for the gap threshold. Before the fix its
    report ended "Not stale: the copy's buffers fit its weights on this probe."."""
    from torch.optim.swa_utils import AveragedModel

    from bnrotation.audit import audit_averaged, format_audit

    raw = _net()
    avg = AveragedModel(raw)
    x, _ = _probe(8)
    report = audit_averaged(raw, avg, (x, _labels_of(raw, x)))
    assert report.undetermined and not report.stale
    text = format_audit(report)
    assert "Not stale" not in text and "Undetermined" in text.splitlines()[-1]


def test_a_layer_whose_fresh_statistics_overflow_makes_the_verdict_undetermined():
    """Found by a new user: inputs scaled by 1e20 overflow the first layer's batch variance (inf), so its lag reads
    0σ and its E NaN, while the layers below stay finite and the rule read "not stale" (exit 0) on stale
    statistics. A fresh statistic that is infinite is not measured: undetermined, naming the layer."""
    model = _stale(_net())
    x, _ = _probe()
    y = _labels_of(model, x)
    record = _quiet(model, (x * 1e20, y))(0)
    ch = record.channels
    assert np.isinf(ch.loc[ch["norm_layer"] == "1", "fresh_var"]).any()  # the case: the first layer overflows
    assert "1" in record.undetermined and "not finite" in record.undetermined
    assert not record.stale and record.summary.startswith("UNDETERMINED")


def _zeroed_variance(model: nn.Module) -> nn.Module:
    """``model`` with every running variance 0: E reads hundreds of σ, the statistics are plainly off."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_var.zero_()
    return model


def test_a_probe_the_model_does_not_classify_cannot_say_not_stale():
    """An untrained net on labels it does not know: both modes at chance, so the gap is 0 whatever the statistics,
    and the rule read "not stale" with E at hundreds of σ. Even an evaluation mode collapsed to the probe's largest
    class would leave a gap under the threshold: undetermined, saying so; E still measured."""
    model = _zeroed_variance(_net())
    x, y = _probe(256)
    record = _quiet(model, (x, y))(0)
    assert record.mode_gap < Thresholds().mode_gap and record.worst_median_eval_error_sigma > 10
    assert "constant guess" in record.undetermined and not record.stale
    assert record.summary.startswith("UNDETERMINED") and "E median" in record.summary
    report = check_checkpoint(model, [(x, y)])  # the check says the same, and exits 2
    assert report.summary.startswith("Undetermined:") and "constant guess" in report.summary


def test_a_probe_of_one_class_judges_a_gap_it_measures_and_no_other():
    """The second case: labels of one class. A constant guess of it scores 100%, so a gap of 0 says nothing
    (undetermined); a gap that crosses the threshold is measured all the same: stale."""
    from bnrotation.bnstats import reestimate

    model = _net()
    x, _ = _probe(64)
    reestimate(model, [x])  # statistics of exactly this batch: evaluation mode is training mode, gap 0
    y = torch.full((64,), int(torch.mode(_labels_of(model, x)).values))
    fresh = _quiet(model, (x, y))(0)
    assert fresh.mode_gap == 0 and "largest class scores 100.0%" in fresh.undetermined
    assert "a probe of one class" in fresh.undetermined and "not learned" not in fresh.undetermined
    stale = _quiet(_stale(copy.deepcopy(model)), (x, y))(0)
    assert stale.mode_gap >= Thresholds().mode_gap and not stale.undetermined and stale.stale


def test_a_model_right_on_an_imbalanced_probe_is_told_to_balance_it_not_that_it_has_not_learned():
    """Found by a new user: a model 100% right on a probe of 96% one class read "a model that has not learned the
    probe yet". A constant guess of that class scores within the threshold of training mode: a collapse to it would
    not cross it, so the verdict stays undetermined, and the reason names the probe's imbalance. Here one class
    holds the share s > 1/2 of a probe the model gets all right, under a gap threshold of 1 - s + 0.05."""
    from bnrotation.bnstats import reestimate

    model = _net()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(400, 3, 8, 8, generator=g) + 2 * torch.randn(400, 3, 1, 1, generator=g)
    reestimate(model, [x])
    y = _labels_of(model, x)
    major = int(torch.mode(y).values)
    keep = torch.cat([torch.nonzero(y == major).flatten()[:90], torch.nonzero(y != major).flatten()[:10]])
    y_kept = _labels_of(model, x[keep])  # right on every sample with the statistics of these 100
    share = int(torch.bincount(y_kept).max()) / 100
    assert share > 0.5  # the case: one class dominates
    record = _quiet(model, (x[keep], y_kept), thresholds=Thresholds(mode_gap=round(1 - share + 0.05, 2)))(0)
    assert record.checks["acc_train_mode"].iloc[0] == 1.0
    assert f"largest class scores {share:.1%}" in record.undetermined and "dominated by one class" in record.undetermined
    assert "not learned" not in record.undetermined
    assert not _quiet(model, (x[keep], y_kept))(0).undetermined  # at the default 5%: judged


def test_an_undetermined_call_in_the_warm_up_says_it_is_warming_up_first():
    """Found by a new user: the docs say a summary in the warm-up starts ``warming up, k steps left``; an undetermined
    call at step 0 started ``UNDETERMINED``. Both are said, the warm-up first."""
    model = _net()
    x, y = _probe(64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MonitorSetupWarning)
        record = StalenessMonitor(model, (x, y), warn=False)(0)  # random labels: a constant guess does as well
    assert record.warming_up and record.undetermined
    assert record.summary.startswith("warming up, 44 steps left; UNDETERMINED (a constant guess")


def _pooled_net() -> nn.Module:
    """An untrained net with a global average pool: on noise it predicts one class for every sample."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def test_without_labels_a_model_that_predicts_one_class_cannot_say_not_stale():
    """The second case of the constant guess, without labels: the gap is then the share of predictions that change
    between the modes, and a model that predicts one class everywhere shows none when evaluation mode collapses to
    that class: undetermined. A model whose predictions spread over classes is judged; and stale statistics that
    move the predictions off that class cross the threshold all the same."""
    x, _ = _probe(64)
    fresh = _quiet(_pooled_net(), x)(0)
    assert fresh.mode_gap == 0 and "predicts one class for 100.0% of the probe" in fresh.undetermined
    assert not fresh.stale and fresh.summary.startswith("UNDETERMINED")
    assert not _quiet(_net(), x)(0).undetermined  # predictions over several classes
    net = _pooled_net()  # a head that predicts class 0 while the last layer's channel 0 is on, else class 1
    with torch.no_grad():
        head = net[-1]
        head.weight.zero_(), head.bias.zero_()
        head.weight[0, 0], head.weight[1, 0], head.bias[1] = 1.0, -1.0, 0.5
        net[4].running_mean[0] = 10.0  # stale: evaluation mode switches channel 0 off
    stale = _quiet(net, x)(0)
    assert stale.checks["mode_agreement"].iloc[0] < 0.5  # the case: evaluation mode moved the predictions
    assert stale.mode_gap >= Thresholds().mode_gap and not stale.undetermined and stale.stale


@pytest.mark.parametrize("above, judged", [(0, True), (1, False)])
def test_the_constant_guess_boundary_is_the_gap_threshold_itself(above, judged):
    """Labels that training mode gets all right, on inputs whose per-sample offsets spread the predictions over
    classes, the largest holding L of n: a collapse gap of (n - L)/n. A gap threshold of exactly that can still be
    crossed (judged); one sample above it cannot (undetermined). Counted in samples: no float rounding decides."""
    from bnrotation.bnstats import reestimate

    model = _net()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(100, 3, 8, 8, generator=g) + 2 * torch.randn(100, 3, 1, 1, generator=g)
    reestimate(model, [x])  # statistics of exactly this batch: evaluation mode is training mode, gap 0
    y = _labels_of(model, x)
    largest = int(torch.bincount(y).max())
    assert 25 < largest < 95  # the case: more than one class, and room for a threshold of at least 5%
    thresholds = Thresholds(mode_gap=(100 - largest + above) / 100, lag_sigma=0.0)  # the gap alone decides
    record = _quiet(model, (x, y), thresholds=thresholds)(0)
    assert record.mode_gap < thresholds.mode_gap
    assert bool(record.undetermined) == (not judged), record.undetermined


def test_a_call_between_the_forward_and_the_backward_pass_leaves_the_graph_usable():
    """Found by a new user: the monitor put the running statistics back in place, which bumped their version
    counters, and the backward pass of a forward made before the call failed ("modified by an inplace operation").
    The values are put back unchanged, so the graph is valid: the call must not invalidate it."""
    model = _net().train()
    x, y = _probe()
    monitor = _quiet(model, (x, y))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    monitor(1)
    loss.backward()  # raised RuntimeError before the fix
    assert all(p.grad is not None for p in model.parameters())


class _Unreached(nn.Module):
    """A network with a BatchNorm layer its forward pass never calls (a head swapped out, a branch unused)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.bn, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Linear(8 * 8 * 8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1))


def test_an_undetermined_check_says_not_measured_where_a_number_is_nan():
    """Found by a new user: a BatchNorm layer the forward pass never reaches has no lag and no E, and the check's last
    line compared NaN with its thresholds ("worst median E nanσ < 0.069σ or worst median |lag| nanσ () < 0.1σ"),
    which reads like a measurement. A NaN number of the rule reads "not measured (NaN)"; the gap, measured, keeps
    its comparison."""
    model = _Unreached()
    x, _ = _probe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = check_checkpoint(model, [(x, _labels_of(model, x))])
    assert report.summary.startswith("Undetermined:")
    measured = report.summary.split("Measured: ", 1)[1]
    assert "nan" not in measured.replace("not measured (NaN)", "").lower() and "()" not in measured
    assert measured.count("not measured (NaN)") == 2 and "mode gap 0.000 < 0.05" in measured


def test_float64_inputs_for_a_float32_model_are_refused_with_the_cast_to_make():
    """Found by a new user: a probe saved as float64 was refused with torch's "expected scalar type Double but found
    Float" alone. The refusal names both dtypes and the cast; float32 inputs of the same values are accepted (the
    second case: the hint is not printed for a model that fails for another reason)."""
    model = _net()
    x, y = _probe()
    with pytest.raises(ValueError, match=r"the inputs are float64, the model's parameters float32: save the batches "
                                         r"as float32 \(x.to\(torch.float32\)\)"):
        StalenessMonitor(model, (x.double(), y), warn=False)
    StalenessMonitor(model, (x.double().float(), y), warn=False)
    with pytest.raises(ValueError, match="cannot run on the probe inputs") as err:
        StalenessMonitor(model, (x[:, :2], y), warn=False)  # two channels for a three-channel convolution
    assert "float64" not in str(err.value)
