"""Re-estimation and statistic swaps: against torch.optim.swa_utils.update_bn, closed forms, failure cases."""

from __future__ import annotations

import copy
import itertools

import pandas as pd
import pytest
import torch
import torch.nn as nn
from torch.optim.swa_utils import update_bn
from torch.utils.data import DataLoader, TensorDataset

from bnrotation import records
from bnrotation.bnstats import (parameter_digests, reestimate, running_stat_layers, running_stats,
                                swapped_statistics, top_k_channel_masks, weights_fingerprint)
from bnrotation.study.config import ModelConfig
from bnrotation.study.model import build_network
from bnrotation.study.interventions import run_interventions, top_k_grid


# ----------------------------------------------------------------------------- helpers
def _net(dropout: float = 0.0) -> nn.Sequential:
    """Conv-BN-ReLU-[Dropout]-Conv-BN-ReLU-pool-Linear-BN1d, with stale running statistics."""
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8, momentum=0.1), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers += [nn.Conv2d(8, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6, momentum=0.1), nn.ReLU(),
               nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 4), nn.BatchNorm1d(4, momentum=0.1)]
    net = nn.Sequential(*layers)
    with torch.no_grad():
        net.train()(torch.randn(16, 3, 8, 8) * 3 + 2)  # running statistics of another distribution
    return net.eval()


def _uneven_batches() -> list[torch.Tensor]:
    """Four batches of sizes 5, 16, 3, 9 (N, 3, 8, 8), each from a different distribution."""
    g = torch.Generator().manual_seed(1)
    return [torch.randn(n, 3, 8, 8, generator=g) * (1 + i) + i for i, n in enumerate((5, 16, 3, 9))]


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()
            if k.endswith(("running_mean", "running_var", "num_batches_tracked"))}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _flags(model: nn.Module) -> list[bool]:
    return [m.training for m in model.modules()]


# ----------------------------------------------------------------------------- re-estimation
def test_matches_update_bn_on_a_network_without_dropout():
    ours, ref = _net(), _net()
    batches = _uneven_batches()
    report = reestimate(ours, batches)
    update_bn(batches, ref)
    assert _same(_buffers(ours), _buffers(ref))  # bit-identical, num_batches_tracked included
    assert not _same(_buffers(ours), _buffers(_net()))  # and it did change them
    assert report.layers == ["1", "4", "9"] and report.batches == 4 and report.samples == 33


def test_plain_cumulative_average_weighs_batches_not_samples():
    """PyTorch's momentum=None: the mean over batches of the batch mean and of the unbiased batch variance."""
    bn = nn.BatchNorm1d(3, momentum=0.03)
    g = torch.Generator().manual_seed(2)
    batches = [torch.randn(n, 3, generator=g, dtype=torch.float32) * (i + 1) + 2 * i
               for i, n in enumerate((2, 50, 7))]
    reestimate(bn, batches)
    mean = torch.stack([b.mean(0) for b in batches]).mean(0)
    var = torch.stack([b.var(0, unbiased=True) for b in batches]).mean(0)
    assert torch.allclose(bn.running_mean, mean, rtol=1e-5, atol=1e-6)
    assert torch.allclose(bn.running_var, var, rtol=1e-5, atol=1e-6)
    pooled = torch.cat(batches).mean(0)
    assert not torch.allclose(bn.running_mean, pooled, atol=1e-2)  # not a per-sample average
    assert bn.momentum == 0.03 and int(bn.num_batches_tracked) == 3


def test_with_dropout_ours_is_deterministic_and_update_bns_is_not():
    batches = _uneven_batches()

    def buffers_after(estimate, seed: int) -> dict[str, torch.Tensor]:
        net = _net(dropout=0.5)
        torch.manual_seed(seed)
        estimate(batches, net)
        return _buffers(net)

    ours = [buffers_after(lambda b, net: reestimate(net, b), seed) for seed in (0, 1)]
    assert _same(*ours)
    # dropout stayed in evaluation mode, so ours equals update_bn on the network without it
    no_dropout = _net(dropout=0.5)
    no_dropout[3] = nn.Identity()
    update_bn(batches, no_dropout)
    assert _same(ours[0], _buffers(no_dropout))
    # update_bn puts the whole network, dropout included, into training mode: its result depends on the RNG
    theirs = [buffers_after(update_bn, seed) for seed in (0, 1)]
    assert not torch.equal(theirs[0]["5.running_mean"], theirs[1]["5.running_mean"])


def test_dropout_and_other_modules_keep_their_mode_during_the_pass():
    net = _net(dropout=0.5)
    seen = []
    hooks = [m.register_forward_pre_hook(lambda mod, inp: seen.append((type(mod).__name__, mod.training)))
             for m in net.modules() if isinstance(m, (nn.Dropout, nn.BatchNorm2d, nn.Linear))]
    reestimate(net, _uneven_batches()[:1])
    for h in hooks:
        h.remove()
    assert set(seen) == {("BatchNorm2d", True), ("Dropout", False), ("Linear", False)}


@pytest.mark.parametrize("shape", ["tensor", "tuple", "list", "mapping", "loader"])
def test_the_three_batch_shapes_give_the_same_statistics(shape):
    batches = _uneven_batches()
    labels = [torch.zeros(len(x), dtype=torch.long) for x in batches]
    reference = _net()
    reestimate(reference, batches)
    net = _net()
    if shape == "tensor":
        report = reestimate(net, batches)
    elif shape == "tuple":
        report = reestimate(net, list(zip(batches, labels)))
    elif shape == "list":
        report = reestimate(net, [[x, y] for x, y in zip(batches, labels)])
    elif shape == "mapping":
        report = reestimate(net, [{"image": x, "label": y} for x, y in zip(batches, labels)], input_key="image")
    else:  # a DataLoader yields [input, target] lists; uneven last batch (33 = 3 x 10 + 3)
        x = torch.cat(batches)
        report = reestimate(net, DataLoader(TensorDataset(x, torch.zeros(len(x))), batch_size=10))
        ref = _net()
        update_bn(DataLoader(TensorDataset(x, torch.zeros(len(x))), batch_size=10), ref)
        assert _same(_buffers(net), _buffers(ref)) and report.batches == 4
        return
    assert _same(_buffers(net), _buffers(reference))
    assert report.batches == 4 and report.samples == 33


def test_modes_and_momentum_are_restored():
    net = _net(dropout=0.5).train()
    net[3].eval()  # a mixed state: everything in training mode except the dropout
    net[5].momentum = None  # a layer that already used the cumulative average
    flags, momenta = _flags(net), [m.momentum for _, m in running_stat_layers(net)]
    report = reestimate(net, _uneven_batches())
    assert _flags(net) == flags
    assert [m.momentum for _, m in running_stat_layers(net)] == momenta == [0.1, None, 0.1]
    assert report.momentum_restored == {"1": 0.1, "5": None, "10": 0.1}


def test_no_parameter_changes_and_the_fingerprint_names_the_weights():
    net = _net()
    params = {n: p.detach().clone() for n, p in net.named_parameters()}
    report = reestimate(net, _uneven_batches())
    assert all(torch.equal(p, params[n]) for n, p in net.named_parameters())
    assert report.weights_fingerprint == weights_fingerprint(_net())  # buffers do not enter it
    with torch.no_grad():
        net[0].weight[0, 0, 0, 0] += 1e-3
    assert weights_fingerprint(net) != report.weights_fingerprint


class _Sneaky(nn.Module):
    """A BatchNorm network whose forward pass edits one of its own parameters."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(2)
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        with torch.no_grad():
            self.scale.add_(1.0)
        return self.bn(x) * self.scale


def test_a_parameter_that_changes_is_reported():
    with pytest.raises(RuntimeError, match=r"parameters changed.*scale"):
        reestimate(_Sneaky(), [torch.randn(4, 2)])



def test_the_parameter_check_keeps_digests_not_copies(monkeypatch):
    """No clone of a parameter during the pass (the check used to keep one of each: twice the parameters'
    memory); a parameter that changes is still caught (test_a_parameter_that_changes_is_reported)."""
    net = nn.Sequential(nn.Linear(512, 512, bias=False), nn.BatchNorm1d(512))
    cloned, real = [], torch.Tensor.clone

    def spy(t, *args, **kwargs):
        cloned.append(t.numel())
        return real(t, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "clone", spy)
    reestimate(net, [torch.randn(8, 512) for _ in range(2)])
    monkeypatch.undo()
    assert max(cloned, default=0) < 512 * 512
    digests = parameter_digests(net)
    assert set(digests) == {"0.weight", "1.weight", "1.bias"} and all(len(d) == 64 for d in digests.values())
    with torch.no_grad():
        net[0].weight[3, 4] = torch.nextafter(net[0].weight[3, 4], torch.tensor(2.0))  # one ulp
    assert parameter_digests(net)["0.weight"] != digests["0.weight"]
    assert parameter_digests(net)["1.weight"] == digests["1.weight"]


def test_max_batches_stops_an_endless_loader_and_draws_no_batch_past_it():
    batches = _uneven_batches()
    drawn = []

    def endless():
        for i in itertools.count():
            drawn.append(i)
            yield batches[i % len(batches)]

    ours, ref = _net(), _net()
    report = reestimate(ours, endless(), max_batches=len(batches))
    update_bn(batches, ref)
    assert _same(_buffers(ours), _buffers(ref))  # the first four batches, as update_bn on exactly those
    assert (report.batches, report.samples, drawn) == (4, 33, [0, 1, 2, 3])
    short = _net()
    assert reestimate(short, batches, max_batches=10).batches == 4  # a shorter loader is not an error
    assert _same(_buffers(short), _buffers(ref))


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3"])
def test_max_batches_must_be_a_positive_integer(bad):
    net = _net()
    before = _buffers(net)
    with pytest.raises(ValueError, match=r"max_batches: expected a positive integer"):
        reestimate(net, _uneven_batches(), max_batches=bad)
    assert _same(_buffers(net), before)


class _FrozenBN(nn.Module):
    """A BatchNorm layer in evaluation mode for good: the oracle's stand-in for a frozen one (``update_bn``
    puts every BatchNorm into training mode and re-estimates it)."""

    def __init__(self, bn: nn.BatchNorm2d):
        super().__init__()
        self.stats = [bn.running_mean.clone(), bn.running_var.clone()]  # not buffers: update_bn cannot see them
        self.weight, self.bias, self.eps = bn.weight, bn.bias, bn.eps

    def forward(self, x):
        return torch.nn.functional.batch_norm(x, *self.stats, self.weight, self.bias, training=False, eps=self.eps)


def test_skip_frozen_leaves_a_frozen_layer_alone_and_reestimates_the_rest_as_update_bn_does():
    """Fine-tuning with frozen BatchNorm (fvcore's PreciseBN): the model in training mode, bn "4" in evaluation
    mode. The layers after it see its output normalised with its running statistics."""
    batches = _uneven_batches()
    net = _net(dropout=0.5).train()
    net[3].eval()  # dropout off, so that update_bn (which trains the whole model) is an oracle
    frozen = net[5]
    frozen.eval()
    frozen_before = {k: v.clone() for k, v in frozen.state_dict().items()}
    oracle = copy.deepcopy(net)
    oracle[5] = _FrozenBN(oracle[5])
    oracle[3] = nn.Identity()
    update_bn(batches, oracle)

    report = reestimate(net, batches, skip_frozen=True)
    assert (report.layers, report.skipped) == (["1", "10"], ["5"])
    assert all(torch.equal(v, frozen_before[k]) for k, v in frozen.state_dict().items())  # untouched, count too
    assert frozen.momentum == 0.1 and not frozen.training and net.training
    for name in ("1", "10"):
        for buf in ("running_mean", "running_var", "num_batches_tracked"):
            assert torch.equal(getattr(net[int(name)], buf), getattr(oracle[int(name)], buf)), (name, buf)
    assert "5" not in report.momentum_restored
    total = sum(len(b) for b in batches)
    assert report.summary == f"re-estimated 2 BatchNorm layers on {len(batches)} batches ({total:,} samples); 1 left " \
                             "as they were"  # one line to print, and the repr, which would otherwise list every layer
    assert repr(report) == f"ReestimationReport({report.summary}; weights {report.weights_fingerprint[:12]})"

    everything = _net(dropout=0.5).train()
    everything[5].eval()
    assert reestimate(everything, batches).skipped == []  # without the switch every layer is re-estimated
    assert not torch.equal(everything[5].running_mean, frozen_before["running_mean"])
    in_eval = _net()  # a model in evaluation mode has no frozen layer
    assert reestimate(in_eval, batches, skip_frozen=True).layers == ["1", "4", "9"]


def test_skip_frozen_with_every_layer_frozen_is_an_error():
    net = _net().train()
    for _, m in running_stat_layers(net):
        m.eval()
    before = _buffers(net)
    with pytest.raises(ValueError, match=r"every layer with running statistics is frozen .*\['1', '4', '9'\]"):
        reestimate(net, _uneven_batches(), skip_frozen=True)
    assert _same(_buffers(net), before)


def test_an_uninitialised_lazy_batchnorm_is_named():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LazyBatchNorm2d(), nn.ReLU())
    with pytest.raises(ValueError, match=r"layer '1' \(LazyBatchNorm2d\) is not initialised.*forward pass"):
        reestimate(net, _uneven_batches())
    with torch.no_grad():
        net.train()(torch.randn(2, 3, 8, 8))  # initialised: now an ordinary BatchNorm2d
    ref = copy.deepcopy(net)
    reestimate(net, _uneven_batches())
    update_bn(_uneven_batches(), ref)
    assert _same(_buffers(net), _buffers(ref))


# ----------------------------------------------------------------------------- failure cases
def _assert_untouched(net: nn.Module, before: dict, flags: list[bool]) -> None:
    assert _same(_buffers(net), before)
    assert _flags(net) == flags
    assert all(m.momentum == 0.1 for _, m in running_stat_layers(net))


def test_empty_loader_is_an_error_and_leaves_the_buffers():
    net = _net(dropout=0.5)
    before, flags = _buffers(net), _flags(net)
    with pytest.raises(ValueError, match="empty loader"):
        reestimate(net, [])
    with pytest.raises(ValueError, match="empty loader"):
        reestimate(net, DataLoader(TensorDataset(torch.zeros(0, 3, 8, 8)), batch_size=4))
    _assert_untouched(net, before, flags)


@pytest.mark.parametrize("model", [nn.Sequential(nn.Conv2d(3, 8, 3), nn.GroupNorm(2, 8)),
                                   nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8, track_running_stats=False)),
                                   nn.Linear(3, 2)])
def test_a_model_without_running_statistics_is_an_error(model):
    with pytest.raises(ValueError, match="no normalisation layer with running statistics"):
        reestimate(model, _uneven_batches())


@pytest.mark.parametrize("bad, match", [
    ("not a batch", "got str"),
    ({"x": torch.zeros(2, 3, 8, 8)}, r"under 'input'.*keys: \['x'\]"),
    ((["a list"], torch.zeros(2)), "got tuple of 2 items"),
    ([], "got list of 0 items"),
])
def test_an_unreadable_batch_is_an_error_and_leaves_the_buffers(bad, match):
    net = _net(dropout=0.5)
    before, flags = _buffers(net), _flags(net)
    with pytest.raises(TypeError, match=match):
        reestimate(net, [_uneven_batches()[0], bad])  # fails after one batch went through
    _assert_untouched(net, before, flags)


# ----------------------------------------------------------------------------- swaps
def _stored_and_fresh():
    net = _net()
    fresh_net = copy.deepcopy(net)
    reestimate(fresh_net, _uneven_batches())
    stored, fresh = running_stats(net), running_stats(fresh_net)
    lag = {n: (stored[n][0] - fresh[n][0]) / fresh[n][1].sqrt() for n in fresh}
    return net, fresh_net, stored, fresh, lag


def test_k_zero_is_the_stored_model_and_k_all_the_reestimated_one():
    net, fresh_net, stored, fresh, lag = _stored_and_fresh()
    x = torch.randn(12, 3, 8, 8)
    with torch.no_grad():
        out_stored, out_fresh = net(x), fresh_net(x)
        total = sum(v.numel() for v in lag.values())
        with swapped_statistics(net, fresh, channels=top_k_channel_masks(lag, 0)):
            assert torch.equal(net(x), out_stored)
        with swapped_statistics(net, fresh, channels=top_k_channel_masks(lag, total)):
            assert torch.equal(net(x), out_fresh)
        with swapped_statistics(net, fresh):
            assert torch.equal(net(x), out_fresh)
        assert not torch.equal(out_stored, out_fresh)
        assert torch.equal(net(x), out_stored)  # restored on exit


def test_one_layer_swapped_leaves_the_others_alone():
    net, _, stored, fresh, _ = _stored_and_fresh()
    for name in fresh:
        with swapped_statistics(net, {name: fresh[name]}):
            now = running_stats(net)
            for other in stored:
                want = fresh[other] if other == name else stored[other]
                assert torch.equal(now[other][0], want[0]) and torch.equal(now[other][1], want[1])
    assert all(torch.equal(running_stats(net)[n][i], stored[n][i]) for n in stored for i in (0, 1))


def test_a_channel_mask_swaps_only_those_channels():
    net, _, stored, fresh, _ = _stored_and_fresh()
    mask = torch.tensor([True, False, False, True, False, False, False, True])
    with swapped_statistics(net, fresh, channels={"1": mask}):
        mean = running_stats(net)["1"][0]
        assert torch.equal(mean[mask], fresh["1"][0][mask]) and torch.equal(mean[~mask], stored["1"][0][~mask])
        assert torch.equal(running_stats(net)["4"][0], stored["4"][0])  # a layer without a mask keeps its own


def test_statistics_are_restored_when_the_block_raises():
    net, _, stored, fresh, _ = _stored_and_fresh()
    with pytest.raises(ZeroDivisionError):
        with swapped_statistics(net, fresh):
            1 / 0
    assert all(torch.equal(running_stats(net)[n][0], stored[n][0]) for n in stored)


def test_swapping_into_an_unknown_layer_is_an_error():
    net, _, _, fresh, _ = _stored_and_fresh()
    with pytest.raises(KeyError, match="no layer with running statistics named"):
        with swapped_statistics(net, {"bn9": fresh["1"]}):
            pass


def test_top_k_ranks_channels_by_absolute_lag_across_layers():
    lag = {"a": torch.tensor([0.1, -3.0, 0.5]), "b": torch.tensor([2.0, -0.2])}
    chosen = lambda k: {n: m.nonzero().flatten().tolist() for n, m in top_k_channel_masks(lag, k).items()}
    assert chosen(0) == {"a": [], "b": []}
    assert chosen(1) == {"a": [1], "b": []}
    assert chosen(2) == {"a": [1], "b": [0]}
    assert chosen(3) == {"a": [1, 2], "b": [0]}
    assert chosen(99) == {"a": [0, 1, 2], "b": [0, 1]}
    assert top_k_grid(160) == [0, 1, 2, 4, 8, 16, 32, 64, 128, 160] and top_k_grid(1) == [0, 1]


# ----------------------------------------------------------------------------- the runner's interventions
def test_run_interventions_rows_and_their_invariants():
    torch.manual_seed(3)
    model = build_network(ModelConfig(channels=[4, 8, 8], channels_last=False), 10, seed=0).eval()
    g = torch.Generator().manual_seed(4)
    batches = [torch.randn(16, 3, 16, 16, generator=g) * 2 + 1 for _ in range(3)]
    x, y = torch.randn(40, 3, 16, 16, generator=g), torch.randint(0, 10, (40,), generator=g)
    before = _buffers(model)
    res = run_interventions(model, batches, x, y, chunk=16)
    t = res.table
    assert _same(_buffers(model), before)  # the model keeps its stored statistics
    assert t["intervention"].tolist() == ["none", "reestimate", "layer", "layer", "layer"] + ["top_k"] * 7
    assert t.loc[t["intervention"] == "layer", "norm_layer"].tolist() == ["bn1", "bn2", "bn3"]
    assert t.loc[t["intervention"] == "top_k", "k"].tolist() == [0, 1, 2, 4, 8, 16, 20]
    acc = lambda what, k=-1: float(t.loc[(t["intervention"] == what) & (t["k"] == k), "acc_eval_mode"].iloc[0])
    assert acc("top_k", 0) == acc("none") and acc("top_k", 20) == acc("reestimate")
    assert res.reestimation.batches == 3 and res.reestimation.samples == 48
    assert {n: v.shape for n, v in res.lag_sigma.items()} == {"bn1": (4,), "bn2": (8,), "bn3": (8,)}
    fresh = copy.deepcopy(model)
    reestimate(fresh, batches)
    assert all(torch.equal(res.fresh[n][0], running_stats(fresh)[n][0]) for n in res.fresh)


def test_the_runner_logs_the_interventions_table(adam_smoke_run):
    out = adam_smoke_run
    iv = pd.read_parquet(out / "interventions.parquet")
    assert list(iv.columns[:7]) == list(records.TABLE_COLUMNS["interventions"])
    assert sorted(iv["step"].unique()) == [10, 20]  # every 10 steps inside the window (smoke), and the last
    for step, g in iv.groupby("step"):
        assert g["intervention"].value_counts().to_dict() == {"top_k": 10, "layer": 3, "none": 1, "reestimate": 1}
        assert g.loc[g["intervention"] == "top_k", "k"].tolist() == top_k_grid(32 + 64 + 64)
        by = g.set_index(["intervention", "k"])["acc_eval_mode"]
        assert by[("top_k", 0)] == by[("none", -1)] and by[("top_k", 160)] == by[("reestimate", -1)]
        assert (out / "checkpoints" / f"step={step}.pt").exists()
    checks = pd.read_parquet(out / "checks.parquet").set_index("step")
    none = iv[iv["intervention"] == "none"].set_index("step")["acc_eval_mode"]
    assert (none == checks.loc[none.index, "acc_eval_mode"]).all()  # "none" is the check's own number
