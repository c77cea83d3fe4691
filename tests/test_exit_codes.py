"""One exit-code convention for every command that judges (``bnrotation.helptext.EXIT_STATUS``): the same words in
each command's ``--help`` and in the docs, and the check's three codes (the audit's are in ``tests/test_audit.py``,
beside its other command-line cases). ``diagnose`` reports on a run without a verdict (0, or 2 on bad input), so it
is not one of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from bnrotation import audit, check
from bnrotation.bnstats import reestimate
from bnrotation.helptext import EXIT_FOUND, EXIT_NOTHING_FOUND, EXIT_STATUS, EXIT_UNUSABLE, exit_status

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
JUDGING = {"bnrotation-check": check.main, "python -m bnrotation.audit": audit.main}

NETS = '''
import torch
import torch.nn as nn


class Scale(nn.Module):
    """Multiplies its input by a fixed factor: a factor beyond float32's range makes the activations overflow."""

    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


def make(scale=1.0):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), Scale(scale), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3, bias=False))
'''


def _words(text: str) -> str:
    return " ".join(text.split())


def test_the_convention_in_one_function():
    assert (EXIT_NOTHING_FOUND, EXIT_FOUND, EXIT_UNUSABLE) == (0, 1, 2)
    assert [exit_status(False), exit_status(True), exit_status(False, True), exit_status(True, True)] == [0, 1, 2, 1]


@pytest.mark.parametrize("command", JUDGING)
def test_every_judging_command_ends_its_help_with_the_same_words(command, capsys):
    with pytest.raises(SystemExit) as stop:
        JUDGING[command](["--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.rstrip().endswith(EXIT_STATUS)


@pytest.mark.parametrize("doc", ["monitor.md", "troubleshooting.md"])
def test_the_docs_say_it_in_the_same_words(doc):
    text = _words((ROOT / "docs" / doc).read_text())
    assert _words(EXIT_STATUS) in text
    # no other sense of an exit status of the check or the audit is left in the doc
    assert not re.search(r"exit 0 when it names one policy|1 when it cannot", text)


@pytest.fixture()
def files(tmp_path, monkeypatch):
    """The user's factory module, weights re-estimated on the batch (fitting), the same with bn's running mean
    moved by 2σ in every channel (stale), and the batch with labels the model gets right in evaluation mode."""
    (tmp_path / "exit_nets.py").write_text(NETS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from exit_nets import make

    x = torch.randn(32, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    model = make()
    reestimate(model, [x])
    torch.save(model.state_dict(), tmp_path / "fitting.pt")
    with torch.no_grad():
        y = model.eval()(x).argmax(1)
        model[2].running_mean += 2.0 * model[2].running_var.sqrt()
    torch.save(model.state_dict(), tmp_path / "stale.pt")
    torch.save((x, y), tmp_path / "batch.pt")
    yield tmp_path
    import sys
    sys.modules.pop("exit_nets", None)


def _check(capsys, weights: str, *args: str) -> tuple[int, str, str]:
    code = check.main(["--model", "exit_nets:make", "--weights", weights, "--batches", "batch.pt", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_check_exits_0_nothing_found_1_stale_2_undetermined_or_bad_input(files, capsys):
    code, out, err = _check(capsys, "fitting.pt")
    assert (code, err) == (0, "") and "Not stale: mode gap 0.000 < 0.05" in out
    code, out, err = _check(capsys, "stale.pt")
    assert (code, err) == (1, "") and "STALE: mode gap" in out and "2.000σ (2) ≥ 0.1σ" in out
    # activations beyond float32's range: the fresh statistics are NaN, so no lag can cross the threshold
    code, out, err = _check(capsys, "fitting.pt", "--model-kwargs", '{"scale": 1e39}')
    assert (code, err) == (2, "") and out.rstrip().splitlines()[-1].startswith(
        "Undetermined: no layer's lag or E is finite"), out
    code, out, err = _check(capsys, "missing.pt")
    assert (code, out) == (2, "") and err.startswith("error: --weights: missing.pt") and len(err.splitlines()) == 1
