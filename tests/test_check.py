"""The offline check of a saved model (python -m bnrotation.check, make check) on models the suite did not define:
a stale one, a re-estimated one, a hand computation, and every bad input."""

from __future__ import annotations

import importlib
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from bnrotation.bnstats import batch_statistics, reestimate
from bnrotation.check import MESSAGE_CHARS, CheckInputError, check_checkpoint, format_report, load_batches, main
from bnrotation.monitor import StalenessMonitor, Thresholds

ROOT = Path(__file__).resolve().parents[1]
MODULE = "check_nets"  # the user's module, imported by name from the current directory
SOURCE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Res(nn.Module):
    """A stem and one residual block, BatchNorm after each convolution."""

    def __init__(self):
        super().__init__()
        self.stem, self.bn0 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv1, self.bn1 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        x = F.relu(self.bn0(self.stem(x)))
        x = F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))
        return self.head(x.mean((2, 3)))


class Marker:
    """Pickled by reference: a checkpoint holding one needs arbitrary code to load."""


def make():
    torch.manual_seed(0)
    return Res()


def make_gn():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.Flatten(), nn.Linear(144, 2))


def not_a_module():
    return 3


def broken():
    raise RuntimeError("no weights here")


NOT_CALLABLE = 5


def loader():
    return iter(torch.load("batches.pt", weights_only=True))


def endless():
    g = torch.Generator().manual_seed(0)
    while True:
        yield torch.randn(4, 3, 8, 8, generator=g)


def number():
    return 7
'''


@pytest.fixture(scope="module")
def nets(tmp_path_factory):
    """A folder holding the user's module, a stale checkpoint, a re-estimated one and the batches:
    labels are the model's own training-mode predictions, so training-mode accuracy is 100%. Each sample's
    channels are offset (a per-sample shift of 1 σ) so that those predictions span three classes: on inputs that
    are noise alone this untrained net predicts one class, a probe on which a constant guess scores 100%, and whose
    "not stale" the monitor refuses (undetermined)."""
    folder = tmp_path_factory.mktemp("user")
    (folder / f"{MODULE}.py").write_text(SOURCE)
    sys.path.insert(0, str(folder))
    user = importlib.import_module(MODULE)
    model = user.make()
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(32, 3, 8, 8, generator=g) + torch.randn(32, 3, 1, 1, generator=g) for _ in range(3)]
    with torch.no_grad(), batch_statistics(model):
        batches = [(x, model(x).argmax(1)) for x in xs]
    reestimate(model, xs)
    torch.save(model.state_dict(), folder / "fresh.pt")
    with torch.no_grad():
        model.bn1.running_mean += 2.0 * model.bn1.running_var.sqrt()  # stale by 2σ in every channel of bn1
    torch.save({"model": model.state_dict(), "step": 100}, folder / "stale.pt")  # the suite's checkpoint layout
    torch.save(batches, folder / "batches.pt")
    yield folder, user, batches
    sys.path.remove(str(folder))
    sys.modules.pop(MODULE, None)


def run_main(nets, monkeypatch, capsys, *args: str, weights: str = "stale.pt", batches: str = "batches.pt",
             model: str = f"{MODULE}:make"):
    monkeypatch.chdir(nets[0])
    code = main(["--model", model, "--weights", weights, "--batches", batches, *args])
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- stale, re-estimated
def test_a_stale_model_exits_1_naming_the_layer_and_a_re_estimated_one_exits_0(nets, monkeypatch, capsys):
    code, out, err = run_main(nets, monkeypatch, capsys)
    assert code == 1 and err == ""
    assert "| bn1 | conv1 | 8 | 2.000 |" in out  # the shifted layer: 2σ in every channel
    assert "| bn2 | conv2 | 8 | 0.000 |" in out
    assert "STALE: mode gap" in out and "2.000σ (bn1) ≥ 0.1σ" in out
    assert "training mode 100.0%" in out and "not a held-out score" in out
    assert "stale.pt (a checkpoint dict, its 'model' entry)" in out and "3 batches, 96 samples, with labels" in out
    code, out, _ = run_main(nets, monkeypatch, capsys, weights="fresh.pt")
    # the gap of 32-sample batch statistics against statistics pooled over all 96; E and the lag are 0 by construction
    assert code == 0 and "Not stale: mode gap 0.052 ≥ 0.05 and (worst median E 0.000σ" in out and "(a state dict)" in out


def test_the_report_is_the_monitors_on_one_batch_and_the_re_estimated_accuracy_recovers(nets):
    folder, user, batches = nets
    model = user.make()
    report = check_checkpoint(model, [batches[0]], weights=folder / "stale.pt")
    # one batch: the re-estimated statistics are that batch's, the monitor's fresh statistics of its probe
    record = StalenessMonitor(model, batches[0], warn=False)(1)
    monitor = record.layers.set_index("norm_layer")["lag_median_abs_sigma"]
    lags = report.layers.set_index("norm_layer")
    for name in ("bn0", "bn1", "bn2"):  # the check's record is the monitor's, on the same batch
        assert lags.loc[name, "lag_median_abs_sigma"] == pytest.approx(monitor[name], rel=1e-12, abs=1e-12)
    assert lags["layer"].tolist() == ["stem", "conv1", "conv2"]  # the weight layer feeding each
    assert report.mode_gap == pytest.approx(float(record.checks["mode_gap"].iloc[0]))
    assert report.stale == record.stale is True
    assert report.acc_train_mode == 1.0 and report.acc_eval_mode < 0.95, report.before.checks
    assert report.acc_eval_mode_reestimated > report.acc_eval_mode and report.mode_gap_reestimated < 0.05
    assert report.weights == "a checkpoint dict, its 'model' entry" and report.batches == 1
    strict = check_checkpoint(model, [batches[0]], thresholds=Thresholds(lag_sigma=2.5, eval_error_sigma=math.inf))
    assert not strict.stale and strict.thresholds.lag_sigma == 2.5


def test_numbers_equal_a_hand_computation_on_a_tiny_model():
    """Linear (3 -> 4) -> BatchNorm1d(4) -> Linear (4 -> 3), two batches of 6: every number by hand."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4, bias=False), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 3))
    bn = model[1]
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5, 1.5]))
        bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
        bn.running_mean.copy_(torch.tensor([0.5, -1.0, 0.0, 2.0]))
        bn.running_var.copy_(torch.tensor([1.0, 4.0, 0.25, 2.0]))
    xs = [torch.randn(6, 3), torch.randn(6, 3) + 1.0]
    ys = [torch.tensor([0, 1, 2, 0, 1, 2]), torch.tensor([2, 2, 1, 1, 0, 0])]
    report = check_checkpoint(model, list(zip(xs, ys)))

    w, eps = model[0].weight.detach().double(), bn.eps
    zs = [x.double() @ w.T for x in xs]  # (6, 4): the BatchNorm's inputs
    fresh_mean = sum(z.mean(0) for z in zs) / 2  # the cumulative average of the two batch means
    fresh_var = sum(z.var(0, unbiased=True) for z in zs) / 2
    lag = (bn.running_mean.double() - fresh_mean) / (fresh_var + eps).sqrt()  # (4,), the layer's own σ
    line = report.layers.iloc[0]
    assert line["lag_median_abs_sigma"] == pytest.approx(float(lag.abs().median()), rel=1e-5)  # the lower middle
    assert line["worst_channel"] == int(lag.abs().argmax())
    assert report.before.channels["lag_sigma"].iloc[int(lag.abs().argmax())] == pytest.approx(
        float(lag[lag.abs().argmax()]), rel=1e-5)

    def head(u):
        normed = u * bn.weight.detach().double() + bn.bias.detach().double()
        return normed @ model[2].weight.detach().double().T + model[2].bias.detach().double()

    train = [head((z - z.mean(0)) / (z.var(0, unbiased=False) + eps).sqrt()) for z in zs]  # batch statistics
    stored = [head((z - bn.running_mean.double()) / (bn.running_var.double() + eps).sqrt()) for z in zs]
    fresh = [head((z - fresh_mean) / (fresh_var + eps).sqrt()) for z in zs]
    y = torch.cat(ys)

    def acc(outs):
        return float((torch.cat(outs).argmax(1) == y).double().mean())

    assert report.acc_train_mode == acc(train) and report.acc_eval_mode == acc(stored)
    assert report.acc_eval_mode_reestimated == acc(fresh)
    assert report.mode_gap == pytest.approx(acc(train) - acc(stored))
    assert report.samples == 12 and report.labelled
    assert report.stale == (acc(train) - acc(stored) >= 0.05 and float(lag.abs().median()) >= 0.25)
    # without labels: the share of samples predicted differently in the two modes
    unlabelled = check_checkpoint(model, xs)
    differ = float((torch.cat(train).argmax(1) != torch.cat(stored).argmax(1)).double().mean())
    assert unlabelled.mode_gap == pytest.approx(differ) and math.isnan(unlabelled.acc_eval_mode)
    assert torch.equal(bn.running_mean, torch.tensor([0.5, -1.0, 0.0, 2.0]))  # the stored statistics put back


def test_the_check_reads_and_checks_each_batch_once_and_pairs_and_lints_the_model_once(monkeypatch):
    """From --batches to the monitor: each batch is checked against the model once (one eager pass on its first
    two samples, :func:`probe_batch.check_probe`), the model is paired and linted once (one monitor asked before
    and after re-estimation), and every buffer the re-estimation replaced is put back, bit for bit."""
    import bnrotation.monitor as monitor_module

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 3))
    model[1].running_mean.fill_(0.5)
    stored = {k: v.clone() for k, v in model.state_dict().items()}
    calls = {"find_pairs": 0, "lint_batchnorm": 0}
    for name in calls:
        def counted(*args, _f=getattr(monitor_module, name), _name=name, **kwargs):
            calls[_name] += 1
            return _f(*args, **kwargs)
        monkeypatch.setattr(monitor_module, name, counted)
    heads = []  # the batch sizes of the evaluation-mode passes on two samples: check_probe's
    model.register_forward_hook(lambda m, args, out: heads.append(len(args[0])) if not m.training else None)
    batches = [(torch.randn(8, 3), torch.randint(0, 3, (8,))) for _ in range(3)]
    report = check_checkpoint(model, batches)
    assert heads.count(2) == 3 and calls == {"find_pairs": 1, "lint_batchnorm": 1}
    assert (report.before.step, report.after.step) == (0, 1) and report.batches == 3
    assert report.worst_median_lag_sigma > 0.1 > float(report.after.layers["lag_median_abs_sigma"].max())
    assert all(torch.equal(v, stored[k]) for k, v in model.state_dict().items())


def test_batches_from_a_function_a_dict_and_an_endless_loader(nets, monkeypatch, capsys):
    folder, _, batches = nets
    code, out, _ = run_main(nets, monkeypatch, capsys, batches=f"{MODULE}:loader")
    assert code == 1 and "on check_nets:loader: 3 batches, 96 samples" in out
    torch.save({"image": batches[0][0], "label": batches[0][1]}, folder / "dict.pt")
    code, out, _ = run_main(nets, monkeypatch, capsys, "--input-key", "image", "--target-key", "label",
                            batches="dict.pt")
    assert code == 1 and "1 batch, 32 samples, with labels" in out
    code, out, _ = run_main(nets, monkeypatch, capsys, "--max-batches", "5", batches=f"{MODULE}:endless")
    assert code in (0, 1) and "5 batches, 20 samples, without labels (stopped after the first 5" in out
    data, more = load_batches(batches[0][0])  # a tensor is one batch
    assert len(data) == 1 and data[0][1] is None and not more


def test_a_probe_too_small_for_the_gap_threshold_warns_in_one_line_and_is_undetermined(nets, monkeypatch, capsys):
    """8 samples: one moves the mode gap by 12.5%, more than the 0.05 threshold, so one sample alone can cross it
    (the monitor warns at construction for such a probe, MonitorSetupWarning). The check says so in one line on
    stderr, naming the smallest probe (probe_batch.smallest_probe: 20) and what sets the size (--batches, or
    --max-batches when it cut the batches short), and gives no verdict: Undetermined, exit 2 (issue 48: a CI
    gate on the check must not fail, or pass, on noise). With a threshold that 8 samples can decide it judges."""
    from bnrotation.probe_batch import smallest_probe
    folder, user, batches = nets
    small = _save(folder, "small.pt", [(batches[0][0][:8], batches[0][1][:8])])
    quiet = check_checkpoint(user.make(), [(batches[0][0][:8], batches[0][1][:8])], weights=folder / "stale.pt",
                             thresholds=Thresholds(mode_gap=0.2))  # 1/8 under 0.2: nothing to say
    code, out, err = run_main(nets, monkeypatch, capsys, batches=small)
    assert code == 2 and "Undetermined: a probe of 8 samples" in out
    assert "1 batch, 8 samples" in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: --batches"), err
    assert len(lines[0]) <= len("warning: ") + MESSAGE_CHARS, err
    assert "8 samples" in err and "12.5%" in err and f"at least {smallest_probe(0.05)} samples" in err, err
    code, out, err = run_main(nets, monkeypatch, capsys, "--mode-gap", "0.2", batches=small)
    assert err == "" and quiet.warnings == ()
    assert code == (1 if quiet.stale else 0) and ("STALE" in out or "Not stale" in out)  # it judged
    # an endless loader cut short by --max-batches: 2 batches of 4, and the flag to raise is named
    code, out, err = run_main(nets, monkeypatch, capsys, "--max-batches", "2", batches=f"{MODULE}:endless")
    assert code == 2 and "2 batches, 8 samples" in out
    assert len(err.strip().splitlines()) == 1 and "at least 20 samples" in err and "--max-batches" in err, err
    report = check_checkpoint(user.make(), [(batches[0][0][:8], batches[0][1][:8])])
    assert len(report.warnings) == 1 and "at least 20 samples" in report.warnings[0]


# ----------------------------------------------------------------------------- bad input: one line, exit 2
def _save(folder: Path, name: str, obj) -> str:
    torch.save(obj, folder / name)
    return name


BAD = {
    "module that does not import": (dict(model="no_such_module_xyz:make"), "cannot find 'no_such_module_xyz'"),
    "no such function": (dict(model=f"{MODULE}:missing"), "module 'check_nets' has no 'missing'"),
    "not module:function": (dict(model=MODULE), "expected module:function"),
    "not callable": (dict(model=f"{MODULE}:NOT_CALLABLE"), "'NOT_CALLABLE' is a int, not a function"),
    "factory returns no module": (dict(model=f"{MODULE}:not_a_module"), "returned a int, not a torch.nn.Module"),
    "factory raises": (dict(model=f"{MODULE}:broken"), "the factory raised RuntimeError: no weights here"),
    "no running statistics": (dict(model=f"{MODULE}:make_gn"), "no BatchNorm layer with running statistics"),
    "weights file missing": (dict(weights="nothing.pt"), "--weights: nothing.pt: no such checkpoint"),
    "weights missing a key": ("missing_key", "missing key 'bn1.running_mean'"),
    "weights with an extra key": ("extra_key", "unexpected key 'extra.weight'"),
    "weights of another shape": ("shape", "does not fit the model: key 'head.weight'"),
    "weights not a state dict": ("a_list", "holds a list; expected a state dict"),
    "unsafe checkpoint": ("unsafe", "refused: loading it would run arbitrary code"),
    "unreadable batch file": ("garbage", "--batches: garbage.pt: unreadable checkpoint: not a torch"),
    "batch file missing": (dict(batches="none.pt"), "--batches none.pt: no such file"),
    "batch file of a number": ("number", "holds a int; expected a tensor"),
    "labels that do not match": ("short_labels", "batch 0: probe: 8 inputs but labels"),
    "labels that are not class indices": ("float_labels", "labels must be class indices"),
    "labels on some batches only": ("mixed", "some batches have labels and some do not (the first without: batch 1)"),
    "a batch of one sample": ("one_sample", "batch 0 has 1 sample(s)"),
    "a dict batch without the key": ("dict_batch", "batch 0: a dict of 1 entry ('image') without a tensor under "
                                                   "the input key 'input' (--input-key)\n"),
    "loader returns no iterable": (dict(batches=f"{MODULE}:number"), "returned a int, not an iterable"),
    "model fails on the batch": ("wrong_shape", "batch 0: probe: the model cannot run on the probe inputs "
                                                "(4, 2, 8, 8)"),
    "empty batch list": ("empty", "no batches"),
    "NaN in a batch": ("nan_batch", "nan_batch.pt: batch 1: probe: 1 of 1536 input values are NaN or infinite"),
    # the monitor's validation of a probe, applied to every batch: today's check said "Not stale" here
    "labels outside the model's classes": ("labels_10_to_14", "batch 0: probe: labels must lie in [0, 5) for a "
                                                              "model with 5 outputs, got [5, 9]"),
    "integer inputs": ("integer_inputs", "batch 0: probe: expected floating-point inputs, got torch.int64"),
    # the weights and batches people pass by mistake: one short line
    "a state dict as --batches": ("state_dict_batches", "batch 0: a dict of 20 entries ('stem.weight', "
                                  "'bn0.weight', 'bn0.bias' and 17 more) without a tensor under the input key "
                                  "'input' (--input-key); it looks like a state dict (weights), not a batch"),
    "a text file as --weights": ("text_weights", "--weights: notes.txt: unreadable checkpoint: not a torch "
                                                 "(torch.save) or safetensors file (it begins like text: "
                                                 "'model: resnet18\\nlr: 0.1\\n')"),
    "--weights-key that is not there": (dict(args=("--weights-key", "state_dict_ema")),
                                        "--weights stale.pt: has no entry 'state_dict_ema'; its entries: 'model', "
                                        "'step'"),
    "no state dict, no key": ("no_state_dict", "holds no state dict: a dict of 2 entries ('weights', 'epoch'), "
                                               "none of them 'model' or 'state_dict' holding one; --weights-key"),
    "keys under a prefix, not all of them": ("net_and_loss", "missing key 'stem.weight' (and 16 more); unexpected "
                                             "key 'net.stem.weight' (and 20 more); its keys under 'net.' fit the "
                                             "model: --strip-prefix net."),
    "--strip-prefix that no key has": (dict(args=("--strip-prefix", "module.")),
                                       "--strip-prefix module.: no key starts with it; its keys: 'stem.weight',"),
    "--model-kwargs not JSON": (dict(args=("--model-kwargs", "{num_classes: 10}")), "--model-kwargs '{num_classes: "
                                                                                    "10}': not JSON"),
    "--model-kwargs not an object": (dict(args=("--model-kwargs", "[10]")), "--model-kwargs '[10]': a JSON list; "
                                                                            "expected an object"),
    "--model-kwargs the factory refuses": (dict(args=("--model-kwargs", '{"width": 3}')),
                                           "the factory raised TypeError: make() got an unexpected keyword"),
    "NaN in a weight": ("nan_weight", "--weights: NaN or infinite values in conv2.weight: the model itself has "
                                      "diverged"),
    "negative threshold": (dict(args=("--lag-sigma", "-1")), "--lag-sigma: Thresholds.lag_sigma: expected"),
    "a gap threshold no gap reaches": (dict(args=("--mode-gap", "2")), "--mode-gap: Thresholds.mode_gap: expected a "
                                                                       "fraction in [0, 1]"),
    "no CUDA here": (dict(args=("--device", "cuda:7")), "--device cuda:7: torch sees"),
}


def _bad_files(folder: Path, user, case: str) -> dict:
    state = user.make().state_dict()
    x = torch.randn(8, 3, 8, 8)
    if case == "missing_key":
        return {"weights": _save(folder, "w.pt", {k: v for k, v in state.items() if k != "bn1.running_mean"})}
    if case == "extra_key":
        return {"weights": _save(folder, "w.pt", {**state, "extra.weight": torch.zeros(2)})}
    if case == "shape":
        return {"weights": _save(folder, "w.pt", {**state, "head.weight": torch.zeros(3, 8)})}
    if case == "a_list":
        return {"weights": _save(folder, "w.pt", [torch.zeros(2)])}
    if case == "unsafe":
        return {"weights": _save(folder, "w.pt", {"model": state, "marker": user.Marker()})}
    if case == "nan_weight":
        state["conv2.weight"][0, 0, 0, 0] = math.nan
        return {"weights": _save(folder, "w.pt", state)}
    if case == "text_weights":
        (folder / "notes.txt").write_text("model: resnet18\nlr: 0.1\n")
        return {"weights": "notes.txt"}
    if case == "state_dict_batches":
        return {"batches": "fresh.pt"}
    if case == "no_state_dict":
        return {"weights": _save(folder, "w.pt", {"weights": state, "epoch": 3})}
    if case == "net_and_loss":  # a LightningModule's network under net. and its loss's buffer beside it
        return {"weights": _save(folder, "w.pt", {**{f"net.{k}": v for k, v in state.items()},
                                                  "loss.weight": torch.ones(5)})}
    if case == "garbage":
        (folder / "garbage.pt").write_bytes(b"not a torch file")
        return {"batches": "garbage.pt"}
    files = {"number": 7, "short_labels": (x, torch.zeros(5, dtype=torch.long)),
             "float_labels": (x, torch.zeros(8)), "mixed": [(x, torch.zeros(8, dtype=torch.long)), x],
             "one_sample": x[:1], "dict_batch": {"image": x}, "wrong_shape": torch.randn(4, 2, 8, 8), "empty": [],
             "nan_batch": [x, x.clone().index_put_((torch.tensor(0),) * 4, torch.tensor(math.nan))],
             "labels_10_to_14": (x, torch.arange(8) % 5 + 5), "integer_inputs": x.long()}
    return {"batches": _save(folder, f"{case}.pt", files[case])}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_exit_2_before_any_work(nets, monkeypatch, capsys, case):
    folder, user, _ = nets
    given, message = BAD[case]
    given = dict(given) if isinstance(given, dict) else _bad_files(folder, user, given)
    args = given.pop("args", ())
    code, out, err = run_main(nets, monkeypatch, capsys, *args, **given)
    assert code == 2 and out == "", (case, out)
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert len(err.strip()) <= len("error: ") + MESSAGE_CHARS, err
    assert message in err, err


def test_non_finite_running_statistics_are_stale_and_named(nets, monkeypatch, capsys):
    """A NaN running mean is reported stale (exit 1) naming it: its layer's lag is NaN, which the rule alone
    would skip, and evaluation mode is unusable."""
    folder, user, _ = nets
    state = torch.load(folder / "fresh.pt", weights_only=True)
    state["bn2.running_mean"][3] = math.nan
    code, out, err = run_main(nets, monkeypatch, capsys, weights=_save(folder, "nan_stats.pt", state))
    assert code == 1 and err == "", err
    assert "STALE: NaN or infinite running statistics in bn2.running_mean (evaluation mode is unusable)" in out


def test_a_bad_input_raises_from_the_function_too(nets):
    _, user, batches = nets
    with pytest.raises(CheckInputError, match="no batches"):
        check_checkpoint(user.make(), [])
    with pytest.raises(CheckInputError, match="no BatchNorm layer"):
        check_checkpoint(user.make_gn(), batches)


def test_the_summary_is_the_reports_verdict_line(nets, monkeypatch, capsys):
    """``CheckReport.summary``, the one line a Python caller prints, is the line the command ends its report with."""
    folder, user, batches = nets
    report = check_checkpoint(user.make(), batches, weights=folder / "stale.pt")
    assert report.summary.startswith("STALE: mode gap ") and "bnrotation.reestimate" in report.summary
    assert format_report(report).splitlines()[-1] == report.summary
    assert check_checkpoint(user.make(), batches, weights=folder / "fresh.pt").summary.startswith("Not stale: ")


def test_the_help_is_plain_text():
    """``--help`` is the module docstring without its Sphinx markup, and its example lines stay lines."""
    help_text = subprocess.run([sys.executable, "-m", "bnrotation.check", "--help"], capture_output=True,
                               text=True, check=True).stdout
    assert not re.search(r":[a-z]+:`|``", help_text), help_text
    assert "--model-kwargs '{\"model_name\": \"resnet18\", \"num_classes\": 10}' \\\n" in help_text


# ----------------------------------------------------------------------------- the real commands
@pytest.mark.slow
def test_the_command_and_make_check_in_a_subprocess(nets):
    folder = nets[0]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), str(ROOT / "src")]))
    done = subprocess.run([sys.executable, "-m", "bnrotation.check", "--model", f"{MODULE}:make", "--weights",
                           "stale.pt", "--batches", "batches.pt"], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and "STALE" in done.stdout and "(bn1)" in done.stdout, done.stderr
    made = subprocess.run(["make", "-s", "check", f"PY={sys.executable}", f"MODEL={MODULE}:make",
                           f"WEIGHTS={folder / 'fresh.pt'}", f"BATCHES={folder / 'batches.pt'}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0 and "Not stale" in made.stdout, made.stderr


def test_a_factory_module_that_fails_while_importing_is_told_apart_from_one_not_found(tmp_path, monkeypatch):
    """timm beside a torchvision built for another torch raises RuntimeError on import: the error must say the
    module was found and failed, not that it is missing (and a module importing a missing one says so too)."""
    from bnrotation.check import CheckInputError, load_function

    (tmp_path / "raises_on_import_xyz.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    (tmp_path / "needs_missing_xyz.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(CheckInputError, match=r"'raises_on_import_xyz' was found but failed while importing "
                                              r"\(RuntimeError: operator torchvision::nms"):
        load_function("raises_on_import_xyz:make", "--model")
    with pytest.raises(CheckInputError, match=r"'needs_missing_xyz' was found but failed while importing: "
                                              r"ModuleNotFoundError"):
        load_function("needs_missing_xyz:make", "--model")
    with pytest.raises(CheckInputError, match=r"cannot find 'absent_module_xyz'"):
        load_function("absent_module_xyz:make", "--model")


# ----------------------------------------------------------------------------- batches on another scale
def _trained_on_normalised_inputs() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A small net trained 200 SGD steps on uniform pixels normalised to unit σ, and 256 fresh normalised samples
    with their labels (which channel is brightest)."""
    import torch.nn.functional as F
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                        nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))
    g = torch.Generator().manual_seed(4)

    def data(n):
        x = torch.rand(n, 3, 8, 8, generator=g) + 0.3 * torch.rand(n, 3, 1, 1, generator=g)
        return (x - 0.65) / 0.3, x.mean((2, 3)).argmax(1)

    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for _ in range(200):
        x, y = data(64)
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval(), *data(256)


@pytest.mark.parametrize("inputs, note", [("normalised", None), ("pixels 0-255", "×"), ("divided by 100", "1/")])
def test_batches_on_another_scale_are_named_before_the_advice_to_re_estimate(inputs, note):
    """Found by a new user: pixels in 0-255 given to a model trained on normalised inputs read STALE (rightly: the
    statistics do not fit those batches), and the advice was to re-estimate on them, which fits the statistics to
    the wrong scale. The first layer's batch σ is then tens of times its running σ (or a small fraction of it,
    the other direction): the verdict asks about the scale first. On the training scale, nothing is added."""
    net, x, y = _trained_on_normalised_inputs()
    x = {"normalised": x, "pixels 0-255": (x * 0.3 + 0.65) * 255, "divided by 100": x / 100}[inputs]
    report = check_checkpoint(net, [(x, y)])
    if note is None:
        assert not report.input_scale and "scaled as the training inputs" not in report.summary
        return
    assert report.input_scale.startswith("The first BatchNorm layer (1) sees a batch σ ") and note in report.input_scale
    if report.stale:  # the rule fired: the scale is asked about before the advice
        assert report.summary.index("scaled as the training inputs") < report.summary.index("If they are: re-estimate")
    else:  # never "not stale" on batches of another scale (0-255 pixels here: E at tens of σ, gap under 0)
        assert report.summary.startswith("Undetermined: The first BatchNorm layer (1)")
    assert {"pixels 0-255": False, "divided by 100": True}[inputs] == report.stale  # both cases are exercised


def test_statistics_moved_by_a_few_sigma_are_not_taken_for_another_scale():
    """The second case: genuinely stale statistics (the first layer's running mean moved by 2σ, its variance
    halved) read STALE with the plain advice: the scale note is for ratios beyond INPUT_SCALE_RATIO alone."""
    net, x, y = _trained_on_normalised_inputs()
    with torch.no_grad():
        net[1].running_mean += 2 * net[1].running_var.sqrt()
        net[1].running_var *= 0.5
    report = check_checkpoint(net, [(x, y)])
    assert report.stale and not report.input_scale and report.summary.endswith("before evaluating or saving this model.")


def test_batches_of_one_class_are_warned_of_and_two_classes_are_not():
    """Found by a new user: labelled batches of one class read STALE and advised re-estimating on them, which fits
    the statistics to that class alone (evaluation mode then 14% on the same batches). The report warns, naming
    the argument; a second class among the labels is enough to stay quiet (the boundary), and so are no labels."""
    from bnrotation.check import one_class_warning

    net, x, y = _trained_on_normalised_inputs()
    one = torch.full_like(y, int(y[0]))
    report = check_checkpoint(net, [(x[:128], one[:128]), (x[128:], one[128:])])
    assert any(w.startswith(f"--batches: every labelled sample is of class {int(y[0])}") for w in report.warnings)
    two = one.clone()
    two[-1] = (int(y[0]) + 1) % 3
    assert one_class_warning([one[:128], two[128:]]) is None and one_class_warning([None]) is None
    assert not [w for w in check_checkpoint(net, [(x, two)]).warnings if "every labelled sample" in w]


@pytest.mark.parametrize("ratio, asked", [(10.0, False), (10.5, True), (1 / 10.0, False), (1 / 10.5, True)])
def test_the_scale_question_starts_past_the_ratio_and_reads_the_first_layer_alone(ratio, asked):
    """The boundary: a first-layer median σ ratio of exactly INPUT_SCALE_RATIO (or its inverse) is not asked about,
    one past it is. The column beside: the second layer's ratio, far off here, is not read (its inputs are already
    normalised by the first), and the median over the first layer's channels is (one channel far off is not)."""
    import types

    import pandas as pd

    from bnrotation.check import INPUT_SCALE_RATIO, CheckReport

    first = [math.log(ratio * INPUT_SCALE_RATIO / 10.0)] * 3 + [math.log(1000.0)] * 2  # median: the first three's
    channels = pd.DataFrame({"norm_layer": ["bn0"] * 5 + ["bn1"] * 3,
                             "log_std_ratio": first + [math.log(1000.0)] * 3})
    fake = types.SimpleNamespace(before=types.SimpleNamespace(channels=channels), first_norm_layer="bn0")
    text = CheckReport.input_scale.fget(fake)
    assert bool(text) == asked
    if asked:
        assert text.startswith("The first BatchNorm layer (bn0) sees a batch σ ")


def test_the_scale_question_reads_the_layer_the_forward_pass_reaches_first():
    """Found by a new user: a tabular net whose input BatchNorm1d has no layer before it (unpaired, so listed after
    the paired layers) had the second layer's ratio read, and features 1000 times their training scale got the
    plain advice. The first layer the forward pass reaches is read: the input BatchNorm."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    net = nn.Sequential(nn.BatchNorm1d(10), nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 3))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(512, 10, generator=g)
    y = x[:, :3].argmax(1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for i in range(100):
        loss = F.cross_entropy(net(x[i % 8 * 64:(i % 8 + 1) * 64]), y[i % 8 * 64:(i % 8 + 1) * 64])
        opt.zero_grad()
        loss.backward()
        opt.step()
    report = check_checkpoint(net.eval(), [(x * 1000, y)])
    assert report.first_norm_layer == "0" and list(report.layers["norm_layer"])[0] != "0"  # the case
    import re
    assert re.match(r"The first BatchNorm layer \(0\) sees a batch σ (9\d\d|1,0\d\d)× its running σ", report.input_scale)
    assert not check_checkpoint(net, [(x, y)]).input_scale


def test_a_stale_verdict_on_batches_of_one_class_advises_re_estimating_on_every_class():
    """Found by a new user: the warning said statistics re-estimated on one-class batches describe that class alone,
    while the verdict still advised re-estimating, without a word on which batches."""
    net, x, y = _trained_on_normalised_inputs()
    with torch.no_grad():
        net[1].running_mean += 2 * net[1].running_var.sqrt()
    one = torch.full_like(y, int(y[0]))
    report = check_checkpoint(net, [(x, one)])
    assert report.stale and report.summary.endswith("on batches of every class as in training, not these.")
    assert check_checkpoint(net, [(x, y)]).summary.endswith("before evaluating or saving this model.")
