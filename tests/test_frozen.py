"""The frozen-backbone experiment (bnrotation.study.frozen, on the suite's frame: conf/frozen.yaml, the runner's run
folder and lock, Hydra's multirun) and its claim (analysis/tables/frozen.py, analysis/claims/frozen.py), at toy scale.

Each test trains for a few steps on 8x8 images with a narrow network; the planted runs of the claim's tests are
tables written by hand, not training. The committed runs (results/reference/frozen) are read, never rerun.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch.optim.swa_utils import update_bn

from bnrotation import records

from omegaconf import OmegaConf

from bnrotation.study import frozen
from bnrotation.study.analysis.tables import frozen as frozen_analysis
from bnrotation.study.analysis.claims import frozen_report
from bnrotation.study.analysis.claims.evidence import Evidence
from bnrotation.study.analysis.claims.registry import CLAIMS
from bnrotation.bnstats import frozen_layers, reestimate, running_stat_layers
from bnrotation.study.config import ConfigError
from bnrotation.study.rows import FROZEN_ROOT, FROZEN_ROWS, frozen_row
from bnrotation.study.rundir import RunExistsError, config_yaml, prepare_run_dir

ROOT = Path(__file__).resolve().parents[1]
TOY = ["task.image_size=8", "task.batch_size=16", "task.probe_size=32", "model.channels=[4,8,8]",
       "pretrain.steps=3", "pretrain.reestimate_batches=2", "finetune.steps=4", "finetune.log_every=1",
       "heldout_size=64", "reestimate_batches=3"]


COMMITTED = ROOT / "results" / "reference" / FROZEN_ROOT


def config(*overrides: str) -> frozen.FrozenConfig:
    return frozen.to_frozen_config(OmegaConf.from_dotlist(list(overrides)))


def toy(tmp: Path, *extra: str) -> frozen.FrozenConfig:
    return config(*TOY, f"results_root={tmp}", "progress=false", *extra)


def command(*args: str) -> subprocess.CompletedProcess:
    """``experiments/frozen.py`` in its own process, as ``make frozen`` runs it."""
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "frozen.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize("override, key", [
    ("mode=bn_eval", "mode"), ("shift.noise_std=1.0", "shift.noise_std"), ("shift.noise_std=-2", "shift.noise_std"),
    ("finetune.log_every=500", "finetune.log_every"), ("pretrain.steps=0", "pretrain.steps"),
    ("finetune.lr=-0.1", "finetune.lr"), ("model.norm=group", "model"), ("heldout_size=0", "heldout_size"),
    ("finetune.stepz=3", "finetune.stepz"), ("seed=abc", "seed"), ("threads=-1", "threads"),
])
def test_a_bad_config_stops_with_one_line_naming_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        config(override)
    message = str(err.value)
    assert "\n" not in message and message.startswith(key + ":"), message


def test_conf_frozen_yaml_composes_to_the_schemas_defaults():
    """conf/frozen.yaml repeats FrozenConfig's defaults for the reader; they must agree (the committed runs ran
    them: test_the_committed_runs_are_the_defaults_and_a_rerun_skips_them)."""
    from hydra import compose, initialize_config_dir

    frozen.register_frozen_config()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        assert frozen.to_frozen_config(compose(config_name="frozen")) == frozen.FrozenConfig()


@pytest.mark.slow
def test_the_command_refuses_a_misspelt_key_or_a_bad_value_in_one_line_before_any_work(tmp_path):
    """A misspelt key, in a single run and in a sweep (before Hydra composes anything: cli.stop_on_unknown_keys),
    and a value out of range (the schema's check, before any work)."""
    misspelt = ("error: bad config: finetune.stepz: not a key of the config (did you mean finetune.steps?); keys are "
                "listed in bnrotation/study/config.py and conf/")
    for args, said in ((("finetune.stepz=3",), misspelt), (("-m", "seed=0,1", "finetune.stepz=3"), misspelt),
                       (("mode=nope",), "error: bad config: mode: expected one of bn_train, norm_eval, reestimate, "
                                        "got 'nope'")):
        done = command(*args, f"results_root={tmp_path}")
        assert done.returncode == 2 and done.stderr.strip() == said, done.stderr
    assert not (tmp_path / "runs").exists()  # nothing trained


def test_every_mode_has_its_row():
    assert {frozen_row(m) for m in frozen.MODES} == set(FROZEN_ROWS)
    with pytest.raises(KeyError):
        frozen_row("bn_eval")


# ----------------------------------------------------------------------------- the measurement
def test_drift_in_sigma_per_100_steps_has_the_closed_form():
    """Channel 0: its mean moves by 0.5 with σ = 2 (0.25σ); channel 1: σ goes from 1 to 3 (2σ), its mean stays.
    Over 50 steps: (0.25 + 2) / 2 channels * 100 / 50 = 2.25σ per 100 steps. Exact in float64 (the powers of two
    and 9 = 3² are exact)."""
    before = (torch.tensor([1.0, 0.0]), torch.tensor([4.0, 1.0]))
    now = (torch.tensor([1.5, 0.0]), torch.tensor([4.0, 9.0]))
    mean_move, std_move = frozen.statistics_move(now, before)
    assert mean_move.tolist() == [0.25, 0.0] and std_move.tolist() == [0.0, 2.0]
    assert frozen.running_drift(now, before, 50) == 2.25
    assert frozen.running_drift(now, before, 100) == 1.125  # the displacement itself
    assert frozen.running_drift(before, before, 7) == 0.0
    with pytest.raises(ValueError):
        frozen.running_drift(now, before, 0)


def test_the_shifted_task_has_the_original_templates_and_the_noise_it_names():
    """Sample minus template part is noise of standard deviation noise_std: over 20,000 values per pixel of 8x8x3
    images the sample standard deviation of the noise is within 3% of 3.0 (its relative standard error is
    1/sqrt(2 * 20,000 * 192) < 0.2%)."""
    cfg = config(*TOY, "shift.noise_std=3.0")
    data = frozen.task_data(cfg)
    g = torch.Generator().manual_seed(0)
    x, y = data.shifted.sample(20_000, g)
    noise = x - cfg.task.template_scale * data.original.templates[y]
    assert abs(float(noise.std()) / 3.0 - 1) < 0.03
    assert torch.equal(data.shifted.templates, data.original.templates)


# ----------------------------------------------------------------------------- the freeze
def _step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


@pytest.mark.parametrize("mode", frozen.MODES)
def test_the_fine_tuning_model_of_each_mode(mode):
    """Built without training (for the lint): backbone frozen, a new head, BatchNorm as the mode says. Then a few
    steps on the shifted task: no backbone parameter moves; the BatchNorm buffers move in bn_train only."""
    cfg = config(*TOY, f"mode={mode}")
    model, original_head = frozen.finetune_model(cfg)
    assert model.training
    assert all(not p.requires_grad for p in frozen.backbone_parameters(model).values())
    assert all(p.requires_grad for p in model.fc.parameters())
    assert not torch.equal(model.fc.weight, original_head.weight)
    bn = running_stat_layers(model)
    assert [m.training for _, m in bn] == [mode == "bn_train"] * 3
    assert [n for n, _ in frozen_layers(model)] == ([] if mode == "bn_train" else [n for n, _ in bn])
    reference = {n: p.detach().clone() for n, p in frozen.backbone_parameters(model).items()}
    buffers = [t.clone() for _, m in bn for t in (m.running_mean, m.running_var, m.num_batches_tracked)]
    data = frozen.task_data(cfg)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        _step(model, *data.shifted.sample(16, g))
    frozen.assert_backbone_unchanged(model, reference)
    after = [t for _, m in bn for t in (m.running_mean, m.running_var, m.num_batches_tracked)]
    unchanged = all(torch.equal(a, b) for a, b in zip(after, buffers))
    assert unchanged == (mode != "bn_train")


@pytest.mark.parametrize("mode", frozen.MODES)
def test_the_lint_flags_the_common_mistake_and_only_it(mode):
    """The lint (bnrotation.lint) on each mode's fine-tuning model: bn_train, a frozen backbone whose BatchNorm layers
    still train, is flagged on every one of its BatchNorm layers, and by that rule alone; norm_eval and reestimate
    (BatchNorm in evaluation mode) get no finding."""
    from bnrotation.lint import lint_batchnorm

    model, _ = frozen.finetune_model(config(*TOY, f"mode={mode}"))
    findings = lint_batchnorm(model)
    expected = [n for n, _ in running_stat_layers(model)] if mode == "bn_train" else []
    assert [f.layer for f in findings] == expected
    assert {f.rule for f in findings} <= {"frozen-weights-training-bn"}


def test_a_backbone_that_moves_is_caught():
    """The failure case: one convolution weight nudged by 1e-6 must raise, naming it."""
    model, _ = frozen.finetune_model(config(*TOY))
    reference = {n: p.detach().clone() for n, p in frozen.backbone_parameters(model).items()}
    with torch.no_grad():
        model.conv2.weight[0, 0, 0, 0] += 1e-6
    with pytest.raises(RuntimeError, match="conv2.weight"):
        frozen.assert_backbone_unchanged(model, reference)


def test_reestimation_mode_matches_swa_utils_update_bn(tmp_path):
    """The reestimate mode's statistics are the cumulative average over the shifted batches, as
    torch.optim.swa_utils.update_bn computes it on a copy (no dropout: the same forward passes, the same order,
    so equal to float32 rounding: rtol 1e-6 on values of order 1)."""
    cfg = toy(tmp_path, "mode=reestimate")
    data = frozen.task_data(cfg)
    backbone, _ = frozen.pretrained_backbone(cfg, data)
    model, _ = frozen.finetune_model(cfg, backbone)
    oracle, _ = frozen.finetune_model(cfg, backbone)
    report = reestimate(model, frozen.shifted_batches(cfg, data))
    assert report.batches == cfg.reestimate_batches
    update_bn(list(frozen.shifted_batches(cfg, data)), oracle)
    for (name, m), (_, o) in zip(running_stat_layers(model), running_stat_layers(oracle)):
        torch.testing.assert_close(m.running_mean, o.running_mean, rtol=1e-6, atol=1e-7, msg=name)
        torch.testing.assert_close(m.running_var, o.running_var, rtol=1e-6, atol=1e-7, msg=name)
    pre = dict(running_stat_layers(backbone))
    assert not torch.equal(pre["bn1"].running_var, dict(running_stat_layers(model))["bn1"].running_var)
    assert [m.training for _, m in running_stat_layers(model)] == [False] * 3  # held in evaluation mode after


# ----------------------------------------------------------------------------- runs
@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    """One toy run per mode, seed 0, into one root (pre-trained once, then cached)."""
    root = tmp_path_factory.mktemp("frozen")
    outs = {mode: frozen.run(toy(root, f"mode={mode}")) for mode in frozen.MODES}
    return root, outs


def test_a_run_writes_its_tables_and_done_last(toy_runs):
    root, outs = toy_runs
    for mode, out in outs.items():
        assert out == records.run_dir(root, frozen_row(mode), 0)
        names = {p.name for p in out.iterdir()}
        assert names == {"config.yaml", "run.json", "accuracy.parquet", "statistics.parquet", "monitor.parquet", "DONE"}
        done = (out / "DONE").stat().st_mtime_ns  # written last: no file is newer (equal stamps: a coarse clock)
        assert all(p.stat().st_mtime_ns <= done for p in out.iterdir())
        info = json.loads((out / "run.json").read_text())
        assert info["status"] == "done" and info["backbone_unchanged"] is True and info["mode"] == mode
        assert info["trainable_parameters"] == ["fc.bias", "fc.weight"]
        committed = ROOT / "results" / "reference" / "frozen" / "runs" / frozen_row(mode) / "seed=0" / "run.json"
        assert set(info) == set(json.loads(committed.read_text()))  # what a committed run holds
    infos = [json.loads((o / "run.json").read_text())["pretrained"] for o in outs.values()]
    assert [i["cached"] for i in infos] == [False, True, True]  # pre-trained once per seed


def test_statistics_move_in_training_mode_and_stand_still_otherwise(toy_runs):
    """bn_train: the buffers follow the noisier data (displacement > 0 after the first step); norm_eval: the
    pre-trained statistics exactly, at every log point, so its original-task accuracy never changes; reestimate:
    moved once at step 0 (the re-estimation), then still."""
    root, outs = toy_runs
    st = {m: pd.read_parquet(o / "statistics.parquet") for m, o in outs.items()}
    acc = {m: pd.read_parquet(o / "accuracy.parquet") for m, o in outs.items()}
    moving = st["bn_train"][st["bn_train"]["step"] > 0]
    assert (moving["displacement_sigma"] > 0).all() and (moving["drift_sigma_per_100"] > 0).all()
    assert (st["norm_eval"]["displacement_sigma"] == 0).all()
    assert (st["norm_eval"]["drift_sigma_per_100"].dropna() == 0).all()
    orig = acc["norm_eval"][acc["norm_eval"]["task"] == "original"]["acc_eval_mode"]
    assert orig.nunique() == 1
    re = st["reestimate"]
    assert (re[re["step"] == 0]["displacement_sigma"] > 0).all()
    assert (re["drift_sigma_per_100"].dropna() == 0).all()
    # training-mode accuracy on the original task uses batch statistics only: the same in every mode and step
    train_mode = pd.concat([a[a["task"] == "original"]["acc_train_mode"] for a in acc.values()])
    assert train_mode.nunique() == 1
    mon = pd.read_parquet(outs["bn_train"] / "monitor.parquet")
    assert set(mon["probe"]) == {"shifted", "original"} and mon["stale"].dtype == bool


def test_a_finished_run_is_skipped_and_another_config_refused(toy_runs):
    root, outs = toy_runs
    out = outs["norm_eval"]
    stamp = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert frozen.run(toy(root, "mode=norm_eval")) is None
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamp
    with pytest.raises(RunExistsError, match=r"different config \(keys \['finetune.lr'\]\)"):
        frozen.run(toy(root, "mode=norm_eval", "finetune.lr=0.01"))
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamp


@pytest.mark.slow
def test_make_frozen_s_multirun_trains_every_mode_through_the_entry_point_and_skips_finished_runs(tmp_path):
    """The sweep as ``make frozen`` runs it (python -m bnrotation.study.frozen's lists, Hydra's joblib launcher), at
    toy size on one seed: every mode trains in its folder; the same sweep again skips all three."""
    lists = subprocess.run([sys.executable, "-m", "bnrotation.study.frozen"], capture_output=True, text=True,
                           check=True).stdout.split()
    assert lists == [f"mode={','.join(frozen.MODES)}", "seed=0,1,2"]
    sweep = ["-m", lists[0], "seed=0", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *TOY,
             f"results_root={tmp_path}", "progress=false"]
    first = command(*sweep)
    assert first.returncode == 0 and "sweep: 3 runs: 3 done" in first.stderr, first.stderr
    runs, problems = frozen_analysis.load_frozen_runs(tmp_path)
    assert problems == [] and sorted(r.row for r in runs) == sorted(FROZEN_ROWS)
    again = command(*sweep)
    assert again.returncode == 0 and "sweep: 3 runs: 3 skipped" in again.stderr, again.stderr


KILLER = """
import os, signal, sys
from bnrotation.study import frozen
calls = []
original = frozen._accuracy_lines
def dying(*args, **kwargs):
    calls.append(1)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGKILL)  # no clean-up of any kind
    return original(*args, **kwargs)
frozen._accuracy_lines = dying
from omegaconf import OmegaConf
frozen.run(frozen.to_frozen_config(OmegaConf.from_dotlist(sys.argv[1:])))
"""


def test_a_killed_run_leaves_no_done_and_is_rerun(tmp_path):
    overrides = [*TOY, f"results_root={tmp_path}", "mode=bn_train", "progress=false"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    killed = subprocess.run([sys.executable, "-c", KILLER, *overrides], env=env, capture_output=True, timeout=300)
    assert killed.returncode == -9
    out = records.run_dir(tmp_path, "frozen_bn_train", 0)
    assert (out / "config.yaml").exists() and not (out / "DONE").exists()
    runs, problems = frozen_analysis.load_frozen_runs(tmp_path)
    assert runs == [] and len(problems) == 1 and "no DONE" in problems[0]
    assert frozen.run(config(*overrides)) == out  # rerun from scratch, not skipped
    assert (out / "DONE").exists()
    assert len(frozen_analysis.load_frozen_runs(tmp_path)[0]) == 1


# ----------------------------------------------------------------------------- the claim, on planted runs
def _plant(root: Path, row: str, seed: int, *, displacement: float, acc_start: float, acc_end: float,
           unchanged: bool = True) -> None:
    """A finished run folder with two log points (steps 0 and 100) whose end figures are the given ones."""
    out = records.run_dir(root, row, seed)
    out.mkdir(parents=True)
    layers = ("bn1", "bn2", "bn3")
    st = pd.DataFrame({"step": [0] * 3 + [100] * 3, "norm_layer": layers * 2,
                       "drift_sigma_per_100": [math.nan] * 3 + [displacement] * 3,
                       "displacement_sigma": [0.0] * 3 + [displacement] * 3,
                       "mean_displacement_sigma": [0.0] * 6, "std_displacement_sigma": [0.0] * 3 + [displacement] * 3})
    acc = pd.DataFrame({"step": [0, 0, 100, 100], "task": ["original", "shifted"] * 2,
                        "acc_eval_mode": [acc_start, 0.1, acc_end, 0.8], "acc_train_mode": [1.0, 0.1, 1.0, 0.8],
                        "loss": [math.nan, math.nan, 0.5, 0.5]})
    mon = pd.DataFrame({"step": [0, 0, 100, 100], "probe": ["shifted", "original"] * 2, "stale": [False] * 4,
                        "mode_gap": [0.0, 0.0, 0.0, 0.2],
                        "norm_layer": ["bn1"] * 4, "lag_median_abs_sigma": [0.0, 0.0, 0.01, 0.02]})
    for name, frame in (("statistics", st), ("accuracy", acc), ("monitor", mon)):
        records.write_table(frame.assign(row=row, seed=np.int64(seed)), out / f"{name}.parquet", name)
    mode = FROZEN_ROWS[row].mode
    records.atomic_write_text(out / "config.yaml", config_yaml(config(f"mode={mode}", f"seed={seed}")))
    records.write_json(out / "run.json", {"schema_version": records.SCHEMA_VERSION, "row": row, "seed": seed,
                                          "mode": mode, "status": "done", "backbone_unchanged": unchanged,
                                          "pretrained": {"acc_eval_mode": 1.0}})
    records.mark_done(out)


def _planted(root: Path, **change) -> Path:
    """Three seeds of bn_train (displacement about 0.8σ, the original task from 100% to about 80%) and of
    norm_eval (still): the claim holds, unless ``change`` plants a failure."""
    for seed, (d, drop) in enumerate(((0.8, 0.20), (0.7, 0.25), (0.9, 0.15))):
        _plant(root, "frozen_bn_train", seed, displacement=change.get("displacement", d),
               acc_start=1.0, acc_end=1.0 - change.get("drop", drop))
        _plant(root, "frozen_norm_eval", seed, displacement=change.get("still", 0.0), acc_start=1.0,
               acc_end=1.0 - change.get("still_drop", 0.0), unchanged=change.get("unchanged", True))
    return root


def _claim(root: Path):
    claim = next(c for c in CLAIMS if c.name == "frozen_backbone_batchnorm_follows_new_data")
    return claim.check(Evidence(root, [], pd.DataFrame({"row": [], "seed": []})))


def test_the_claim_passes_on_runs_that_show_it(tmp_path):
    _planted(tmp_path / FROZEN_ROOT)
    check = _claim(tmp_path)
    assert check.verdict == "PASS", check
    assert "displacement 0.8σ" in check.measured


@pytest.mark.parametrize("change, reason", [
    ({"still": 1e-9}, "norm_eval statistics moved"),
    ({"still_drop": 0.0005}, "norm_eval statistics moved"),
    ({"displacement": 0.05}, "did not move enough"),  # below the monitor's 0.1σ
    ({"drop": 0.005}, "did not degrade enough"),  # half a point
    ({"unchanged": False}, "a backbone moved"),
])
def test_the_claim_fails_on_planted_runs_that_contradict_it(tmp_path, change, reason):
    _planted(tmp_path / FROZEN_ROOT, **change)
    check = _claim(tmp_path)
    assert check.verdict == "FAIL" and reason in check.note, check


def test_the_claim_fails_when_the_drop_is_within_its_seed_spread(tmp_path):
    """Drops of +9, -3 and +0.5 points: mean 2.2 points ≥ 1, but its standard error (3.6 points) is larger."""
    root = tmp_path / FROZEN_ROOT
    for seed, drop in enumerate((0.09, -0.03, 0.005)):
        _plant(root, "frozen_bn_train", seed, displacement=0.8, acc_start=0.9, acc_end=0.9 - drop)
        _plant(root, "frozen_norm_eval", seed, displacement=0.0, acc_start=1.0, acc_end=1.0)
    assert _claim(tmp_path).verdict == "FAIL"


def test_the_claim_is_not_run_without_its_runs_and_names_a_refused_one(tmp_path):
    assert _claim(tmp_path).verdict == "NOT RUN"
    root = _planted(tmp_path / FROZEN_ROOT)
    (records.run_dir(root, "frozen_bn_train", 2) / "DONE").unlink()
    check = _claim(tmp_path)
    assert check.verdict == "PASS" and "seed=2: no DONE" in check.note  # two seeds still judge; the third is named
    for seed in (0, 1):
        (records.run_dir(root, "frozen_bn_train", seed) / "DONE").unlink()
    assert _claim(tmp_path).verdict == "NOT RUN"


def test_the_docs_table_comes_from_the_runs(tmp_path, capsys):
    root = _planted(tmp_path / FROZEN_ROOT)
    assert frozen_report.main(["--results", str(root)]) == 0
    text = (root / "frozen.md").read_text()
    assert "| displacement at the end | 0.8σ ± 0.1σ (n = 3) | 0σ ± 0σ (n = 3) |" in text
    assert "**PASS**" in text
    assert frozen_report.main(["--results", str(tmp_path / "nowhere")]) == 2


def test_a_run_whose_run_json_says_another_mode_is_refused_by_name(tmp_path):
    """The run reader's frozen layout (analysis/results.FROZEN): run.json against the folder's row."""
    root = _planted(tmp_path / FROZEN_ROOT)
    path = records.run_dir(root, "frozen_norm_eval", 1)
    records.write_json(path / "run.json", {**json.loads((path / "run.json").read_text()), "mode": "bn_train"})
    runs, problems = frozen_analysis.load_frozen_runs(root)
    assert len(runs) == 5 and problems == [f"{path}: what ran contradicts row 'frozen_norm_eval': mode 'bn_train', "
                                           "the row means 'norm_eval'"]


# ----------------------------------------------------------------------------- the committed runs
def test_the_committed_runs_give_the_committed_table_byte_for_byte(tmp_path):
    """frozen.md regenerated from results/reference/frozen/runs by the command ``make frozen`` ends with (the run
    reader, the table, the claim's judge) is the committed file, byte for byte; the root is named as make names it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        assert frozen_report.main(["--results", str(COMMITTED.relative_to(ROOT)), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "frozen.md").read_bytes() == (COMMITTED / "frozen.md").read_bytes()


def test_the_committed_runs_are_the_defaults_and_a_rerun_skips_them():
    """Each committed run's config.yaml is conf/frozen.yaml's defaults at its mode and seed, by the runner's folder
    policy (rundir.prepare_run_dir: a finished run with the same config is skipped, untouched), so ``make frozen
    RESULTS=results/reference/frozen`` reruns nothing."""
    runs, problems = frozen_analysis.load_frozen_runs(COMMITTED)
    assert problems == [] and len(runs) == len(FROZEN_ROWS) * 3
    for r in runs:
        cfg = config(f"mode={r.info['mode']}", f"seed={r.seed}", f"results_root={COMMITTED}")
        assert prepare_run_dir(cfg, frozen.FrozenConfig) == (None, False), r.path


# ----------------------------------------------------------------------------- the second case (issue 40)
def test_the_last_step_is_logged_when_the_steps_are_not_a_multiple_of_log_every(tmp_path):
    """3 steps, a log point every 2: steps 0, 2 and the last, 3, in every table, and the claim reads step 3.
    Planted: the last step left out of the log points (only multiples of ``log_every``); the run then ended at 2."""
    out = frozen.run(toy(tmp_path, "mode=norm_eval", "finetune.steps=3", "finetune.log_every=2"))
    for name in ("statistics", "accuracy", "monitor"):
        assert sorted(set(pd.read_parquet(out / f"{name}.parquet")["step"])) == [0, 2, 3], name
    runs, problems = frozen_analysis.load_frozen_runs(tmp_path)
    assert problems == [] and list(frozen_analysis.per_run(runs)["steps"]) == [3]


EPS = 1e-6  # relative step across a boundary (float64 tables: rounding some 1e-16 relative)
SPREAD = (-1.0, -1.0, 1.0, 1.0)  # 4 seeds at mean ± a: sample sd 2a/√3, standard error a/√3


def _four_seeds(root: Path, displacement: tuple[float, float], drop: tuple[float, float]) -> None:
    """4 seeds of bn_train with displacements ``mean ± a`` and original-task drops ``mean ± a`` (each a
    ``(mean, a)``), and of a still norm_eval."""
    for seed, d in enumerate(SPREAD):
        _plant(root, "frozen_bn_train", seed, displacement=displacement[0] + d * displacement[1], acc_start=1.0,
               acc_end=1.0 - (drop[0] + d * drop[1]))
        _plant(root, "frozen_norm_eval", seed, displacement=0.0, acc_start=1.0, acc_end=1.0)


@pytest.mark.parametrize("what", ["displacement", "drop", "drop floor"])
def test_the_claim_keeps_its_two_standard_errors_and_floors_at_the_boundary(tmp_path, what):
    """From the tolerance's words: mean displacement − 2 SE ≥ 0.1σ; drop ≥ 1 point and drop − 2 SE > 0. Each
    just inside passes and just outside fails, the other two far inside. A case just inside a floor without the
    margin (mean − 1 SE over it, mean − 2 SE under) must FAIL. Planted: Z = 1 for the displacement, Z = 1 for the
    drop, the drop's floor halved: each moved its case across."""
    a_disp, a_drop = 0.3, 0.05
    se_disp, se_drop = a_disp / math.sqrt(3), a_drop / math.sqrt(3)  # sd 2a/√3 over √4
    for factor, expected in ((1 + EPS, "PASS"), (1 - EPS, "FAIL")):
        root = tmp_path / f"{factor}" / FROZEN_ROOT
        disp, drop = (0.1 + 2 * se_disp + 0.5, a_disp), (0.5, a_drop)  # far inside
        if what == "displacement":
            disp = ((0.1 + 2 * se_disp) * factor, a_disp)
        elif what == "drop":
            drop = (2 * se_drop * factor, a_drop)
        else:
            drop = (0.01 * factor, 1e-9)  # the spread negligible: the floor decides
        _four_seeds(root, disp, drop)
        check = _claim(root.parent)
        assert check.verdict == expected, (what, factor, check.note)
