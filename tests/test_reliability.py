"""Reliability: killed runs and sweeps, diverging runs, corrupt or foreign results,
deterministic reruns, safe checkpoint loading, and the config that was never applied.

Runs here are the smoke scale at a toy size (``TINY``: 8x8 images, 4-8 channels), a
fraction of a second each, so that every fault can be tried on a real run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir

from bnrotation import records

from bnrotation.study import cli, ensemble, rundir, runner
from bnrotation.study.analysis.measures import metrics
from bnrotation.study.analysis.results import BadRunError, has_runs, load_run, load_runs, read_table
from bnrotation.study.analysis.tables.table import build_table, main as table_main
from bnrotation.checkpoints import BadCheckpointError, UnsafeCheckpointError, load_checkpoint, save_checkpoint
from bnrotation.study.config import ConfigError, RunConfig, to_run_config
from bnrotation.study.runner import run

from conftest import CONF, ROOT, TOY_SIZE, compose_cfg, run_cfg

TINY = [*TOY_SIZE, "model.channels=[4,8,8]"]
ALL_TABLES = tuple(records.TABLE_COLUMNS)
# Keys of run.json that say when and where a run ran, not what it computed.
CLOCK_KEYS = ("started_at", "ended_at", "wall_seconds", "timings_s", "host", "cpu", "resumes")


@functools.lru_cache(maxsize=None)
def _composed(overrides: tuple[str, ...]) -> RunConfig:
    return run_cfg([*TINY, *overrides], Path("results"))


def tiny(root: Path, *overrides: str) -> RunConfig:
    """The config of ``experiments/train.py scale=smoke <TINY> <overrides> results_root=<root>``
    (composed once per set of overrides: composing takes longer than a toy run)."""
    return dataclasses.replace(_composed(overrides), results_root=str(root))


def assert_same_results(a: Path, b: Path) -> None:
    """Every parquet value and every checkpoint tensor of two run folders identical; run.json too,
    clock readings aside."""
    for name in ALL_TABLES:
        pd.testing.assert_frame_equal(pd.read_parquet(a / f"{name}.parquet"), pd.read_parquet(b / f"{name}.parquet"),
                                      check_exact=True, obj=name)
    ia, ib = (json.loads((p / "run.json").read_text()) for p in (a, b))
    assert {k: v for k, v in ia.items() if k not in CLOCK_KEYS} == {k: v for k, v in ib.items() if k not in CLOCK_KEYS}
    names = sorted(p.name for p in (a / "checkpoints").iterdir())
    assert names == sorted(p.name for p in (b / "checkpoints").iterdir())
    for ckpt in (a / "checkpoints").iterdir():
        sa, sb = load_checkpoint(ckpt)["model"], load_checkpoint(b / "checkpoints" / ckpt.name)["model"]
        assert all(torch.equal(sa[k], sb[k]) for k in sa), ckpt.name


# ----------------------------------------------------------------------------- 1. killed runs
# Every file a run writes, in order, with how often; a kill during any of them, or during training.
WRITES = [("config.yaml", 1), ("run.json", 1), ("step=10.pt", 1), ("step=20.pt", 1), ("checks.parquet", 1),
          ("layers.parquet", 1), ("channels.parquet", 1), ("interventions.parquet", 1), ("averaging.parquet", 1),
          ("run.json", 2), ("DONE", 1)]


def assert_nothing_complete_looking_is_corrupt(out: Path, ref: Path) -> None:
    """Each file under its final name is whole: equal to the uninterrupted run's (config.yaml and
    run.json: readable; run.json from either of its two writes). Partial bytes only under a temp name."""
    for f in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = f.relative_to(out)
        if f.name.startswith("."):
            assert f.name.endswith(".tmp"), rel  # a write cut short, under its temporary name
        elif f.suffix == ".parquet":
            pd.testing.assert_frame_equal(read_table(f, f.stem), read_table(ref / rel, f.stem), check_exact=True)
        elif f.suffix == ".pt":
            got, want = load_checkpoint(f)["model"], load_checkpoint(ref / rel)["model"]
            assert all(torch.equal(got[k], want[k]) for k in want), rel
        elif f.name == "config.yaml":
            assert {**yaml.safe_load(f.read_text()), "results_root": None} == \
                {**yaml.safe_load((ref / rel).read_text()), "results_root": None}
        elif f.name == "run.json":
            assert json.loads(f.read_text())["status"] in ("running", "done")
        else:
            pytest.fail(f"unexpected file {rel}")


@pytest.mark.kernels
@pytest.mark.slow
def test_killed_runs_are_never_read_as_complete_and_rerun_whole(tmp_path):
    """Killed during writes (a parquet table, the final run.json, DONE and two more drawn at
    random, each at a random fraction of its bytes), in a random training step, by the kernel at
    a random file size (SIGXFSZ), and a disk that fills up on the largest table. The random seed
    is in every message."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    parquet = [w for w in WRITES if w[0].endswith(".parquet")]
    always = [rng.choice(parquet), ("run.json", 2), ("DONE", 1)]
    writes = always + rng.sample([w for w in WRITES if w not in always], 2)
    cases = [f"write:{name}:{n}:{rng.uniform(0.05, 0.95):.3f}" for name, n in writes]
    cases += [f"step:{rng.randint(1, 20)}", f"xfsz:{rng.randint(100, 15_000)}", "fsize:channels.parquet"]
    spec = {"reference": str(tmp_path / "reference"), "overrides": ["experiment=adam", *TINY],
            "cases": [{"root": str(tmp_path / f"case{i}"), "kill": kill} for i, kill in enumerate(cases)]}
    (tmp_path / "cases.json").write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "killed_run.py"), str(tmp_path / "cases.json")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = json.loads(proc.stdout.strip().splitlines()[-1])
    ref = records.run_dir(spec["reference"], "adam", 0)
    for case in spec["cases"]:
        root, kill = Path(case["root"]), case["kill"]
        why = f"kill point {kill} (random seed {seed})"
        out = records.run_dir(root, "adam", 0)
        if kill.startswith("fsize"):
            assert os.waitstatus_to_exitcode(status[str(root)]) == 3, why  # the write raised OSError (EFBIG)
            assert not list(out.glob(".*.tmp")), why  # and cleaned up its temporary file
        else:
            want = signal.SIGXFSZ if kill.startswith("xfsz") else signal.SIGKILL
            assert os.WIFSIGNALED(status[str(root)]) and os.WTERMSIG(status[str(root)]) == want, why
        assert not (out / records.DONE).exists(), why
        assert not has_runs(root), why
        with pytest.raises(BadRunError, match="no DONE marker"):
            load_runs(root)
        assert load_runs(root, skip_bad=True) == [], why
        assert_nothing_complete_looking_is_corrupt(out, ref)
        assert run(tiny(root, "experiment=adam")) == out, why  # not skipped: rerun from scratch
        assert load_run(out).info["status"] == "done"
        assert_same_results(out, ref)


def test_forced_rerun_killed_while_removing_the_old_run_is_rerun_not_skipped(tmp_path, monkeypatch):
    """force=true replaces a finished run; a kill during the removal must not leave DONE behind
    beside missing tables (the next sweep would skip the run forever)."""
    out = run(tiny(tmp_path, "experiment=sgd", "interventions=false"))

    def killed_half_way(path, *args, **kwargs):
        for name in ("checks.parquet", "run.json"):  # some files go, then the process dies
            (Path(path) / name).unlink()
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(rundir.shutil, "rmtree", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        run(tiny(tmp_path, "experiment=sgd", "interventions=false", "force=true"))
    monkeypatch.undo()
    assert not (out / records.DONE).exists()
    assert run(tiny(tmp_path, "experiment=sgd", "interventions=false")) == out  # rerun, not skipped
    assert load_run(out).info["status"] == "done"


@pytest.mark.slow
def test_killed_sweep_resumes_without_redoing_or_duplicating(tmp_path):
    """`experiments/train.py -m` over three rows, SIGKILLed while the second run is under way, then rerun."""
    rows = ("sgd", "adam", "adam_bn_m0.3")
    cmd = [sys.executable, str(ROOT / "experiments" / "train.py"), "-m", f"experiment={','.join(rows)}",
           "scale=smoke", f"results_root={tmp_path}", "progress=false", "threads=1", *TINY]
    dirs = [records.run_dir(tmp_path, row, 0) for row in rows]
    sweep = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while sweep.poll() is None and time.monotonic() < deadline:
        if any((d / records.DONE).exists() for d in dirs) and \
                any(d.exists() and not (d / records.DONE).exists() for d in dirs):
            break
        time.sleep(0.002)
    os.killpg(sweep.pid, signal.SIGKILL)
    sweep.wait()
    done = [d for d in dirs if (d / records.DONE).exists()]
    assert 0 < len(done) < len(rows), "the sweep was not killed half way"
    stamps = {d: (d / "run.json").stat().st_mtime_ns for d in done}

    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    for row, d in zip(rows, dirs):
        assert (d / records.DONE).exists()
        verb = "skip" if d in done else "done"
        assert f"{verb}: {row} seed=0" in rerun.stderr
    assert {d: (d / "run.json").stat().st_mtime_ns for d in done} == stamps  # finished runs not redone

    assert table_main(["--results", str(tmp_path), "--out", str(tmp_path / "table"), "--seeds", "1"]) == 0
    csv = pd.read_csv(tmp_path / "table" / "table.csv")
    assert sorted(csv["row"]) == sorted(rows)  # one line per row, each on its one run
    assert (csv["n_seeds"] == 1).all() and (csv["seeds"].astype(str) == "0").all()


# ----------------------------------------------------------------------------- 2. diverging runs
def nan_loss_at(monkeypatch, step: int) -> None:
    """The training loss turns NaN at ``step`` (the runner computes one loss per step)."""
    real, calls = ensemble.F.cross_entropy, {"n": 0}

    def loss(*args, **kwargs):
        calls["n"] += 1
        value = real(*args, **kwargs)
        return value * float("nan") if calls["n"] == step else value

    monkeypatch.setattr(ensemble.F, "cross_entropy", loss)


def test_diverged_run_ends_at_its_step_keeps_its_rows_and_is_not_averaged(tmp_path, monkeypatch):
    finished = run(tiny(tmp_path, "experiment=adam", "seed=0"))
    nan_loss_at(monkeypatch, 12)  # after the check at step 10, before the one at 15
    out = run(tiny(tmp_path, "experiment=adam", "seed=1"))
    monkeypatch.undo()

    info = json.loads((out / "run.json").read_text())
    assert (info["status"], info["diverged_at_step"], info["steps_completed"]) == ("diverged", 12, 11)
    assert (out / records.DONE).exists()
    diverged = load_run(out, ALL_TABLES)
    assert diverged.diverged
    assert diverged.tables["checks"]["step"].tolist() == [10]  # what was logged before step 12 is kept
    assert sorted(diverged.tables["layers"]["step"].unique()) == [0, 5, 10]
    assert sorted(diverged.tables["interventions"]["step"].unique()) == [10]
    assert diverged.tables["checks"][["loss", "acc_eval_mode"]].notna().all().all()

    # The table counts it and averages only the finished run: every mean is seed 0's own value.
    line = build_table(load_runs(tmp_path)).set_index("row").loc["adam"]
    assert (line["n_seeds"], line["seeds"], line["diverged"], line["diverged_seeds"]) == (1, "0", 1, "1")
    alone = load_run(finished, ALL_TABLES)
    assert line["acc_eval_mode_mean"] == metrics.acc_eval_mode(alone)
    assert line["rotation_per_100_deg_mean"] == metrics.rotation_per_100_deg(alone)
    assert line["norm_growth_mean"] == metrics.norm_growth(alone)
    assert metrics.rotation_per_100_deg(diverged) != metrics.rotation_per_100_deg(alone)  # averaging it in shows
    assert table_main(["--results", str(tmp_path), "--out", str(tmp_path / "t")]) == 0
    assert "| 1 (seeds 1) |" in (tmp_path / "t" / "table.md").read_text()


def test_a_diverging_config_in_a_sweep_is_reported_and_the_sweep_goes_on(tmp_path, capsys):
    """What each Hydra multirun job does (cli.run_task): lr 1e30 makes SGD's loss non-finite."""
    common = ["scale=smoke", f"results_root={tmp_path}", "progress=false", "interventions=false", *TINY]
    diverged = cli.run_task(compose_cfg(["experiment=sgd", "optimizer.lr=1e30", "row=sgd_lr1e30", *common]))
    assert (diverged.status, diverged.exit_code, diverged.failed) == ("diverged", 0, False)
    assert cli.run_task(compose_cfg(["experiment=sgd", *common])).status == "done"
    err = capsys.readouterr().err
    assert "diverged: sgd_lr1e30 seed=0 at step" in err and "done: sgd seed=0" in err
    table = build_table(load_runs(tmp_path)).set_index("row")
    assert table.loc["sgd_lr1e30", "diverged"] == 1 and table.loc["sgd_lr1e30", "n_seeds"] == 0
    assert pd.isna(table.loc["sgd_lr1e30", "acc_eval_mode_mean"])  # nothing to average: "–", not a number
    assert table.loc["sgd", "diverged"] == 0 and table.loc["sgd", "n_seeds"] == 1


# ----------------------------------------------------------------------------- 3. corrupt or foreign results
@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("two_runs")
    for row in ("sgd", "adam"):
        run(tiny(root, f"experiment={row}", "interventions=false"))
    return root


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _rewrite_parquet(path: Path, drop: str | None = None, version: bytes | None = b"keep") -> None:
    table = pq.read_table(path)
    if drop:
        table = table.drop_columns([drop])
    meta = dict(table.schema.metadata or {})
    if version is None:
        meta = {k: v for k, v in meta.items() if not k.startswith(b"bnrotation.")}
    elif version != b"keep":
        meta[b"bnrotation.schema_version"] = version
    pq.write_table(table.replace_schema_metadata(meta), path)


def _edit_run_json(path: Path, **changes) -> None:
    info = json.loads(path.read_text())
    path.write_text(json.dumps({**info, **changes}))


NEWER = str(records.SCHEMA_VERSION + 1)
FAULTS = {  # name: (what to do to the adam run, file named in the message, what the message says)
    "truncated parquet": (lambda d: _truncate(d / "channels.parquet"), "channels.parquet", "unreadable parquet"),
    "missing column": (lambda d: _rewrite_parquet(d / "checks.parquet", drop="acc_eval_mode"), "checks.parquet",
                       "missing columns ['acc_eval_mode']"),
    "newer table schema": (lambda d: _rewrite_parquet(d / "layers.parquet", version=NEWER.encode()),
                           "layers.parquet", f"schema version '{NEWER}'"),
    "foreign table": (lambda d: _rewrite_parquet(d / "layers.parquet", version=None), "layers.parquet",
                      "no bnrotation.schema_version"),
    "newer run.json": (lambda d: _edit_run_json(d / "run.json", schema_version=int(NEWER)), "run.json",
                       f"schema version {NEWER}"),
    "run.json not an object": (lambda d: (d / "run.json").write_text("[1, 2]"), "run.json", "expected a JSON object"),
    "truncated run.json": (lambda d: _truncate(d / "run.json"), "run.json", "unreadable"),
    "foreign config.yaml": (lambda d: (d / "config.yaml").write_text("lr: 0.1\n"), "config.yaml",
                            "expected integer keys scale."),
    "stray file in runs/": (lambda d: (d.parents[1] / "notes.txt").write_text("hi"), "runs/notes.txt",
                                       "stray entry"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_corrupt_or_foreign_results_are_named_and_skipped_only_when_asked(fault, two_runs, tmp_path, capsys):
    damage, file, what = FAULTS[fault]
    root = tmp_path / "results"
    shutil.copytree(two_runs, root)
    damage(records.run_dir(root, "adam", 0))
    capsys.readouterr()

    assert table_main(["--results", str(root), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert file in err and what in err and "--skip-bad" in err and "Traceback" not in err
    assert not (tmp_path / "t" / "table.md").exists()

    assert table_main(["--results", str(root), "--out", str(tmp_path / "t"), "--skip-bad"]) == 0
    err = capsys.readouterr().err
    assert "skipped: " in err and file in err and what in err
    md = (tmp_path / "t" / "table.md").read_text()
    assert "Left out with --skip-bad (1)" in md and file in md
    rows = set(pd.read_csv(tmp_path / "t" / "table.csv")["row"])
    assert rows == ({"sgd", "adam"} if fault.startswith("stray") else {"sgd"})


def test_every_table_carries_the_schema_version(two_runs, tmp_path):
    for path in records.run_dir(two_runs, "adam", 0).glob("*.parquet"):
        meta = pq.read_schema(path).metadata
        assert meta[b"bnrotation.schema_version"] == str(records.SCHEMA_VERSION).encode(), path.name
        assert meta[b"bnrotation.table"] == path.stem.encode()
    assert table_main(["--results", str(two_runs), "--out", str(tmp_path)]) == 0
    assert (pd.read_csv(tmp_path / "table.csv")["schema_version"] == records.SCHEMA_VERSION).all()
    assert f"(schema version {records.SCHEMA_VERSION})" in (tmp_path / "table.md").read_text()


# ----------------------------------------------------------------------------- 5. deterministic reruns
@pytest.mark.kernels
def test_same_row_and_seed_twice_on_cpu_gives_identical_results(tmp_path):
    a = run(tiny(tmp_path / "a", "experiment=adam_projected", "seed=3"))
    b = run(tiny(tmp_path / "b", "experiment=adam_projected", "seed=3"))
    assert_same_results(a, b)
    c = run(tiny(tmp_path / "c", "experiment=adam_projected", "seed=4"))  # the comparison can tell runs apart
    with pytest.raises(AssertionError):
        assert_same_results(a, c)


# ----------------------------------------------------------------------------- 6. safe checkpoint loading
class _Payload:
    """Unpickling this runs code: it writes a file (``Path.write_text``)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.write_text, (self.marker, "code ran")


def test_checkpoint_that_needs_code_is_refused_and_the_code_never_runs(tmp_path):
    marker = tmp_path / "code_ran"
    evil = tmp_path / "evil.pt"
    torch.save({"model": {}, "step": 10, "payload": _Payload(marker)}, evil)
    with pytest.raises(UnsafeCheckpointError, match=r"evil\.pt: refused: loading it would run arbitrary code "
                                                    r"\(it pickles .*getattr"):
        load_checkpoint(evil)
    assert not marker.exists()
    whole_module = tmp_path / "module.pt"
    torch.save(torch.nn.Linear(2, 2), whole_module)
    with pytest.raises(UnsafeCheckpointError, match=r"module\.pt: .*torch\.nn\.modules\.linear\.Linear"):
        load_checkpoint(whole_module)
    torch.load(evil, weights_only=False)  # the payload is live: an unsafe loader would have run it
    assert marker.read_text() == "code ran"


def test_checkpoint_round_trip_and_a_truncated_one_named(tmp_path):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    path = tmp_path / "checkpoints" / "step=10.pt"
    save_checkpoint(path, model, step=10, row="adam", seed=0)
    loaded = load_checkpoint(path)
    assert (loaded["step"], loaded["row"], loaded["seed"]) == (10, "adam", 0)
    assert all(torch.equal(loaded["model"][k], v) for k, v in model.state_dict().items())
    _truncate(path)
    with pytest.raises(ValueError, match=r"step=10\.pt: unreadable checkpoint"):
        load_checkpoint(path)
    (tmp_path / "notes.pt").write_text("not a torch file")  # no pickle at all: unreadable, not unsafe
    with pytest.raises(BadCheckpointError, match=r"notes\.pt: unreadable checkpoint"):
        load_checkpoint(tmp_path / "notes.pt")


# ----------------------------------------------------------------------------- 7. the config that was never applied
def test_momentum_patched_into_a_file_that_is_never_loaded_is_flagged_by_the_table(tmp_path, capsys):
    """The article's window test: BatchNorm momentum 0.3 written into a config file that the
    composition does not load. The run goes through with 0.03; the table refuses the row."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    window = conf / "experiment" / "adam_bn_m0.3.yaml"
    window.write_text(window.read_text().replace("model:\n  bn_momentum: 0.3\n", ""))
    (conf / "model" / "convnet_bn_m0.3.yaml").write_text(
        (conf / "model" / "convnet_bn.yaml").read_text().replace("bn_momentum: 0.03", "bn_momentum: 0.3"))
    root = tmp_path / "results"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = to_run_config(compose(config_name="config", overrides=[
            "experiment=adam_bn_m0.3", "scale=smoke", f"results_root={root}", "progress=false",
            "interventions=false", *TINY]))
    assert cfg.row == "adam_bn_m0.3" and cfg.model.bn_momentum == 0.03  # the edit never reached the run
    with pytest.raises(ConfigError, match=r"^model.bn_momentum: 0.03 changes what row 'adam_bn_m0.3' means"):
        run(cfg)  # today the runner refuses it before any step
    assert not root.exists()
    # A run made by a suite without that check (simulated) is still refused by the table, from run.json.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "check_row", lambda cfg: None)
        mp.setattr(runner, "check_against_row", lambda built, spec: [])
        run(cfg)
    run(tiny(root, "experiment=adam", "interventions=false"))
    capsys.readouterr()

    assert table_main(["--results", str(root), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "adam_bn_m0.3" in err and "bn1 ran with BatchNorm momentum 0.03, the row means 0.3" in err
    assert table_main(["--results", str(root), "--out", str(tmp_path / "t"), "--skip-bad"]) == 0
    assert set(pd.read_csv(tmp_path / "t" / "table.csv")["row"]) == {"adam"}
    assert "momentum 0.03, the row means 0.3" in (tmp_path / "t" / "table.md").read_text()


def test_momentum_in_the_config_but_not_in_the_built_layers_is_flagged(tmp_path, monkeypatch):
    """The check reads what was built, not the config: a model builder that drops the momentum
    (BatchNorm2d's default 0.1) is caught although config.yaml says 0.3."""
    import bnrotation.study.model as model_module
    monkeypatch.setattr(model_module, "make_norm",
                        lambda cfg, channels: torch.nn.BatchNorm2d(channels, eps=cfg.bn_eps))
    cfg = tiny(tmp_path, "experiment=adam_bn_m0.3", "interventions=false")
    assert cfg.model.bn_momentum == 0.3
    with pytest.raises(ConfigError, match=r"bn2 ran with BatchNorm momentum 0\.1, the row means 0\.3"):
        run(cfg)  # the runner reads the built layers back before the first step
    monkeypatch.setattr(runner, "check_against_row", lambda built, spec: [])  # a suite without that check
    out = run(cfg)
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["bn_momentum"] == 0.3
    with pytest.raises(BadRunError, match=r"bn2 ran with BatchNorm momentum 0\.1, the row means 0\.3"):
        load_run(out)
