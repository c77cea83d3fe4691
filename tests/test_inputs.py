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
