"""The adapters in bnrotation.integrations, each driven by its real framework's trainer on CPU: Lightning's
``Trainer`` and Hugging Face's ``Trainer`` train a tiny BatchNorm network a few optimizer steps. A framework
that is not installed skips its tests, saying so."""

from __future__ import annotations

import importlib
import json
import math
import os
import socket
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from bnrotation.integrations import MonitorSession, record_metrics

torch.set_num_threads(1)

from thirdparty import torchvision_shim  # noqa: E402 - Lightning and transformers import torchvision

torchvision_shim()

try:
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger, Logger
except ImportError:
    pl = None
try:
    import transformers
except ImportError:
    transformers = None

needs_lightning = pytest.mark.skipif(pl is None, reason="Lightning is not installed "
                                                         "(pip install 'bnrotation[lightning]')")
needs_transformers = pytest.mark.skipif(transformers is None, reason="transformers is not installed "
                                                                     "(pip install 'bnrotation[transformers]')")

# Lightning 2.6.6 calls a torch pytree API that torch 2.13 deprecates, at every fit
pytestmark = pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated")

PREFIX = "bnrotation/"
N_SAMPLES, BATCH = 64, 8  # 8 batches an epoch


# ----------------------------------------------------------------------------- a tiny task and network
def data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(64, 6) inputs and (64,) labels of 3 classes, a linear rule of the inputs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N_SAMPLES, 6, generator=g)
    y = (x @ torch.randn(6, 3, generator=g)).argmax(1)
    return x, y


class Net(nn.Module):
    """Linear -> BatchNorm1d -> ReLU -> Dropout -> Linear; the dropout draws from the global random stream,
    so a monitor that touched it would change training."""

    def __init__(self):
        super().__init__()
        self.fc, self.bn = nn.Linear(6, 16, bias=False), nn.BatchNorm1d(16)
        self.drop, self.head = nn.Dropout(0.2), nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.drop(F.relu(self.bn(self.fc(x)))))


def probe() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = data(seed=1)
    return x[:32], y[:32]


# ----------------------------------------------------------------------------- the framework-free part
def test_session_measures_each_due_step_once_and_refuses_bad_arguments():
    session = MonitorSession(probe(), every_n_steps=3)
    net = Net()
    session.start(net, 0, lambda p: p)
    steps = [0, 0, 1, 1, 2, 3, 3, 3, 4, 7, 7, 9]  # a framework's global step at each batch end
    measured = [s for s in steps if session.after_optimizer_step(s) is not None]
    assert measured == [3, 7, 9]  # 7: the first step past the multiple 6; 0 was measured at the start
    assert [r.step for r in session.records] == [0, 3, 7, 9]
    with pytest.raises(ValueError, match="every_n_steps.*int >= 1"):
        MonitorSession(probe(), every_n_steps=0)
    with pytest.raises(TypeError, match="probe"):
        MonitorSession("not a batch", every_n_steps=1)
    with pytest.raises(ValueError, match="keep_records"):
        MonitorSession(probe(), save_dir="somewhere", keep_records=False)


def test_record_metrics_are_the_records_columns_and_leave_out_what_was_not_measured():
    session = MonitorSession(probe(), every_n_steps=1, monitor_kwargs={"warn": False})
    net = Net()
    first = session.start(net, 0, lambda p: p)
    with torch.no_grad():
        net.fc.weight.mul_(-1.0).add_(0.1)  # rotates every channel, so the next call has a rotation
    second = session.after_optimizer_step(1)
    m0, m1 = record_metrics(first), record_metrics(second, per_layer=True)
    assert PREFIX + "rotation_deg_per_100" not in m0  # no previous call: NaN, left out
    c = second.checks.iloc[0]
    assert m1[PREFIX + "mode_gap"] == c["mode_gap"] and m1[PREFIX + "acc_eval_mode"] == c["acc_eval_mode"]
    assert m1[PREFIX + "rotation_deg_per_100"] == second.layers["rotation_deg_per_100"].median() > 0
    assert m1[PREFIX + "lag_median_abs_sigma"] == second.layers["lag_median_abs_sigma"].max()
    assert m1[PREFIX + "bn/lag_median_abs_sigma"] == second.layers["lag_median_abs_sigma"].iloc[0]
    assert m1[PREFIX + "stale"] == float(second.flagged) and m1[PREFIX + "stale_rule"] == float(second.stale)
    unlabelled = MonitorSession(probe()[0], every_n_steps=1).start(Net(), 0, lambda p: p)
    assert PREFIX + "acc_eval_mode" not in record_metrics(unlabelled)
    assert PREFIX + "mode_agreement" in record_metrics(unlabelled)


def test_importing_the_package_imports_no_framework():
    code = ("import sys, bnrotation, bnrotation.integrations, bnrotation.monitor; "
            "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers', 'accelerate') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("module, blocked, extra", [
    ("bnrotation.integrations.lightning", ("lightning", "lightning.pytorch", "pytorch_lightning"), "lightning"),
    ("bnrotation.integrations.transformers", ("transformers",), "transformers")])
def test_an_adapter_without_its_framework_names_the_extra_to_install(monkeypatch, module, blocked, extra):
    monkeypatch.delitem(sys.modules, module, raising=False)
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError, as when not installed
    with pytest.raises(ImportError, match=rf"pip install 'bnrotation\[{extra}\]'"):
        importlib.import_module(module)


# ----------------------------------------------------------------------------- Lightning
if pl is not None:
    from bnrotation.integrations.lightning import StalenessCallback as LightningCallback

    class Module(pl.LightningModule):
        """The network as a LightningModule: Adam, cross-entropy; forward returns the logits."""

        def __init__(self):
            super().__init__()
            self.net = Net()

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

    class NaiveCallback(pl.Callback):
        """The README's five lines as a callback: the monitor at every batch end whose global step is due."""

        def __init__(self, every_n_steps: int):
            self.every_n_steps, self.monitor = every_n_steps, None

        def on_train_start(self, trainer, pl_module):
            from bnrotation.monitor import StalenessMonitor
            self.monitor = StalenessMonitor(pl_module, probe())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step % self.every_n_steps == 0:
                self.monitor(trainer.global_step)

    class RankLogger(Logger):
        """A logger that, unlike Lightning's own, logs on every rank: one JSON line per call in
        ``log_rank<r>.jsonl``, so a test sees which ranks the callback logged from."""

        def __init__(self, folder: str):
            super().__init__()
            self.folder = folder

        @property
        def name(self):
            return "rank"

        @property
        def version(self):
            return 0

        def log_hyperparams(self, params, *args, **kwargs):
            pass

        def log_metrics(self, metrics, step=None):
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            with open(Path(self.folder) / f"log_rank{rank}.jsonl", "a") as f:
                f.write(json.dumps({"step": step, "keys": sorted(metrics)}) + "\n")

    class RankRecorder(LightningCallback):
        """The callback, writing each rank's measured steps to ``measured_rank<r>.jsonl``."""

        def __init__(self, folder: str, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.folder = folder

        def on_train_start(self, trainer, pl_module):
            if self.session.save_dir is not None:  # one folder per rank: a rank that writes is seen writing
                self.session.save_dir = self.session.save_dir / f"rank{trainer.global_rank}"
            super().on_train_start(trainer, pl_module)

        def on_record(self, trainer, record):
            with open(Path(self.folder) / f"measured_rank{trainer.global_rank}.jsonl", "a") as f:
                f.write(json.dumps({"step": record.step,
                                    "acc_eval_mode": float(record.checks["acc_eval_mode"].iloc[0])}) + "\n")

    class RandomDraw(pl.Callback):
        """Draws from the global random stream at every batch end: a callback that does change training."""

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            torch.rand(1)


def lightning_fit(tmp: Path, callbacks: list, max_steps: int = 6, accumulate: int = 1, val=None, ckpt_path=None,
                  **trainer_kwargs):
    """Seed, build the module, fit ``max_steps`` optimizer steps on shuffled batches of 8 (validating on
    ``val`` if given; resuming from ``ckpt_path`` if given); the module."""
    pl.seed_everything(0, verbose=False)
    module = Module()
    x, y = data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=True)
    kwargs = dict(accelerator="cpu", devices=1, max_steps=max_steps, logger=CSVLogger(tmp), callbacks=callbacks,
                  accumulate_grad_batches=accumulate, enable_progress_bar=False, enable_checkpointing=False,
                  enable_model_summary=False, num_sanity_val_steps=0)
    kwargs.update(trainer_kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers|log_every_n_steps).*")
        warnings.filterwarnings("ignore", message=".*validation_step.*")
        pl.Trainer(**kwargs).fit(module, loader, val, ckpt_path=ckpt_path)
    return module


def csv_metrics(tmp: Path) -> pd.DataFrame:
    (path,) = tmp.glob("lightning_logs/version_*/metrics.csv")
    return pd.read_csv(path)


def logged_steps(frame: pd.DataFrame, key: str) -> list[int]:
    return frame.loc[frame[key].notna(), "step"].astype(int).tolist()


@needs_lightning
def test_lightning_logs_the_three_signals_at_the_optimizer_steps(tmp_path):
    cb = LightningCallback(probe(), every_n_steps=2, warn=False)
    lightning_fit(tmp_path, [cb], max_steps=6)
    metrics = csv_metrics(tmp_path)
    assert logged_steps(metrics, PREFIX + "mode_gap") == [0, 2, 4, 6]
    assert logged_steps(metrics, PREFIX + "rotation_deg_per_100") == [2, 4, 6]  # none before a previous call
    assert logged_steps(metrics, PREFIX + "lag_median_abs_sigma") == [0, 2, 4, 6]
    assert [r.step for r in cb.records] == [0, 2, 4, 6]
    for record in cb.records:  # what reached the CSV is the record's, to the CSV's printed precision
        line = metrics[(metrics["step"] == record.step) & metrics[PREFIX + "mode_gap"].notna()].iloc[0]
        for key, value in record_metrics(record).items():
            assert math.isclose(line[key], value, rel_tol=1e-12, abs_tol=1e-12), key  # repr round trip
    # the snapshot at on_before_optimizer_step gives the update and gradient cosines of each measured step
    layers = cb.frames()["layers"]
    assert layers.loc[layers["step"] > 0, ["update_cos", "grad_cos"]].notna().all().all()
    assert layers.loc[layers["step"] == 0, "update_cos"].isna().all()


@needs_lightning
def test_lightning_warnings_name_the_users_line_not_the_callbacks(tmp_path):
    """Under the callback, the staleness warning (thresholds of 0, no warm-up) points at the line that called
    ``trainer.fit``, this file's, as in a plain loop it points at ``monitor(step)``; not at the adapter's hook,
    Lightning's loop or torch's decorators. (The setup warnings take the same path: test_reestimate_gated.py.)"""
    from bnrotation.monitor import StaleStatisticsWarning, Thresholds
    cb = LightningCallback(probe(), every_n_steps=2, thresholds=Thresholds(0.0, 0.0), warmup_steps=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lightning_fit(tmp_path, [cb], max_steps=2)
    ours = [w for w in caught if issubclass(w.category, StaleStatisticsWarning)]
    assert ours, caught
    assert {w.filename for w in ours} == {__file__}, [(w.filename, w.lineno) for w in ours]


@needs_lightning
def test_lightning_gradient_accumulation_logs_once_per_interval(tmp_path):
    cb = LightningCallback(probe(), every_n_steps=2, warn=False)
    lightning_fit(tmp_path, [cb], max_steps=6, accumulate=2)  # 12 batches, each global step seen twice
    metrics = csv_metrics(tmp_path)
    assert logged_steps(metrics, PREFIX + "mode_gap") == [0, 2, 4, 6]  # once each, not once per batch
    assert [r.step for r in cb.records] == [0, 2, 4, 6]
    layers = cb.frames()["layers"]
    assert layers.loc[layers["step"] > 0, "update_cos"].notna().all()


@needs_lightning
def test_a_naive_lightning_callback_dies_under_gradient_accumulation(tmp_path):
    # the failure the adapter exists for: the same global step at two batch ends reaches the monitor twice
    # (batches 3 and 4 both end at global step 2)
    with pytest.raises(ValueError, match="step 2 is not after the previous call's step 2"):
        lightning_fit(tmp_path, [NaiveCallback(every_n_steps=2)], max_steps=4, accumulate=2)
    lightning_fit(tmp_path / "without", [NaiveCallback(every_n_steps=2)], max_steps=4, accumulate=1)  # fine


@needs_lightning
def test_lightning_refuses_a_probe_or_model_it_cannot_measure_before_the_first_step(tmp_path):
    x, y = probe()
    steps = []
    with pytest.raises(ValueError, match=r"probe: the model cannot run on the probe inputs \(32, 5\)"):
        lightning_fit(tmp_path / "probe", [LightningCallback((x[:, :5], y)), _StepLog(steps)])
    with pytest.raises(AttributeError, match="nett"):
        lightning_fit(tmp_path / "model", [LightningCallback(probe(), model="nett"), _StepLog(steps)])
    assert steps == []  # no optimizer step was taken


def _StepLog(steps: list):
    return pl.callbacks.LambdaCallback(on_before_optimizer_step=lambda trainer, *a: steps.append(trainer.global_step))


@needs_lightning
def test_lightning_training_is_unchanged_by_the_callback(tmp_path):
    plain = lightning_fit(tmp_path / "plain", [], max_steps=6, accumulate=2)
    watched = lightning_fit(tmp_path / "watched", [LightningCallback(probe(), every_n_steps=1, warn=False)],
                            max_steps=6, accumulate=2)
    spoiled = lightning_fit(tmp_path / "spoiled", [RandomDraw()], max_steps=6, accumulate=2)
    a, b, c = plain.state_dict(), watched.state_dict(), spoiled.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # every parameter and running statistic, bit for bit
    assert not all(torch.equal(a[k], c[k]) for k in a)  # the comparison can fail: one random draw changes it


@needs_lightning
def test_lightning_resumes_the_monitor_from_the_checkpoint(tmp_path):
    """fit 4 steps, checkpoint at step 4 (a measured step), ``fit(ckpt_path=...)`` to step 8: the resumed
    callback does not measure step 4 again, and its first call, at step 6, measures the rotation against
    step 4's weights from the checkpoint (the same arithmetic: equal) and the drift against step 4's fresh
    means. Without the callback's state a resumed run measures step 4 twice and its step 6 against step 4 of
    the resumed run only: the assertions on the steps and on step 4's weights fail."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    from bnrotation.probes import rotation_deg

    class Kept(LightningCallback):
        """Keeps the measured model's weight layers at each call."""

        def on_record(self, trainer, record):
            self.kept = getattr(self, "kept", {})
            self.kept[record.step] = {k: v.detach().clone() for k, v in trainer.lightning_module.state_dict().items()}

    first = LightningCallback(probe(), every_n_steps=2, warn=False)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    lightning_fit(tmp_path / "first", [first, ckpt], max_steps=4, enable_checkpointing=True)
    (path,) = (tmp_path / "ckpt").glob("*.ckpt")
    saved = torch.load(path, weights_only=False)
    assert [r.step for r in first.records] == [0, 2, 4]
    resumed = Kept(probe(), every_n_steps=2, warn=False)
    lightning_fit(tmp_path / "resumed", [resumed], max_steps=8, ckpt_path=path)
    assert [r.step for r in resumed.records] == [6, 8]
    at_6 = resumed.records[0].channels
    assert at_6["rotation_deg"].notna().all() and at_6["drift_sigma_per_step"].notna().all()
    for layer, rows in at_6.groupby("layer"):
        want = rotation_deg(saved["state_dict"][f"{layer}.weight"], resumed.kept[6][f"{layer}.weight"])
        assert torch.equal(torch.tensor(rows.sort_values("channel")["rotation_deg"].to_numpy()), want), layer
    want = first.records[-1].channels.set_index(["norm_layer", "channel"])["fresh_mean"]  # step 4's
    got = at_6.set_index(["norm_layer", "channel"])
    drift = (got["fresh_mean"] - want).abs() / ((got["fresh_var"] + 1e-5).pow(0.5) * 2)  # BatchNorm's default eps
    assert torch.allclose(torch.tensor(got["drift_sigma_per_step"].to_numpy()), torch.tensor(drift.to_numpy()),
                          rtol=1e-12, atol=0)  # the monitor's formula on the same float64 values


@needs_lightning
def test_lightning_refuses_a_checkpoint_of_another_model(tmp_path):
    """A checkpoint whose monitor state holds weights of other shapes stops the resumed fit, naming them."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    lightning_fit(tmp_path / "first", [LightningCallback(probe(), every_n_steps=2, warn=False), ckpt], max_steps=2,
                  enable_checkpointing=True)
    (path,) = (tmp_path / "ckpt").glob("*.ckpt")
    state = torch.load(path, weights_only=False)
    (key,) = [k for k in state["callbacks"] if "StalenessCallback" in k]
    weights = state["callbacks"][key]["monitor"]["weights"]
    name = next(iter(weights))
    weights[name] = weights[name][:1]  # one output channel: another model's layer
    torch.save(state, path)
    with pytest.raises(ValueError, match=rf"monitor state: weights\['{name}'\] of shape"):
        lightning_fit(tmp_path / "resumed", [LightningCallback(probe(), every_n_steps=2, warn=False)], max_steps=4,
                      ckpt_path=path)


@needs_lightning
def test_lightning_measures_the_training_weights_beside_weight_averaging(tmp_path):
    # EMAWeightAveraging swaps its average into the module for each validation (every 2 steps here); the
    # callback's records are those of a run without it, step for step (averaging changes no training step)
    from lightning.pytorch.callbacks import EMAWeightAveraging
    x, y = data(seed=2)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
    kwargs = dict(max_steps=6, val=val, val_check_interval=2, check_val_every_n_epoch=None, limit_val_batches=1)
    alone, beside = (LightningCallback(probe(), every_n_steps=2, warn=False) for _ in range(2))
    lightning_fit(tmp_path / "alone", [alone], **kwargs)
    module = lightning_fit(tmp_path / "averaged", [EMAWeightAveraging(decay=0.5), beside], **kwargs)
    assert [r.step for r in beside.records] == [0, 2, 4, 6]
    for name in ("checks", "layers", "channels"):
        pd.testing.assert_frame_equal(alone.frames()[name], beside.frames()[name], check_exact=True)
    # and the module fit leaves behind holds the average, which the records do not describe
    measured = beside.records[-1].layers.set_index("layer").loc["net.fc", "weight_norm"]
    assert float(module.net.fc.weight.detach().double().norm()) != measured


def _lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@needs_lightning
def test_lightning_two_processes_measure_on_each_rank_and_log_from_rank_zero(tmp_path):
    cb = RankRecorder(str(tmp_path), probe(), every_n_steps=2, warn=False, save_dir=tmp_path / "tables")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers|log_every_n_steps).*")
        pl.seed_everything(0, verbose=False)
        x, y = data()
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
        pl.Trainer(accelerator="cpu", devices=2, strategy="ddp_fork", max_steps=4, logger=RankLogger(str(tmp_path)),
                   callbacks=[cb], enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                   num_sanity_val_steps=0).fit(Module(), loader)
    for rank in (0, 1):
        assert [line["step"] for line in _lines(tmp_path / f"measured_rank{rank}.jsonl")] == [0, 2, 4], rank
    ours = [line["step"] for line in _lines(tmp_path / "log_rank0.jsonl") if PREFIX + "mode_gap" in line["keys"]]
    assert ours == [0, 2, 4]
    assert not [line for line in _lines(tmp_path / "log_rank1.jsonl") if any(k.startswith(PREFIX)
                                                                             for k in line["keys"])]
    # save_dir from rank 0 only (each rank's folder of its own): rank 0's three tables, at its measured steps
    assert sorted(p.name for p in (tmp_path / "tables" / "rank0").iterdir()) == ["channels.parquet",
                                                                                "checks.parquet", "layers.parquet"]
    assert sorted(pd.read_parquet(tmp_path / "tables" / "rank0" / "checks.parquet")["step"]) == [0, 2, 4]
    assert not (tmp_path / "tables" / "rank1").exists()


# ----------------------------------------------------------------------------- Hugging Face transformers
if transformers is not None:
    from bnrotation.integrations.transformers import StalenessCallback as HFCallback

    class HFNet(nn.Module):
        """The network as the Trainer calls a model: keyword inputs, a dict with the loss when given labels."""

        def __init__(self):
            super().__init__()
            self.net = Net()

        def forward(self, x, labels=None):
            logits = self.net(x)
            out = {"logits": logits}
            if labels is not None:
                out["loss"] = F.cross_entropy(logits, labels)
            return out

    class Samples(torch.utils.data.Dataset):
        """The task's samples as the Trainer's default collator takes them: ``{"x": (6,), "labels": ()}``."""

        def __init__(self, seed: int = 0):
            self.x, self.y = data(seed)

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return {"x": self.x[i], "labels": self.y[i]}

    class RandomDrawHF(transformers.TrainerCallback):
        """Draws from the global random stream at every step end: a callback that does change training."""

        def on_step_end(self, args, state, control, **kwargs):
            torch.rand(1)

    class SeenByLaterCallbacks(transformers.TrainerCallback):
        """Keeps the steps at which a callback after the adapter received its metrics in ``logs``."""

        def __init__(self):
            self.steps = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if PREFIX + "mode_gap" in logs:
                self.steps.append(state.global_step)


def hf_probe() -> dict[str, torch.Tensor]:
    x, y = probe()
    return {"x": x, "labels": y}


def hf_train(tmp: Path, callbacks: list, max_steps: int = 6, accumulate: int = 1, main_process: bool = True,
             first: list = (), save_steps: int | None = None, resume: str | None = None):
    """Seed, build the model, train ``max_steps`` optimizer steps with batches of 8 through the real Trainer
    (Adam at 0.01, no scheduler, no checkpoints); the trainer. ``first``: callbacks put before the Trainer's own,
    where its ``report_to`` integrations sit. ``main_process=False`` makes the Trainer
    report, as a process other than the main one does, ``state.is_world_process_zero = False``. ``save_steps``:
    a checkpoint every so many steps; ``resume``: the checkpoint to resume from."""
    transformers.set_seed(0)
    model = HFNet()
    args = transformers.TrainingArguments(
        output_dir=str(tmp), max_steps=max_steps, per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=accumulate,
        learning_rate=0.01, lr_scheduler_type="constant", optim="adamw_torch", weight_decay=0.0, use_cpu=True,
        report_to=[], save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
        logging_steps=1000, disable_tqdm=True, seed=0, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Samples(), callbacks=callbacks)
    trainer.callback_handler.callbacks[:0] = first
    if not main_process:
        trainer.is_world_process_zero = lambda: False
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(PreTrainedModel|num_workers).*")
        trainer.train(resume_from_checkpoint=resume)
    return trainer


def hf_logged_steps(trainer, key: str = PREFIX + "mode_gap") -> list[int]:
    return [line["step"] for line in trainer.state.log_history if key in line]


@needs_transformers
def test_transformers_logs_the_three_signals_at_the_optimizer_steps(tmp_path):
    cb, later = HFCallback(hf_probe(), every_n_steps=2, input_key="x", warn=False), SeenByLaterCallbacks()
    trainer = hf_train(tmp_path, [cb, later], max_steps=6)
    assert hf_logged_steps(trainer) == [0, 2, 4, 6]
    assert hf_logged_steps(trainer, PREFIX + "rotation_deg_per_100") == [2, 4, 6]
    assert later.steps == [2, 4, 6]  # the logs dict of each measured step carries them to later callbacks
    by_step = {line["step"]: line for line in trainer.state.log_history if PREFIX + "mode_gap" in line}
    for record in cb.records:
        assert {k: by_step[record.step][k] for k in record_metrics(record)} == record_metrics(record)
    assert "loss" in by_step[2]  # the Trainer's own line of that step, which the callback asked for
    layers = cb.frames()["layers"]
    assert layers["norm_layer"].unique().tolist() == ["model.net.bn"]  # measured through ModelLogits
    assert layers.loc[layers["step"] > 0, ["update_cos", "grad_cos"]].notna().all().all()


@needs_transformers
def test_transformers_callbacks_before_the_adapter_see_the_metrics_only_when_it_goes_first(tmp_path):
    reporter = SeenByLaterCallbacks()  # where report_to's integrations sit: before Trainer(callbacks=...)
    hf_train(tmp_path / "last", [HFCallback(hf_probe(), every_n_steps=2, input_key="x", warn=False)], max_steps=4,
             first=[reporter])
    assert reporter.steps == []
    reporter = SeenByLaterCallbacks()
    hf_train(tmp_path / "first", [], max_steps=4,
             first=[HFCallback(hf_probe(), every_n_steps=2, input_key="x", warn=False), reporter])
    assert reporter.steps == [2, 4]


@needs_transformers
def test_transformers_gradient_accumulation_logs_once_per_interval(tmp_path):
    cb = HFCallback(hf_probe(), every_n_steps=2, input_key="x", warn=False)
    trainer = hf_train(tmp_path, [cb], max_steps=6, accumulate=2)  # 12 micro-batches
    assert trainer.state.global_step == 6
    assert hf_logged_steps(trainer) == [0, 2, 4, 6]
    assert [r.step for r in cb.records] == [0, 2, 4, 6]


@needs_transformers
def test_transformers_two_processes_measure_in_each_and_log_from_the_main_one(tmp_path):
    # two forked processes, as torchrun would start them (RANK, WORLD_SIZE, ...), gloo on CPU
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.start_processes(hf_two_process_worker, args=(str(tmp_path), port), nprocs=2,
                                          start_method="fork")
    for rank in (0, 1):
        assert _lines(tmp_path / f"measured_rank{rank}.jsonl") == [0, 2, 4], rank
    logged = {rank: json.loads((tmp_path / f"logged_rank{rank}.json").read_text()) for rank in (0, 1)}
    assert logged[0] == [0, 2, 4] and logged[1] == []


def hf_two_process_worker(rank: int, folder: str, port: int) -> None:
    """One process of the two-process run: train 4 steps, record the steps this process measured
    (``measured_rank<r>.jsonl``) and the steps of its log lines holding the metrics (``logged_rank<r>.json``)."""
    from accelerate.state import AcceleratorState
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    AcceleratorState._reset_state(reset_partial_state=True)  # the parent's single-process state, forked

    class Recorder(HFCallback):
        def on_record(self, state, record):
            with open(Path(folder) / f"measured_rank{torch.distributed.get_rank()}.jsonl", "a") as f:
                f.write(json.dumps(record.step) + "\n")

    try:
        trainer = hf_train(Path(folder) / "out", [Recorder(hf_probe(), every_n_steps=2, input_key="x", warn=False)],
                           max_steps=4)
        assert torch.distributed.get_world_size() == 2 and torch.distributed.get_rank() == rank
        (Path(folder) / f"logged_rank{rank}.json").write_text(json.dumps(hf_logged_steps(trainer)))
        torch.distributed.barrier()
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    # leave without tearing down: freeing the DDP reducer's gloo group can wait forever for the other
    # process's threads, and the run is over
    os._exit(0)


@needs_transformers
def test_transformers_rank_logic_through_the_trainers_own_attribute(tmp_path):
    # the same rule in one process: a Trainer that is not the world's process zero measures, logs nothing
    cb = HFCallback(hf_probe(), every_n_steps=2, input_key="x", warn=False, save_dir=tmp_path / "tables")
    trainer = hf_train(tmp_path, [cb], max_steps=4, main_process=False)
    assert trainer.state.is_world_process_zero is False
    assert [r.step for r in cb.records] == [0, 2, 4]  # measured
    assert hf_logged_steps(trainer) == []  # not logged
    assert not (tmp_path / "tables").exists()  # not written


@needs_transformers
def test_transformers_training_is_unchanged_by_the_callback_and_tables_are_written(tmp_path):
    plain = hf_train(tmp_path / "plain", [], max_steps=6, accumulate=2).model.state_dict()
    cb = HFCallback(hf_probe(), every_n_steps=1, input_key="x", warn=False, save_dir=tmp_path / "tables")
    watched = hf_train(tmp_path / "watched", [cb], max_steps=6, accumulate=2).model.state_dict()
    spoiled = hf_train(tmp_path / "spoiled", [RandomDrawHF()], max_steps=6, accumulate=2).model.state_dict()
    assert all(torch.equal(plain[k], watched[k]) for k in plain)  # every parameter and running statistic
    assert not all(torch.equal(plain[k], spoiled[k]) for k in plain)  # the comparison can fail
    tables = {name: pd.read_parquet(tmp_path / "tables" / f"{name}.parquet") for name in ("checks", "layers",
                                                                                          "channels")}
    assert tables["checks"]["step"].tolist() == list(range(7))
    pd.testing.assert_frame_equal(tables["channels"], cb.frames()["channels"], check_exact=True)


@needs_transformers
def test_transformers_resumes_the_monitor_from_the_checkpoint(tmp_path):
    """Train 4 steps with a checkpoint at step 4 (a measured step), resume from it to step 8: the monitor's
    state written beside the checkpoint is read back, so step 4 is not measured again and the call at step 6
    measures the rotation against step 4's weights (the checkpoint's: the same arithmetic, equal). Without it
    the resumed run measures step 4 again, without rotation, and the assertion on the steps fails."""
    from safetensors.torch import load_file
    from bnrotation.integrations.transformers import STATE_FILE
    from bnrotation.probes import rotation_deg

    class Kept(HFCallback):
        """Keeps the measured model's weights at each call."""

        def on_record(self, state, record):
            self.kept = getattr(self, "kept", {})
            self.kept[record.step] = {k: v.detach().clone() for k, v in self.monitor.model.state_dict().items()}

    first = HFCallback(hf_probe(), every_n_steps=2, input_key="x", warn=False)
    hf_train(tmp_path, [first], max_steps=4, save_steps=4)
    folder = tmp_path / "checkpoint-4"
    assert (folder / STATE_FILE).is_file() and [r.step for r in first.records] == [0, 2, 4]
    saved = load_file(folder / "model.safetensors")  # the model's own names; the monitor's start with "model."
    resumed = Kept(hf_probe(), every_n_steps=2, input_key="x", warn=False)
    hf_train(tmp_path, [resumed], max_steps=8, resume=str(folder))
    assert [r.step for r in resumed.records] == [6, 8]
    at_6 = resumed.records[0].channels
    assert at_6["rotation_deg"].notna().all()
    for layer, rows in at_6.groupby("layer"):
        want = rotation_deg(saved[layer.removeprefix("model.") + ".weight"], resumed.kept[6][f"{layer}.weight"])
        assert torch.equal(torch.tensor(rows.sort_values("channel")["rotation_deg"].to_numpy()), want), layer


# ----------------------------------------------------------------------------- both adapters: what the user is told
def _adapter(name: str):
    """``(callback class, its keyword arguments for the tiny task, a function training with it)`` of one adapter:
    Lightning's, driven by :func:`lightning_fit`, or the Trainer's, driven by :func:`hf_train`."""
    if name == "lightning":
        return LightningCallback, probe(), {}, lambda tmp, callbacks, **kw: lightning_fit(tmp, callbacks, **kw)
    return HFCallback, hf_probe(), {"input_key": "x"}, lambda tmp, callbacks, **kw: hf_train(tmp, callbacks, **kw)


ADAPTERS = [pytest.param("lightning", marks=needs_lightning), pytest.param("transformers", marks=needs_transformers)]


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_records_folder_without_pyarrow_fails_at_construction_in_one_line_naming_the_argument(monkeypatch, tmp_path,
                                                                                                adapter):
    """``save_dir`` writes parquet, which needs pyarrow (the ``[suite]`` extra, not the bare package). Without it
    the callback must refuse at construction, before any training, in one line that names ``save_dir`` and says
    what to install or pass; with ``save_dir=None`` the same real Trainer trains and measures."""
    callback, probe_batch, kwargs, train = _adapter(adapter)
    pyarrow = sys.modules.get("pyarrow")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError, as when not installed
    monkeypatch.delitem(sys.modules, "bnrotation.records", raising=False)  # so its own `import pyarrow` runs again
    with pytest.raises(ImportError) as caught:
        callback(probe_batch, every_n_steps=2, save_dir=tmp_path / "tables", warn=False, **kwargs)
    message = str(caught.value)
    assert "\n" not in message and len(message) <= 300, message
    assert message.startswith("save_dir"), message
    assert "pyarrow" in message and "pip install" in message and "bnrotation[suite]" in message, message
    assert "save_dir=None" in message, message
    assert not (tmp_path / "tables").exists()
    cb = callback(probe_batch, every_n_steps=2, save_dir=None, warn=False, **kwargs)  # asks nothing of pyarrow
    # pandas, imported here beside pyarrow, goes on importing pyarrow's submodules for its own string columns:
    # give pyarrow back before training (a pandas installed without pyarrow never asks)
    monkeypatch.setitem(sys.modules, "pyarrow", pyarrow)
    train(tmp_path / "run", [cb], max_steps=4)
    assert [r.step for r in cb.records] == [0, 2, 4]


def _logged(adapter: str, trained, tmp: Path) -> dict[int, dict]:
    """``{step: {metric: value}}`` of the steps where the adapter logged its metrics: Lightning's CSV logger
    under ``tmp``, or the Trainer's ``state.log_history``."""
    if adapter == "lightning":
        frame = csv_metrics(tmp)
        return {int(line["step"]): line.to_dict() for _, line in frame[frame[PREFIX + "mode_gap"].notna()].iterrows()}
    return {line["step"]: line for line in trained.state.log_history if PREFIX + "mode_gap" in line}


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("warmup_steps", [None, 0])
def test_the_logged_stale_is_what_the_user_is_told_during_the_warm_up_and_after(tmp_path, adapter, warmup_steps):
    """Thresholds of 0 make the rule fire at every call (without labels the gap, 1 - agreement, is never
    negative). During the monitor's warm-up (44 steps at the network's
    BatchNorm momentum of 0.1: every call here) no warning is raised and no summary starts with STALE, so the
    logged ``stale`` must be 0 too; the rule's own verdict is logged as ``stale_rule``. With ``warmup_steps=0``
    all three say stale at every call."""
    from bnrotation.monitor import StaleStatisticsWarning, Thresholds
    callback, probe_batch, kwargs, train = _adapter(adapter)
    probe_batch = probe_batch[0] if adapter == "lightning" else {"x": probe_batch["x"]}  # no labels
    always = Thresholds(mode_gap=0.0, lag_sigma=0.0)
    cb = callback(probe_batch, every_n_steps=2, thresholds=always, warmup_steps=warmup_steps, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trained = train(tmp_path, [cb], max_steps=4)
    assert cb.monitor.warmup_steps == (44 if warmup_steps is None else 0)
    warned = [int(str(w.message).split(":")[0].removeprefix("step ")) for w in caught
              if issubclass(w.category, StaleStatisticsWarning)]
    told = [r.step for r in cb.records if r.summary.startswith("STALE")]
    logged = _logged(adapter, trained, tmp_path)
    assert sorted(logged) == [0, 2, 4] and all(r.stale for r in cb.records)  # the rule fired at every call
    flagged = [step for step in sorted(logged) if logged[step][PREFIX + "stale"] == 1.0]
    assert flagged == warned == told == ([] if warmup_steps is None else [0, 2, 4])
    assert [logged[step][PREFIX + "stale_rule"] for step in sorted(logged)] == [1.0, 1.0, 1.0]
