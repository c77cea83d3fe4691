"""The statistics along the evaluation path (bnrotation.probes.evaluation_path_pass; the monitor's
``evaluation_path``): each norm layer's input moments with the network upstream in evaluation mode, against an
oracle that keeps every input whole, chunked and unchunked, against a closed form where the lag is carried through
depth, on an outside model, and the monitor's columns with and without it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn

from bnrotation.monitor import StalenessMonitor
from bnrotation.probes import Scratch, batch_statistics_pass, evaluation_path_pass, pooled_chunk_moments
from bnrotation.staleness import channel_signals

from thirdparty import import_optional

# input_moments' documented accuracy on float32 inputs (tests/test_probes.py): the mean within 1e-6 σ, the
# variance within 1e-5 relative. Pooling chunks in float64 adds nothing at that scale.
MEAN_SIGMA, VAR_REL = 1e-6, 1e-5


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 4))


def _staled(net: nn.Module) -> nn.Module:
    """Running statistics that describe other inputs: a few training-mode passes on shifted, scaled data."""
    with torch.no_grad():
        for _ in range(3):
            net.train()(torch.randn(32, 3, 8, 8) * 2 + 1)
    return net


def _oracle(net: nn.Module, x: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each BatchNorm input of one whole evaluation-mode pass, kept and reduced in float64."""
    kept, hooks = {}, []
    for name, m in net.named_modules():
        if isinstance(m, nn.BatchNorm2d):
            hooks.append(m.register_forward_pre_hook(lambda mod, inp, name=name: kept.__setitem__(name, inp[0])))
    was = net.training
    with torch.no_grad():
        net.eval()(x)
    net.train(was)
    for h in hooks:
        h.remove()
    out = {}
    for name, z in kept.items():
        var, mean = torch.var_mean(z.double(), dim=(0, 2, 3), correction=1)
        out[name] = (mean, var)
    return out


def _assert_moments_close(got, want):
    assert set(got) == set(want)
    for name in want:
        (m, v), (wm, wv) = got[name], want[name]
        sd = wv.sqrt()
        assert ((m - wm).abs() / sd).max() < MEAN_SIGMA, name
        assert ((v - wv).abs() / wv).max() < VAR_REL, name


# ----------------------------------------------------------------------------- the pooling of chunks
def test_pooled_chunk_moments_is_the_whole_batchs_moments():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(103, 5, generator=g, dtype=torch.float64) * 3 + 7
    parts = []
    for c in z.split([40, 1, 50, 12]):  # uneven chunks, one of a single sample
        n = len(c)
        var = c.var(0, correction=1) if n > 1 else torch.zeros(5, dtype=torch.float64)  # n = 1: M2 = 0
        parts.append((n, c.mean(0), var))
    mean, var = pooled_chunk_moments(parts)
    wvar, wmean = torch.var_mean(z, 0, correction=1)
    torch.testing.assert_close(mean, wmean, rtol=1e-13, atol=0)
    torch.testing.assert_close(var, wvar, rtol=1e-12, atol=0)
    one = pooled_chunk_moments(parts[:1])
    assert one[0] is parts[0][1] and one[1] is parts[0][2]  # one chunk: as it is


def test_pooled_chunk_moments_refuses_nothing_to_pool():
    with pytest.raises(ValueError, match="no chunks"):
        pooled_chunk_moments([])
    one = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(ValueError, match="at least 2"):
        pooled_chunk_moments([(1, one, one), (0, one, one)])


def test_two_values_per_channel_are_enough_to_pool_and_no_chunk_is_refused_in_words():
    """The refusal's boundary, from the side it does not refuse: two chunks of one value each (n = 2 in all) pool
    to the two values' mean and unbiased variance."""
    a = torch.tensor([1.0, -2.0], dtype=torch.float64)
    b = torch.tensor([3.0, 2.0], dtype=torch.float64)
    zero = torch.zeros(2, dtype=torch.float64)  # one value: M2 = 0
    mean, var = pooled_chunk_moments([(1, a, zero), (1, b, zero)])
    torch.testing.assert_close(mean, (a + b) / 2, rtol=0, atol=0)
    torch.testing.assert_close(var, (a - b).square() / 2, rtol=0, atol=0)
    with pytest.raises(ValueError) as refused:
        pooled_chunk_moments([])
    assert str(refused.value) == "pooled_chunk_moments: no chunks"


def test_the_pass_runs_one_forward_per_chunk_and_measures_the_layers_asked_with_the_buffer_lent():
    """Chunks of ``chunk`` samples, the last one shorter (a chunk of 1 included); ``chunk`` of N or more: one
    pass. ``layers`` names the layers measured (only those), and the ``scratch`` lent is the one used: its
    ``largest`` is the bytes of the layer input measured."""
    net = _staled(_net())
    seen: list[int] = []
    net.register_forward_pre_hook(lambda mod, inp: seen.append(len(inp[0])))
    x = torch.randn(20, 3, 8, 8)
    for chunk, calls in ((7, [7, 7, 6]), (1, [1] * 20), (19, [19, 1]), (20, [20]), (None, [20])):
        seen.clear()
        evaluation_path_pass(net, x, chunk=chunk)
        assert seen == calls, chunk
    scratch = Scratch()
    _, moments = evaluation_path_pass(net, x, layers=[("4", net[4])], chunk=7, scratch=scratch)
    assert list(moments) == ["4"]
    assert scratch.largest == 7 * 6 * 8 * 8 * 4  # the largest chunk's (7, 6, 8, 8) float32 input to net[4]
    _assert_moments_close(moments, {"4": _oracle(net, x)["4"]})


# ----------------------------------------------------------------------------- the pass against an oracle
@pytest.mark.parametrize("chunk", [None, 7, 1000])
def test_the_pass_gives_each_layers_evaluation_mode_input_moments_and_output(chunk):
    net = _staled(_net())
    x = torch.randn(50, 3, 8, 8)
    net.train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    out, moments = evaluation_path_pass(net, x, chunk=chunk)
    _assert_moments_close(moments, _oracle(net, x))
    with torch.no_grad():
        want = net.eval()(x)
    net.train()
    torch.testing.assert_close(out, want)  # per sample, evaluation mode does not depend on the chunk
    assert all(m.training for m in net.modules())  # flags restored
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k  # no buffer moved


def test_the_second_layer_differs_from_the_training_path_and_the_first_does_not():
    """The first BatchNorm input (conv of x) is the same in both modes; the second is not when the first
    layer's running statistics are stale: that difference is what the evaluation path adds."""
    net = _staled(_net())
    x = torch.randn(64, 3, 8, 8)
    _, train_path = batch_statistics_pass(net, x)
    _, eval_path = evaluation_path_pass(net, x)
    _assert_moments_close({"1": eval_path["1"]}, {"1": train_path["1"]})
    m_t, v_t = train_path["4"]
    m_e, v_e = eval_path["4"]
    assert ((m_e - m_t).abs() / v_t.sqrt()).max() > 0.1  # the stale first layer moved the second's inputs


def test_a_layer_called_twice_keeps_its_last_calls_input():
    bn = nn.BatchNorm1d(3)
    net = nn.Sequential(bn, nn.Linear(3, 3, bias=False), bn)  # the same layer at two places
    with torch.no_grad():
        net[1].weight.copy_(torch.eye(3) * 5)
    x = torch.randn(40, 3)
    _, moments = evaluation_path_pass(net, x, chunk=9)
    with torch.no_grad():
        second = net[1](net.eval()[0](x)).double()
    torch.testing.assert_close(moments["0"][1], second.var(0), rtol=VAR_REL, atol=0)


# ----------------------------------------------------------------------------- a closed form through depth
def test_E_along_the_evaluation_path_is_the_lag_carried_from_the_layer_above():
    """BN1 -> BN2, identity affines. BN1's running σ set to twice its batch σ (mean exact): in evaluation mode it
    halves its output. BN2's running statistics set to its training-path input's: its own E is 0. Along the
    evaluation path BN2 meets inputs of half the σ: s = 1/2, d = 0, so E = 1/2 (to the share of eps in its
    variance, computed exactly below); BN1's E is 1/2 on both paths."""
    torch.manual_seed(3)
    bn1, bn2 = nn.BatchNorm1d(4), nn.BatchNorm1d(4)
    net = nn.Sequential(bn1, bn2)
    x = torch.randn(4096, 4, dtype=torch.float64) * 3 + 2
    net.double()
    with torch.no_grad():
        var_b, mean = torch.var_mean(x, 0, correction=0)  # BN1 normalises with the biased batch variance
        bn1.running_mean.copy_(mean)
        bn1.running_var.copy_(4 * (var_b + bn1.eps) - bn1.eps)  # sqrt(running_var + eps) = 2 sqrt(var_b + eps)
        z = (x - mean) / (var_b + bn1.eps).sqrt()  # BN1's training-mode output, BN2's training-path input
        bn2.running_mean.copy_(z.mean(0))
        bn2.running_var.copy_(z.var(0, correction=1))
    record = StalenessMonitor(net, x, warn=False, warmup_steps=0, evaluation_path=True,
                              running_statistics_only=True)(1)
    ch = record.channels.set_index(["norm_layer", "channel"])
    own = ch.loc["1", "eval_error_sigma"].to_numpy()
    assert np.abs(own).max() < 1e-12  # BN2's statistics are its training-path input's
    rv, eps = bn2.running_var.numpy(), bn2.eps
    zv = z.var(0, correction=1).numpy()
    half = np.sqrt(zv / 4 + eps) / np.sqrt(rv + eps)  # s along the evaluation path
    want = channel_signals(bn2.running_mean.numpy(), rv, z.mean(0).numpy() / 2, zv / 4, eps).eval_error_sigma
    np.testing.assert_allclose(ch.loc["1", "eval_path_error_sigma"], want, rtol=1e-10)
    np.testing.assert_allclose(half, 0.5, rtol=1e-4)  # eps (1e-5) against a variance near 1
    np.testing.assert_allclose(ch.loc["1", "eval_path_error_sigma"], 0.5, rtol=1e-4)
    np.testing.assert_allclose(ch.loc["0", "eval_path_error_sigma"], ch.loc["0", "eval_error_sigma"], rtol=1e-10)
    # BN1: d = 0 and s = sqrt(v + eps) / (2 sqrt(v_b + eps)), v the unbiased variance the monitor measures,
    # v_b = v (n - 1) / n the biased one BN1 normalised with: E = 1 - s = 1/2 - 1/(4n) to first order
    n = len(x)
    want1 = channel_signals(mean.numpy(), bn1.running_var.numpy(), mean.numpy(), x.var(0, correction=1).numpy(),
                            bn1.eps).eval_error_sigma
    np.testing.assert_allclose(ch.loc["0", "eval_error_sigma"], want1, rtol=1e-10)
    np.testing.assert_allclose(want1, 0.5 - 0.25 / n, rtol=1 / n ** 2 + 1e-5 / 9)  # 2nd order in 1/n, eps / var
    line = record.layers.set_index("norm_layer").loc["1"]
    assert line["eval_path_error_median_sigma"] == pytest.approx(float(np.median(want)), rel=1e-10)
    assert line["eval_path_error_max_sigma"] == pytest.approx(float(want.max()), rel=1e-10)
    assert line["eval_error_max_sigma"] < 1e-12


# ----------------------------------------------------------------------------- the monitor's option
def test_without_the_option_nothing_changes_and_with_it_the_mode_check_is_the_same():
    net = _staled(_net())
    x, y = torch.randn(64, 3, 8, 8), torch.randint(0, 4, (64,))
    plain = StalenessMonitor(net, (x, y), warn=False)(1)
    path = StalenessMonitor(net, (x, y), warn=False, evaluation_path=True)(1)
    assert not any(c.startswith("eval_path") for c in (*plain.layers.columns, *plain.channels.columns))
    assert {"eval_path_error_median_sigma", "eval_path_error_max_sigma"} <= set(path.layers.columns)
    assert {"eval_path_mean", "eval_path_var", "eval_path_error_sigma"} <= set(path.channels.columns)
    for col in ("acc_train_mode", "acc_eval_mode", "mode_agreement", "mode_gap"):
        assert path.checks[col].iloc[0] == plain.checks[col].iloc[0], col
    same = [c for c in plain.channels.columns if c not in ("rotation_deg", "rotation_deg_per_100", "update_cos",
                                                            "drift_sigma_per_step", "predicted_lag_sigma")]
    assert plain.channels[same].equals(path.channels[same])  # the training-path measures are untouched


def test_several_probe_batches_and_no_mode_check():
    net = _staled(_net())
    batches = [(torch.randn(32, 3, 8, 8), torch.randint(0, 4, (32,))) for _ in range(3)]
    record = StalenessMonitor(net, batches, warn=False, modes=False, evaluation_path=True)(1)
    assert math.isnan(record.mode_gap)  # no mode check asked for
    per_batch = [evaluation_path_pass(net, x)[1] for x, _ in batches]
    ch = record.channels.set_index(["norm_layer", "channel"])
    for layer in ("1", "4"):  # pooled as the fresh statistics are: each batch weighted alike
        mean = sum(b[layer][0] for b in per_batch) / 3
        np.testing.assert_allclose(ch.loc[layer, "eval_path_mean"], mean.numpy(), rtol=0, atol=1e-12)


def test_a_layer_without_running_statistics_gives_nan_and_the_option_is_checked():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.GroupNorm(2, 8), nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8),
                        nn.Flatten(), nn.LazyLinear(4))
    x = torch.randn(16, 3, 8, 8)
    net(x)
    record = StalenessMonitor(net, x, warn=False, running_statistics_only=False, evaluation_path=True)(1)
    lines = record.layers.set_index("norm_layer")
    assert math.isnan(lines.loc["1", "eval_path_error_median_sigma"])
    assert np.isfinite(lines.loc["3", "eval_path_error_median_sigma"])
    with pytest.raises(TypeError, match="evaluation_path: expected a bool"):
        StalenessMonitor(net, x, evaluation_path="yes")


# ----------------------------------------------------------------------------- an outside model
def test_torchvisions_resnet_first_layer_agrees_on_both_paths_and_deeper_layers_move():
    models = import_optional("torchvision.models")
    torch.manual_seed(0)
    net = models.resnet18(num_classes=10)
    x = torch.randn(8, 3, 32, 32)
    with torch.no_grad():  # stale statistics: a few training passes on other inputs
        for _ in range(2):
            net.train()(torch.randn(8, 3, 32, 32) * 3 + 1)
    record = StalenessMonitor(net, x, warn=False, evaluation_path=True)(1)
    lines = record.layers.set_index("norm_layer")
    assert lines.loc["bn1", "eval_path_error_median_sigma"] == pytest.approx(
        lines.loc["bn1", "eval_error_median_sigma"], rel=1e-4)  # the same inputs: conv1 of x
    deep = lines.loc["layer4.1.bn2"]
    assert deep["eval_path_error_median_sigma"] != pytest.approx(deep["eval_error_median_sigma"], rel=1e-2)
    assert np.isfinite(lines["eval_path_error_median_sigma"]).all()


# ----------------------------------------------------------------------------- layers a pass does not reach
class _Branches(nn.Module):
    """conv-BN twice, a BatchNorm never called (``unused``), and a third conv-BN (``b3``) run only on batches of
    more than ``big`` samples, or only while ``b2`` is in training mode (``eval_skips``)."""

    def __init__(self, big: int = 10 ** 9, eval_skips: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c3, self.b3 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.unused = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)
        self.big, self.eval_skips = big, eval_skips

    def forward(self, x):
        x = torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))
        if len(x) > self.big or (self.eval_skips and self.b2.training):
            x = torch.relu(self.b3(self.c3(x)))
        return self.head(x.mean((2, 3)))


@pytest.mark.parametrize("evaluation_path", [False, True])
def test_a_layer_never_called_gives_nan_not_an_error(evaluation_path):
    """The monitor says at construction that it measures the lag of a layer 'not called on the probe batch'; a call
    then gave a KeyError (found by a new user's trial): now its measures are NaN."""
    net = _staled(_Branches())
    x = torch.randn(32, 3, 8, 8)
    with pytest.warns(UserWarning, match="not called on the probe batch"):
        monitor = StalenessMonitor(net, x, warn=False, evaluation_path=evaluation_path)
    lines = monitor(1).layers.set_index("norm_layer")
    assert lines.loc[["unused", "b3"], "eval_error_median_sigma"].isna().all()
    assert np.isfinite(lines.loc[["b1", "b2"], "eval_error_median_sigma"]).all()


def test_a_layer_some_probe_batches_reach_is_pooled_over_those():
    net = _staled(_Branches(big=40))
    small, large = torch.randn(32, 3, 8, 8), torch.randn(48, 3, 8, 8)
    probe = [(small, torch.randint(0, 4, (32,))), (large, torch.randint(0, 4, (48,)))]
    record = StalenessMonitor(net, probe, warn=False, evaluation_path=True)(1)
    ch = record.channels.set_index(["norm_layer", "channel"])
    _, alone = batch_statistics_pass(net, large)  # b3 saw the large batch only
    np.testing.assert_allclose(ch.loc["b3", "fresh_mean"], alone["b3"][0].numpy(), rtol=0, atol=1e-12)
    _, path = evaluation_path_pass(net, large)
    np.testing.assert_allclose(ch.loc["b3", "eval_path_mean"], path["b3"][0].numpy(), rtol=0, atol=1e-12)


def test_a_layer_the_evaluation_pass_skips_has_nan_on_that_path_only():
    net = _staled(_Branches(eval_skips=True))
    lines = StalenessMonitor(net, torch.randn(32, 3, 8, 8), warn=False,
                             evaluation_path=True)(1).layers.set_index("norm_layer")
    assert np.isfinite(lines.loc["b3", "eval_error_median_sigma"])
    assert math.isnan(lines.loc["b3", "eval_path_error_median_sigma"])
