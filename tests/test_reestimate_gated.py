"""Re-estimation of chosen layers, and the gated form: re-estimate only when the monitor's rule fires, show the
before and after, and put the previous buffers back exactly."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from bnrotation.bnstats import SavedBuffers, batch_statistics, parameter_digests, reestimate, running_stat_layers
from bnrotation.refresh import reestimate_if_stale
from bnrotation.monitor import Thresholds

torch.set_num_threads(1)
LAG_ONLY = Thresholds(mode_gap=0.0, lag_sigma=0.1)  # a gap >= 0 always holds: the rule reads the lag alone


def _net(dropout: float = 0.0) -> nn.Sequential:
    """Conv-BN-ReLU-[Dropout]-Conv-BN-ReLU-pool-Linear-BN1d-Linear, running statistics of another distribution."""
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()]
    layers += [nn.Dropout(dropout)] if dropout else []
    layers += [nn.Conv2d(8, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
               nn.Flatten(), nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Linear(6, 3)]
    net = nn.Sequential(*layers)
    with torch.no_grad():
        for _ in range(3):
            net.train()(torch.randn(32, 3, 8, 8) * 3 + 2)
    return net.eval()


def _batches(n: int = 4) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(16, 3, 8, 8, generator=g) for _ in range(n)]


def _probe() -> tuple[torch.Tensor, torch.Tensor]:
    """64 inputs of the batches' distribution, labelled with the network's own predictions under batch statistics
    (training-mode accuracy 100%: the mode gap is then the share of predictions the running statistics change)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 3, 8, 8, generator=g)
    with torch.no_grad(), batch_statistics(_net()) as net:
        return x, net(x).argmax(1)


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()
            if k.endswith(("running_mean", "running_var", "num_batches_tracked"))}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- reestimate(layers=...)
def test_one_layer_re_estimated_is_the_closed_form_under_the_model_in_evaluation_mode():
    """The last BatchNorm1d alone: its running mean is the mean over batches of the batch means of its input, its
    running variance the mean of the unbiased batch variances (momentum None, PyTorch's convention), with the
    layers before it in evaluation mode; the other layers are left bit for bit."""
    net, batches = _net(), _batches()
    before = _buffers(net)
    inputs = []
    hook = net[9].register_forward_pre_hook(lambda m, a: inputs.append(a[0].detach().double()))
    with torch.no_grad():
        for x in batches:
            net(x)  # in evaluation mode: what the other layers do during the pass
    hook.remove()
    report = reestimate(net, batches, layers=["9"])
    assert report.layers == ["9"] and report.skipped == ["1", "4"]
    mean = torch.stack([z.mean(0) for z in inputs]).mean(0)
    var = torch.stack([z.var(0, unbiased=True) for z in inputs]).mean(0)
    # float32 layer arithmetic against a float64 closed form over 16 samples a batch: a few float32 ulps
    torch.testing.assert_close(net[9].running_mean.double(), mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(net[9].running_var.double(), var, rtol=1e-5, atol=1e-6)
    after = _buffers(net)
    assert _same({k: v for k, v in after.items() if not k.startswith("9.")},
                 {k: v for k, v in before.items() if not k.startswith("9.")})
    assert int(net[9].num_batches_tracked) == len(batches)


def test_the_first_layer_alone_equals_its_statistics_from_a_full_re_estimation():
    """Nothing upstream of the first BatchNorm depends on another one: both ways give it the same bits."""
    alone, full = _net(), _net()
    reestimate(alone, _batches(), layers=["1"])
    reestimate(full, _batches())
    assert torch.equal(alone[1].running_mean, full[1].running_mean)
    assert torch.equal(alone[1].running_var, full[1].running_var)
    assert not torch.equal(alone[4].running_mean, full[4].running_mean)  # left stale


@pytest.mark.parametrize("bad", [["7"], ["nope"], []])
def test_layers_that_are_not_batchnorm_layers_are_refused_before_any_change(bad):
    net = _net()
    before = _buffers(net)
    with pytest.raises(ValueError, match=r"layers: .*expected names of layers with running statistics"):
        reestimate(net, _batches(), layers=bad)
    assert _same(_buffers(net), before)


# ----------------------------------------------------------------------------- SavedBuffers
def test_saved_buffers_put_back_every_buffer_and_momentum_exactly():
    net = _net()
    before, momenta = _buffers(net), [m.momentum for _, m in running_stat_layers(net)]
    saved = SavedBuffers(net)
    reestimate(net, _batches())
    net[1].momentum = None
    assert not _same(_buffers(net), before)
    saved.restore()
    assert _same(_buffers(net), before)
    assert [m.momentum for _, m in running_stat_layers(net)] == momenta
    with pytest.raises(RuntimeError, match="inside"):
        with SavedBuffers(net):
            reestimate(net, _batches())
            raise RuntimeError("inside")
    assert _same(_buffers(net), before)


# ----------------------------------------------------------------------------- reestimate_if_stale
def test_statistics_that_fit_are_left_alone():
    """Re-estimated on the probe itself, they fit it: the rule does not fire and no buffer moves."""
    net = _net()
    x, y = _probe()
    reestimate(net, [x])
    before = _buffers(net)
    result = reestimate_if_stale(net, _batches(), (x, y))
    assert not result.fired and result.layers == [] and result.report is None and not result.helped
    assert result.after is result.before
    assert _same(_buffers(net), before)
    assert "nothing re-estimated" in result.summary


def test_stale_statistics_are_re_estimated_as_reestimate_does_and_it_shows_that_it_helped():
    gated, plain = _net(), _net()
    x, y = _probe()
    result = reestimate_if_stale(gated, _batches(), (x, y))
    reestimate(plain, _batches())
    assert result.fired and result.layers == ["1", "4", "9"]
    assert _same(_buffers(gated), _buffers(plain))  # the same pass, bit for bit
    assert result.after.worst_median_lag_sigma < LAG_ONLY.lag_sigma <= result.before.worst_median_lag_sigma
    assert result.after.mode_gap <= result.before.mode_gap and result.helped
    with torch.no_grad():  # the accuracy, counted directly on the model re-estimated without the gate
        assert result.after.acc_eval_mode == float((plain.eval()(x).argmax(1) == y).double().mean())
    lags = result.lags()
    assert list(lags["norm_layer"]) == ["1", "4", "9"] and lags["reestimated"].all()
    assert (lags["lag_median_abs_sigma_after"] < lags["lag_median_abs_sigma_before"]).all()


def test_scope_layers_re_estimates_only_the_layers_over_the_lag_threshold():
    """All three layers fit the probe; then one running mean is moved by 2 standard deviations of its channel:
    only that layer crosses 0.1σ, only it is re-estimated, and the other two keep their bits."""
    net = _net()
    x, y = _probe()
    reestimate(net, [x])
    with torch.no_grad():
        net[4].running_mean += 2 * net[4].running_var.sqrt()
    untouched = {k: v for k, v in _buffers(net).items() if not k.startswith("4.")}
    result = reestimate_if_stale(net, [x], (x, y), thresholds=LAG_ONLY, scope="layers")
    assert result.fired and result.layers == ["4"]
    assert list(result.lags().query("reestimated")["norm_layer"]) == ["4"]
    assert _same({k: v for k, v in _buffers(net).items() if not k.startswith("4.")}, untouched)
    # Re-estimated on the probe itself, but with layer 1 in evaluation mode (unbiased running variance over
    # n = 64 * 8 * 8 values) where the monitor normalises with the biased batch variance: layer 4's input is scaled
    # by about 1 / (2n) = 1.2e-4 relatively, a lag of 1.2e-4 |mean| / std, well under 1e-3 for |mean| / std < 8.
    assert result.lags().set_index("norm_layer").loc["4", "lag_median_abs_sigma_after"] < 1e-3


def test_the_handle_restores_the_previous_buffers_exactly_also_as_a_context_manager():
    net = _net()
    before = _buffers(net)
    result = reestimate_if_stale(net, _batches(), _probe())
    assert result.fired and not _same(_buffers(net), before)
    result.restore()
    assert _same(_buffers(net), before)
    with reestimate_if_stale(net, _batches(), _probe()) as inside:
        assert inside.fired and not _same(_buffers(net), before)
    assert _same(_buffers(net), before)


def test_parameters_stay_and_dropout_stays_off():
    """With dropout in the network the pass is still deterministic (dropout off): two runs give the same bits, no
    parameter changes, and every module's mode is as it was."""
    a, b = _net(dropout=0.5), _net(dropout=0.5)
    digests, flags = parameter_digests(a), [m.training for m in a.modules()]
    torch.manual_seed(3)
    reestimate_if_stale(a, _batches(), _probe())
    torch.manual_seed(4)
    reestimate_if_stale(b, _batches(), _probe())
    assert _same(_buffers(a), _buffers(b))
    assert parameter_digests(a) == digests and [m.training for m in a.modules()] == flags


def test_a_gap_threshold_out_of_reach_is_undetermined_and_re_estimates():
    """Stale statistics, and a gap threshold the probe cannot reach: even an evaluation mode collapsed to the
    probe's largest class would stay under it. The rule cannot judge, and an undetermined verdict cannot rule
    staleness out: it re-estimates and says why. (Before the constant-guess bound it read "not stale" and left the
    stale statistics.) The threshold at the gap itself judges: stale."""
    net = _net()
    result = reestimate_if_stale(net, _batches(), _probe(), thresholds=Thresholds(mode_gap=1.0, lag_sigma=0.1))
    assert result.before.worst_median_lag_sigma > 0.1 and result.before.mode_gap < 1.0
    assert "constant guess" in result.before.undetermined and result.fired
    assert result.summary.startswith("undetermined")
    net = _net()
    reached = Thresholds(mode_gap=result.before.mode_gap, lag_sigma=0.1)
    again = reestimate_if_stale(net, _batches(), _probe(), thresholds=reached)
    assert not again.before.undetermined and again.before.stale and again.fired


def test_a_rule_that_cannot_fire_leaves_the_statistics_and_says_so():
    """The failure case: the statistics are stale, the gap crosses its threshold, but the lag's is out of reach
    (E left out of the rule); nothing may change."""
    net = _net()
    before = _buffers(net)
    result = reestimate_if_stale(net, _batches(), _probe(),
                                 thresholds=Thresholds(lag_sigma=1e6, eval_error_sigma=math.inf))
    assert result.before.worst_median_lag_sigma > 0.1 and not result.before.undetermined and not result.fired
    assert _same(_buffers(net), before)


def test_a_bad_scope_is_refused():
    with pytest.raises(ValueError, match="scope: expected one of model, layers, got 'all'"):
        reestimate_if_stale(_net(), _batches(), _probe(), scope="all")


def test_its_warnings_name_the_callers_line():
    """The monitor it builds warns at construction (here a probe too small for the gap threshold) at the line that
    called ``reestimate_if_stale``, so Python's default filter shows it once per such line, not at the library's."""
    from bnrotation.monitor import MonitorSetupWarning
    x, y = _probe()
    with pytest.warns(MonitorSetupWarning, match="one of its 8 samples") as caught:
        reestimate_if_stale(_net(), _batches(), (x[:8], y[:8]))
    assert {w.filename for w in caught if w.category is MonitorSetupWarning} == {__file__}
