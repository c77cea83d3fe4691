"""The runner end to end at smoke scale: every experiment config to parquet and into the table."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from bnrotation import records
from bnrotation.study.analysis.results import load_runs
from bnrotation.study.analysis.tables.table import build_table, main as table_main
from bnrotation.study.provenance import KERNEL_ENV, cpu_kernels, cpu_model
from bnrotation.study.rows import ROWS
from bnrotation.study.rundir import RunExistsError
from bnrotation.study.runner import check_steps, intervention_steps, log_steps, run

from conftest import EXPERIMENTS, TOY_SIZE
from test_reliability import tiny  # the toy size, for what does not need the study's network


# The fixture's toy size: conftest.TOY_SIZE's 8x8 images and small sets, with widths every row's norm divides
# (GroupNorm's eight groups): the schedule, the tables and run.json are those of the smoke scale, in a fraction of the time.
TOY = [*TOY_SIZE, "model.channels=[8,16,16]"]
WIDTHS = (8, 16, 16)


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
    """Every experiment config at smoke scale and the toy size (:data:`TOY`), seed 0, into one results root."""
    from conftest import run_cfg
    root = tmp_path_factory.mktemp("results")
    for row in EXPERIMENTS:
        assert run(run_cfg([f"experiment={row}", *TOY], root)) is not None
    return root


def test_every_experiment_runs_to_parquet(smoke_results):
    for row in EXPERIMENTS:
        out = records.run_dir(smoke_results, row, 0)
        assert (out / records.DONE).exists()
        info = json.loads((out / "run.json").read_text())
        assert info["status"] == "done" and info["schema_version"] == records.SCHEMA_VERSION
        for name, cols in records.TABLE_COLUMNS.items():
            df = pd.read_parquet(out / f"{name}.parquet")
            assert set(cols) <= set(df.columns), name
            assert (df["row"] == row).all() and (df["seed"] == 0).all()
        checks = pd.read_parquet(out / "checks.parquet")
        assert checks["step"].tolist() == [10, 15, 20]
        channels = pd.read_parquet(out / "channels.parquet")
        c1, c2, c3 = WIDTHS  # every norm layer: three blocks; a stem, six per stage and two shortcuts
        widths = {"convnet": c1 + c2 + c3, "resnet20": c1 * 7 + c2 * 6 + c3 * 6 + c2 + c3}
        assert len(channels) == len(range(0, 21, 5)) * widths[ROWS[row].arch]
        assert channels.loc[channels["step"] > 0, "rotation_deg"].notna().all()


def test_every_check_logs_the_monitors_probe_gap_beside_the_held_out_one(smoke_results):
    """Issue 48: the runner logs what the shipped monitor computes at every check, its gap on the probe batch of
    training images (``mode_gap``, the zoo's name) and the rule's verdict, beside the held-out accuracies the truth
    reads. The probe gap is its own accuracies' difference, not the held-out one."""
    for row in ("adam", "sgd"):
        checks = pd.read_parquet(records.run_dir(smoke_results, row, 0) / "checks.parquet")
        assert checks["mode_gap"].notna().all()
        assert np.allclose(checks["mode_gap"], checks["probe_acc_train_mode"] - checks["probe_acc_eval_mode"])
        assert (checks["probe_size"] > 0).all() and checks["rule_undetermined"].map(type).eq(str).all()
        # on the toy probe (fewer samples than the gap threshold needs) the rule says why it cannot judge
        assert (checks["rule_undetermined"].str.startswith("a probe of")).all() and not checks["rule_stale"].any()


@pytest.mark.kernels
def test_compiled_evaluation_writes_the_same_tables_as_eager(tmp_path):
    """``eval_backend=compiled`` (what ``auto`` picks for CPU runs of 1,000 steps or more) changes no table:
    the smoke ``adam`` run, which checks, intervenes and averages, equals the eager one, both run here in
    float64, and ``run.json`` says which backend ran. The key does not change results, so a finished run is
    skipped, not refused, under the other backend. A compiler that fails here (evaluation falls back to eager,
    with a warning) fails the test: it would otherwise compare eager with eager.

    Tolerance: the compiled passes fuse and reorder the evaluation's sums, a rounding of about 1e-16 relative
    each in float64; training never reads them, so nothing compounds, and 1e-9 relative (1e-12 absolute, for
    values that are differences of close means) is far above that and far below any real change (an
    accuracy moves by 1 / heldout_size = 1/32)."""
    from conftest import run_cfg
    overrides = ["experiment=adam", *TOY, "dtype=float64"]
    eager = run(run_cfg([*overrides, "eval_backend=eager"], tmp_path / "eager"))
    with warnings.catch_warnings(record=True) as caught:  # a compiler that fails falls back to eager, warning
        warnings.simplefilter("always")
        out = run(run_cfg([*overrides, "eval_backend=compiled"], tmp_path))
    assert not [str(w.message) for w in caught if "compiled evaluation failed" in str(w.message)]
    for table in records.TABLE_COLUMNS:
        old, new = pd.read_parquet(eager / f"{table}.parquet"), pd.read_parquet(out / f"{table}.parquet")
        pd.testing.assert_frame_equal(new, old, check_exact=False, rtol=1e-9, atol=1e-12, obj=f"adam/{table}")
    assert json.loads((out / "run.json").read_text())["eval_backend"] == "compiled"
    assert json.loads((eager / "run.json").read_text())["eval_backend"] == "eager"
    assert json.loads((out / "run.json").read_text())["dtype"] == "float64"
    assert run(run_cfg([*overrides, "eval_backend=eager"], tmp_path)) is None


def test_run_json_reads_back_what_the_row_sets(smoke_results):
    for row in EXPERIMENTS:
        spec = ROWS[row]
        info = json.loads((records.run_dir(smoke_results, row, 0) / "run.json").read_text())
        if spec.norm == "batch":
            assert {n["momentum"] for n in info["norm_layers"].values()} == {spec.bn_momentum}
        else:  # GroupNorm keeps no running statistics, hence no momentum
            assert {(n["class"], n["num_groups"]) for n in info["norm_layers"].values()} == \
                {("GroupNorm", {"group": 8, "layer": 1}[spec.norm])}
        assert {g["lr"] for g in info["optimizer"]["param_groups"]} == {spec.lr}
        if spec.optimizer == "adam_projected":
            assert info["projection"]["params"] == ["conv1.weight", "conv2.weight", "conv3.weight"]
        assert info["git"].keys() == {"commit", "dirty"} and info["wall_seconds"] > 0


@pytest.mark.kernels
def test_run_json_names_the_cpu_kernels_it_ran_on(tmp_path):
    """``run.json`` records torch's CPU capability and the variables that cap it: a bit-identity claim (a rerun,
    a resume) holds on one kernel path. Under ``make test-kernels`` this also shows that the rerun took the path
    it asked for; the failure case, a process started on the no-vector path, reads as another path."""
    out = run(tiny(tmp_path, "experiment=sgd", "interventions=false"))
    info = json.loads((out / "run.json").read_text())
    kernels = info["cpu_kernels"]
    assert kernels == cpu_kernels() and kernels["capability"] == torch.backends.cpu.get_cpu_capability()
    # and the CPU's model: the same kernel path on another CPU may sum in another order
    assert info["cpu"] == cpu_model() and (not Path("/proc/cpuinfo").exists() or info["cpu"])
    if os.environ.get("ATEN_CPU_CAPABILITY"):
        assert kernels["capability"] == os.environ["ATEN_CPU_CAPABILITY"].upper()
    plain = subprocess.run([sys.executable, "-c", "from bnrotation.study.provenance import cpu_kernels; "
                            "print(cpu_kernels()['capability'])"], capture_output=True, text=True, check=True,
                           env={**os.environ, "ATEN_CPU_CAPABILITY": "default"}).stdout.strip()
    assert plain == "DEFAULT"
    if kernels["capability"] != "DEFAULT":
        assert plain != kernels["capability"]


@pytest.mark.slow
def test_compiled_code_is_cached_per_kernel_path(tmp_path, monkeypatch):
    """torch.compile's cache does not tell kernel paths apart (code compiled under AVX-512 aborted a process on
    AVX2): the suite gives each path its own folder when TORCHINDUCTOR_CACHE_DIR is unset, the same one in every
    process of a path, and keeps the user's folder when it is set. Torch sets the variable to its default folder
    at a process's first ``torch.compile``; that value is torch's, not the user's, and is replaced too (the full
    suite under the no-vector path fell back to eager when an earlier test's ``torch.compile`` had left the
    shared default folder there). Fails if two paths share a folder, a process of the same path gets another, a
    set folder is overridden, or torch's default is kept."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from bnrotation.study.provenance import compile_cache_per_kernel_path

    code = "from bnrotation.study.provenance import compile_cache_per_kernel_path as f; print(f())"
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", *KERNEL_ENV)}
    vectorless = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}
    ours = {k: os.environ[k] for k in KERNEL_ENV if k in os.environ}  # make test-kernels sets them
    other = {} if ours else vectorless  # another kernel path than this process's

    def folder(**extra) -> str:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**env, **extra}).stdout.strip()

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # restored after the test, also where it was unset
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    here = compile_cache_per_kernel_path()  # this process's path
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == here and Path(here).parent == Path(default_cache_dir())
    assert folder(**ours) == here  # stable: every process of the path
    elsewhere = folder(**other)
    assert elsewhere != here and Path(elsewhere).parent == Path(here).parent
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    assert compile_cache_per_kernel_path() == str(tmp_path)  # the user's folder
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    torch.compile(torch.nn.Identity())  # torch writes its default folder into the variable
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == default_cache_dir()
    assert compile_cache_per_kernel_path() == here == os.environ["TORCHINDUCTOR_CACHE_DIR"]


def test_table_from_smoke_results(smoke_results, tmp_path, capsys):
    assert table_main(["--results", str(smoke_results), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "table.md").read_text()
    for row in EXPERIMENTS:
        assert f"`{row}`" in md
    assert "(`sgd`) | the study's ConvNet | noisy templates | 0 (1) |" in md  # the smoke sweep runs seed 0 of the article's network
    assert "(`resnet20_adam`) | ResNet-20 | noisy templates | 0 (1; to run: seeds 1, 2) |" in md  # SET=resnet runs seeds 0-2 at every scale
    assert "| Minutes per run |" in md and "**Not the article's scale.**" in md  # smoke: orientation only
    csv = pd.read_csv(tmp_path / "table.csv")
    assert set(csv["row"]) == set(EXPERIMENTS)
    assert (csv["n_seeds"] == 1).all()
    sgd = csv.set_index("row").loc["sgd"]
    assert sgd["rotation_per_100_deg_published"] == 0.46
    assert 0 <= sgd["acc_eval_mode_mean"] <= 1 and sgd["norm_growth_mean"] > 0
    assert math.isnan(csv.set_index("row").loc["adam_groupnorm", "acc_reestimated_final_mean"])
    lag = (tmp_path / "lag.md").read_text()  # make table writes the lag table too
    assert "| Adam, lr 3e-3 (`adam`) | conv2 (bn2) |" in lag and "`adam_groupnorm`, `adam_layernorm`" in lag
    assert "adam_groupnorm seed=0" in (tmp_path / "monitor.md").read_text()  # and the monitor's rule on the checks


def test_finished_run_is_skipped_and_a_changed_config_refused(tmp_path):
    cfg = tiny(tmp_path, "experiment=sgd", "interventions=false")
    out = run(cfg)
    stamp = (out / "run.json").stat().st_mtime_ns
    assert run(cfg) is None  # same config: skipped
    assert (out / "run.json").stat().st_mtime_ns == stamp
    with pytest.raises(RunExistsError, match=r"task\.template_scale"):  # a setting the row name does not fix
        run(tiny(tmp_path, "experiment=sgd", "interventions=false", "task.template_scale=0.5"))
    assert run(tiny(tmp_path, "experiment=sgd", "interventions=false", "force=true")) == out


def test_a_key_added_to_the_schema_later_does_not_invalidate_a_finished_run(tmp_path):
    import yaml
    cfg = tiny(tmp_path, "experiment=sgd", "interventions=false")
    out = run(cfg)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    del saved["averaging"], saved["model"]["channels_last"]  # as written before these keys existed
    (out / "config.yaml").write_text(yaml.safe_dump(saved))
    assert run(cfg) is None
    saved["model"]["no_such_key"] = 1
    (out / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(RunExistsError, match="schema"):
        run(cfg)


def test_run_without_done_is_rerun_from_scratch(tmp_path):
    cfg = tiny(tmp_path, "experiment=adam", "interventions=false")
    out = records.run_dir(cfg.results_root, cfg.row, cfg.seed)
    out.mkdir(parents=True)
    (out / "checks.parquet").write_bytes(b"half a file")
    assert run(cfg) == out
    assert (out / records.DONE).exists()
    assert len(pd.read_parquet(out / "checks.parquet")) == 3


def test_schedules_of_a_full_run():
    from conftest import compose_cfg
    from bnrotation.study.config import to_run_config
    cfg = to_run_config(compose_cfg(["experiment=adam"]))
    assert len(check_steps(cfg)) == 41 and check_steps(cfg)[0] == 2000 and check_steps(cfg)[-1] == 6000
    assert intervention_steps(cfg) == list(range(2000, 6001, 500))
    assert min(log_steps(cfg)) == 0 and max(log_steps(cfg)) == 6000 and len(log_steps(cfg)) == 61


@pytest.mark.kernels
def test_same_seed_gives_every_row_the_same_data_and_init(tmp_path):
    a = run(tiny(tmp_path, "experiment=sgd", "interventions=false"))
    b = run(tiny(tmp_path, "experiment=adam", "interventions=false"))
    ca, cb = (pd.read_parquet(p / "channels.parquet") for p in (a, b))
    step0 = lambda df: df[df["step"] == 0][["layer", "channel", "weight_norm", "fresh_mean"]].reset_index(drop=True)
    pd.testing.assert_frame_equal(step0(ca), step0(cb))


def test_table_refuses_a_run_whose_momentum_contradicts_its_row(smoke_results, tmp_path):
    import shutil
    root = tmp_path / "r"
    shutil.copytree(records.run_dir(smoke_results, "adam", 0), records.run_dir(root, "adam_bn_m0.3", 0))
    info_path = records.run_dir(root, "adam_bn_m0.3", 0) / "run.json"
    info = json.loads(info_path.read_text())
    info["row"] = "adam_bn_m0.3"
    info_path.write_text(json.dumps(info))
    with pytest.raises(Exception, match=r"adam_bn_m0\.3.*momentum 0\.03, the row means 0\.3"):
        load_runs(root)
    assert math.isnan(build_table(load_runs(smoke_results)).set_index("row").loc["adam_bn_m0.3",
                                                                                  "norm_growth_published"])


@pytest.mark.parametrize("row", ["adam_groupnorm", "adam_layernorm"])
def test_norms_without_running_statistics_log_them_as_absent(smoke_results, row):
    out = records.run_dir(smoke_results, row, 0)
    ch = pd.read_parquet(out / "channels.parquet")
    for col in ("running_mean", "running_var", "lag_sigma", "predicted_lag_sigma"):
        assert ch[col].isna().all(), col  # absent, not zero
    later = ch[ch["step"] > 0]
    for col in ("rotation_deg", "fresh_mean", "fresh_var", "drift_sigma_per_step", "weight_norm"):
        assert later[col].notna().all(), col
    checks = pd.read_parquet(out / "checks.parquet")
    assert checks["acc_eval_mode"].notna().all()
    assert (checks["acc_train_mode"] == checks["acc_eval_mode"]).all()  # GroupNorm has no train/eval difference
    assert pd.read_parquet(out / "interventions.parquet").empty and not (out / "checkpoints").exists()
    assert json.loads((out / "run.json").read_text())["norm_layers"]["gn1" if row == "adam_groupnorm" else "ln1"][
        "num_groups"] == (8 if row == "adam_groupnorm" else 1)


def test_adamp_row_reads_back_heo_et_als_defaults_and_a_change_is_refused(smoke_results, tmp_path):
    import shutil
    info = json.loads((records.run_dir(smoke_results, "adamp", 0) / "run.json").read_text())
    assert info["optimizer"]["class"] == "ProjectedAdam" and info["projection"]["mode"] == ["adamp"]
    assert {(g["delta"], g["wd_ratio"], g["weight_decay"]) for g in info["optimizer"]["param_groups"]} == \
        {(0.1, 0.1, 0.0)}
    assert "bn1.weight" not in info["projection"]["params"]  # one-dim parameters are never projected
    root = tmp_path / "r"
    shutil.copytree(records.run_dir(smoke_results, "adamp", 0), records.run_dir(root, "adamp", 0))
    info["optimizer"]["param_groups"][0]["delta"] = 1.0
    (records.run_dir(root, "adamp", 0) / "run.json").write_text(json.dumps(info))
    with pytest.raises(Exception, match=r"delta 1\.0 in group 'conv', the row means 0\.1"):
        load_runs(root)
