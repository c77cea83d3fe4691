"""The check and the audit read what the averaging helpers save, as they save it, with no flag, through one reader
(:func:`bnrotation.checkpoints.read_weights`, under :func:`bnrotation.inputs.load_saved`): torch's
``AveragedModel`` state dict (``n_averaged`` beside the ``module.`` keys, with ``use_buffers`` and without),
Lightning's ``WeightAveraging`` checkpoint written by a real ``Trainer``, timm's ``ModelEmaV3`` state dict. Each file
is the one the helper itself wrote (``torch.save`` of its ``state_dict()``, or Lightning's own ``ModelCheckpoint``).
The second cases: the same model one level deeper (a wrapper in a wrapper, a ``ModuleDict``, a child of a
``Sequential``), ``strip_prefix=""`` passed on purpose, and a file that cannot be mapped (one line naming the fix,
exit 2)."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from thirdparty import import_optional, import_timm
from torch.optim.swa_utils import AveragedModel

from bnrotation import audit as audit_module
from bnrotation.audit import audit_averaged
from bnrotation.check import check_checkpoint, main
from bnrotation.checkpoints import read_weights
from bnrotation.inputs import InputError, load_saved, load_weights

torch.set_num_threads(1)
MODULE = "averaged_nets"
SOURCE = '''
import torch
import torch.nn as nn


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))
'''


class Wrap(nn.Module):
    """A wrapper of the kind users write around a network: the network under ``inner``."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


class Holder(nn.Module):
    """A LightningModule-like holder: the network under ``net`` beside a loss's buffer of its own."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net
        self.register_buffer("class_weights", torch.ones(3))

    def forward(self, x):
        return self.net(x)


@pytest.fixture(scope="module")
def nets(tmp_path_factory):
    """The user's factory module (``averaged_nets:make``) in a folder on ``sys.path``, with a probe file."""
    folder = tmp_path_factory.mktemp("averaged")
    (folder / f"{MODULE}.py").write_text(SOURCE)
    sys.path.insert(0, str(folder))
    import importlib
    module = importlib.import_module(MODULE)
    x, y = _data()
    torch.save([(x[64:], y[64:])], folder / "probe.pt")
    yield folder, module
    sys.path.remove(str(folder))
    sys.modules.pop(MODULE, None)


def _data(n: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (n, 3, 8, 8) whose class is the channel with the largest mean: a task a few Adam steps learn."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, 3, 8, 8, generator=g) + 0.5 * torch.randn(n, 3, 1, 1, generator=g)
    return x, x.mean((2, 3)).argmax(1)


def _train(model: nn.Module, steps: int, after_step=lambda: None) -> None:
    """``steps`` Adam steps on batches of 32, ``after_step()`` after each; the model left in evaluation mode."""
    x, y = _data()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    for step in range(steps):
        i = (step * 32) % 64
        loss = F.cross_entropy(model(x[i:i + 32]), y[i:i + 32])
        opt.zero_grad()
        loss.backward()
        opt.step()
        after_step()
    model.eval()


def _equal_states(model: nn.Module, want: dict) -> bool:
    got = model.state_dict()
    return set(got) == set(want) and all(torch.equal(got[k], want[k].to(got[k].device)) for k in got)


def _run(command, folder, monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.chdir(folder)
    capsys.readouterr()  # what ran before (a Trainer's log lines) is not the command's
    code = command(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _judged(code: int, out: str, err: str) -> bool:
    """The command read its inputs and gave a verdict: 0, 1, or 2 saying "Undetermined" on stdout, and nothing on
    stderr (bad input exits 2 with one line there)."""
    return err == "" and (code in (0, 1) or (code == 2 and "Undetermined" in out))


# ----------------------------------------------------------------------------- torch AveragedModel
@pytest.mark.parametrize("use_buffers", [False, True])
def test_an_averaged_models_state_dict_is_read_without_a_flag(use_buffers, nets, tmp_path, monkeypatch, capsys):
    """``torch.save(AveragedModel(...).state_dict())`` after 5 updates: the check loads exactly the module's tensors
    and says so, gives the report of the same tensors saved plainly, and the audit reads the same file through the
    same reader (its update count from ``n_averaged``). ``--strip-prefix module.``, the fix the check used to ask
    for, still works and says what it did."""
    folder, user = nets
    raw = user.make()
    swa = AveragedModel(raw, use_buffers=use_buffers)
    _train(raw, 5, lambda: swa.update_parameters(raw))
    torch.save(swa.state_dict(), tmp_path / "swa.pt")
    torch.save(swa.module.state_dict(), tmp_path / "plain.pt")
    torch.save(raw.state_dict(), tmp_path / "raw.pt")
    assert "n_averaged" in torch.load(tmp_path / "swa.pt", weights_only=True)  # the file as torch saves it

    model = user.make()
    assert not _equal_states(model, swa.module.state_dict())  # five updates moved the weights: the next can fail
    saved = load_saved(model, tmp_path / "swa.pt")
    assert _equal_states(model, swa.module.state_dict()) and saved.updates == 5
    assert saved.kind == ("a state dict, torch AveragedModel's: its module's keys under 'module.', beside "
                          "n_averaged 5")
    a = check_checkpoint(user.make(), folder / "probe.pt", weights=tmp_path / "swa.pt")
    b = check_checkpoint(user.make(), folder / "probe.pt", weights=tmp_path / "plain.pt")
    assert a.layers.equals(b.layers) and (a.mode_gap, a.stale) == (b.mode_gap, b.stale)
    code, out, err = _run(main, folder, monkeypatch, capsys, "--model", f"{MODULE}:make", "--weights",
                          str(tmp_path / "swa.pt"), "--batches", "probe.pt")
    assert _judged(code, out, err), err
    assert "torch AveragedModel's: its module's keys under 'module.', beside n_averaged 5" in out
    assert load_weights(user.make(), tmp_path / "swa.pt", prefix="module.") == (
        "a state dict, its keys under 'module.' (1 other keys left out)")

    code, out, err = _run(audit_module.main, folder, monkeypatch, capsys, str(tmp_path / "raw.pt"),
                          str(tmp_path / "swa.pt"), "--model", f"{MODULE}:make", "--batches", "probe.pt")
    assert _judged(code, out, err) and ", 5 averaging updates." in out.splitlines()[0], err


# ----------------------------------------------------------------------------- one level deeper
DEEPER = {
    "a wrapper in a wrapper": (lambda net: Wrap(Wrap(net)), "module.inner.inner."),
    "a ModuleDict": (lambda net: nn.ModuleDict({"net": net}), "module.net."),
    "a child of a Sequential": (lambda net: nn.Sequential(net), "module.0."),
}


@pytest.mark.parametrize("case", list(DEEPER))
def test_an_averaged_model_of_the_network_one_level_deeper(case, nets, tmp_path):
    """The averaged network inside another module: the wrapper's prefix is stripped after the ``AveragedModel``'s,
    the report names the ``--strip-prefix`` that does both, and that flag, given, loads the same tensors."""
    _, user = nets
    wrap, flag = DEEPER[case]
    net = user.make()
    swa = AveragedModel(wrap(net))
    _train(net, 3, lambda: swa.update_parameters(wrap(net)))
    torch.save(swa.state_dict(), tmp_path / "swa.pt")
    want = {k.removeprefix(flag[len("module."):]): v for k, v in swa.module.state_dict().items()}

    model = user.make()
    assert not _equal_states(model, want)
    kind = load_weights(model, tmp_path / "swa.pt")
    assert _equal_states(model, want), kind
    assert kind.endswith(f"stripped from its keys (as --strip-prefix {flag} does)"), kind
    again = user.make()
    load_weights(again, tmp_path / "swa.pt", prefix=flag)
    assert _equal_states(again, want)


def test_a_model_one_level_deeper_than_the_averaged_network_gets_the_prefix_added(nets, tmp_path):
    """The other way round: the file is the bare network's average, the model is that network in a wrapper in a
    wrapper: the model's shared prefix is added to the module's keys."""
    _, user = nets
    net = user.make()
    swa = AveragedModel(net)
    _train(net, 3, lambda: swa.update_parameters(net))
    torch.save(swa.state_dict(), tmp_path / "swa.pt")
    model = Wrap(Wrap(user.make()))
    kind = load_weights(model, tmp_path / "swa.pt")
    assert _equal_states(model.inner.inner, swa.module.state_dict())
    assert kind.endswith("the prefix 'inner.inner.' added to its keys (the model's own keys all start with it)")


def test_an_averaged_models_file_loads_as_saved_into_an_averaged_model(nets, tmp_path):
    """The model is itself the ``AveragedModel``: its own keys are the file's, so nothing is unwrapped."""
    _, user = nets
    net = user.make()
    swa = AveragedModel(net)
    _train(net, 3, lambda: swa.update_parameters(net))
    torch.save(swa.state_dict(), tmp_path / "swa.pt")
    model = AveragedModel(user.make())
    assert load_weights(model, tmp_path / "swa.pt") == "a state dict"
    assert _equal_states(model, swa.state_dict())


def test_an_averaged_file_that_does_not_map_names_the_flag_that_does_in_one_line(nets, tmp_path, monkeypatch,
                                                                                 capsys):
    """An ``AveragedModel`` of a holder whose network sits beside a buffer of its own: no prefix is shared, so the
    check stops with exit 2 and one line naming ``--strip-prefix module.net.`` (the keys as saved); given, that flag
    reads the file."""
    folder, user = nets
    net = user.make()
    swa = AveragedModel(Holder(net))
    torch.save(swa.state_dict(), tmp_path / "holder.pt")
    args = ("--model", f"{MODULE}:make", "--weights", str(tmp_path / "holder.pt"), "--batches", "probe.pt")
    code, out, err = _run(main, folder, monkeypatch, capsys, *args)
    assert (code, out) == (2, "") and len(err.splitlines()) == 1, err
    assert err.rstrip().endswith("its keys under 'module.net.' fit the model: --strip-prefix module.net."), err
    code, out, err = _run(main, folder, monkeypatch, capsys, *args, "--strip-prefix", "module.net.")
    assert _judged(code, out, err), err
    assert "its keys under 'module.net.' (2 other keys left out)" in out


# ----------------------------------------------------------------------------- an empty prefix, on purpose
def test_an_empty_strip_prefix_keeps_every_key_as_saved(nets, tmp_path):
    """``strip_prefix=""`` is a value, not the default: the keys as saved, nothing stripped and no averaging
    layout read, so an ``AveragedModel``'s file does not fit the bare network (its ``n_averaged`` named), while a
    plain state dict loads and the report says the keys were kept."""
    _, user = nets
    net = user.make()
    swa = AveragedModel(net)
    torch.save(swa.state_dict(), tmp_path / "swa.pt")
    torch.save(net.state_dict(), tmp_path / "plain.pt")
    load_weights(user.make(), tmp_path / "swa.pt")  # the default reads it
    with pytest.raises(InputError, match="does not fit the model: missing key '0.weight'.*unexpected key "
                                         "'n_averaged'"):
        load_weights(user.make(), tmp_path / "swa.pt", prefix="")
    assert load_weights(user.make(), tmp_path / "plain.pt", prefix="") == (
        "a state dict, its keys as saved (--strip-prefix '')")


# ----------------------------------------------------------------------------- Lightning WeightAveraging
def test_a_lightning_weight_averaging_checkpoint_is_read_as_lightning_wrote_it(nets, tmp_path, monkeypatch, capsys):
    """Four steps of a LightningModule under a real ``Trainer`` with ``WeightAveraging``, the checkpoint written by
    Lightning's own ``ModelCheckpoint`` at the last step: the check reads the averaged copy (its ``state_dict``)
    and names the raw model beside it, whose ``--weights-key`` reads it; the audit takes both from the one file."""
    L = import_optional("lightning.pytorch")
    folder, user = nets

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = user.make()

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

    x, y = _data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:64], y[:64]), batch_size=16)
    averaging = L.callbacks.WeightAveraging()
    saver = L.callbacks.ModelCheckpoint(dirpath=tmp_path, filename="last", every_n_train_steps=4)
    trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, callbacks=[averaging, saver])
    module = Classifier()
    trainer.fit(module, loader)
    ckpt = tmp_path / "last.ckpt"
    contents = torch.load(ckpt, weights_only=True)
    assert {"state_dict", "current_model_state", "averaging_state"} <= set(contents)  # as Lightning saved it
    averaged = {k.removeprefix("net."): v for k, v in contents["state_dict"].items()}
    raw = {k.removeprefix("net."): v for k, v in contents["current_model_state"].items()}
    assert not all(torch.equal(averaged[k], raw[k]) for k in raw)  # two copies: reading the wrong one can fail
    assert _equal_states(averaging._average_model.module.net, averaged)

    saved = read_weights(contents)
    assert saved.updates == 4 and set(saved.raw) == set(contents["current_model_state"])
    model = user.make()
    kind = load_weights(model, ckpt)
    assert _equal_states(model, averaged)
    assert kind == ("a checkpoint dict, its 'state_dict' entry, the averaged copy Lightning's WeightAveraging saves "
                    "there (n_averaged 4); the raw model is under 'current_model_state' (--weights-key "
                    "current_model_state), the prefix 'net.' stripped from its keys (as --strip-prefix net. does)")
    assert load_weights(user.make(), ckpt, prefix="net.").startswith(  # a prefix named: still Lightning's copy
        "a checkpoint dict, its 'state_dict' entry, the averaged copy Lightning's WeightAveraging saves there")
    load_weights(model, ckpt, key="current_model_state")
    assert _equal_states(model, raw)

    code, out, err = _run(main, folder, monkeypatch, capsys, "--model", f"{MODULE}:make", "--weights", str(ckpt),
                          "--batches", "probe.pt")
    assert _judged(code, out, err) and "Lightning's WeightAveraging" in out, err
    code, out, err = _run(audit_module.main, folder, monkeypatch, capsys, str(ckpt), str(ckpt), "--model",
                          f"{MODULE}:make", "--batches", "probe.pt")
    assert _judged(code, out, err) and ", 4 averaging updates." in out.splitlines()[0], err
    report = audit_averaged(None, contents, _data()[0][64:], model=Classifier())
    assert report.updates == 4 and not report.same_weights


# ----------------------------------------------------------------------------- timm ModelEmaV3
def test_a_timm_model_ema_v3_state_dict_is_read_without_a_flag(nets, tmp_path, monkeypatch, capsys):
    """``torch.save(ModelEmaV3(model).state_dict())`` after 5 updates: its ``module.`` keys are stripped, saying so,
    the check loads exactly the EMA's tensors, and the audit reads the same file."""
    timm = import_timm()
    folder, user = nets
    raw = user.make()
    ema = timm.utils.ModelEmaV3(raw, decay=0.5)
    _train(raw, 5, lambda: ema.update(raw))
    torch.save(ema.state_dict(), tmp_path / "ema.pt")
    torch.save(raw.state_dict(), tmp_path / "raw.pt")
    model = user.make()
    assert not _equal_states(model, ema.module.state_dict())
    kind = load_weights(model, tmp_path / "ema.pt")
    assert _equal_states(model, ema.module.state_dict())
    assert kind == "a state dict, the prefix 'module.' stripped from its keys (as --strip-prefix module. does)"
    code, out, err = _run(main, folder, monkeypatch, capsys, "--model", f"{MODULE}:make", "--weights",
                          str(tmp_path / "ema.pt"), "--batches", "probe.pt")
    assert _judged(code, out, err), err
    code, out, err = _run(audit_module.main, folder, monkeypatch, capsys, str(tmp_path / "raw.pt"),
                          str(tmp_path / "ema.pt"), "--model", f"{MODULE}:make", "--batches", "probe.pt")
    assert _judged(code, out, err) and "Buffer policy: averaged" in out, (err, out)
