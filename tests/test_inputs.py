"""The input loaders' errors carry the argument they name as a field, so that each command names it its own way."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from bnrotation import audit, check
from bnrotation.inputs import CheckInputError, InputError, load_batches, load_weights, parse_model_kwargs


def test_an_input_error_is_a_value_error_whose_argument_is_a_field():
    with pytest.raises(InputError) as caught:
        parse_model_kwargs("[1]")
    err = caught.value
    assert isinstance(err, ValueError) and CheckInputError is InputError
    assert err.argument == "--model-kwargs" and str(err) == err.argument + err.message
    assert err.message.startswith(" '[1]': a JSON list")
    assert err.named("model_kwargs") == "model_kwargs '[1]': a JSON list; expected an object such as " \
                                        "'{\"num_classes\": 10}'"
    with pytest.raises(InputError) as caught:
        load_batches([])
    assert (caught.value.argument, caught.value.message) == ("--batches", " (given): no batches")


def test_the_audit_names_the_weights_by_its_own_argument_without_the_checks_flag():
    """The check's ``--weights`` refusal, raised again by the audit under ``averaged`` (its argument), the rest of
    the line unchanged."""
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    bad = {"0.weight": torch.zeros(4, 3)}  # missing keys
    with pytest.raises(InputError) as direct:
        load_weights(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)), bad)
    with pytest.raises(InputError) as audited:
        audit.audit_averaged(net, bad, torch.randn(8, 3), model=net)
    assert direct.value.argument == "--weights" and audited.value.argument == "averaged"
    assert audited.value.message == direct.value.message and "--weights" not in str(audited.value)
    assert check.InputError is InputError  # the check re-exports what it loads with


# ----------------------------------------------------------------------------- the small readers, exactly
def test_one_line_folds_white_space_and_cuts_at_its_limit_with_an_ellipsis():
    from bnrotation.inputs import MESSAGE_CHARS, one_line
    assert one_line("a\n  b\tc ") == "a b c"
    assert one_line("x" * MESSAGE_CHARS) == "x" * MESSAGE_CHARS  # at the limit: kept whole
    assert one_line("x" * (MESSAGE_CHARS + 1)) == "x" * (MESSAGE_CHARS - 1) + "…"
    assert one_line("abcdef", limit=4) == "abc…" and one_line("abcd", limit=4) == "abcd"


def test_first_line_is_the_first_line_of_the_message_or_nothing():
    from bnrotation.inputs import first_line
    assert first_line(ValueError("  one\ntwo\n")) == "one"
    assert first_line(ValueError("")) == "" and first_line(ValueError("   \n")) == ""


@pytest.mark.parametrize("value, ok", [(1, True), (7, True), (0, False), (-3, False)])
def test_max_batches_is_a_whole_number_from_one(value, ok):
    import argparse

    from bnrotation.inputs import batch_limit
    args = argparse.Namespace(max_batches=value)
    if ok:
        assert batch_limit(args) == value
    else:
        with pytest.raises(InputError) as err:
            batch_limit(args)
        assert err.value.argument == "--max-batches"
        assert str(err.value) == f"--max-batches {value}: expected a whole number >= 1"


def _nets_module(tmp_path, monkeypatch) -> None:
    (tmp_path / "factory_nets.py").write_text(
        "import torch.nn as nn\n\n"
        "def make(width=4):\n    return nn.Sequential(nn.Conv2d(3, width, 1), nn.BatchNorm2d(width))\n\n"
        "def broken(**kwargs):\n    raise RuntimeError('no such width\\nsecond line')\n\n"
        "def not_a_module():\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_factory_is_called_with_its_keyword_arguments_and_its_failures_are_one_line(tmp_path, monkeypatch):
    import sys

    from bnrotation.inputs import build_model, model_from_factory
    _nets_module(tmp_path, monkeypatch)
    try:
        model = model_from_factory("factory_nets:make", {"width": 6})
        assert isinstance(model, nn.Sequential) and model[1].num_features == 6
        assert model_from_factory("factory_nets:make")[1].num_features == 4  # no kwargs: the factory's defaults
        built, how = build_model("factory_nets:make", None)
        assert how == "" and built[0].out_channels == 4
        with pytest.raises(InputError) as err:
            model_from_factory("factory_nets:broken", {"width": 2})
        assert (err.value.argument, str(err.value)) == (
            "--model", "--model factory_nets:broken: the factory raised RuntimeError: no such width")
        with pytest.raises(InputError) as err:
            model_from_factory("factory_nets:not_a_module")
        assert str(err.value) == ("--model factory_nets:not_a_module: the factory returned a int, not a "
                                  "torch.nn.Module")
    finally:
        sys.modules.pop("factory_nets", None)
