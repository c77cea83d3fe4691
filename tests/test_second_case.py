"""The second case of what a docstring promises (issue 40): a concatenation along torch's default dim, a model with
one BatchNorm in evaluation mode and another training, a NaN layer under ``scope="layers"``, a second restore, labels
of shape (N, 1), a claim that holds on one side only. Each test here was seen failing on the bug its docstring names,
planted by hand (the issue's list); the ranks, the Lightning adapter's ``save_dir`` and the frozen experiment have
theirs beside the tests of the same code (test_distributed.py, test_integrations.py, test_frozen.py)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from bnrotation.study.analysis.claims import registry
from bnrotation.study.analysis.claims.kinds import FAIL, PASS
from bnrotation.bnstats import SavedBuffers, reestimate
from bnrotation.check import CheckInputError, load_batches
from bnrotation.lint import lint_batchnorm
from bnrotation.monitor import MonitorSetupWarning, StalenessMonitor
from bnrotation.pairing import find_pairs
from bnrotation.refresh import reestimate_if_stale
from test_claims import around, evidence, sd_of
from test_reestimate_gated import _batches, _buffers, _net, _probe, _same

torch.set_num_threads(1)


# ----------------------------------------------------------------------------- 1. torch.cat without dim
class CatOnBatch(nn.Module):
    """Two convolutions joined by ``torch.cat`` without ``dim``: torch's default dim 0, the batch. Each of the
    BatchNorm's 4 channels then holds channel c of both convolutions, so no channel has one weight layer.
    ``traceable=False`` adds data-dependent control flow, which ``torch.fx`` cannot trace: the layer is then
    placed by execution order."""

    def __init__(self, traceable: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 3)
        self.traceable = traceable

    def forward(self, x):
        if not self.traceable and bool(x.sum() > -1e30):  # always true; fx cannot trace a bool of a tensor
            x = x * 1.0
        y = self.bn(torch.cat([self.a(x), self.b(x)]))  # (2N, 4, H, W)
        n = x.shape[0]
        return self.head(torch.relu(y[:n] + y[n:]).mean((2, 3)))  # (N, 3)


@pytest.mark.parametrize("traceable, method", [(True, "fx"), (False, "execution order")])
def test_a_concatenation_along_the_default_dim_leaves_its_batchnorm_unpaired(traceable, method):
    """Planted: ``_cat_dim``'s default read as 1. The BatchNorm was then paired by two segments of 4 channels each
    for its 4 channels, and the monitor's first call raised."""
    model, x = CatOnBatch(traceable), torch.randn(6, 3, 5, 5)
    pairing = find_pairs(model, x)
    assert pairing.methods == {"bn": method}
    assert pairing.pairs == [] and [p.norm for p in pairing.unpaired] == ["bn"]
    assert pairing.unpaired[0].segments == () and "cat" in pairing.unpaired[0].reason
    with pytest.warns(MonitorSetupWarning, match="1 of 1 normalisation layer"):
        monitor = StalenessMonitor(model, torch.randn(20, 3, 5, 5), warn=False)
    record = monitor(0)  # measures the lag of the unpaired layer, and does not raise
    assert list(record.layers["norm_layer"]) == ["bn"]


# ----------------------------------------------------------------------------- 2. lint: one BN frozen, one training
def _frozen_pair_net() -> nn.Sequential:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4),
                        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    for p in net.parameters():
        p.requires_grad_(False)
    return net.train()


@pytest.mark.parametrize("in_eval, reported", [("1", "4"), ("4", "1")])
def test_the_frozen_weights_rule_reports_the_training_batchnorm_beside_one_in_eval(in_eval, reported):
    """Planted: the rule run only when every BatchNorm trains (``all`` for ``any``): nothing was reported."""
    net = _frozen_pair_net()
    net.get_submodule(in_eval).eval()
    found = lint_batchnorm(net, torch.randn(2, 3, 7, 7))
    assert [(f.rule, f.layer) for f in found] == [("frozen-weights-training-bn", reported)]
    weight = str(int(reported) - 1)
    assert found[0].message == (f"{weight} and {reported} are frozen (requires_grad=False) but the BatchNorm layer is "
                                "in training mode: its running statistics keep moving to the new data while the "
                                "weights stand still; call .eval() on the frozen part after every model.train() (or "
                                "replace it with FrozenBatchNorm2d)")
    net.get_submodule(reported).eval()  # the fix the message gives: nothing left to report
    assert lint_batchnorm(net, torch.randn(2, 3, 7, 7)) == []


def test_the_frozen_weights_rule_needs_every_parameter_of_the_pair_frozen():
    """One weight of the pair still trains: not frozen, not reported (the other pair still is)."""
    net = _frozen_pair_net()
    net[3].weight.requires_grad_(True)
    assert [f.layer for f in lint_batchnorm(net, torch.randn(2, 3, 7, 7))] == ["1"]
    net[1].bias.requires_grad_(True)  # the BatchNorm's own parameter counts too
    assert lint_batchnorm(net, torch.randn(2, 3, 7, 7)) == []


# ----------------------------------------------------------------------------- 3. scope="layers" and non-finite layers
@pytest.mark.parametrize("buffer, value", [("running_var", math.nan), ("running_mean", math.inf)])
def test_scope_layers_re_estimates_a_layer_whose_statistics_are_not_finite(buffer, value):
    """The statistics fit the probe but for one value of layer 4: its lag is NaN, under no threshold, and the
    rule fires on the non-finite statistic alone. Planted: the non-finite layers left out of ``scope="layers"``'s
    choice; no layer was chosen (and ``reestimate`` refused the empty list)."""
    net = _net()
    x, y = _probe()
    reestimate(net, [x])
    with torch.no_grad():
        getattr(net[4], buffer)[0] = value
    untouched = {k: v for k, v in _buffers(net).items() if not k.startswith("4.")}
    result = reestimate_if_stale(net, [x], (x, y), scope="layers")
    assert result.fired and result.layers == ["4"]
    assert result.before.nonfinite.running_statistics == (f"4.{buffer}",)
    assert not result.after.nonfinite and torch.isfinite(getattr(net[4], buffer)).all()
    assert _same({k: v for k, v in _buffers(net).items() if not k.startswith("4.")}, untouched)
    result.restore()
    assert math.isnan(getattr(net[4], buffer)[0]) if math.isnan(value) else getattr(net[4], buffer)[0] == value


# ----------------------------------------------------------------------------- 4. the handle's second restore
def test_saved_buffers_restore_again_after_a_second_re_estimation():
    """Planted: ``restore`` rebinding the saved tensors as the buffers instead of copying into them. The first
    restore passed; the second re-estimation then wrote into the saved copies and the second restore put back
    nothing."""
    net = _net()
    before = _buffers(net)
    saved = SavedBuffers(net)
    for _ in range(2):
        reestimate(net, _batches())
        assert not _same(_buffers(net), before)
        saved.restore()
        assert _same(_buffers(net), before)


def test_the_gated_handle_restores_again_after_a_second_re_estimation():
    net = _net()
    before = _buffers(net)
    result = reestimate_if_stale(net, _batches(), _probe())
    assert result.fired
    for _ in range(2):
        result.restore()
        assert _same(_buffers(net), before)
        reestimate(net, _batches())
    with result:
        pass
    assert _same(_buffers(net), before)


# ----------------------------------------------------------------------------- 7. the check: labels of shape (N, 1)
@pytest.mark.parametrize("shape", [(8, 1), (8, 2)])
def test_the_check_refuses_labels_that_are_not_one_dimensional(shape):
    """Planted: labels of two dims accepted. (N, 1) labels then compared with (N,) predictions by broadcasting
    (every label with every prediction), which turned a 100% probe into 46.5%."""
    x = torch.randn(8, 6)
    y = torch.zeros(shape, dtype=torch.long)
    with pytest.raises(CheckInputError, match=rf"batch 0: labels must be class indices, integers of shape \(N,\), "
                                              rf"got torch.int64 \({shape[0]}, {shape[1]}\)"):
        load_batches((x, y))
    (got, more), = [load_batches((x, y.flatten()[:8]))]  # the same labels as (N,): read
    assert got[0][1].shape == (8,) and not more


# ----------------------------------------------------------------------------- 10. "between" needs both sides
BETWEEN = next(c for c in registry.CLAIMS if c.name == "adamw_between_adam_and_sgd")
A = 0.003  # per-seed spread: 4 seeds at mean ± A, sample sd 2A/√3
TWO_SE = 2 * math.sqrt(2 * sd_of(A) ** 2 / 4)  # 2 standard errors of a difference of two 4-seed means (Welch)


def _between(adam: float, adamw: float, sgd: float):
    return BETWEEN.check(evidence({r: {registry.ACC: around(m, A)} for r, m in
                                   ((registry.ADAM, adam), (registry.ADAMW, adamw), (registry.SGD, sgd))}))


@pytest.mark.parametrize("adam, adamw, sgd, expected", [
    (0.70, 0.75, 0.80, PASS),
    (0.70, 0.80, 0.80, FAIL),  # above Adam, not below SGD
    (0.70, 0.70, 0.80, FAIL),  # below SGD, not above Adam
    (0.70, 0.85, 0.80, FAIL),  # above both
    (0.70, 0.65, 0.80, FAIL),  # below both
])
def test_adamw_between_fails_when_it_beats_only_one_side(adam, adamw, sgd, expected):
    """Planted: ``ok1 or ok2``; the one-sided cases passed."""
    assert _between(adam, adamw, sgd).verdict == expected


@pytest.mark.parametrize("side", ["adam", "sgd"])
def test_adamw_between_each_step_must_exceed_two_standard_errors(side):
    """Each step of the order by more than 2 standard errors of the difference: just over passes, just under fails,
    on either side (the other step far from its boundary)."""
    for factor, expected in ((1 + 1e-6, PASS), (1 - 1e-6, FAIL)):
        step = TWO_SE * factor
        args = (0.70, 0.70 + step, 0.90) if side == "adam" else (0.50, 0.80 - step, 0.80)
        assert _between(*args).verdict == expected, (side, factor)
