"""The check on the monitor reproduces the check as it was before (its own table from ``layer_lags``), in float64.

The old computation is written out here as the oracle, from torch alone: training-mode outputs on each batch,
evaluation-mode outputs, re-estimation by ``torch.optim.swa_utils.update_bn`` on a copy (the cumulative average
over batches), and per layer ``lag = (running mean - re-estimated mean) / sqrt(re-estimated var + eps)``, its
median |lag| over channels (torch's median, the lower middle one), the worst channel and its signed lag. With
``eps = 0`` that is the old formula exactly; with the layer's ``eps`` it is the unit the monitor divides by (the
one change the check's numbers make: DESIGN.md, "Units"). BatchNorm refuses ``eps = 0`` in training mode, so
"0" is 1e-300, which adds nothing to a float64 variance of order 0.01-10. Everything in float64, in this process: the same
arithmetic in another order, so the tolerance is a few hundred ulps of numbers of order 1-10 (1e-12).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from bnrotation.check import check_checkpoint

TOL = 1e-12


def _stale_net(eps: float) -> nn.Module:
    """Two convolutions, each followed by a BatchNorm of an odd channel count, made stale by shifting the running
    statistics (means by up to 3, variances by a factor of 1/4 to 4)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 5, 3), nn.BatchNorm2d(5, eps=eps), nn.ReLU(), nn.Conv2d(5, 7, 3),
                        nn.BatchNorm2d(7, eps=eps), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(7, 3)).double()
    batches = _batches()
    torch.optim.swa_utils.update_bn([x for x, _ in batches], net)  # statistics that fit, then moved off them
    with torch.no_grad():
        for bn in (net[1], net[4]):
            c = bn.num_features
            bn.running_mean += torch.linspace(-3.0, 3.0, c, dtype=torch.float64)
            bn.running_var *= torch.linspace(0.25, 4.0, c, dtype=torch.float64)
    return net.eval()


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 3, 6, 6, generator=g, dtype=torch.float64) + 0.3 * i,
             torch.randint(0, 3, (8,), generator=g)) for i in range(3)]


def _old_check(net: nn.Module, batches) -> dict:
    """The check's numbers as it computed them before it asked the monitor."""
    y = torch.cat([y for _, y in batches])
    train_net = copy.deepcopy(net).train()  # each batch's own statistics (the copy's buffers move; no matter)
    with torch.no_grad():
        pred_train = torch.cat([train_net(x) for x, _ in batches]).argmax(1)
        pred_eval = torch.cat([net(x) for x, _ in batches]).argmax(1)
        fresh = copy.deepcopy(net)
        torch.optim.swa_utils.update_bn([x for x, _ in batches], fresh)
        pred_fresh = torch.cat([fresh.eval()(x) for x, _ in batches]).argmax(1)
    layers = {}
    for name in ("1", "4"):
        stored, re = getattr(net, name), getattr(fresh, name)
        lag = (stored.running_mean - re.running_mean) / (re.running_var + stored.eps).sqrt()  # (C,)
        worst = int(lag.abs().argmax())
        layers[name] = (float(lag.abs().median()), worst, float(lag[worst]))
    acc = {k: float((p == y).double().mean()) for k, p in (("train", pred_train), ("eval", pred_eval),
                                                           ("fresh", pred_fresh))}
    return {"acc": acc, "gap": acc["train"] - acc["eval"], "gap_fresh": acc["train"] - acc["fresh"],
            "layers": layers}


@pytest.mark.parametrize("eps", [1e-300, 1e-5])  # 1e-300: below every variance's ulp, the old σ exactly
def test_the_check_on_the_monitor_reproduces_the_old_check_in_float64(eps):
    net = _stale_net(eps)
    with torch.no_grad():  # labels: the network's own training-mode predictions, so that stale statistics cost
        batches = [(x, copy.deepcopy(net).train()(x).argmax(1)) for x, _ in _batches()]
    old = _old_check(net, batches)
    report = check_checkpoint(net, batches)
    assert report.acc_train_mode == old["acc"]["train"] and report.acc_eval_mode == old["acc"]["eval"]
    assert report.mode_gap == pytest.approx(old["gap"], abs=TOL)
    assert report.acc_eval_mode_reestimated == old["acc"]["fresh"]
    assert report.mode_gap_reestimated == pytest.approx(old["gap_fresh"], abs=TOL)
    assert old["gap"] > 0.05 and report.stale  # a case where the numbers mean something
    layers = report.layers.set_index("norm_layer")
    channels = report.before.channels
    for name, (median, worst, worst_lag) in old["layers"].items():
        assert layers.loc[name, "lag_median_abs_sigma"] == pytest.approx(median, rel=TOL, abs=TOL)
        assert int(layers.loc[name, "worst_channel"]) == worst
        got = float(channels[channels["norm_layer"] == name]["lag_sigma"].iloc[worst])
        assert got == pytest.approx(worst_lag, rel=TOL, abs=TOL)
    assert report.layers["layer"].tolist() == ["0", "3"]  # the monitor's schema: the weight layer feeding each
    # after re-estimation the stored statistics are the pooled fresh ones: no lag left, to rounding
    assert float(report.after.layers["lag_max_abs_sigma"].max()) < 1e-9
