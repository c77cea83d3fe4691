"""A mistyped row stops before anything starts, with the nearest names (issue 63, the newcomer's first screen)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bnrotation.study.cli import _stop_on_unknown_choice

from conftest import ROOT


def test_a_mistyped_choice_names_the_nearest_rows_and_exits_2(tmp_path, capsys):
    (tmp_path / "experiment").mkdir()
    for name in ("adam", "adamw", "sgd"):
        (tmp_path / "experiment" / f"{name}.yaml").write_text("")
    _stop_on_unknown_choice("experiment", "adam", tmp_path)  # a known row: nothing
    with pytest.raises(SystemExit) as stop:
        _stop_on_unknown_choice("experiment", "adma", tmp_path)
    assert stop.value.code == 2
    assert capsys.readouterr().err == ("error: experiment=adma: no conf/experiment/adma.yaml; did you mean adam or "
                                       "adamw?\n")
    with pytest.raises(SystemExit):
        _stop_on_unknown_choice("experiment", "zzz", tmp_path)  # nothing near: every name
    assert "expected one of adam, adamw, sgd" in capsys.readouterr().err
    _stop_on_unknown_choice("experiment", "adma", tmp_path / "nowhere")  # no conf folder (a wheel): Hydra's to say


@pytest.mark.slow
def test_a_sweep_with_a_mistyped_row_stops_in_one_line_before_training():
    # the second element of a sweep is checked too, not only the first
    out = subprocess.run([sys.executable, "experiments/train.py", "-m", "experiment=sgd,adma", "scale=smoke"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: experiment=adma: no conf/experiment/adma.yaml; did you mean adam or adamw or adamp?"]
