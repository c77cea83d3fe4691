"""experiments/minimal.py, the article's loop in one file: a handful of steps, the same function the bench times."""

from __future__ import annotations

import runpy

import pytest
import torch

from conftest import ROOT

MINIMAL = runpy.run_path(str(ROOT / "experiments" / "minimal.py"))
train, main, parser = MINIMAL["train"], MINIMAL["main"], MINIMAL["parser"]
CPU = torch.device("cpu")
BATCH = 16  # the article's 128 is not what these tests check: 8x less arithmetic per step


def test_a_few_steps_report_both_accuracies_at_each_check():
    seen = []
    out = train(12, {4, 8, 12}, 64, CPU, on_check=lambda *r: seen.append(r), batch_size=BATCH)
    assert out["checks"] == 3 and seen == out["accuracies"] and [s for s, _, _ in seen] == [4, 8, 12]
    for _, acc_train, acc_eval in seen:  # a share of 64 samples: a multiple of 1/64, exactly in float32
        assert 0 <= acc_train <= 1 and 0 <= acc_eval <= 1 and (acc_train * 64).is_integer()
    assert set(out["seconds"]) == {"setup", "train", "checks"} and min(out["seconds"].values()) >= 0


def test_a_check_moves_nothing():
    """The training-mode pass runs on a copy: with a check at every step the network ends exactly where it ends
    with none (same arithmetic in the same order, so bit for bit); a check run on the network itself in training
    mode would move its running statistics and fail this."""
    checked = train(6, set(range(1, 7)), 32, CPU, batch_size=BATCH)["model"].state_dict()
    unchecked = train(6, set(), 32, CPU, batch_size=BATCH)["model"].state_dict()
    assert checked.keys() == unchecked.keys()
    for key in checked:
        assert torch.equal(checked[key], unchecked[key]), key


def test_the_seed_sets_the_run():
    a, b, c = (train(5, {5}, 32, CPU, seed=s, batch_size=BATCH)["model"].state_dict()["0.1.running_mean"]
               for s in (0, 0, 1))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_the_command_prints_the_checks_and_the_lowest(capsys):
    assert main(["--steps", "6", "--check-start", "3", "--check-every", "3", "--heldout", "32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "16x16 images, 6 steps, seed 0"  # the default size
    assert lines[1].startswith("step") and [ln.split()[0] for ln in lines[2:4]] == ["3", "6"]
    assert lines[-1].startswith("lowest evaluation-mode accuracy")


def test_bad_arguments_stop_before_training(capsys):
    assert main(["--steps", "5", "--check-start", "10"]) == 2  # no check would run: nothing to judge, not 0
    out = capsys.readouterr()
    assert "no check would run" in out.err and out.out == ""  # stopped before the header, so before training
    with pytest.raises(SystemExit) as stop:
        main(["--steps", "0"])
    assert stop.value.code == 2 and "--steps" in capsys.readouterr().err


def test_the_size_sets_the_images_and_a_bad_one_stops_before_training(capsys):
    small = train(2, {2}, 8, CPU, batch_size=BATCH, size=8)["model"]
    assert small(torch.zeros(1, 3, 8, 8)).shape == (1, 10)  # the network takes any size of at least 4
    with pytest.raises(SystemExit) as stop:
        main(["--size", "3"])
    assert stop.value.code == 2 and "--size 3" in capsys.readouterr().err


def test_the_docstring_states_the_defaults():
    """The module's docstring says which setting the command runs by default; it must be the parser's."""
    d = parser().parse_args([])
    doc = " ".join(MINIMAL["__doc__"].split())
    assert f"on {d.size}x{d.size} images instead of its 32x32, for {d.steps:,} steps, seed {d.seed}, one thread" in doc
    assert d.threads == 1
