"""The staleness monitor on models the suite did not define: pairing, closed forms, invariance, failure cases."""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from bnrotation.bnstats import reestimate
from bnrotation.study.config import ModelConfig
from bnrotation.evaluation import EVAL_CHUNK
from bnrotation.study.model import build_network
from bnrotation.evaluation import evaluation_forward
from bnrotation.monitor import MonitorSetupWarning, StaleStatisticsWarning, StalenessMonitor, Thresholds, find_pairs
from bnrotation.probe_batch import split_probe
from bnrotation.probes import fresh_statistics, rotation_deg

from test_probes import rotated


# ----------------------------------------------------------------------------- models the suite did not define
class MLP(nn.Module):
    """Linear -> BatchNorm1d on (N, C) inputs."""

    def __init__(self):
        super().__init__()
        self.fc1, self.bn1 = nn.Linear(12, 16, bias=False), nn.BatchNorm1d(16)
        self.fc2, self.bn2 = nn.Linear(16, 8), nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(F.relu(self.bn2(self.fc2(F.relu(self.bn1(self.fc1(x)))))))


class Seq1d(nn.Module):
    """Conv1d -> BatchNorm1d on (N, C, L) inputs, inside nn.Sequential (nested names)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(2, 6, 3, padding=1, bias=False), nn.BatchNorm1d(6), nn.ReLU(),
                                  nn.Sequential(nn.Conv1d(6, 6, 3, padding=1), nn.BatchNorm1d(6), nn.ReLU()))
        self.head = nn.Linear(6, 4)

    def forward(self, x):
        return self.head(self.body(x).mean(-1))


class Vol(nn.Module):
    """Conv3d -> BatchNorm3d, and a BatchNorm after an addition (unpairable: no single layer feeds it)."""

    def __init__(self):
        super().__init__()
        self.a, self.bn_a = nn.Conv3d(1, 4, 3, padding=1, bias=False), nn.BatchNorm3d(4)
        self.b = nn.Conv3d(1, 4, 1, bias=False)
        self.bn_sum = nn.BatchNorm3d(4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        y = F.relu(self.bn_a(self.a(x)))
        y = self.bn_sum(y + self.b(x))
        return self.head(y.mean((2, 3, 4)))


class Branchy(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it, so pairing falls back to execution order."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        y = F.relu(self.bn(self.conv(x)))
        if y.mean() > -1e9:  # depends on the data: fx's proxies cannot decide it
            y = y * 1.0
        return self.head(y.mean((2, 3)))


class DictModel(nn.Module):
    """Takes the input tensor itself; the probe comes as a dict batch."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(F.relu(self.bn(self.conv(x))).mean((2, 3)))


def trained(model: nn.Module, x: torch.Tensor, steps: int = 3) -> nn.Module:
    """A few forward passes in training mode, so the running statistics are not their initial values."""
    model.train()
    with torch.no_grad():
        for i in range(steps):
            model(x * (1 + 0.1 * i) + 0.2)
    return model


def everything(model: nn.Module, opt: torch.optim.Optimizer | None = None) -> dict:
    """Every parameter, gradient, buffer, training flag, optimizer state and the CPU RNG state, cloned."""
    state = {f"p:{n}": p.detach().clone() for n, p in model.named_parameters()}
    state |= {f"g:{n}": p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    state |= {f"b:{n}": b.clone() for n, b in model.named_buffers()}
    state |= {f"t:{n}": torch.tensor(m.training) for n, m in model.named_modules()}
    state["rng"] = torch.get_rng_state()
    if opt is not None:
        for i, (p, s) in enumerate(opt.state.items()):
            state |= {f"o:{i}:{k}": torch.as_tensor(v).clone() for k, v in s.items()}
    return state


def assert_unchanged(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for k in before:
        assert torch.equal(before[k], after[k]), k


# ----------------------------------------------------------------------------- pairing
@pytest.mark.parametrize("factory, x, pairs", [
    (MLP, torch.randn(32, 12), {"bn1": "fc1", "bn2": "fc2"}),
    (Seq1d, torch.randn(16, 2, 20), {"body.1": "body.0", "body.3.1": "body.3.0"}),
    (Vol, torch.randn(8, 1, 5, 5, 5), {"bn_a": "a"}),
])
def test_pairs_by_fx_on_1d_3d_and_nested_models(factory, x, pairs):
    pairing = find_pairs(factory(), x)
    assert pairing.method == "fx"
    assert {p.norm: p.weight for p in pairing.pairs} == pairs


def test_a_norm_after_an_addition_is_reported_unpaired_never_guessed():
    pairing = find_pairs(Vol(), torch.randn(8, 1, 5, 5, 5))
    (unpaired,) = pairing.unpaired
    assert unpaired.norm == "bn_sum" and unpaired.weight is None and "add" in unpaired.reason
    assert "unpaired: bn_sum" in pairing.describe()
    record = StalenessMonitor(trained(Vol(), torch.randn(8, 1, 5, 5, 5)), torch.randn(8, 1, 5, 5, 5), warn=False)(1)
    layer = record.layers.set_index("norm_layer").loc["bn_sum"]  # its lag is still measured, its rotation is not
    assert layer["layer"] == "" and math.isfinite(layer["lag_median_abs_sigma"])
    assert math.isnan(layer["weight_norm"])


def test_a_model_fx_cannot_trace_is_paired_by_execution_order():
    x = torch.randn(8, 3, 6, 6)
    with pytest.raises(Exception):
        torch.fx.symbolic_trace(Branchy())
    pairing = find_pairs(Branchy(), x)
    assert pairing.method == "execution order" and [(p.norm, p.weight) for p in pairing.pairs] == [("bn", "conv")]
    with pytest.raises(ValueError, match="does not trace"):
        find_pairs(Branchy())


def test_every_batchnorm_of_resnet20_is_paired_with_its_convolution():
    model = build_network(ModelConfig(arch="resnet20", channels=[16, 32, 64]), 10, seed=0)
    pairing = find_pairs(model, torch.randn(4, 3, 16, 16))
    assert pairing.method == "fx" and not pairing.unpaired and len(pairing.pairs) == 21
    pairs = {p.norm: p.weight for p in pairing.pairs}
    assert pairs["bn1"] == "conv1" and pairs["layer3.2.bn2"] == "layer3.2.conv2"
    assert pairs["layer2.0.shortcut.1"] == "layer2.0.shortcut.0" and pairs["layer3.0.shortcut.1"] == "layer3.0.shortcut.0"


def test_a_model_without_running_statistics_gets_a_clear_error():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(36, 2))
    with pytest.raises(ValueError, match="no BatchNorm layer with running statistics"):
        StalenessMonitor(model, torch.randn(4, 3, 5, 5))
    no_track = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False))
    with pytest.raises(ValueError, match="running statistics"):
        StalenessMonitor(no_track, torch.randn(4, 3, 5, 5))


def test_bad_probes_and_lazy_layers_get_clear_errors():
    with pytest.raises(TypeError, match="probe: expected a tensor"):
        split_probe("images")
    with pytest.raises(TypeError, match=r"keys: \['image'\]"):
        split_probe({"image": torch.randn(4, 3)})
    with pytest.raises(ValueError, match="4 inputs but labels"):
        split_probe((torch.randn(4, 3), torch.zeros(3)))
    with pytest.raises(TypeError, match="got tuple of 3 items"):
        split_probe((torch.randn(4, 3), torch.zeros(4, dtype=torch.long), torch.zeros(4)))
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module, got str"):
        StalenessMonitor("model", torch.randn(4, 12))
    with pytest.raises(ValueError, match="at least 2 samples"):
        StalenessMonitor(MLP(), torch.randn(1, 12))
    lazy = nn.Sequential(nn.LazyConv2d(4, 3), nn.BatchNorm2d(4))
    with pytest.raises(ValueError, match="uninitialised lazy module"):
        StalenessMonitor(lazy, torch.randn(4, 3, 5, 5))


def test_probes_that_would_fail_or_mislead_at_the_first_call_are_refused_at_construction():
    """Each names the probe: a wrong input shape, non-finite or integer inputs, labels outside the output's
    classes or not class indices, a model without a class dim, and thresholds of the wrong type; and a step
    that is not an int >= 0 at the call. Nothing is changed by the refused construction."""
    model = MLP()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    y = torch.zeros(8, dtype=torch.long)
    with pytest.raises(ValueError, match=r"probe: the model cannot run on the probe inputs \(8, 10\)"):
        StalenessMonitor(model, (torch.randn(8, 10), y))
    nan = torch.randn(8, 12)
    nan[0, 0] = math.nan
    with pytest.raises(ValueError, match="probe: 1 of 96 input values are NaN or infinite"):
        StalenessMonitor(model, nan)
    with pytest.raises(ValueError, match="probe: expected floating-point inputs"):
        StalenessMonitor(model, torch.ones(8, 12, dtype=torch.long))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\).*got \[0, 7\]"):
        StalenessMonitor(model, (torch.randn(8, 12), torch.tensor([0, 1, 2, 7, 0, 1, 2, 0])))
    with pytest.raises(ValueError, match="labels must be class indices"):
        StalenessMonitor(model, (torch.randn(8, 12), torch.zeros(8)))
    with pytest.raises(ValueError, match=r"output on the probe must be \(N, classes"):
        StalenessMonitor(nn.Sequential(nn.Linear(12, 4), nn.BatchNorm1d(4), nn.Flatten(0)), torch.randn(8, 12))
    with pytest.raises(TypeError, match="thresholds: expected a bnrotation.monitor.Thresholds, got dict"):
        StalenessMonitor(model, torch.randn(8, 12), thresholds={"mode_gap": 0.1})
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    monitor = StalenessMonitor(model, (torch.randn(8, 12), y), warn=False)
    for bad in ("3", 1.5, -5, True):
        with pytest.raises(TypeError, match="step: expected the optimizer step as an int >= 0"):
            monitor(bad)
    assert monitor(np.int64(3)).step == 3


# ----------------------------------------------------------------------------- closed forms
def test_lag_equals_a_hand_computation():
    torch.manual_seed(0)
    x = torch.randn(64, 12)
    model = trained(MLP(), x)
    with torch.no_grad():
        model.bn1.running_mean += 0.5  # stale by a known shift
    record = StalenessMonitor(model, x, warn=False)(10)
    with torch.no_grad():
        z = model.fc1(x).double()  # the input of bn1: no norm upstream, so batch statistics change nothing
    mean, var = z.mean(0), z.var(0, unbiased=True)
    want = (model.bn1.running_mean.double() - mean) / (var + model.bn1.eps).sqrt()  # the layer's own σ
    got = record.channels.query("norm_layer == 'bn1'").sort_values("channel")
    assert torch.allclose(torch.tensor(got["lag_sigma"].to_numpy()), want, rtol=1e-5, atol=1e-6)
    assert torch.allclose(torch.tensor(got["fresh_var"].to_numpy()), var, rtol=1e-5)
    line = record.layers.set_index("norm_layer").loc["bn1"]
    assert math.isclose(line["lag_median_abs_sigma"], float(want.abs().median()), rel_tol=1e-5)
    assert line["worst_channel"] == int(want.abs().argmax())
    assert line["channels_above_1_sigma"] == int((want.abs() > 1).sum())


def test_a_known_rotation_gives_its_angle_per_channel_and_per_100_steps():
    torch.manual_seed(0)
    x = torch.randn(32, 2, 20)
    model = trained(Seq1d(), x)
    monitor = StalenessMonitor(model, x, warn=False)
    monitor(100)
    conv = model.body[0]
    angles = torch.linspace(0.1, 5.0, conv.out_channels)
    with torch.no_grad():
        w = conv.weight.detach().double().reshape(conv.out_channels, -1)
        conv.weight.copy_(rotated(w, angles).reshape(conv.weight.shape).float())
    record = monitor(150)
    got = record.channels.query("layer == 'body.0'").sort_values("channel")
    assert torch.allclose(torch.tensor(got["rotation_deg"].to_numpy()), angles.double(), rtol=1e-4, atol=1e-4)
    assert torch.allclose(torch.tensor(got["rotation_deg_per_100"].to_numpy()), angles.double() * 2, rtol=1e-4,
                          atol=2e-4)  # 50 steps between the calls
    assert got["drift_sigma_per_step"].notna().all()
    with pytest.raises(ValueError, match="not after"):
        monitor(150)


def _moved(model: nn.Module, seed: int) -> None:
    """Every parameter moved by 5% of its mean size, at random, as a training step would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * p.abs().mean() * torch.randn(p.shape, generator=g))


def _comparable(record) -> pd.DataFrame:
    return record.channels.drop(columns=["running_mean", "running_var"]).reset_index(drop=True)


def test_a_monitor_resumed_from_its_state_measures_what_the_uninterrupted_one_does():
    """state_dict after a call, load_state_dict into a new monitor: the next call's records are the
    uninterrupted monitor's, bit for bit; the state holds the weights of that call and is a copy (the next call
    overwrites the monitor's own in place and leaves it as it was), and loading it copies it too; a state of other
    shapes fails naming the layer."""
    torch.manual_seed(0)
    x = torch.randn(32, 2, 20)
    model = trained(Seq1d(), x)
    monitor = StalenessMonitor(model, x, warn=False)
    monitor(100)
    state = monitor.state_dict()
    then = {name: layer.weight.detach().clone() for name, layer in monitor.weight_layers.items()}
    assert state["weights"].keys() == then.keys() and all(torch.equal(state["weights"][k], then[k]) for k in then)
    _moved(model, 1)
    want = _comparable(monitor(200))
    assert all(torch.equal(state["weights"][k], then[k]) for k in then)  # the state taken is a copy
    assert want["rotation_deg"].notna().all() and (want["rotation_deg"] > 0).all()
    resumed = StalenessMonitor(model, x, warn=False)
    resumed.load_state_dict(state)
    pd.testing.assert_frame_equal(_comparable(resumed(200)), want, check_exact=True)
    assert all(torch.equal(state["weights"][k], then[k]) for k in then)  # loading copied it
    name = next(iter(then))
    with pytest.raises(ValueError, match=rf"weights\['{name}'\] of shape"):
        StalenessMonitor(model, x, warn=False).load_state_dict(
            state | {"weights": state["weights"] | {name: state["weights"][name][:1]}})


def test_a_call_that_fails_part_way_leaves_no_rotation_to_measure_against(monkeypatch):
    """The kept weights are overwritten during a call: one that raises after its weight pass leaves the next call
    without a rotation (NaN), never one against weights of another step; the drift still compares with the last
    completed call."""
    torch.manual_seed(0)
    x = torch.randn(32, 2, 20)
    model = trained(Seq1d(), x)
    monitor = StalenessMonitor(model, x, warn=False)
    monitor(100)
    _moved(model, 1)
    with monkeypatch.context() as m:
        m.setattr(StalenessMonitor, "_layer", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("part-way")))
        with pytest.raises(RuntimeError, match="part-way"):
            monitor(200)
    record = monitor(300)
    assert record.channels["rotation_deg"].isna().all() and record.channels["drift_sigma_per_step"].notna().all()
    _moved(model, 2)
    assert monitor(400).channels["rotation_deg"].notna().all()


def test_update_and_gradient_cosines_need_the_snapshot_before_the_step():
    torch.manual_seed(0)
    x, y = torch.randn(64, 12), torch.randint(0, 3, (64,))
    model = trained(MLP(), x)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = StalenessMonitor(model, (x, y), warn=False)
    F.cross_entropy(model(x), y).backward()
    before = monitor.snapshot()
    opt.step()
    line = monitor(1, before).layers.set_index("layer").loc["fc1"]
    wb = before["fc1"].double().flatten()
    u = model.fc1.weight.detach().double().flatten() - wb
    assert math.isclose(line["update_cos"], float(u @ wb / (u.norm() * wb.norm())), rel_tol=1e-9)
    g = model.fc1.weight.grad.double().flatten()
    assert math.isclose(line["grad_cos"], float(g @ wb / (g.norm() * wb.norm())), rel_tol=1e-9)
    assert monitor(2).layers["update_cos"].isna().all()  # without a snapshot: not measured


# ----------------------------------------------------------------------------- invariance
def test_a_call_changes_nothing_on_a_model_with_a_frozen_batchnorm():
    torch.manual_seed(0)
    x, y = torch.randn(16, 2, 20), torch.randint(0, 4, (16,))
    model = trained(Seq1d(), x)
    model.train()
    model.body[1].eval()  # frozen: fine-tuning with this BatchNorm in evaluation mode
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    F.cross_entropy(model(x), y).backward()  # gradients present at the call
    monitor = StalenessMonitor(model, (x, y), warn=False)
    before = everything(model, opt)
    monitor(1)
    monitor(2)
    assert_unchanged(before, everything(model, opt))
    assert model.training and not model.body[1].training


def test_the_training_mode_pass_keeps_a_frozen_layer_on_its_running_statistics():
    """As in the model's own training steps: the frozen body.1 normalises with its (deliberately stale) running
    statistics, so the next layer's fresh mean is that of a network whose body.1 is off."""
    torch.manual_seed(0)
    x = torch.randn(16, 2, 20)
    model = trained(Seq1d(), x)
    model.train()
    model.body[1].eval()
    with torch.no_grad():
        model.body[1].running_mean.fill_(3.0)
    record = StalenessMonitor(model, x, warn=False)(1)

    def next_layer_mean(frozen_uses_running: bool) -> torch.Tensor:
        twin = copy.deepcopy(model)
        for m in (twin.body[1], twin.body[3][1]):
            m.train()
            m.track_running_stats = False
        if frozen_uses_running:
            twin.body[1].eval()
            twin.body[1].track_running_stats = True
        with torch.no_grad():
            z = twin.body[3][0](twin.body[2](twin.body[1](twin.body[0](x))))
        return z.double().mean((0, 2))

    got = torch.tensor(record.channels.query("norm_layer == 'body.3.1'").sort_values("channel")["fresh_mean"]
                       .to_numpy())
    assert torch.allclose(got, next_layer_mean(True), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, next_layer_mean(False), rtol=1e-3, atol=1e-3)
    frozen = record.channels.query("norm_layer == 'body.1'")
    assert (frozen["lag_sigma"].abs() > 1).all()  # and its own stored mean shows up as stale


def test_dict_probes_and_unlabelled_probes():
    torch.manual_seed(0)
    x, y = torch.randn(16, 3, 6, 6), torch.randint(0, 2, (16,))
    model = trained(DictModel(), x)
    labelled = StalenessMonitor(model, {"image": x, "label": y}, input_key="image", target_key="label", warn=False)
    checks = labelled(1).checks.iloc[0]
    assert 0 <= checks["acc_train_mode"] <= 1 and 0 <= checks["acc_eval_mode"] <= 1
    assert math.isclose(checks["mode_gap"], checks["acc_train_mode"] - checks["acc_eval_mode"])
    unlabelled = StalenessMonitor(model, x, warn=False)(1).checks.iloc[0]
    assert math.isnan(unlabelled["acc_train_mode"]) and 0 <= unlabelled["mode_agreement"] <= 1
    assert math.isclose(unlabelled["mode_gap"], 1 - unlabelled["mode_agreement"])


# ----------------------------------------------------------------------------- the warning
def test_stale_statistics_warn_naming_the_worst_layer_and_channel_and_re_estimation_clears_it():
    from bnrotation.study.config import TaskConfig
    from bnrotation.study.task import NoisyTemplates, generator
    torch.manual_seed(0)
    task = NoisyTemplates.build(TaskConfig(image_size=8), seed=0)
    model = build_network(ModelConfig(channels=[8, 16, 16], channels_last=False), 10, seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = generator(0, "train")
    for _ in range(60):  # enough to learn the templates
        xb, yb = task.sample(64, g)
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    x, y = task.fixed_set(128, 0, "probe")
    batches = [task.sample(64, g)[0] for _ in range(4)]
    reestimate(model, batches)
    with torch.no_grad():
        model.bn2.running_mean += 2.0 * model.bn2.running_var.sqrt()  # stale by 2 sigma
        model.bn2.running_mean[3] += 3.0 * model.bn2.running_var[3].sqrt()  # channel 3 the worst
    with pytest.warns(StaleStatisticsWarning, match=r"worst channel bn2 channel 3 .*Re-estimate") as caught:
        record = StalenessMonitor(model, (x, y))(200)  # past the warm-up: 151 steps at this momentum of 0.03
    assert caught[0].filename == __file__  # the warning names the caller's line, not torch.no_grad's wrapper
    assert record.stale and record.summary.startswith("STALE ") and record.worst()[:2] == ("bn2", 3)
    reestimate(model, batches)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StaleStatisticsWarning)
        fresh = StalenessMonitor(model, (x, y))(300)
    assert not fresh.stale and fresh.checks["mode_gap"].iloc[0] < 0.05
    quiet = StalenessMonitor(model, (x, y), thresholds=Thresholds(mode_gap=0.0, lag_sigma=0.0), warn=False)(1)
    assert quiet.stale  # thresholds of 0 always fire; warn=False keeps it silent
    with pytest.raises(ValueError, match="Thresholds.lag_sigma"):
        Thresholds(lag_sigma=float("nan"))


def test_non_finite_statistics_or_weights_are_named_and_never_dropped():
    """A NaN running mean makes its layer's lag NaN, which the rule alone would skip: the record is stale and
    the warning and summary name the tensor. A NaN weight warns that the model has diverged."""
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(32, 12)
    reestimate(model, [x])
    never = Thresholds(mode_gap=1.0, lag_sigma=100.0)  # the rule alone cannot fire
    monitor = StalenessMonitor(model, x, thresholds=never)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = monitor(0)
    assert not first.stale and not first.nonfinite and "NON-FINITE" not in first.summary
    with torch.no_grad():
        model.bn2.running_mean[5] = math.nan
    with pytest.warns(StaleStatisticsWarning, match=r"running statistics hold NaN or infinite values "
                                                    r"\(bn2.running_mean\): evaluation mode is unusable"):
        record = monitor(1)
    assert record.stale and record.nonfinite.running_statistics == ("bn2.running_mean",)
    assert record.summary.startswith("STALE NON-FINITE bn2.running_mean | ")
    reestimate(model, [x])
    with torch.no_grad():
        model.fc1.weight[0, 0] = math.inf
    with pytest.warns(RuntimeWarning, match=r"step 2: the model has diverged: NaN or infinite values in fc1.weight"):
        record = monitor(2)
    assert record.nonfinite.parameters == ("fc1.weight",) and "NON-FINITE fc1.weight" in record.summary


def test_records_have_the_suites_column_names_and_append_to_parquet(tmp_path):
    from bnrotation import records
    torch.manual_seed(0)
    x = torch.randn(32, 12)
    monitor = StalenessMonitor(trained(MLP(), x), x, warn=False)
    recs = [monitor(step) for step in (0, 100, 200)]
    for table in ("layers", "channels"):
        df = pd.concat([getattr(r, table) for r in recs], ignore_index=True)
        missing = set(records.TABLE_COLUMNS[table]) - {"row", "seed"} - set(df.columns)
        assert not missing, (table, missing)
        df.to_parquet(tmp_path / f"{table}.parquet")
        assert len(pd.read_parquet(tmp_path / f"{table}.parquet")) == len(df)
    assert {"step", "acc_train_mode", "acc_eval_mode"} <= set(recs[0].checks.columns)
    assert "lag median" in recs[-1].summary and "rotation" in recs[-1].summary


def test_on_the_suites_network_the_monitor_equals_a_direct_computation():
    """The runner's tables come from the monitor (tests/test_runner.py compares them with the runner's own
    probes before the monitor); here its fresh statistics against probes.fresh_statistics and rotation_deg."""
    model = build_network(ModelConfig(), 10, seed=0)
    x = torch.randn(48, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    monitor = StalenessMonitor(model, x, warn=False, modes=False)
    w0 = model.conv3.weight.detach().clone()
    monitor(0)
    with torch.no_grad():
        model.conv3.weight.mul_(1.5).add_(0.01)
    rec = monitor(100)
    fresh = fresh_statistics(model, x)
    got = rec.channels.query("layer == 'conv3'").sort_values("channel")
    assert torch.allclose(torch.tensor(got["fresh_mean"].to_numpy()), fresh["bn3"][0], rtol=1e-6, atol=1e-7)
    assert torch.allclose(torch.tensor(got["rotation_deg"].to_numpy()), rotation_deg(w0, model.conv3.weight), rtol=1e-9)


def test_the_evaluation_pass_in_chunks_equals_one_pass_and_restores_the_flags():
    """The monitor's evaluation-mode pass runs in chunks of EVAL_CHUNK on a CPU: with more samples than one chunk
    (and a ragged last chunk) its outputs equal one pass of model.eval(), and every training flag is as before."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    model.train()
    model(torch.randn(32, 3, 8, 8))  # running statistics that differ from any batch's
    x = torch.randn(3 * EVAL_CHUNK + 7, 3, 8, 8)
    out = evaluation_forward(model, x)
    assert all(m.training for m in model.modules())
    model.eval()
    with torch.no_grad():
        assert torch.allclose(out, model(x), rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- pairing on layers from elsewhere
class ForeignBatchNorm(nn.BatchNorm2d):
    """Like timm's ``BatchNormAct2d``: a BatchNorm2d subclass defined outside torch.nn, with its own forward (a
    fused ReLU), which counts ``num_batches_tracked`` itself, whatever ``track_running_stats`` says."""

    def forward(self, x):
        if self.training:
            self.num_batches_tracked.add_(1)
        use_batch = self.training or self.running_mean is None
        return F.relu(F.batch_norm(x, self.running_mean if not use_batch or self.track_running_stats else None,
                                   self.running_var if not use_batch or self.track_running_stats else None,
                                   self.weight, self.bias, use_batch, self.momentum or 0.0, self.eps))


class MyConv(nn.Conv2d):
    """A user's Conv2d subclass with its own forward."""

    def forward(self, x):
        return super().forward(x) * 1.0


class Foreign(nn.Module):
    """Foreign layers, see-through operations, and layers no single weight feeds; ``untraceable`` adds a
    data-dependent branch, so that torch.fx cannot trace it and every layer is placed by execution order."""

    def __init__(self, untraceable: bool = False):
        super().__init__()
        self.untraceable = untraceable
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), ForeignBatchNorm(8)
        self.conv2, self.bn2 = MyConv(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv3, self.bn3 = nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8)  # through ReLU, max pooling and dropout
        self.a, self.b, self.bn_sum = nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8)
        self.c, self.bn_inplace = nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8)
        self.d, self.bn_silu = nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8)
        self.e, self.f, self.bn_shared = nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8)
        self.g, self.bn_merged = nn.Conv2d(8, 2, 1), nn.BatchNorm1d(2 * 4 * 4)
        self.fc, self.bn_tokens = nn.Linear(8, 6), nn.BatchNorm1d(6)  # Linear -> flatten(0, 1) -> BN1d (LeViT)
        self.fc_l, self.bn_over_l = nn.Linear(8, 6), nn.BatchNorm1d(16)  # BN1d over the 16 tokens, not features
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        y = self.bn1(self.conv1(x))  # (N, 8, 8, 8)
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.drop(F.max_pool2d(F.relu(self.conv3(y)), 2)))  # (N, 8, 4, 4)
        if self.untraceable and y.sum() > 1e9:  # depends on the data: fx's proxies cannot decide it
            y = -y
        s = self.bn_sum(self.a(y) + self.b(y))
        t = self.c(y)
        t += y  # in place: the tensor conv c returned now holds a sum
        t = self.bn_inplace(t)
        u = self.bn_silu(F.silu(self.d(y)))
        v = self.bn_shared(self.e(y)) + self.bn_shared(self.f(y))
        w = self.bn_merged(self.g(y).flatten(1))  # channels merged with the spatial dims
        tokens = y.flatten(2).transpose(1, 2)  # (N, 16, 8)
        z = self.fc(tokens)  # (N, 16, 6)
        z = self.bn_tokens(z.flatten(0, 1)).reshape_as(z)
        q = self.bn_over_l(self.fc_l(tokens))
        return self.head((s + t + u + v).mean((2, 3))) + w.sum() * 0 + z.sum() * 0 + q.sum() * 0


FOREIGN_PAIRS = {"bn1": "conv1", "bn2": "conv2", "bn3": "conv3", "bn_tokens": "fc"}
FOREIGN_UNPAIRED = {"bn_sum": "its input comes from add,", "bn_inplace": "its input comes from add",  # fx: add; execution order: add_
                    "bn_silu": "its input comes from silu,", "bn_shared": "called 2 times on the outputs of different",
                    "bn_merged": "but flatten does not keep each channel apart",
                    "bn_over_l": "its channel dim holds dim 2's channels"}


@pytest.mark.parametrize("untraceable", [False, True], ids=["fx", "execution order"])
def test_foreign_layers_see_through_operations_and_what_no_single_weight_feeds(untraceable):
    """Both placements on the same model: each pair by fx (traceable) and by execution order alone
    (untraceable), and each unpaired layer with its reason. The in-place sum caught a tracker that followed
    tensors by identity; the sum, a pairing with the last weight layer run."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 8, 8)
    model = Foreign(untraceable)
    if untraceable:
        with pytest.raises(Exception):
            torch.fx.symbolic_trace(model)
    pairing = find_pairs(model, x)
    assert pairing.method == ("execution order" if untraceable else "fx")
    assert {p.norm: p.weight for p in pairing.pairs} == FOREIGN_PAIRS
    assert pairing.via == {"bn3": ("relu", "max_pool2d", "dropout"), "bn_tokens": ("flatten",)}
    reasons = {p.norm: p.reason for p in pairing.unpaired}
    assert reasons.keys() == FOREIGN_UNPAIRED.keys()
    for norm, text in FOREIGN_UNPAIRED.items():
        assert text in reasons[norm], (norm, reasons[norm])


def test_a_layer_fx_does_not_place_is_placed_by_execution_order_alone():
    """A model that traces, with one BatchNorm hidden from the graph inside a function fx keeps opaque: that
    layer, and only it, is placed by execution order."""
    torch.manual_seed(0)
    model = HiddenNorm()
    pairing = find_pairs(model, torch.randn(4, 3, 6, 6))
    assert pairing.methods == {"bn1": "fx", "bn2": "execution order"}
    assert pairing.method == "fx and execution order"
    assert {p.norm: p.weight for p in pairing.pairs} == {"bn1": "conv1", "bn2": "conv2"}
    assert "[execution order]" in pairing.describe()


@torch.fx.wrap
def _opaque_norm(norm: nn.Module, z: torch.Tensor) -> torch.Tensor:
    return norm(z)


class HiddenNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        y = _opaque_norm(self.bn2, self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return self.head(y.mean((2, 3)))


def test_unpaired_layers_are_named_in_one_warning_and_the_summary_says_what_rotation_covers():
    torch.manual_seed(0)
    x = torch.randn(32, 3, 8, 8)
    with pytest.warns(MonitorSetupWarning, match="6 of 10 normalisation layer") as caught:
        monitor = StalenessMonitor(trained(Foreign(), x), x, warn=False)
    setup = [str(w.message) for w in caught if issubclass(w.category, MonitorSetupWarning)]
    assert len(setup) == 1 and setup[0] == monitor.pairing.unpaired_text()
    assert all(norm in setup[0] and reason in setup[0] for norm, reason in FOREIGN_UNPAIRED.items())  # 1 of each
    assert all(f"unpaired: {norm} (" in monitor.pairing.describe() for norm in FOREIGN_UNPAIRED)  # the full list
    monitor(0)
    assert "(4 of 10 layers paired)" in monitor(100).summary
    none = nn.Sequential(nn.Conv2d(3, 4, 1), nn.SiLU(), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 64, 2))
    with pytest.warns(MonitorSetupWarning, match="its input comes from SiLU"):
        monitor = StalenessMonitor(trained(none, x), x, warn=False)
    assert "rotation: no layer paired" in monitor(1).summary


@pytest.mark.parametrize("momentum", [0.1, None])
def test_construction_and_calls_leave_num_batches_tracked_on_a_layer_that_counts_itself(momentum):
    """ForeignBatchNorm counts every training-mode pass, as timm's BatchNormAct2d did when fx traced into it.
    With momentum=None the counter weights the next batch: one stray increment changes training."""
    torch.manual_seed(0)
    x = torch.randn(16, 3, 8, 8)
    model = trained(Foreign(), x)
    model.bn1.momentum = momentum
    before = everything(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MonitorSetupWarning)
        monitor = StalenessMonitor(model, x, warn=False)
    assert_unchanged(before, everything(model))
    monitor(1)
    monitor(2)
    assert_unchanged(before, everything(model))


# ----------------------------------------------------------------------------- warnings worth trusting
def test_no_staleness_warning_before_the_warm_up_and_one_after():
    """An untrained model at step 0: both modes at chance, running statistics at their initial values. Thresholds
    of 0 make the rule fire at every call (without labels the gap, 1 - agreement, is never negative); the warm-up
    holds the warning back until its step."""
    torch.manual_seed(0)
    x, y = torch.randn(64, 12), torch.randint(0, 3, (64,))
    model = MLP()
    always = Thresholds(mode_gap=0.0, lag_sigma=0.0)
    monitor = StalenessMonitor(model, x, thresholds=always)
    assert monitor.warmup_steps == 44  # ceil(ln 0.01 / ln 0.9): PyTorch's default momentum 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("error", StaleStatisticsWarning)
        record = monitor(0)
        assert record.stale and not record.summary.startswith("STALE")  # the rule's verdict, not announced
        assert record.warming_up and not record.flagged
        monitor(43)
    with pytest.warns(StaleStatisticsWarning, match="step 44: running statistics are stale"):
        record = monitor(44)
    assert record.stale and record.flagged and not record.warming_up and record.summary.startswith("STALE")
    model.bn1.momentum = 0.03
    assert StalenessMonitor(model, (x, y)).warmup_steps == 152  # ceil(ln 0.01 / ln 0.97), the slowest layer
    assert StalenessMonitor(model, (x, y), warmup_steps=0).warmup_steps == 0
    with pytest.raises(ValueError, match="warmup_steps: expected an int >= 0"):
        StalenessMonitor(model, x, warmup_steps=-1)


def test_a_probe_whose_one_sample_outweighs_the_gap_threshold_warns_with_the_smallest_size():
    torch.manual_seed(0)
    model = MLP()
    with pytest.warns(MonitorSetupWarning, match=r"one of its 16 samples moves the mode gap by 6.25%.*at least 20"):
        StalenessMonitor(model, torch.randn(16, 12))
    with pytest.warns(MonitorSetupWarning, match="at least 10 samples"):
        StalenessMonitor(model, torch.randn(8, 12), thresholds=Thresholds(mode_gap=0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", MonitorSetupWarning)
        StalenessMonitor(model, torch.randn(20, 12))  # 5% per sample: at the threshold, not above it
        StalenessMonitor(model, torch.randn(16, 12), modes=False)  # no mode check, no gap to mislead


# ----------------------------------------------------------------------------- other inputs
class FeaturesModel(nn.Module):
    """``forward(batch)`` reads ``batch["features"]`` itself."""

    def __init__(self):
        super().__init__()
        self.net = MLP()

    def forward(self, batch):
        return self.net(batch["features"])


def test_a_model_that_reads_a_mapping_gets_the_whole_mapping_and_labels_are_still_read():
    torch.manual_seed(0)
    x, y = torch.randn(64, 12), torch.randint(0, 3, (64,))
    model = FeaturesModel()
    trained(model.net, x)
    with pytest.raises(TypeError, match="input_key=None passes a mapping whole"):
        StalenessMonitor(model, {"features": x, "target": y})
    before = everything(model)
    monitor = StalenessMonitor(model, {"features": x, "target": y, "id": torch.arange(64)}, input_key=None,
                               warn=False)
    got = monitor(1)
    assert_unchanged(before, everything(model))
    want = StalenessMonitor(model.net, (x, y), warn=False)(1)  # the same network on the tensor itself
    pd.testing.assert_frame_equal(got.checks, want.checks)
    assert np.array_equal(got.channels["lag_sigma"].to_numpy(), want.channels["lag_sigma"].to_numpy())
    assert {p.norm for p in monitor.pairing.pairs} == {"net.bn1", "net.bn2"}


def test_a_compiled_model_is_measured_through_the_module_it_wraps_without_compiling():
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    x = torch.randn(32, 12)
    model = trained(MLP(), x)
    compiled = torch.compile(model)
    frames = dict(counters["frames"])
    monitor = StalenessMonitor(compiled, x, warn=False)
    record = monitor(1)
    assert monitor.model is model and dict(counters["frames"]) == frames  # nothing was compiled
    want = StalenessMonitor(model, x, warn=False)(1)
    assert np.array_equal(record.channels["lag_sigma"].to_numpy(), want.channels["lag_sigma"].to_numpy())


# ----------------------------------------------------------------------------- pairing per channel segment
def batch_statistics_copy(model: nn.Module) -> nn.Module:
    """A copy normalising with batch statistics, written independently of ``bnstats.batch_statistics``: every
    module in evaluation mode, every BatchNorm layer (only it) in training mode without running statistics."""
    twin = copy.deepcopy(model).eval()
    for m in twin.modules():
        if isinstance(m, _BatchNorm):
            m.training, m.track_running_stats = True, False
    return twin


def norm_inputs(model: nn.Module, x) -> dict[str, list[torch.Tensor]]:
    """``{BatchNorm layer: [its input at each call]}`` on ``x``, from forward pre-hooks."""
    seen: dict[str, list[torch.Tensor]] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, inp, n=n: seen.setdefault(n, []).append(inp[0].detach()))
             for n, m in model.named_modules() if isinstance(m, _BatchNorm)]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return seen


def scaled_channels(model: nn.Module, weights) -> dict[str, torch.Tensor]:
    """Multiplies each output channel c of each named weight layer (weight and bias) by ``alpha[c]``, 1/2 or 2 at
    random (seeded), in place; returns ``{layer: alpha (C_out,)}``."""
    g = torch.Generator().manual_seed(1)
    modules, alphas = dict(model.named_modules()), {}
    with torch.no_grad():
        for name in dict.fromkeys(weights):
            layer = modules[name]
            alpha = 2.0 ** (2 * torch.randint(0, 2, (layer.weight.shape[0],), generator=g) - 1).to(layer.weight.dtype)
            layer.weight.mul_(alpha.view(-1, *([1] * (layer.weight.dim() - 1))))
            if layer.bias is not None:
                layer.bias.mul_(alpha)
            alphas[name] = alpha
    return alphas


def assert_pairs_by_scaling(model: nn.Module, x, pairs) -> None:
    """Each pair, segment by segment, by scale invariance: output channel ``offset + k`` of a segment's weight
    layer scaled by alpha (1/2 or 2) scales channel ``start + k`` of its norm layer's input by the same alpha,
    exactly. With alpha a power of 2 every product, sum and square root of a convolution, a concatenation and
    BatchNorm commutes with the scaling in floating point, and with eps ~ 0 a BatchNorm's output does not change
    at all, so what reaches each norm layer downstream is unchanged to the bit (NaN where a channel's batch
    variance is 0, in both runs alike). A channel paired with the wrong layer, or the wrong channel of the right
    one, sees another factor (or none) and fails."""
    invariant = batch_statistics_copy(model)
    for m in invariant.modules():
        if isinstance(m, _BatchNorm):
            m.eps = 1e-30  # > 0, as training mode needs, and lost in rounding against any variance above 1e-22
    unscaled = norm_inputs(invariant, x)
    alphas = scaled_channels(invariant, [w for p in pairs for w in p.weights])
    scaled = norm_inputs(invariant, x)
    for pair in pairs:
        for z0, z1 in zip(unscaled[pair.norm], scaled[pair.norm]):
            alpha = torch.cat([alphas[s.weight][s.offset:s.offset + s.stop - s.start] for s in pair.spans(z0.shape[1])])
            want = alpha.view((1, -1) + (1,) * (z0.dim() - 2)) * z0
            assert torch.equal(z1.isnan(), want.isnan()) and torch.equal(z1.nan_to_num(), want.nan_to_num()), \
                (f"{pair.weight} -> {pair.norm}", float((z1 - want).abs().nan_to_num().max()), float(z0.abs().max()))


class Concatenated(nn.Module):
    """BatchNorm layers after concatenations along the channel dim: of two convolutions (one through ReLU and
    max pooling); of a convolution and the model's input (a segment no weight layer feeds); of two
    convolutions along a spatial dim (two weight layers in each channel). ``untraceable`` adds a data-dependent
    branch, so that every layer is placed by execution order."""

    def __init__(self, untraceable: bool = False):
        super().__init__()
        self.untraceable = untraceable
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 6, 1, bias=False)
        self.bn_ab = nn.BatchNorm2d(10)
        self.c, self.bn_cx = nn.Conv2d(3, 5, 1), nn.BatchNorm2d(8)
        self.d, self.e, self.bn_spatial = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)
        self.head = nn.Linear(10 + 8 + 4, 3)

    def forward(self, x):
        if self.untraceable and x.sum() > 1e9:  # depends on the data: fx's proxies cannot decide it
            x = -x
        ab = self.bn_ab(torch.cat([self.a(x), F.max_pool2d(F.relu(self.b(x)), 1)], dim=1))
        cx = self.bn_cx(torch.cat((x, self.c(x)), 1))
        spatial = self.bn_spatial(torch.cat([self.d(x), self.e(x)], dim=-1))
        return self.head(torch.cat([ab.mean((2, 3)), cx.mean((2, 3)), spatial.mean((2, 3))], 1))


@pytest.mark.parametrize("untraceable", [False, True], ids=["fx", "execution order"])
def test_a_batchnorm_after_a_concatenation_is_paired_per_channel_segment(untraceable):
    """``cat`` of two convolutions into one BatchNorm: channels [0, 4) are conv a's, [4, 10) conv b's (through
    ReLU and max pooling); by fx and by execution order alone, checked by scale invariance. A segment from the
    model's input, and a concatenation along a spatial dim, leave their layers unpaired with the reason."""
    from bnrotation.pairing import Segment
    torch.manual_seed(0)
    x = torch.randn(6, 3, 5, 5)
    model = Concatenated(untraceable)
    pairing = find_pairs(model, x)
    assert pairing.method == ("execution order" if untraceable else "fx")
    (pair,) = pairing.pairs
    assert pair.norm == "bn_ab" and pair.weight == "cat(a, b)" and pair.weights == ("a", "b")
    assert pair.segments == (Segment(0, 4, "a", 0), Segment(4, 10, "b", 0))
    assert pairing.via["bn_ab"] == ("cat", "relu", "max_pool2d")
    assert "cat(a, b) -> bn_ab" in pairing.describe()
    reasons = {p.norm: p.reason for p in pairing.unpaired}
    assert reasons["bn_cx"].startswith("its channels [0, 3) come from the model's input, not from a convolution")
    assert reasons["bn_spatial"].startswith("its input comes from cat, not from"), reasons["bn_spatial"]
    assert_pairs_by_scaling(model, x, pairing.pairs)
    if not untraceable:  # without a probe the graph has no shapes, which segments need: unpaired, not an error
        assert not find_pairs(model).pairs


def test_rotation_and_cosines_of_a_concatenated_layer_are_each_segments_own():
    """Conv a's and conv b's output channels turned by known, different angles between two calls: each of the
    BatchNorm's channels reports its own segment's angle, and is named after its segment's layer; the layer's
    update cosine is the cosine of the two weights' rows taken together, and its weight norm their norm."""
    torch.manual_seed(0)
    x = torch.randn(32, 3, 5, 5)
    model = Concatenated()
    monitor = StalenessMonitor(model, x, warn=False, warmup_steps=0)
    monitor(10)
    angles = {"a": torch.linspace(0.5, 4.0, 4), "b": torch.linspace(6.0, 9.0, 6)}
    before = monitor.snapshot()
    with torch.no_grad():
        for name, angle in angles.items():
            conv = getattr(model, name)
            w = conv.weight.detach().double().reshape(conv.out_channels, -1)
            conv.weight.copy_(rotated(w, angle).reshape(conv.weight.shape).float())
    record = monitor(20, before)
    got = record.channels.query("norm_layer == 'bn_ab'").sort_values("channel")
    assert got["layer"].tolist() == ["a"] * 4 + ["b"] * 6
    want = torch.cat([angles["a"], angles["b"]]).double()
    # rotated() turns float64 rows by the angle; the copy to float32 moves each row by < 1e-7 relative: 1e-4°
    assert torch.allclose(torch.tensor(got["rotation_deg"].to_numpy()), want, rtol=1e-4, atol=1e-4)
    line = record.layers.set_index("norm_layer").loc["bn_ab"]
    assert line["layer"] == "cat(a, b)"
    wb = torch.cat([before["a"].double().flatten(), before["b"].double().flatten()])
    w = torch.cat([model.a.weight.detach().double().flatten(), model.b.weight.detach().double().flatten()])
    assert math.isclose(line["update_cos"], float((w - wb) @ wb / ((w - wb).norm() * wb.norm())), rel_tol=1e-9)
    assert math.isclose(line["weight_norm"], float(w.norm()), rel_tol=1e-12)
    assert record.channels.query("norm_layer == 'bn_cx'")["rotation_deg"].isna().all()  # unpaired: lag only
    assert record.channels.query("norm_layer == 'bn_cx'")["lag_sigma"].notna().all()


class DenseStem(nn.Module):
    """timm's DenseNet block (``timm.models.densenet.DenseBlock``, BatchNormAct2d layers) after a stem
    convolution: each layer's first BatchNorm normalises the concatenation of the stem's output and every
    earlier layer's last convolution. ``untraceable``: placed by execution order alone."""

    def __init__(self, untraceable: bool = False):
        super().__init__()
        from thirdparty import import_timm
        densenet = import_timm().models.densenet
        self.untraceable = untraceable
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.block = densenet.DenseBlock(num_layers=3, num_input_features=8, bn_size=2, growth_rate=4)
        self.norm = densenet.BatchNormAct2d(8 + 3 * 4)
        self.head = nn.Linear(8 + 3 * 4, 3)

    def forward(self, x):
        if self.untraceable and x.sum() > 1e9:
            x = -x
        return self.head(self.norm(self.block(self.stem(x))).mean((2, 3)))


@pytest.mark.parametrize("untraceable", [False, True], ids=["fx", "execution order"])
def test_a_densenet_block_from_timm_is_paired_segment_by_segment(untraceable):
    """Every BatchNorm of a timm DenseNet block is paired: each ``norm1`` with the stem and the earlier layers'
    ``conv2`` (one segment each, in concatenation order), each ``norm2`` with its own ``conv1``."""
    from bnrotation.pairing import Segment
    torch.manual_seed(0)
    x = torch.randn(6, 3, 6, 6)
    model = DenseStem(untraceable)
    pairing = find_pairs(model, x)
    assert not pairing.unpaired, pairing.describe()
    segments = {p.norm: [(s.start, s.stop, s.weight) for s in p.spans(dict(model.named_modules())[p.norm].num_features)]
                for p in pairing.pairs}
    conv2 = [f"block.denselayer{i}.conv2" for i in (1, 2, 3)]
    for i in (1, 2, 3):
        want = [(0, 8, "stem")] + [(8 + 4 * k, 12 + 4 * k, conv2[k]) for k in range(i - 1)]
        assert segments[f"block.denselayer{i}.norm1"] == want
        assert segments[f"block.denselayer{i}.norm2"] == [(0, 8, f"block.denselayer{i}.conv1")]
    assert segments["norm"] == [(0, 8, "stem")] + [(8 + 4 * k, 12 + 4 * k, conv2[k]) for k in range(3)]
    assert_pairs_by_scaling(model, x, pairing.pairs)
    assert all(s == Segment(s.start, s.stop, s.weight, 0) for p in pairing.pairs for s in p.segments)


def test_the_scaling_oracle_fails_a_segment_paired_with_the_wrong_layer_or_channels():
    """The mutation guard: the pairing found passes the scale-invariance oracle; the same pairing with one
    segment's weight layer swapped for another of the same width, or with its channels shifted, fails it."""
    import dataclasses
    torch.manual_seed(0)
    x = torch.randn(6, 3, 6, 6)
    model = DenseStem()
    pairing = find_pairs(model, x)
    assert_pairs_by_scaling(model, x, pairing.pairs)
    norm = "block.denselayer3.norm1"  # stem [0, 8), denselayer1.conv2 [8, 12), denselayer2.conv2 [12, 16)
    pair = next(p for p in pairing.pairs if p.norm == norm)
    first, second, third = pair.segments
    swapped = (first, dataclasses.replace(second, weight=third.weight), dataclasses.replace(third, weight=second.weight))
    shifted = (dataclasses.replace(first, stop=4), dataclasses.replace(first, start=4, offset=4),
               dataclasses.replace(second, weight="block.denselayer3.conv1"), third)  # conv1: 8 channels
    for wrong in (swapped, shifted):
        with pytest.raises(AssertionError, match=norm):
            assert_pairs_by_scaling(model, x, [dataclasses.replace(pair, segments=wrong)])
