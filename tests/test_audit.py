"""The audit of an averaged model, against the real averaging classes: torch ``AveragedModel``, timm
``ModelEmaV2``/``ModelEmaV3``, Lightning's ``WeightAveraging`` under a real ``Trainer``, the suite's own ``EMA``
and ``average_checkpoints`` (its policies are the ground truth), and plain state dicts; a closed-form lag; the
cases it must not judge; the command line."""

from __future__ import annotations

import copy
import math
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from thirdparty import import_optional, import_timm
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn, update_bn

from bnrotation import audit as audit_module
from bnrotation.audit import audit_averaged, format_audit, unwrap_averaged
from bnrotation.averaging import EMA, average_checkpoints
from bnrotation.monitor import StalenessMonitor
from bnrotation.staleness import Thresholds

torch.set_num_threads(1)
NORMS = ["1", "4"]  # the BatchNorm layers of _net


def _net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))


def _data(n: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (n, 3, 8, 8) whose class is the channel with the largest mean: a task a few Adam steps learn."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, 3, 8, 8, generator=g) + 0.5 * torch.randn(n, 3, 1, 1, generator=g)
    return x, x.mean((2, 3)).argmax(1)


def _train(model: nn.Module, steps: int, after_step=lambda: None, lr: float = 0.01) -> None:
    """``steps`` Adam steps on batches of 32 (one training-mode forward each), ``after_step()`` after each."""
    x, y = _data()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        i = (step * 32) % 64
        loss = F.cross_entropy(model(x[i:i + 32]), y[i:i + 32])
        opt.zero_grad()
        loss.backward()
        opt.step()
        after_step()
    model.eval()


def _probe() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _data()
    return x[64:], y[64:]


# ----------------------------------------------------------------------------- torch AveragedModel
@pytest.mark.parametrize("multi_avg_fn", [None, get_ema_multi_avg_fn(0.9)], ids=["swa", "ema"])
def test_averaged_model_copies_the_buffers_by_default_and_averages_them_with_use_buffers(multi_avg_fn):
    raw = _net()
    copied = AveragedModel(raw, multi_avg_fn=multi_avg_fn)
    averaged = AveragedModel(raw, multi_avg_fn=multi_avg_fn, use_buffers=True)
    _train(raw, 12, lambda: (copied.update_parameters(raw), averaged.update_parameters(raw)))
    a = audit_averaged(raw, copied, _probe())
    assert (a.policy, a.declared, a.updates) == ("copied", "copied", 12) and a.judged
    assert a.layers["same_as_raw"].all() and list(a.layers["norm_layer"]) == NORMS
    b = audit_averaged(raw, averaged, _probe())
    assert (b.policy, b.declared) == ("averaged", "averaged")
    # the witness: AveragedModel averages num_batches_tracked too, so the copy's count trails the raw model's 12
    assert (b.layers["count_raw"] == 12).all() and (b.layers["count_copy"] < 12).all()


def test_an_averaged_model_that_stopped_updating_was_never_updated_since_its_last_update():
    """``use_buffers=False`` copies the buffers at each update; after the last one (averaging that ends inside an
    epoch) the raw model trains on: the copy holds the raw model's buffers of its count at that update."""
    raw = _net()
    swa = AveragedModel(raw)
    _train(raw, 8, lambda: swa.update_parameters(raw))
    _train(raw, 5)
    a = audit_averaged(raw, swa, _probe())
    assert a.policy == "never updated" and a.since_count == 8 and a.judged
    assert (a.layers["count_raw"] == 13).all() and not a.layers["same_as_raw"].any()


def _swa_recipe(epochs_of_batches: int) -> tuple[nn.Module, AveragedModel]:
    """torch's SWA recipe (``torch.optim.swa_utils`` docs): ``AveragedModel`` updated at every step of the
    averaging phase, then ``update_bn`` over ``epochs_of_batches`` batches of the training data, which resets each
    layer's statistics and count and takes the cumulative average over those batches."""
    raw = _net()
    swa = AveragedModel(raw)
    _train(raw, 8)
    _train(raw, 8, lambda: swa.update_parameters(raw))
    g = torch.Generator().manual_seed(6)  # batches of 128 of the same task, not the probe's samples
    x = torch.randn(epochs_of_batches * 128, 3, 8, 8, generator=g) + 0.5 * torch.randn(epochs_of_batches * 128, 3,
                                                                                        1, 1, generator=g)
    update_bn(x.split(128), swa)
    return raw, swa


def _large_probe() -> tuple[torch.Tensor, torch.Tensor]:
    """512 samples of the task: a lag that sampling alone gives is about 0.674/√512 ≈ 0.03σ, under the rule's."""
    return _data(512)


def test_torchs_swa_recipe_with_update_bn_is_not_called_never_updated():
    """After ``update_bn`` on fewer batches than the raw model's count, the copy's count trails the raw model's as a
    frozen copy's would; but its statistics fit its own weights, which a copy frozen since then need not: the
    audit names both candidates, and the copy is not stale."""
    raw, swa = _swa_recipe(3)
    a = audit_averaged(raw, swa, _large_probe())
    assert (a.layers["count_copy"] == 3).all() and (a.layers["count_raw"] == 16).all()
    assert a.policy == "undetermined" and set(a.candidates) == {"re-estimated", "never updated"}, a.reason
    assert "fit the copy's own weights" in a.reason and not a.stale and a.since_count is None


def test_torchs_swa_recipe_with_more_batches_than_the_raw_model_saw_is_re_estimated():
    """A count above the raw model's cannot come from copying it: with statistics that fit the copy's own weights,
    the copy was re-estimated after its last update (``update_bn``), whatever ``use_buffers=False`` declares."""
    raw, swa = _swa_recipe(20)
    a = audit_averaged(raw, swa, _large_probe())
    assert (a.layers["count_copy"] == 20).all() and (a.layers["count_raw"] == 16).all()
    assert a.policy == "re-estimated" and a.judged and not a.stale, a.reason


def test_torchs_swa_recipe_saved_as_state_dicts_is_re_estimated_too(tmp_path, monkeypatch, capsys):
    """Found by a new user: the recipe's copy saved as a state dict (or read by the command) declares nothing, and a
    count above the raw model's with statistics that fit read "undetermined (candidates: re-estimated)". Neither a
    copy nor an average of the raw model's buffers holds a count above its: re-estimated, exit 0."""
    raw, swa = _swa_recipe(20)
    a = audit_averaged(raw.state_dict(), swa.module.state_dict(), _large_probe(), model=_net())
    assert a.policy == "re-estimated" and a.judged and not a.stale, a.reason
    assert not a.reason.startswith("2 layers")  # one reason, said once, when the layers agree
    (tmp_path / "audit_nets.py").write_text(NETS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    torch.save(raw.state_dict(), tmp_path / "raw.pt")
    torch.save(swa.state_dict(), tmp_path / "swa.pt")  # the AveragedModel's own: n_averaged and module. keys
    torch.save(_large_probe(), tmp_path / "probe.pt")
    assert audit_module.main(["raw.pt", "swa.pt", "--model", "audit_nets:make", "--batches", "probe.pt"]) == 0
    assert "Buffer policy: re-estimated" in capsys.readouterr().out
    sys.modules.pop("audit_nets", None)


def test_an_averaged_model_that_averages_its_buffers_then_update_bn_is_re_estimated():
    """The second case, from the same user: ``AveragedModel(use_buffers=True)`` declares averaged buffers, but after
    ``update_bn`` on more batches than the raw model saw its count is above the raw model's, which no average of
    counts reaches: re-estimated."""
    raw = _net()
    swa = AveragedModel(raw, use_buffers=True)
    _train(raw, 8, lambda: swa.update_parameters(raw))
    g = torch.Generator().manual_seed(6)
    x = torch.randn(20 * 128, 3, 8, 8, generator=g) + 0.5 * torch.randn(20 * 128, 3, 1, 1, generator=g)
    update_bn(x.split(128), swa)
    a = audit_averaged(raw, swa, _large_probe())
    assert (a.layers["count_copy"] == 20).all() and a.declared == "averaged"
    assert a.policy == "re-estimated" and not a.stale, a.reason


def test_the_audits_records_have_no_warm_up():
    """Found by a new user: the audit measures once, yet its records said "warming up, 44 steps left"."""
    raw, swa = _swa_recipe(3)
    a = audit_averaged(raw, swa, _large_probe())
    assert not a.copy.warming_up and not a.raw.warming_up and "warming up" not in a.copy.summary


def test_torchs_swa_recipe_with_as_many_batches_as_the_raw_model_saw_is_re_estimated():
    """Found by a new user: ``update_bn`` over exactly as many batches as the raw model's steps leaves the raw
    model's count with other statistics, which read "averaged, the count copied" (a state dict) or undetermined with
    no candidates (the live wrapper). A wrapper that copies averages nothing: re-estimated, as its fit says; without
    the fit's evidence, undetermined with re-estimated its candidate."""
    raw, swa = _swa_recipe(16)
    a = audit_averaged(raw, swa, _large_probe())
    assert (a.layers["count_copy"] == a.layers["count_raw"]).all()  # the case: 16 and 16
    assert a.policy == "re-estimated" and not a.stale, a.reason
    b = audit_averaged(raw, swa, _large_probe(), thresholds=Thresholds(lag_sigma=0.0))  # no layer can "fit"
    assert b.policy == "undetermined" and b.candidates == ("re-estimated",), b.reason


def test_a_copy_identical_to_the_raw_model_is_not_judged():
    """The first update of an AveragedModel copies everything: nothing shows which policy it will apply."""
    raw = _net()
    swa = AveragedModel(raw)
    _train(raw, 3)
    swa.update_parameters(raw)
    a = audit_averaged(raw, swa, _probe())
    assert a.policy == "undetermined" and a.same_weights and not a.judged
    assert "no buffer policy shows" in a.reason


def _raw_and_teacher() -> tuple[nn.Module, nn.Module]:
    """A raw model after 40 Adam steps, and a Mean-Teacher style EMA of its parameters alone (rate 0.5 a step),
    whose BatchNorm buffers never moved."""
    raw = _net()
    teacher = copy.deepcopy(raw)

    def update():
        with torch.no_grad():
            for t, s in zip(teacher.parameters(), raw.parameters()):
                t.lerp_(s, 0.5)

    _train(raw, 40, update)
    return raw, teacher


def test_a_parameters_only_average_whose_buffers_never_moved_is_never_updated_and_stale():
    """A Mean-Teacher style EMA of the parameters alone: its BatchNorm buffers stay at their initial values while
    the raw model trains; against its own (trained) weights they are stale."""
    raw, teacher = _raw_and_teacher()
    a = audit_averaged(raw, teacher, _probe())
    assert (a.policy, a.since_count, a.declared) == ("never updated", 0, None)
    assert a.lag_sigma >= 0.1 and a.stale, format_audit(a)


# ----------------------------------------------------------------------------- timm
def _timm_model(timm):
    torch.manual_seed(0)
    return timm.create_model("test_resnet", pretrained=False, num_classes=3)


def _timm_steps(model: nn.Module, steps: int, after_step) -> None:
    g = torch.Generator().manual_seed(6)
    x = torch.randn(8, 3, 32, 32, generator=g)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    for _ in range(steps):
        loss = model(x).logsumexp(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        after_step()
    model.eval()


def _timm_probe() -> torch.Tensor:
    return torch.randn(24, 3, 32, 32, generator=torch.Generator().manual_seed(7))


def test_timm_model_ema_v3_averages_the_float_buffers_and_copies_the_counts_or_copies_all_of_them():
    timm = import_timm()
    raw = _timm_model(timm)
    v3 = timm.utils.ModelEmaV3(raw, decay=0.9)
    v3_copy = timm.utils.ModelEmaV3(raw, decay=0.9, exclude_buffers=True)
    _timm_steps(raw, 4, lambda: (v3.update(raw), v3_copy.update(raw)))
    a = audit_averaged(raw, v3, _timm_probe())
    assert (a.policy, a.declared) == ("averaged", "averaged") and (a.layers["count_copy"] == 4).all()
    assert "the same count 4" in a.reason
    b = audit_averaged(raw, v3_copy, _timm_probe())
    assert (b.policy, b.declared) == ("copied", "copied") and b.layers["same_as_raw"].all()
    assert len(a.layers) == len(b.layers) == len([m for m in raw.modules() if isinstance(m, nn.BatchNorm2d)])


def test_timm_model_ema_v2_averages_every_entry_counts_included():
    """V2 writes ``decay * count + (1 - decay) * raw count`` back into an integer: the count stays behind."""
    timm = import_timm()
    raw = _timm_model(timm)
    v2 = timm.utils.ModelEmaV2(raw, decay=0.9)
    _timm_steps(raw, 4, lambda: v2.update(raw))
    a = audit_averaged(raw, v2, _timm_probe())
    assert (a.policy, a.source) == ("averaged", "timm ModelEmaV2")
    assert (a.layers["count_copy"] < a.layers["count_raw"]).all()
    # the same copy as a bare state dict: the count alone cannot tell an average from a frozen copy
    bare = audit_averaged(raw.state_dict(), v2.module.state_dict(), _timm_probe(), model=_timm_model(timm))
    assert bare.policy == "undetermined" and {"averaged", "never updated"} <= set(bare.candidates)
    assert not bare.judged


# ----------------------------------------------------------------------------- Lightning
def _lightning_module(L):
    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _net()

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

    return Classifier()


def _fit(L, callbacks: list, tmp_path, steps: int = 6) -> None:
    """``steps`` steps of a LightningModule under a real ``Trainer`` on CPU, with ``callbacks``."""
    x, y = _data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:64], y[:64]), batch_size=16)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                        callbacks=callbacks)
    trainer.fit(_lightning_module(L), loader)


@pytest.mark.parametrize("use_buffers, policy", [(True, "averaged"), (False, "copied")])
def test_lightning_weight_averaging_copy_under_a_real_trainer(use_buffers, policy, tmp_path):
    """At the end of fit the callback copies the average into the LightningModule itself (``on_train_end``), so
    the raw model is taken from the checkpoint written at the last step, before that copy
    (``current_model_state``); the callback's copy is audited, and the checkpoint alone."""
    L = import_optional("lightning.pytorch")
    callback = L.callbacks.WeightAveraging(use_buffers=use_buffers)
    checkpoints = []

    class Keep(L.Callback):  # the checkpoint as WeightAveraging writes it mid-fit, raw model included
        def on_train_batch_end(self, trainer, pl_module, *args):
            if trainer.global_step == 6:
                trainer.save_checkpoint(tmp_path / "last.ckpt")
                checkpoints.append(torch.load(tmp_path / "last.ckpt", weights_only=False))

    _fit(L, [callback, Keep()], tmp_path)
    ckpt = checkpoints[0]
    raw = _lightning_module(L)
    raw.load_state_dict(ckpt["current_model_state"])
    a = audit_averaged(raw, callback, _probe())
    assert a.policy == policy and a.source.startswith("Lightning WeightAveraging") and a.updates == 6, a.reason
    b = audit_averaged(None, ckpt, _probe(), model=_lightning_module(L))
    assert b.updates == 6 and list(b.layers["norm_layer"]) == [f"net.{n}" for n in NORMS]
    if policy == "copied":
        assert b.policy == "copied"
    else:  # averaged counts: from the file alone it could also be a frozen copy, and the audit says so
        assert b.policy == "undetermined" and "averaged" in b.candidates


def test_a_lightning_callback_before_fit_is_refused():
    L = import_optional("lightning.pytorch")
    with pytest.raises(ValueError, match="holds no averaged model yet"):
        unwrap_averaged(L.callbacks.WeightAveraging())


# ----------------------------------------------------------------------------- the suite's own averaging
def _suite_run():
    """A raw model trained 30 steps with the suite's EMA, and its five checkpoints of the last 10 steps."""
    raw = _net()
    ema = EMA(raw, 0.9)
    snapshots = []

    def after():
        ema.update(raw)
        if ema.updates % 2 == 0 and ema.updates > 20:
            snapshots.append(copy.deepcopy(raw.state_dict()))

    _train(raw, 30, after)
    return raw, ema, snapshots


@pytest.mark.parametrize("policy, expected", [("copy", "copied"), ("average", "averaged"),
                                              ("refresh", "re-estimated")])
def test_the_suites_ema_policies_are_named(policy, expected):
    raw, ema, _ = _suite_run()
    held, provenance = ema.averaged(policy, raw, [_probe()[0]])  # refresh: re-estimated on the probe itself
    a = audit_averaged(raw, held, _probe(), provenance=provenance)
    assert a.policy == expected and a.judged, a.reason
    if policy == "refresh":  # without the provenance the count (1 batch) does not tell
        bare = audit_averaged(raw, held, _probe())
        assert bare.policy == "undetermined" and "re-estimated" in bare.candidates and bare.since_count is None
        # on the probe itself: only the biased/unbiased variance of the layer upstream (1 / (2 * 32 * 64)) is left
        assert not bare.stale and bare.lag_sigma < 1e-3
    if policy == "average":  # the EMA object itself declares the same
        assert audit_averaged(raw, ema, _probe()).policy == "averaged"


@pytest.mark.parametrize("policy, expected", [("copy", "copied"), ("average", "averaged"), ("mixture", "averaged"),
                                              ("refresh", "re-estimated")])
def test_the_suites_checkpoint_average_policies_are_named_from_the_buffers(policy, expected):
    """The raw model is the newest snapshot (``copy`` takes its buffers; ``average`` and ``mixture`` keep the
    largest count, its own): for these three the buffers alone tell, without the provenance."""
    raw_model, _, snapshots = _suite_run()
    raw = _net()
    raw.load_state_dict(snapshots[-1])
    x, _ = _data()
    held, provenance = average_checkpoints(_net(), snapshots, policy=policy, batches=[x[:32], x[32:64]])
    a = audit_averaged(raw, held, _probe(), provenance=provenance if policy == "refresh" else None)
    assert a.policy == expected, a.reason


@pytest.mark.parametrize("policy, alone, declared", [("copy", "undetermined", "never updated"),
                                                     ("average", "undetermined", "averaged"),
                                                     ("mixture", "undetermined", "averaged")])
def test_a_checkpoint_average_against_a_raw_model_that_trained_past_its_newest_constituent(policy, alone, declared):
    """The raw model trains 3 steps past the newest snapshot (count 30): every policy holds count 30, which alone
    could be a frozen copy, an average of counts or a re-estimation; the suite's provenance settles it: ``copy``
    holds that snapshot's buffers, not updated since count 30; ``average`` and ``mixture`` averaged them."""
    raw, _, snapshots = _suite_run()
    _train(raw, 3)
    held, provenance = average_checkpoints(_net(), snapshots, policy=policy)
    a = audit_averaged(raw, held, _probe())
    b = audit_averaged(raw, held, _probe(), provenance=provenance)
    assert (a.policy, b.policy) == (alone, declared), (a.reason, b.reason)
    assert (a.layers["count_copy"] == 30).all() and (a.layers["count_raw"] == 33).all()
    assert b.since_count == (30 if declared == "never updated" else None)


def test_the_two_state_dicts_of_an_averaged_model_file():
    """``AveragedModel.state_dict()`` (``n_averaged`` and ``module.`` keys) and the raw state dict, as saved."""
    raw = _net()
    swa = AveragedModel(raw)
    _train(raw, 6, lambda: swa.update_parameters(raw))
    a = audit_averaged(raw.state_dict(), swa.state_dict(), _probe(), model=_net(1))
    assert (a.policy, a.updates, a.declared) == ("copied", 6, None)
    with pytest.raises(ValueError, match="two state dicts need the architecture"):
        audit_averaged(raw.state_dict(), swa.state_dict(), _probe())


# ----------------------------------------------------------------------------- the measurement
def test_the_copys_lag_is_the_closed_form_of_a_known_shift():
    """Linear -> BatchNorm1d whose running mean is the probe's own mean; the copy is the raw model with each
    output shifted by delta standard deviations of it, and the raw model's buffers: its lag is -delta, exactly
    the monitor's, which the audit reports unchanged."""
    torch.manual_seed(0)
    raw = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).eval()
    x = torch.randn(256, 4, dtype=torch.float64).float()
    with torch.no_grad():
        z = raw[0](x).double()
        raw[1].running_mean.copy_(z.mean(0))
        raw[1].running_var.copy_(z.var(0))
        raw[1].num_batches_tracked.fill_(10)
    delta = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    avg = copy.deepcopy(raw)
    with torch.no_grad():
        avg[0].bias += (delta * z.std(0)).float()
    a = audit_averaged(raw, avg, x)
    assert a.policy == "copied"
    # float32 activations, float64 moments: the lag is delta to float32 rounding of a mean over 256 values, in the
    # layer's own σ = sqrt(var + eps)
    want = delta * z.std(0) / (z.var(0) + raw[1].eps).sqrt()
    assert math.isclose(a.layers.loc[0, "lag_median_abs_sigma"], float(want[1]), abs_tol=1e-5)
    assert math.isclose(a.layers.loc[0, "lag_max_abs_sigma"], float(want[2]), abs_tol=1e-5)
    assert math.isclose(a.layers.loc[0, "lag_median_abs_sigma_raw"], 0.0, abs_tol=1e-5)
    alone = StalenessMonitor(avg, x, warn=False)(0)
    assert a.lag_sigma == float(alone.layers["lag_median_abs_sigma"].max())
    assert a.mode_gap == float(alone.checks["mode_gap"].iloc[0])


def test_the_audit_changes_neither_model():
    raw = _net()
    swa = AveragedModel(raw, use_buffers=True)
    _train(raw, 5, lambda: swa.update_parameters(raw))
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in (raw, swa)]
    flags = [m.training for m in (*raw.modules(), *swa.modules())]
    audit_averaged(raw, swa, _probe())
    for m, saved in zip((raw, swa), before):
        assert all(torch.equal(v, saved[k]) for k, v in m.state_dict().items())
    assert flags == [m.training for m in (*raw.modules(), *swa.modules())]


# ----------------------------------------------------------------------------- bad input
def test_bad_input_is_named():
    raw = _net()
    with pytest.raises(ValueError, match="averaged: a state dict needs model="):
        unwrap_averaged(raw.state_dict())
    with pytest.raises(TypeError, match="averaged: expected an AveragedModel.*got int"):
        audit_averaged(raw, 3, _probe())
    other = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 3))
    with pytest.raises(ValueError, match="raw: no BatchNorm layer named '1'"):
        audit_averaged(other, _net(), _probe())
    with pytest.raises(ValueError, match=r"averaged: does not fit the model: missing key"):
        audit_averaged(raw, {"0.weight": torch.zeros(8, 3, 3, 3)}, _probe(), model=_net())


# ----------------------------------------------------------------------------- the command line
NETS = '''import torch.nn as nn


def make():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))
'''


def test_the_command_line_exits_0_for_a_fitting_copy_1_for_a_stale_one_and_2_when_undetermined_or_bad(
        tmp_path, monkeypatch, capsys):
    """The exit status every judging command shares (bnrotation.helptext.EXIT_STATUS)."""
    (tmp_path / "audit_nets.py").write_text(NETS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    raw = _net()
    swa = AveragedModel(raw)
    teacher = copy.deepcopy(raw)  # the parameters-only average of the test above: never updated, stale

    def update():
        swa.update_parameters(raw)
        with torch.no_grad():
            for t, s in zip(teacher.parameters(), raw.parameters()):
                t.lerp_(s, 0.5)

    _train(raw, 40, update)  # the raw model's path of the test above: the teacher is stale by its numbers
    for name, model in (("raw", raw), ("swa", swa), ("teacher", teacher)):
        torch.save(model.state_dict(), tmp_path / f"{name}.pt")
    torch.save(_probe(), tmp_path / "probe.pt")
    args = ["--model", "audit_nets:make", "--batches", "probe.pt"]
    off = ["--lag-sigma", "100", "--eval-error-sigma", "100"]  # a rule that E or a lag of 100σ alone can fire
    assert audit_module.main(["raw.pt", "swa.pt", *args, *off]) == 0
    out = capsys.readouterr().out
    assert "Buffer policy: copied" in out and "| 1 | copied | 40 | 40 |" in out and "Not stale" in out
    assert audit_module.main(["raw.pt", "teacher.pt", *args]) == 1
    out = capsys.readouterr().out
    assert "Buffer policy: never updated" in out and "STALE: the copy's buffers do not fit" in out
    assert audit_module.main(["raw.pt", "raw.pt", *args]) == 1  # identical, undetermined; stale, which outranks it
    assert "Buffer policy: undetermined" in capsys.readouterr().out
    assert audit_module.main(["raw.pt", "raw.pt", *args, *off]) == 2  # not stale: undetermined
    assert "Buffer policy: undetermined" in capsys.readouterr().out
    assert audit_module.main(["raw.pt", "missing.pt", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: averaged:") and "missing.pt" in err and len(err.strip().splitlines()) == 1
    assert audit_module.main(["raw.pt", "swa.pt", "--model", "audit_nets:nope", "--batches", "probe.pt"]) == 2
    assert "--model audit_nets:nope" in capsys.readouterr().err
    sys.modules.pop("audit_nets", None)


def test_the_command_line_probes_with_every_batch_it_reads_and_names_its_rules_flags(tmp_path, monkeypatch, capsys):
    """The second batch counts: a file of two batches is the monitor's pooled probe (the same report as
    audit_averaged on the list), not its first batch; --max-batches 1 is the first batch alone; the check's
    threshold flags are the audit's, a bad one named."""
    (tmp_path / "audit_nets.py").write_text(NETS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    raw, teacher = _raw_and_teacher()
    torch.save(raw.state_dict(), tmp_path / "raw.pt")
    torch.save(teacher.state_dict(), tmp_path / "teacher.pt")
    x, y = _data()
    batches = [(x[:32], y[:32]), (x[64:], y[64:])]  # unlike halves: the first alone measures other statistics
    torch.save(batches, tmp_path / "two.pt")
    args = ["raw.pt", "teacher.pt", "--model", "audit_nets:make", "--batches", "two.pt", "--lag-sigma", "100",
            "--eval-error-sigma", "100"]  # not stale: exit 0
    assert audit_module.main(args) == 0
    pooled_out = capsys.readouterr().out
    assert audit_module.main([*args, "--max-batches", "1"]) == 0
    first_out = capsys.readouterr().out
    pooled = audit_averaged(raw, teacher, batches)
    first = audit_averaged(raw, teacher, batches[0])
    assert pooled.lag_sigma != first.lag_sigma
    assert f"{pooled.lag_sigma:.3f}" in pooled_out and f"{first.lag_sigma:.3f}" in first_out
    assert "The copy on the probe (64 samples)" in pooled_out and "(32 samples)" in first_out
    for flag, value in (("--eval-error-sigma", "-1"), ("--lag-sigma", "nan"), ("--max-batches", "0")):
        assert audit_module.main([*args, flag, value]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {flag}") and len(err.strip().splitlines()) == 1, err
    sys.modules.pop("audit_nets", None)


def test_the_copys_frozen_parameters_are_not_a_lint_warning_but_the_raw_models_findings_still_are():
    """An averaged copy's parameters are frozen by construction (timm's ModelEmaV2 sets requires_grad off): the
    lint's frozen-weights-training-bn is no news there. Another finding on the raw model still warns."""
    import warnings as w

    from bnrotation.monitor import MonitorSetupWarning
    raw = _net()
    ema = copy.deepcopy(raw).requires_grad_(False).train()
    with w.catch_warnings(record=True) as caught:
        w.simplefilter("always")
        audit_averaged(raw, ema, _probe())
    assert not [c for c in caught if issubclass(c.category, MonitorSetupWarning)], [str(c.message) for c in caught]
    raw[1].momentum = 0.0  # momentum-zero: training never updates the raw model's first running statistics
    with pytest.warns(MonitorSetupWarning, match="momentum-zero"):
        audit_averaged(raw, ema, _probe())
