"""The check reads the checkpoints people have, as the tools that wrote them wrote them: a Lightning ``Trainer``
checkpoint (``.ckpt``: ``state_dict``, keys under the LightningModule's attribute), a timm training checkpoint
(written by timm's own ``CheckpointSaver``: ``state_dict``, ``state_dict_ema``, the script's arguments as an
``argparse.Namespace``) of a timm model built by ``--model timm:create_model --model-kwargs``, a real
``DistributedDataParallel`` state dict (``module.``), and ``.safetensors``. Each file gives the same report as
the plain state dict of the same weights, computed in the same process."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn as nn

from bnrotation.check import check_checkpoint, load_weights, main, model_from_factory
from thirdparty import import_optional

MODULE = "format_nets"
SOURCE = '''
import torch
import torch.nn as nn


def make(width=8):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                         nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 4))
'''


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """A folder holding the user's factory module and batches with labels; the current directory of each test."""
    folder = tmp_path_factory.mktemp("formats")
    (folder / f"{MODULE}.py").write_text(SOURCE)
    sys.path.insert(0, str(folder))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(2)]
    torch.save(batches, folder / "batches.pt")
    yield folder, importlib.import_module(MODULE), batches
    sys.path.remove(str(folder))
    sys.modules.pop(MODULE, None)


def _stale(model: nn.Module) -> nn.Module:
    """``model`` after training-mode passes on inputs of mean 1.5: its running statistics describe other data."""
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(16, 3, 8, 8) + 1.5)
    return model


def _measured(code: int, out: str) -> bool:
    """The check read the file and gave its verdict: stale (1), not stale (0), or undetermined (2, saying so on
    stdout; random labels on an untrained net are often no better than a constant guess). Bad input exits 2 with
    one line on stderr instead, which each caller rules out with ``err == ""``."""
    return code in (0, 1) or (code == 2 and "Undetermined: " in out)


def _same_report(a, b) -> None:
    pd.testing.assert_frame_equal(a.layers, b.layers)
    assert (a.mode_gap, a.acc_eval_mode, a.stale) == (b.mode_gap, b.acc_eval_mode, b.stale)


def _equal_states(model: nn.Module, want: dict) -> bool:
    got = model.state_dict()
    return set(got) == set(want) and all(torch.equal(got[k], want[k].to(got[k].device)) for k in got)


def _run(folder: Path, monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.chdir(folder)
    capsys.readouterr()  # what ran before (a Trainer's log lines) is not the check's
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- DDP, safetensors
def test_a_ddp_state_dict_and_a_safetensors_file_give_the_plain_state_dicts_report(user, tmp_path, monkeypatch,
                                                                                   capsys):
    """A real ``DistributedDataParallel`` (gloo, one process) saves keys under ``module.``: stripped, saying so,
    and the numbers are the plain file's; the same weights as ``.safetensors`` too."""
    import torch.distributed as dist
    folder, nets, batches = user
    model = _stale(nets.make())
    torch.save(model.state_dict(), tmp_path / "plain.pt")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(model)
        torch.save(ddp.state_dict(), tmp_path / "ddp.pt")
    finally:
        dist.destroy_process_group()
    assert all(k.startswith("module.") for k in torch.load(tmp_path / "ddp.pt", weights_only=True))
    safetensors = import_optional("safetensors.torch")
    safetensors.save_file(model.state_dict(), tmp_path / "weights.safetensors")

    plain = check_checkpoint(nets.make(), batches, weights=tmp_path / "plain.pt")
    for name in ("ddp.pt", "weights.safetensors"):
        _same_report(check_checkpoint(nets.make(), batches, weights=tmp_path / name), plain)
    code, out, err = _run(folder, monkeypatch, capsys, "--model", f"{MODULE}:make", "--weights",
                          str(tmp_path / "ddp.pt"), "--batches", "batches.pt")
    assert _measured(code, out) and err == "", err
    assert "(a state dict, the prefix 'module.' stripped from its keys (as --strip-prefix module. does))" in out
    code, out, err = _run(folder, monkeypatch, capsys, "--model", f"{MODULE}:make", "--weights",
                          str(tmp_path / "weights.safetensors"), "--batches", "batches.pt")
    assert _measured(code, out) and err == "" and "weights.safetensors (a state dict)" in out, err


# ----------------------------------------------------------------------------- Lightning
def test_a_lightning_trainer_checkpoint_is_read_from_its_state_dict_entry(user, tmp_path, monkeypatch, capsys):
    """Two training steps of a tiny LightningModule on CPU, ``trainer.save_checkpoint``: the ``.ckpt`` holds the
    network under ``state_dict`` with keys under ``net.``, beside the loops', optimizer's and hyperparameters'
    entries. The check loads exactly the trained network's tensors and reports as on its plain state dict."""
    L = import_optional("lightning.pytorch")
    folder, nets, batches = user

    class Classifier(L.LightningModule):
        def __init__(self, width: int = 8, lr: float = 0.01):
            super().__init__()
            self.save_hyperparameters()
            self.net = nets.make(width)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    module = Classifier()
    data = torch.utils.data.TensorDataset(torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches]))
    trainer = L.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    trained = {k: v.detach().clone() for k, v in module.net.state_dict().items()}
    torch.save(trained, tmp_path / "plain.pt")

    model = nets.make()
    assert not _equal_states(model, trained)  # training moved the weights: the comparison below can fail
    kind = load_weights(model, tmp_path / "last.ckpt")
    assert _equal_states(model, trained) and kind.startswith("a checkpoint dict, its 'state_dict' entry")
    _same_report(check_checkpoint(nets.make(), batches, weights=tmp_path / "last.ckpt"),
                 check_checkpoint(nets.make(), batches, weights=tmp_path / "plain.pt"))
    code, out, err = _run(folder, monkeypatch, capsys, "--model", f"{MODULE}:make", "--weights",
                          str(tmp_path / "last.ckpt"), "--batches", "batches.pt")
    assert _measured(code, out) and err == "", err
    assert ("(a checkpoint dict, its 'state_dict' entry, the prefix 'net.' stripped from its keys (as "
            "--strip-prefix net. does))") in out


# ----------------------------------------------------------------------------- timm
def test_a_timm_training_checkpoint_of_a_timm_model_with_its_ema_copy(user, tmp_path, monkeypatch, capsys):
    """timm's ``CheckpointSaver`` writes ``last.pth.tar`` with the weights (``state_dict``), the EMA's
    (``state_dict_ema``) and the script's arguments; the model comes from ``timm:create_model`` with keyword
    arguments. The default reads ``state_dict`` and names the EMA copy; ``--weights-key state_dict_ema`` reads
    the EMA's tensors exactly."""
    timm = import_optional("timm")
    folder, _, batches = user
    kwargs = {"model_name": "test_resnet", "num_classes": 4}
    model = timm.create_model(**kwargs)
    ema = timm.utils.ModelEmaV3(model)  # a copy of the weights now
    _stale(model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)  # the weights move on; the EMA copy stays behind
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    saver = timm.utils.CheckpointSaver(model, optimizer, args=argparse.Namespace(model="test_resnet", lr=0.1),
                                       model_ema=ema, checkpoint_dir=str(tmp_path), recovery_dir=str(tmp_path))
    saver.save_checkpoint(epoch=0, metric=0.5)
    checkpoint = tmp_path / "last.pth.tar"
    assert isinstance(torch.load(checkpoint, weights_only=False)["args"], argparse.Namespace)

    built = model_from_factory("timm:create_model", kwargs)
    assert "a checkpoint dict, its 'state_dict' entry" in load_weights(built, checkpoint)
    assert _equal_states(built, model.state_dict())
    assert not _equal_states(built, ema.module.state_dict())  # the two copies differ: the next check can fail
    load_weights(built, checkpoint, key="state_dict_ema")
    assert _equal_states(built, ema.module.state_dict())

    args = ("--model", "timm:create_model", "--model-kwargs", '{"model_name": "test_resnet", "num_classes": 4}',
            "--weights", str(checkpoint), "--batches", "batches.pt")
    code, out, err = _run(folder, monkeypatch, capsys, *args)
    assert _measured(code, out) and err == "", err
    assert "it also holds 'state_dict_ema' (--weights-key state_dict_ema checks that copy)" in out
    code, out, err = _run(folder, monkeypatch, capsys, *args, "--weights-key", "state_dict_ema")
    assert _measured(code, out) and err == "" and "(a checkpoint dict, its 'state_dict_ema' entry)" in out, err


def test_state_of_reads_a_model_a_state_dict_and_the_checkpoint_dicts_of_the_suite_and_lightning():
    """``checkpoints.state_of`` (what averaging and ``compare_states`` read) finds the same tensors in a model,
    its state dict, the suite's checkpoint dict (``model``) and a Lightning-style one (``state_dict``); anything
    else is a TypeError that says what it holds."""
    from bnrotation.checkpoints import state_of

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    want = net.state_dict()
    for given in (net, dict(want), {"model": dict(want), "step": 3, "row": "adam"},
                  {"state_dict": dict(want), "epoch": 1}):
        got = state_of(given)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    for bad, says in (([1, 2], "holds a list"), ({}, "holds no state dict"), ({"weights": [1]}, "'weights'")):
        with pytest.raises(TypeError, match=says):
            state_of(bad)
