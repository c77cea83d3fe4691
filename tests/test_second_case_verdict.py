"""The second case of the library's verdict path (issue 66, item 2): the kinds of input that planted bugs slipped
through. Each test names the bug it was seen failing on, planted by hand:

- several probe batches whose first differs from the rest (another size, another class balance, one predicted
  class);
- a model one level deeper (inside a wrapper inside a wrapper, inside a ``ModuleDict``, a child of a
  ``Sequential``);
- a zero passed on purpose where a default would be wrong (``warmup_steps=0``, a checkpoint weighted 0);
- "any" against "all": two layers of which only one is stale;
- a count exactly at a threshold, compared as a count (1 of 20 samples is the 5% gap threshold).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn

from bnrotation.averaging import average_checkpoints, normalised_weights
from bnrotation.bnstats import batch_statistics, reestimate
from bnrotation.check import check_checkpoint, probe_size_warning
from bnrotation.monitor import MonitorSetupWarning, StalenessMonitor, mode_check
from bnrotation.probe_batch import smallest_probe
from bnrotation.staleness import Thresholds

torch.set_num_threads(1)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8 * 8 * 8, 4))


def _x(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def _train_mode_labels(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What training mode (batch statistics of ``x`` alone) predicts on ``x``."""
    with torch.no_grad(), batch_statistics(model):
        return model(x).argmax(1)


def _monitor(model, probe, **kw) -> StalenessMonitor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MonitorSetupWarning)
        return StalenessMonitor(model, probe, warn=False, **{"warmup_steps": 0, **kw})


def _stale_layer(model: nn.Module, name: str) -> None:
    layer = dict(model.named_modules())[name]
    with torch.no_grad():
        layer.running_mean.fill_(3.0)
        layer.running_var.fill_(0.05)


# ----------------------------------------------------------------------------- several batches, the first differs
def test_a_probe_of_two_batches_of_other_sizes_is_scored_over_every_sample():
    """Bugs planted: the accuracies read from the first batch only (1.0), or as the mean of the batches' own
    accuracies (0.75): pooled over the samples it is 20 of 32."""
    net = _net()
    x1, x2 = _x(8, 1), _x(24, 2)
    y1 = _train_mode_labels(net, x1)  # training mode right on all 8
    y2 = _train_mode_labels(net, x2)
    y2[:12] = (y2[:12] + 1) % 4  # and on 12 of 24
    record = _monitor(net, [(x1, y1), (x2, y2)])(1)
    with torch.no_grad():
        right_eval = int((net.eval()(x1).argmax(1) == y1).sum() + (net(x2).argmax(1) == y2).sum())
    c = record.checks.iloc[0]
    assert c["probe_size"] == 32
    assert c["acc_train_mode"] == 20 / 32
    assert c["acc_eval_mode"] == right_eval / 32
    assert c["mode_gap"] == (20 - right_eval) / 32


def test_the_largest_class_is_counted_over_every_batch_not_the_first():
    """Bug planted: the probe's largest class counted on the first batch, which holds class 0 alone (8 labels);
    over both batches it is class 1, with 16."""
    net = _net()
    y1 = torch.zeros(8, dtype=torch.long)
    y2 = torch.tensor([1] * 16 + [2] * 8)
    assert _monitor(net, [(_x(8, 1), y1), (_x(24, 2), y2)]).largest_class == 16


def test_the_pooled_fresh_statistics_are_re_estimations_average_over_batches_of_other_sizes():
    """Bug planted: the fresh statistics of the first batch only. Pooled as :func:`reestimate` pools them (the
    cumulative average over batches, ``momentum=None``), the running means re-estimated on the same two batches."""
    net = _net()
    x1, x2 = _x(4, 1) + 2.0, _x(28, 2)  # the first batch on another mean, and 7 times smaller
    record = _monitor(net, [(x1, _train_mode_labels(net, x1)), (x2, _train_mode_labels(net, x2))])(1)
    fresh = copy.deepcopy(net)
    reestimate(fresh, [x1, x2])
    for name in ("1", "4"):
        got = record.channels[record.channels["norm_layer"] == name].sort_values("channel")["fresh_mean"]
        want = dict(fresh.named_modules())[name].running_mean.double()
        assert torch.allclose(torch.tensor(got.to_numpy()), want, rtol=1e-5, atol=1e-6), name


class Tied(nn.Module):
    """Two logits that are one standardised feature each: an input whose two features are equal is a tie, which
    argmax reads as class 0 in either mode (the running statistics are equal for both features)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2, bias=False)
        self.bn = nn.BatchNorm1d(2)
        with torch.no_grad():
            self.fc.weight.copy_(torch.eye(2))

    def forward(self, x):
        return self.bn(self.fc(x))


def _standardised(n: int, seed: int) -> torch.Tensor:
    x = torch.randn(n, 2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return ((x - x.mean(0)) / x.std(0, unbiased=False)).float()  # batch statistics = the initial running ones


@pytest.mark.parametrize("second_tied", [False, True])
def test_a_first_batch_of_one_predicted_class_does_not_make_the_probe_one_class(second_tied):
    """Bug planted: the share of training mode's most predicted class read from the first batch, which predicts
    class 0 alone; the second batch predicts both classes, and the probe is judged. With both tied it is not."""
    t = torch.linspace(-1, 1, 20).unsqueeze(1)
    tied = torch.cat([t, t], 1) + 0.5
    second = torch.cat([t.flip(0), t.flip(0)], 1) - 0.5 if second_tied else _standardised(20, 3)
    record = _monitor(Tied(), [(tied,), (second,)])(1)
    assert record.mode_gap == 0.0  # evaluation mode changes no prediction: only the collapse check can judge
    if second_tied:
        assert record.undetermined.startswith("training mode predicts one class for 100.0% of the probe")
    else:
        assert record.undetermined == ""


# ----------------------------------------------------------------------------- one level deeper
class Holder(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


class InDict(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.parts = nn.ModuleDict({"body": inner})

    def forward(self, x):
        return self.parts["body"](x)


@pytest.mark.parametrize("wrap", [lambda m: Holder(Holder(m)), lambda m: nn.Sequential(InDict(m)),
                                  lambda m: nn.Sequential(nn.Identity(), Holder(InDict(m)))],
                         ids=["wrapper-in-a-wrapper", "moduledict-in-a-sequential", "child-of-a-sequential"])
def test_a_model_deeper_in_the_tree_gets_the_bare_models_verdict_and_numbers(wrap):
    """Bug planted: the layers read from the model's children only (``children()`` for ``modules()``): no layer
    two levels down is found, measured or re-estimated. The wrapped model's check gives the bare model's verdict,
    mode gap and worst lag, with each layer named by its path."""
    bare = _net()
    _stale_layer(bare, "4")
    x = _x(64, 5)
    y = _train_mode_labels(bare, x)
    deep = wrap(copy.deepcopy(bare))
    a, b = (check_checkpoint(m, [(x, y)]) for m in (bare, deep))
    assert (a.stale, b.stale) == (True, True)
    assert b.before.mode_gap == a.before.mode_gap
    assert b.before.worst_median_lag_sigma == a.before.worst_median_lag_sigma
    prefix = next(n for n, m in deep.named_modules() if isinstance(m, nn.BatchNorm2d))[: -len("1")]
    assert b.worst_layer == prefix + a.worst_layer
    assert b.after.worst_median_lag_sigma < 0.1  # re-estimation reached the nested layers too


# ----------------------------------------------------------------------------- a zero passed on purpose
def test_warmup_steps_0_is_no_warm_up_not_the_default():
    """Bug planted: ``warmup_steps or default_warmup_steps(...)``, which reads the 0 passed on purpose as the
    default of some hundred steps."""
    net, x = _net(), _x(32, 1)
    probe = (x, _train_mode_labels(net, x))
    assert not _monitor(net, probe, warmup_steps=0)(1).warming_up
    assert _monitor(net, probe, warmup_steps=None)(1).warming_up  # the default warm-up covers step 1


def test_a_checkpoint_weighted_0_is_left_out_of_the_average_and_copy_from_0_is_the_first():
    """Bugs planted: a weight of 0 read as "no weight given" (``w or 1``), and ``copy_from or -1``, which reads
    the first constituent (0) as the default, the last. Weighted (0, 1) the average is the second checkpoint; the
    buffers copied from constituent 0 are the first's."""
    assert normalised_weights([0, 1], 2) == [0.0, 1.0]
    net = _net()
    first, second = copy.deepcopy(net.state_dict()), {k: v + 1 if v.is_floating_point() else v
                                                      for k, v in net.state_dict().items()}
    averaged, _ = average_checkpoints(net, [first, second], weights=[0, 1], policy="copy", copy_from=0)
    for name, p in averaged.named_parameters():
        assert torch.equal(p, second[name]), name
    for name, b in averaged.named_buffers():
        assert torch.equal(b, first[name]), name


# ----------------------------------------------------------------------------- any against all
@pytest.mark.parametrize("stale", ["1", "4"])
def test_one_stale_layer_of_two_makes_the_call_stale_and_is_the_one_named(stale):
    """Bug planted: the worst lag read from the first layer's line (``layers.iloc[0]``) for the worst over the
    layers: a stale second layer then reads as fit. Either layer alone is enough, and it is the one named."""
    net, x = _net(), _x(64, 5)
    reestimate(net, [x])  # both layers fit the probe
    _stale_layer(net, stale)
    record = _monitor(net, (x, _train_mode_labels(net, x)))(1)
    lag = record.layers.set_index("norm_layer")["lag_median_abs_sigma"]
    other = "4" if stale == "1" else "1"
    assert lag[other] < 0.1 < lag[stale]
    assert record.worst_median_lag_sigma == lag[stale]
    assert record.stale and record.worst()[0] == stale


# ----------------------------------------------------------------------------- a count at the threshold
@pytest.mark.parametrize("gap", [0.05, 0.1, 0.2, 0.25])
@pytest.mark.parametrize("labelled", [True, False])
def test_a_gap_of_one_sample_at_the_smallest_probe_is_the_threshold_itself(gap, labelled):
    """Bug (found, then fixed): the gap as a difference of two rounded accuracies, 19/20 - 18/20 =
    0.0499999…, which reads below the 5% threshold; as counts, 1 of 20 is 5%, and the rule (≥) fires."""
    n = smallest_probe(gap)
    assert n * gap == pytest.approx(1)
    y = torch.zeros(n, dtype=torch.long)
    train = torch.zeros(n, 2)
    train[:, 0] = 1  # training mode: class 0 everywhere
    train[0] = torch.tensor([0.0, 1.0])  # but one sample wrong
    evaluated = train.clone()
    evaluated[1] = torch.tensor([0.0, 1.0])  # evaluation mode: a second sample wrong
    line = mode_check(1, train, evaluated, y if labelled else None).iloc[0]
    assert line["mode_gap"] == 1 / n
    assert Thresholds(mode_gap=gap).crossed(line["mode_gap"], lag_sigma=10.0)
    same = mode_check(1, train, train.clone(), y if labelled else None).iloc[0]
    assert not Thresholds(mode_gap=gap).crossed(same["mode_gap"], lag_sigma=10.0)


@pytest.mark.parametrize("gap", [0.05, 0.07, 0.1, 1 / 3])
def test_the_smallest_probe_is_enough_and_one_sample_fewer_is_not(gap):
    """Bug planted: ``samples > smallest`` for ``samples >= smallest``; the boundary is a count."""
    n = smallest_probe(gap)
    assert 1 / n <= gap < 1 / (n - 1)
    assert probe_size_warning(n, gap, batches=1, truncated=False) is None
    assert probe_size_warning(n - 1, gap, batches=1, truncated=False).startswith(
        f"--batches: the mode gap is measured on {n - 1} samples")
