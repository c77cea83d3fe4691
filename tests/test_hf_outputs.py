"""Hugging Face models as they are, without a wrapper: the monitor reads the ``logits`` of a ``ModelOutput`` (and of
any mapping), says so once, measures exactly what it measures on the logits tensor, and names the wrapper for any
other output; the check reads what a real ``Trainer`` saved (a ``checkpoint-N/`` folder, the output folder after
``save_model``, a wrapped model's ``model.safetensors``) for a model built from its config. Real ``transformers``
models, built from a small config with random weights: nothing is downloaded."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from thirdparty import import_optional

from bnrotation.check import build_user_model, check_checkpoint, load_weights, main
from bnrotation.evaluation import evaluation_forward, read_logits
from bnrotation.helptext import exit_status
from bnrotation.monitor import MonitorSetupWarning, StalenessMonitor
from bnrotation.probes import accuracy

torch.set_num_threads(1)

# A ResNet of two stages of one basic block each, 8 and 16 channels: six BatchNorm layers, about 6,000 weights
CONFIG = {"num_channels": 3, "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1], "num_labels": 4,
          "layer_type": "basic"}
CHECK = ["--model", "transformers:ResNetForImageClassification", "--batches", "batches.pt",
         "--input-key", "pixel_values", "--target-key", "labels"]
NOTE = ("the model returns an ImageClassifierOutputWithNoAttention: its 'logits' (N, classes) are read as its "
        "predictions")


@pytest.fixture(scope="module")
def hf():
    return import_optional("transformers")


def _resnet(hf, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return hf.ResNetForImageClassification(hf.ResNetConfig(**CONFIG))


def _data(n: int = 32, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (n, 3, 16, 16) whose class is the quadrant with the largest mean: a task a few steps move towards."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 16, 16, generator=g)
    quadrants = torch.stack([x[:, :, :8, :8], x[:, :, :8, 8:], x[:, :, 8:, :8], x[:, :, 8:, 8:]], 1)
    return x, quadrants.mean((2, 3, 4)).argmax(1)


class Logits(nn.Module):
    """The oracle: the same model, returning its logits tensor (as ``ModelLogits`` does for a tensor input)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).logits


class AsDict(Logits):
    """The same model, returning a plain dict that holds the logits beside another tensor."""

    def forward(self, x):
        return {"features": x.mean((1, 2, 3)), "logits": self.model(x).logits}


class AsTuple(Logits):
    def forward(self, x):
        return (self.model(x).logits,)


class NoLogits(Logits):
    def forward(self, x):
        return {"scores": self.model(x).logits}


def _unprefixed(frame: pd.DataFrame) -> pd.DataFrame:
    """A record's table with ``model.`` taken off the layer names (the oracle's wrapper adds it)."""
    frame = frame.copy()
    for column in ("layer", "norm_layer"):
        if column in frame:
            frame[column] = frame[column].str.replace(r"^model\.", "", regex=True)
    return frame


def _same_records(a, b) -> None:
    for table in ("checks", "layers", "channels"):
        pd.testing.assert_frame_equal(_unprefixed(getattr(a, table)), _unprefixed(getattr(b, table)), obj=table)
    assert (a.stale, a.summary.replace("in model.", "in ")) == (b.stale, b.summary.replace("in model.", "in "))


# ----------------------------------------------------------------------------- the monitor
def test_a_model_output_is_measured_through_its_logits_as_the_logits_are_and_said_once(hf):
    model = _resnet(hf)
    x, y = _data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = StalenessMonitor(model, (x, y), warn=False, warmup_steps=0)
        oracle = StalenessMonitor(Logits(model), (x, y), warn=False, warmup_steps=0)
        plain = StalenessMonitor(AsDict(model), (x, y), warn=False, warmup_steps=0)
        records = [(monitor(0), oracle(0), plain(0))]
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        model.train()
        for _ in range(3):  # the weights move, so the second call measures rotation and lag
            loss = F.cross_entropy(model(x).logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        records.append((monitor(3), oracle(3), plain(3)))
    notes = [str(w.message) for w in caught
             if issubclass(w.category, MonitorSetupWarning) and "logits" in str(w.message)]
    assert notes == [NOTE, NOTE.replace("an ImageClassifierOutputWithNoAttention", "a dict")]  # one per monitor
    for hf_record, tensor_record, dict_record in records:
        _same_records(hf_record, tensor_record)
        _same_records(dict_record, tensor_record)
    assert records[1][0].layers["rotation_deg_per_100"].gt(0).all()  # the second call measured something
    assert len(records[1][0].layers) == 6


def test_every_pass_that_reads_predictions_reads_the_logits(hf):
    """The evaluation pass in chunks, and the accuracy in both modes, read the logits as the monitor does."""
    model = _resnet(hf).eval()
    x, y = _data()
    with torch.no_grad():
        want = Logits(model)(x)
        assert torch.allclose(evaluation_forward(model, x, chunk=8), want, rtol=1e-5, atol=1e-6)
    for mode in ("eval", "train"):
        assert accuracy(model, x, y, mode, chunk=8) == accuracy(Logits(model), x, y, mode, chunk=8)


def test_any_other_output_is_refused_naming_the_wrapper_that_fixes_it(hf):
    model = _resnet(hf)
    x = _data()[0]
    with pytest.raises(ValueError, match=r"probe: the model returns a tuple; .*ModelLogits\(model, input_key"):
        StalenessMonitor(AsTuple(model), x)
    with pytest.raises(ValueError, match=r"a dict without a tensor under 'logits' \(keys: 'scores'\).*ModelLogits"):
        StalenessMonitor(NoLogits(model), x)
    with pytest.raises(TypeError, match="ModelLogits"):
        read_logits([torch.zeros(2, 3)])
    assert read_logits({"logits": torch.ones(2, 3)}).shape == (2, 3)


# ----------------------------------------------------------------------------- the check
class Samples(torch.utils.data.Dataset):
    """The images as the Trainer's default collator takes them: ``{"pixel_values": (3, 16, 16), "labels": ()}``."""

    def __init__(self):
        self.x, self.y = _data(64, seed=2)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"pixel_values": self.x[i], "labels": self.y[i]}


class Wrapped(nn.Module):
    """A user's wrapper around the Hugging Face model, as given to a Trainer: its keys gain ``model.``, and the
    Trainer saves it as a bare ``model.safetensors`` (it is no ``PreTrainedModel``), without a ``config.json``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values, labels=None):
        return self.model(pixel_values=pixel_values, labels=labels)


def _train(hf, model: nn.Module, out: Path, steps: int = 2) -> nn.Module:
    """``steps`` Adam steps of a real Trainer on batches of 16, a checkpoint at the last one; the trained model."""
    hf.set_seed(0)
    args = hf.TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=16,
                                learning_rate=0.01, lr_scheduler_type="constant", optim="adamw_torch",
                                weight_decay=0.0, use_cpu=True, report_to=[], save_strategy="steps",
                                save_steps=steps, logging_steps=1000, disable_tqdm=True, seed=0,
                                dataloader_num_workers=0)
    trainer = hf.Trainer(model=model, args=args, train_dataset=Samples())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(PreTrainedModel|num_workers).*")
        trainer.train()
    return trainer.model


def _report_equal(a, b) -> None:
    pd.testing.assert_frame_equal(a.layers, b.layers)
    assert (a.mode_gap, a.acc_eval_mode, a.acc_eval_mode_reestimated, a.stale) == \
        (b.mode_gap, b.acc_eval_mode, b.acc_eval_mode_reestimated, b.stale)


@pytest.mark.slow
def test_the_check_reads_a_trainers_folders_for_a_model_built_from_their_config(hf, tmp_path, monkeypatch, capsys):
    trained = _train(hf, _resnet(hf), tmp_path / "out")
    x, y = _data(48, seed=3)
    torch.save({"pixel_values": x, "labels": y}, tmp_path / "batches.pt")
    monkeypatch.chdir(tmp_path)
    checkpoint = tmp_path / "out" / "checkpoint-2"
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "config.json").is_file()
    want = check_checkpoint(copy.deepcopy(trained), {"pixel_values": x, "labels": y}, input_key="pixel_values",
                            target_key="labels")
    built, how = build_user_model(CHECK[1], {}, checkpoint)
    got = check_checkpoint(built, {"pixel_values": x, "labels": y}, weights=checkpoint, input_key="pixel_values",
                           target_key="labels")
    _report_equal(got, want)
    assert how == f"built from {checkpoint / 'config.json'}" and got.output == NOTE
    capsys.readouterr()  # the Trainer's own lines are not the check's
    code = main([*CHECK, "--weights", str(checkpoint)])
    out, err = capsys.readouterr()
    assert code == exit_status(want.stale, bool(want.undetermined)) and err == "", err  # the report's own status
    assert f"({how}) with {checkpoint} (its model.safetensors: a state dict)" in out
    assert f"Note: {NOTE}." in out and "| resnet.embedder.embedder.normalization |" in out
    auto = ["--model", "transformers:AutoModelForImageClassification", *CHECK[2:]]  # the config's model_type
    assert main([*auto, "--weights", str(checkpoint)]) == code
    assert f"Note: {NOTE}." in capsys.readouterr().out
    # the output folder after save_model, and the output folder that holds only its checkpoints
    assert main([*CHECK, "--weights", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "a folder without model.safetensors or pytorch_model.bin" in err and "checkpoint-2" in err, err
    hf.Trainer(model=trained, args=hf.TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[],
                                                         use_cpu=True)).save_model(str(tmp_path / "final"))
    assert main([*CHECK, "--weights", str(tmp_path / "final")]) == code
    assert "final (its model.safetensors: a state dict)" in capsys.readouterr().out
    # a config setting it does not have, and settings that override the folder's
    assert main([*CHECK, "--weights", str(checkpoint), "--model-kwargs", '{"hiden_sizes": [8]}']) == 2
    assert "--model-kwargs: 'hiden_sizes' is not a setting of ResNetConfig" in capsys.readouterr().err
    assert main([*CHECK, "--weights", str(checkpoint), "--model-kwargs", '{"num_labels": 5}']) == 2
    assert "does not fit the model" in capsys.readouterr().err  # 5 outputs built, 4 saved


@pytest.mark.slow
def test_a_wrapped_models_safetensors_has_its_prefix_stripped_and_a_wrapping_model_gets_it_added(
        hf, tmp_path, monkeypatch, capsys):
    trained = _train(hf, Wrapped(_resnet(hf)), tmp_path / "out").model
    x, y = _data(48, seed=3)
    torch.save({"pixel_values": x, "labels": y}, tmp_path / "batches.pt")
    monkeypatch.chdir(tmp_path)
    weights = tmp_path / "out" / "checkpoint-2" / "model.safetensors"
    assert not (weights.parent / "config.json").exists()  # the Trainer saved a plain module's state dict
    want = check_checkpoint(copy.deepcopy(trained), {"pixel_values": x, "labels": y}, input_key="pixel_values",
                            target_key="labels")
    capsys.readouterr()
    code = main([*CHECK, "--weights", str(weights), "--model-kwargs", json.dumps(CONFIG)])
    out, err = capsys.readouterr()
    assert code == exit_status(want.stale, bool(want.undetermined)) and err == "", err  # the report's own status
    assert "the prefix 'model.' stripped from its keys (as --strip-prefix model. does)" in out
    assert "(built from its default config with --model-kwargs num_channels, embedding_size" in out
    assert f"worst median |lag| {want.worst_median_lag_sigma:.3f}σ" in out
    # the other way round: bare keys into a model that wraps the Hugging Face one
    wrapper = Logits(_resnet(hf, seed=5))
    kind = load_weights(wrapper, trained.state_dict())
    assert kind == "a state dict, the prefix 'model.' added to its keys (the model's own keys all start with it)"
    assert all(torch.equal(v, trained.state_dict()[k]) for k, v in wrapper.model.state_dict().items())


def test_a_folder_of_shards_or_of_a_pytorch_model_bin_is_read_whole(tmp_path):
    safetensors = import_optional("safetensors.torch")

    def net(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(2))

    saved = net(0)
    saved(torch.randn(2, 3, 6, 6))
    state = saved.state_dict()
    keys = list(state)
    sharded, binary = tmp_path / "sharded", tmp_path / "binary"
    sharded.mkdir()
    binary.mkdir()
    shards = {"model-00001-of-00002.safetensors": keys[:3], "model-00002-of-00002.safetensors": keys[3:]}
    for name, part in shards.items():
        safetensors.save_file({k: state[k].contiguous() for k in part}, sharded / name)
    index = {"metadata": {}, "weight_map": {k: name for name, part in shards.items() for k in part}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    torch.save(state, binary / "pytorch_model.bin")
    for folder, what in ((sharded, "its model.safetensors in 2 shards"), (binary, "its pytorch_model.bin")):
        model = net(1)
        model(torch.randn(2, 3, 6, 6))
        assert load_weights(model, folder) == f"{what}: a state dict"
        assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
