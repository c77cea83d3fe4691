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
        "import torch\nimport torch.nn as nn\n\n"
        "def make(width=4):\n    return nn.Sequential(nn.Conv2d(3, width, 1), nn.BatchNorm2d(width))\n\n"
        "def broken(**kwargs):\n    raise RuntimeError('no such width\\nsecond line')\n\n"
        "def not_a_module():\n    return 3\n\n"
        "def failing():\n    yield torch.randn(4, 3)\n    raise OSError('disk gone\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_factory_is_called_with_its_keyword_arguments_and_its_failures_are_one_line(tmp_path, monkeypatch):
    import sys

    from bnrotation.inputs import build_user_model, model_from_factory
    _nets_module(tmp_path, monkeypatch)
    try:
        model = model_from_factory("factory_nets:make", {"width": 6})
        assert isinstance(model, nn.Sequential) and model[1].num_features == 6
        assert model_from_factory("factory_nets:make")[1].num_features == 4  # no kwargs: the factory's defaults
        built, how = build_user_model("factory_nets:make", None)
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


@pytest.fixture
def factory_nets(tmp_path, monkeypatch):
    """The user's module ``factory_nets`` (:func:`_nets_module`), importable from ``tmp_path``, its folder."""
    import sys
    _nets_module(tmp_path, monkeypatch)
    yield tmp_path
    sys.modules.pop("factory_nets", None)


def test_a_module_that_does_not_import_is_named_with_the_import_errors_first_line(factory_nets):
    from bnrotation.inputs import load_function
    (factory_nets / "needs_missing_xyz.py").write_text("import no_such_dependency_xyz\n")
    with pytest.raises(InputError) as err:
        load_function("needs_missing_xyz:make", "--model")
    assert str(err.value) == ("--model needs_missing_xyz:make: 'needs_missing_xyz' was found but failed while "
                              "importing: ModuleNotFoundError: No module named 'no_such_dependency_xyz'")
    with pytest.raises(InputError) as err:
        load_function("absent_module_xyz:make", "--batches")
    assert str(err.value) == ("--batches absent_module_xyz:make: cannot find 'absent_module_xyz' in the current "
                              "directory or PYTHONPATH (No module named 'absent_module_xyz')")


# ----------------------------------------------------------------------------- load_weights, exactly
def _net(seed: int = 0) -> nn.Module:
    """Conv -> BatchNorm, its running statistics random too, so that weights loaded are told from the model's own."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    with torch.no_grad():
        net[1].running_mean.normal_()
        net[1].running_var.uniform_(0.5, 2.0)
        net[1].num_batches_tracked.fill_(seed + 7)
    return net


def _holds(model: nn.Module, state: dict) -> bool:
    """Whether ``model``'s state dict is ``state``, key for key and bit for bit."""
    mine = model.state_dict()
    return set(mine) == set(state) and all(mine[k].dtype == v.dtype and torch.equal(mine[k], v)
                                           for k, v in state.items())


def test_weights_from_a_torch_file_a_safetensors_file_and_a_folder_are_loaded_bit_for_bit(tmp_path):
    """With the default device: a torch.save file, a .safetensors file, and a Hugging Face folder holding
    model.safetensors, whose description names the file it read."""
    from safetensors.torch import save_file
    saved = _net(1).state_dict()
    torch.save(saved, tmp_path / "w.pt")
    save_file(saved, tmp_path / "w.safetensors")
    (tmp_path / "out").mkdir()
    save_file(saved, tmp_path / "out" / "model.safetensors")
    for given, kind in (("w.pt", "a state dict"), ("w.safetensors", "a state dict"),
                        ("out", "its model.safetensors: a state dict")):
        model = _net(0)
        assert not _holds(model, saved)
        assert load_weights(model, tmp_path / given) == kind, given
        assert _holds(model, saved), given


def test_weights_that_do_not_fit_name_the_argument_the_file_and_the_first_key(tmp_path):
    saved = _net(1).state_dict()
    torch.save({**saved, "1.weight": torch.zeros(5)}, tmp_path / "shape.pt")
    with pytest.raises(InputError) as err:
        load_weights(_net(), tmp_path / "shape.pt")
    assert err.value.argument == "--weights"
    assert str(err.value) == (f"--weights {tmp_path / 'shape.pt'}: does not fit the model: key '1.weight': copying "
                              "a param with shape torch.Size([5]) from checkpoint, the shape in current model is "
                              "torch.Size([4]).")
    # torch refuses without a size mismatch (tensors without data): its error's first line
    with pytest.raises(InputError) as err:
        load_weights(_net(), {k: v.to("meta") for k, v in saved.items()})
    assert str(err.value) == "--weights: does not fit the model: Error(s) in loading state_dict for Sequential:"
    # in memory (not a path): no file named after the argument
    with pytest.raises(InputError) as err:
        load_weights(_net(), {k: v for k, v in saved.items() if k != "1.running_mean"})
    assert str(err.value) == "--weights: does not fit the model: missing key '1.running_mean'"
    with pytest.raises(InputError) as err:
        load_weights(_net(), {**{f"net.{k}": v for k, v in saved.items()}, "loss.weight": torch.ones(2)})
    assert str(err.value) == ("--weights: does not fit the model: missing key '0.weight' (and 5 more); unexpected "
                              "key 'net.0.weight' (and 7 more); its keys under 'net.' fit the model: --strip-prefix "
                              "net.")
    # --strip-prefix given: no hint to strip a prefix from what it left (the file's keys start with net.inner.)
    with pytest.raises(InputError) as err:
        load_weights(_net(), {f"net.inner.{k}": v for k, v in saved.items()}, prefix="net.")
    assert str(err.value) == ("--weights: does not fit the model: missing key '0.weight' (and 5 more); unexpected "
                              "key 'inner.0.weight' (and 6 more)")


def test_a_strip_prefix_no_key_has_and_contents_without_a_state_dict_are_named(tmp_path):
    torch.save(_net().state_dict(), tmp_path / "w.pt")
    with pytest.raises(InputError) as err:
        load_weights(_net(), tmp_path / "w.pt", prefix="module.")
    assert (err.value.argument, str(err.value)) == (
        "--weights", f"--weights {tmp_path / 'w.pt'}: --strip-prefix module.: no key starts with it; its keys: "
                     "'0.weight', '0.bias', '1.weight' and 4 more")
    torch.save([torch.zeros(2)], tmp_path / "list.pt")  # not a mapping: no entry for --weights-key to name
    with pytest.raises(InputError) as err:
        load_weights(_net(), tmp_path / "list.pt")
    assert str(err.value) == (f"--weights {tmp_path / 'list.pt'}: holds a list; expected a state dict (a dict of "
                              "tensors) or a checkpoint dict holding one")
    with pytest.raises(InputError) as err:
        load_weights(_net(), {"weights": _net().state_dict(), "epoch": 3})
    assert str(err.value) == ("--weights: holds no state dict: a dict of 2 entries ('weights', 'epoch'), none of "
                              "them 'model' or 'state_dict' holding one; --weights-key names the entry that holds "
                              "the state dict")


def test_a_checkpoints_other_copies_are_named_once_each_with_the_key_that_checks_them():
    raw, ema, other = _net(1).state_dict(), _net(2).state_dict(), _net(3).state_dict()
    checkpoint = {"state_dict": raw, "state_dict_ema": ema, "model_ema": other, "epoch": 4}
    model = _net()
    assert load_weights(model, checkpoint) == (
        "a checkpoint dict, its 'state_dict' entry; it also holds 'state_dict_ema' (--weights-key state_dict_ema "
        "checks that copy); it also holds 'model_ema' (--weights-key model_ema checks that copy)")
    assert _holds(model, raw)
    assert load_weights(model, {"model": raw, "state_dict_ema": ema}) == (
        "a checkpoint dict, its 'model' entry; it also holds 'state_dict_ema' (--weights-key state_dict_ema checks "
        "that copy)")
    # an entry named: that copy, and no note on the others
    assert load_weights(model, checkpoint, key="state_dict_ema") == "a checkpoint dict, its 'state_dict_ema' entry"
    assert _holds(model, ema)
    assert load_weights(model, checkpoint, key="state_dict") == "a checkpoint dict, its 'state_dict' entry"
    assert _holds(model, raw)


def test_a_wrappers_prefix_is_stripped_or_added_and_the_description_says_which():
    saved = _net(1).state_dict()
    model = _net()
    assert load_weights(model, {f"module.{k}": v for k, v in saved.items()}) == (
        "a state dict, the prefix 'module.' stripped from its keys (as --strip-prefix module. does)")
    assert _holds(model, saved)
    wrapped = nn.Sequential(_net())  # the model's keys all start with '0.', the file's do not
    assert load_weights(wrapped, {"model": saved}) == (
        "a checkpoint dict, its 'model' entry, the prefix '0.' added to its keys (the model's own keys all start "
        "with it)")
    assert _holds(wrapped[0], saved)
    model = _net()
    assert load_weights(model, {f"net.{k}": v for k, v in saved.items()}, prefix="net.") == (
        "a state dict, its keys under 'net.'")
    assert _holds(model, saved)
    model = _net()
    assert load_weights(model, {**{f"net.{k}": v for k, v in saved.items()}, "loss.weight": torch.ones(2)},
                        prefix="net.") == "a state dict, its keys under 'net.' (1 other keys left out)"
    assert _holds(model, saved)


# ----------------------------------------------------------------------------- load_batches, exactly
def _classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(16, 3))


X = torch.randn(8, 3, 2, 2, generator=torch.Generator().manual_seed(0))
LABELS = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])


def test_batches_from_a_dict_a_safetensors_file_and_onto_the_device_asked_for(tmp_path):
    from safetensors.torch import save_file
    (x, y), = load_batches({"input": X, "target": LABELS})[0]  # the default keys
    assert torch.equal(x, X) and torch.equal(y, LABELS)
    save_file({"input": X, "target": LABELS}, tmp_path / "b.safetensors")
    (x, y), = load_batches(str(tmp_path / "b.safetensors"))[0]
    assert torch.equal(x, X) and torch.equal(y, LABELS)
    (x, y), = load_batches((X, LABELS), device="meta")[0]  # a second device every machine has
    assert x.device.type == y.device.type == "meta" and x.shape == X.shape and y.dtype == LABELS.dtype
    torch.save(7, tmp_path / "n.pt")
    with pytest.raises(InputError) as err:
        load_batches(str(tmp_path / "n.pt"))
    assert str(err.value) == (f"--batches {tmp_path / 'n.pt'}: holds a int; expected a tensor (N, ...), an (x, y) "
                              "tuple, a dict, or a list of them")


def test_a_loader_that_is_missing_returns_no_iterable_or_raises_is_named_in_one_line(factory_nets):
    cases = {"factory_nets:absent": "--batches factory_nets:absent: module 'factory_nets' has no 'absent'",
             "factory_nets:not_a_module": "--batches factory_nets:not_a_module: returned a int, not an iterable of "
                                          "batches",
             "factory_nets:broken": "--batches factory_nets:broken: raised RuntimeError: no such width",
             # a generator raises only when drawn from, after some batches
             "factory_nets:failing": "--batches factory_nets:failing: batch 1: raised OSError: disk gone"}
    for spec, message in cases.items():
        with pytest.raises(InputError) as err:
            load_batches(spec)
        assert (err.value.argument, str(err.value)) == ("--batches", message), spec


@pytest.mark.parametrize("limit, given, more", [(3, 3, False), (3, 4, True), (1, 2, True)])
def test_max_batches_are_kept_and_exactly_one_more_is_drawn_to_tell(limit, given, more):
    drawn = []

    def batches():
        for i in range(given + 5 if more else given):
            drawn.append(i)
            yield X + i

    out, cut = load_batches(batches(), max_batches=limit)
    assert cut is more and len(out) == limit and torch.equal(out[-1][0], X + (limit - 1))
    assert drawn == list(range(limit + 1 if more else given))


BAD_BATCHES = {
    "labels that do not match": ((X, torch.zeros(5, dtype=torch.long)),
                                 "batch 0: probe: 8 inputs but labels Tensor (5,)"),
    "a batch of one sample": ([X, X[:1]], "batch 1 has 1 sample(s); training mode (batch statistics) needs at "
                                          "least 2"),
    "float labels": ((X, LABELS.float()), "batch 0: labels must be class indices, integers of shape (N,), got "
                                          "torch.float32 (8,)"),
    "complex labels": ((X, LABELS.to(torch.complex64)), "batch 0: labels must be class indices, integers of shape "
                                                        "(N,), got torch.complex64 (8,)"),
    "labels outside the outputs": ((X, LABELS + 1), "batch 0: probe: labels must lie in [0, 3) for a model with 3 "
                                                    "outputs, got [1, 3]"),
    "labels on some batches only": ([(X, LABELS), X, X], "some batches have labels and some do not (the first "
                                                         "without: batch 1)"),
}


@pytest.mark.parametrize("case", list(BAD_BATCHES))
def test_a_bad_batch_is_named_with_its_index_and_reason(case):
    given, reason = BAD_BATCHES[case]
    with pytest.raises(InputError) as err:
        load_batches(given, model=_classifier())
    assert (err.value.argument, str(err.value)) == ("--batches", f"--batches (given): {reason}")


# ----------------------------------------------------------------------------- a Hugging Face class, the rule, devices
def test_a_hugging_face_class_is_built_from_the_config_beside_the_weights_with_the_kwargs_as_settings(tmp_path):
    """A real ``transformers`` ResNet (two stages of one block, 8 channels): the folder's config.json gives its
    settings, ``--model-kwargs`` override them, and a setting the config lacks names ``--model-kwargs``."""
    from thirdparty import import_optional

    from bnrotation.inputs import build_user_model, model_from_factory
    hf = import_optional("transformers")
    spec = "transformers:ResNetForImageClassification"
    hf.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 8], depths=[1, 1], num_labels=3,
                    layer_type="basic").save_pretrained(tmp_path)
    model, how = build_user_model(spec, {"num_labels": 5}, tmp_path)
    assert isinstance(model, hf.ResNetForImageClassification)
    assert how == f"built from {tmp_path / 'config.json'} with --model-kwargs num_labels"
    assert model.config.hidden_sizes == [8, 8] and model.config.num_labels == 5  # the folder's, then the kwargs'
    beside = model_from_factory(spec, None, tmp_path / "model.safetensors")  # the config beside a weights file
    assert beside.config.hidden_sizes == [8, 8] and beside.config.num_labels == 3
    with pytest.raises(InputError) as err:
        build_user_model(spec, {"hiden_sizes": [8]}, tmp_path)
    assert str(err.value) == ("--model-kwargs: 'hiden_sizes' is not a setting of ResNetConfig (--model "
                              "transformers:ResNetForImageClassification takes the settings of its config)")


def test_the_rule_is_read_from_every_flag_and_a_device_torch_does_not_know_is_named():
    import argparse

    from bnrotation.inputs import parse_device, thresholds_from
    from bnrotation.staleness import Thresholds
    args = argparse.Namespace(mode_gap=0.2, lag_sigma=0.7, eval_error_sigma=1.5)
    assert thresholds_from(args) == Thresholds(mode_gap=0.2, lag_sigma=0.7, eval_error_sigma=1.5)
    assert parse_device("cpu") == torch.device("cpu")
    with pytest.raises(RuntimeError) as torchs:  # its wording is torch's own, which changes across versions
        torch.device("gpu0")
    with pytest.raises(InputError) as err:
        parse_device("gpu0")
    assert str(err.value) == f"--device gpu0: {str(torchs.value).splitlines()[0]}" != "--device gpu0: None"


def test_an_iterable_given_from_python_that_raises_is_the_callers_own_error():
    """Only a loader the command imported (``--batches module:function``) is the argument's problem; batches a
    Python caller passes raise their own error, traceback and all."""
    def batches():
        yield X
        raise OSError("the caller's own")

    with pytest.raises(OSError, match="the caller's own"):
        load_batches(batches())
