"""Never a false reproduction: a sweep that lost a run fails and names it, the analysis
never swaps the reference results in for the user's own, a key the schema lacks stops the run even with ``+``,
and a variant that keeps a row's name is refused before it trains."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bnrotation import records

from bnrotation.study import cli
from bnrotation.study.analysis import results as results_mod
from bnrotation.study.analysis.tables.table import main as table_main
from bnrotation.study.config import ConfigError, RunConfig, check_row, to_run_config
from bnrotation.study.runner import run

from conftest import ROOT, compose_cfg

TINY = ["scale=smoke", "task.image_size=8", "task.batch_size=16", "task.probe_size=16", "scale.heldout_size=32",
        "model.channels=[4,8,8]", "progress=false", "interventions=false", "averaging.enabled=false",
        "save_checkpoints=false", "threads=1"]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


def train(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "train.py"), *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=240)


# ----------------------------------------------------------------------------- 1. a failed sweep fails
@pytest.mark.slow
def test_a_sweep_that_lost_a_run_exits_non_zero_naming_it(tmp_path):
    """``adam``'s folder cannot be made (a file stands where runs/adam/ would be); ``sgd`` finishes."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "adam").write_text("in the way")
    proc = train("-m", "experiment=sgd,adam", f"results_root={tmp_path}", f"hydra.sweep.dir={tmp_path / 'hydra'}",
                 *TINY)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert (records.run_dir(tmp_path, "sgd", 0) / records.DONE).exists()  # the sweep went on after the failure
    lines = proc.stderr.splitlines()
    summary = lines.index(next(line for line in lines if line.startswith("sweep: 2 runs")))
    assert "1 done" in lines[summary] and "1 failed" in lines[summary]
    assert lines[summary + 1].startswith("  failed: adam seed=0: ")
    assert any(line.startswith("error: run adam seed=0 failed: ") and line.endswith(
        "(its traceback: rerun with hydra.verbose=true)") for line in lines)  # the one line says where the rest is
    assert lines[-1].startswith("sweep FAILED: 1 of 2 runs did not finish")


@pytest.mark.slow
def test_a_sweep_whose_runs_all_finish_exits_zero(tmp_path):
    proc = train("-m", "experiment=sgd", "seed=0,1", f"results_root={tmp_path}",
                 f"hydra.sweep.dir={tmp_path / 'hydra'}", *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sweep: 2 runs: 2 done" in proc.stderr and "FAILED" not in proc.stderr
    owner = json.loads((tmp_path / "hydra" / cli.SWEEP_OWNER_FILE).read_text())
    assert owner["pid"] != os.getpid() and "seed=0,1" in owner["argv"]
    # a second sweep into the same folder would mix its jobs' outcomes with the first's: refused before any job
    again = train("-m", "experiment=sgd", "seed=2", f"results_root={tmp_path}",
                  f"hydra.sweep.dir={tmp_path / 'hydra'}", *TINY)
    assert again.returncode == 2, again.stderr[-3000:]
    assert again.stderr.strip().splitlines()[-1].startswith(
        f"error: hydra.sweep.dir {tmp_path / 'hydra'} already belongs to another sweep (started ")
    assert f"by pid {owner['pid']}" in again.stderr
    assert not records.run_dir(tmp_path, "sgd", 2).exists()


def test_a_sweep_folder_is_claimed_by_one_sweep_only(tmp_path):
    """Two sweeps started in the same instant, or one ``hydra.sweep.dir`` given twice, would share job folders
    and the summary would count the other sweep's jobs as its own: the first claim wins, the rest are refused."""
    assert cli.claim_sweep_dir(tmp_path / "a", argv=["train.py", "-m"]) is None
    problem = cli.claim_sweep_dir(tmp_path / "a")
    assert problem.startswith(f"hydra.sweep.dir {tmp_path / 'a'} already belongs to another sweep (started ")
    assert f"pid {os.getpid()}" in problem
    (tmp_path / "a" / cli.SWEEP_OWNER_FILE).write_text("{")  # a torn record still holds the folder
    assert "sweep.json is unreadable" in cli.claim_sweep_dir(tmp_path / "a")
    for job in ("0", "1"):  # an earlier sweep's folder without a record: refused, and none is left behind
        (tmp_path / "b" / job).mkdir(parents=True)
    assert "already holds the job folders of an earlier sweep (0, 1)" in cli.claim_sweep_dir(tmp_path / "b")
    assert not (tmp_path / "b" / cli.SWEEP_OWNER_FILE).exists()


def test_the_default_sweep_and_run_folders_are_named_to_the_microsecond():
    """So that two commands started in the same second get folders of their own."""
    from omegaconf import OmegaConf
    hydra = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "config.yaml"), resolve=False)["hydra"]
    assert hydra["sweep"]["dir"].endswith("${now:%Y-%m-%d_%H-%M-%S.%f}")
    assert hydra["run"]["dir"].endswith("${now:%Y-%m-%d_%H-%M-%S.%f}")


def test_a_job_without_an_outcome_counts_as_failed(tmp_path):
    cli.record_outcome(cli.Outcome("done", 0, "sgd seed=0"), tmp_path / "0")
    (tmp_path / "1").mkdir()  # a job whose process died before it wrote its outcome
    cli.record_outcome(cli.Outcome("skipped", 0, "sgd seed=2"), tmp_path / "2")
    text, failed = cli.summarise_sweep(tmp_path)
    assert failed and "3 runs: 2 done" not in text
    assert "  failed: job 1: no outcome.json" in text
    assert cli.summarise_sweep(tmp_path / "nothing")[1]  # a sweep that ran no job did not succeed either


@pytest.mark.slow
def test_make_reproduce_stops_before_analysing_when_the_sweep_fails(tmp_path):
    """The Makefile's `reproduce` runs the sweep first; its exit status stops make before table/figures/claims."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "adam").write_text("in the way")
    out = tmp_path / "out"
    proc = subprocess.run(["make", "-s", "reproduce", "SCALE=smoke", "ROWS=adam", f"RESULTS={tmp_path}",
                           f"OUT={out}", f"PY={sys.executable}", f"ARGS={' '.join(TINY[1:])}"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    assert "sweep FAILED" in proc.stderr
    assert not out.exists()  # no table, figures or claims were written


def test_the_analysis_reads_your_crashed_runs_not_the_reference_ones(tmp_path, monkeypatch, capsys):
    """Asked for nothing, with a crashed run under results/: the table names that run and stops; it never
    falls back to results/reference (whose runs the test also puts there)."""
    monkeypatch.chdir(tmp_path)
    good = run(to_run_config(compose_cfg(["experiment=sgd", "results_root=results/reference", *TINY])))
    crashed = records.run_dir("results", "adam", 0)
    crashed.mkdir(parents=True)
    assert table_main(["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("reading results (your own runs")
    assert any(str(crashed) in line and "no DONE marker" in line for line in err)
    assert not (tmp_path / "out").exists()
    # with nothing of your own, the committed reference runs, and the first line says so
    crashed.rmdir()
    (tmp_path / "results" / "runs" / "adam").rmdir()
    (tmp_path / "results" / "runs").rmdir()
    assert results_mod.default_results_root() == results_mod.REFERENCE_ROOT
    assert table_main(["--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("reading results/reference (the committed reference runs")
    assert good == records.run_dir("results/reference", "sgd", 0)
    assert "from the runs under `results/reference`" in (tmp_path / "out" / "table.md").read_text()


# ----------------------------------------------------------------------------- 2. appended keys stop the run
@pytest.mark.parametrize("override, key, hint", [("+optimizer.lrr=0.1", "optimizer.lrr", "optimizer.lr"),
                                                 ("+model.bn_mom=0.3", "model.bn_mom", "model.bn_momentum"),
                                                 ("+seeed=3", "seeed", "seed"),
                                                 ("+scale.stepz=10", "scale.stepz", "scale.steps")])
def test_an_appended_key_the_schema_lacks_is_rejected_naming_it(override, key, hint):
    with pytest.raises(ConfigError, match=rf"^{key}: not a key of the config \(did you mean {hint}\?\)"):
        to_run_config(compose_cfg(["experiment=adam", override]))


def test_an_appended_key_stops_the_command_before_any_work(tmp_path):
    proc = train("experiment=adam", f"results_root={tmp_path}", "+optimizer.lrr=0.1", *TINY)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: bad config: optimizer.lrr: not a key")
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- 3. variants need a row name
@pytest.mark.parametrize("override, key", [("optimizer.lr=0.001", "optimizer.lr"),
                                           ("model.bn_momentum=0.1", "model.bn_momentum"),
                                           ("schedule=cosine", "schedule.name"),
                                           ("optimizer=sgd", "optimizer.name"),
                                           ("optimizer.weight_decay=0.01", "optimizer.weight_decay")])
def test_a_variant_that_keeps_the_row_name_is_refused_naming_the_key(override, key, tmp_path):
    cfg = to_run_config(compose_cfg(["experiment=adam", override, f"results_root={tmp_path}", *TINY]))
    with pytest.raises(ConfigError, match=rf"^{key}: .* changes what row 'adam' means.*row="):
        check_row(cfg)
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        run(cfg)  # the runner refuses too, before it makes the run's folder
    assert not (tmp_path / "runs").exists()
    check_row(to_run_config(compose_cfg(["experiment=adam", override, "row=adam_variant"])))  # its own name: fine


def test_adamp_delta_is_part_of_the_row(tmp_path):
    with pytest.raises(ConfigError, match=r"^optimizer.delta: "):
        check_row(to_run_config(compose_cfg(["experiment=adamp", "optimizer.delta=0.5"])))


def test_a_variant_stops_the_command_with_status_2(tmp_path):
    proc = train("experiment=adam", "optimizer.lr=0.001", "force=true", f"results_root={tmp_path}", *TINY)
    assert proc.returncode == 2
    assert "error: bad config: optimizer.lr: 0.001 changes what row 'adam' means" in proc.stderr
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- 7. every run diverged
def test_figures_and_claims_on_a_root_where_every_run_diverged_stop_with_one_line(tmp_path, capsys):
    """lr 1e30 makes SGD's loss non-finite at once; the table counts the run, figures and claims refuse the root."""
    from bnrotation.study.analysis.claims import main as claims_main
    from bnrotation.study.analysis.tables.figures import main as figures_main

    out = run(to_run_config(compose_cfg(["experiment=sgd", "optimizer.lr=1e30", "row=sgd_lr1e30",
                                         f"results_root={tmp_path}", *TINY])))
    assert json.loads((out / "run.json").read_text())["status"] == "diverged"
    capsys.readouterr()
    for main, out_dir in ((figures_main, tmp_path / "figures"), (claims_main, tmp_path / "claims")):
        assert main(["--results", str(tmp_path), "--out", str(out_dir)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"error: every run under {tmp_path}/runs diverged (non-finite loss: "
                                  "sgd_lr1e30 seed=0 at step ")
        assert len(err) == 2 and not out_dir.exists()  # the root line, the error; nothing written
    assert table_main(["--results", str(tmp_path), "--out", str(tmp_path / "table")]) == 0  # the table counts it
    assert "| 1 (seeds 0) |" in (tmp_path / "table" / "table.md").read_text()


# ----------------------------------------------------------------------------- 6. bad places
def _bad_places(tmp_path: Path) -> list[Path]:
    """A path through a regular file, and one on a virtual file system where nothing can be created."""
    (tmp_path / "a_file").write_text("not a folder")
    return [tmp_path / "a_file" / "results"] + ([Path("/proc/x")] if Path("/proc/self").is_dir() else [])


@pytest.mark.parametrize("mode", ["single", "sweep"])
def test_a_results_root_that_cannot_be_created_is_one_line_before_any_work(mode, tmp_path):
    for bad in _bad_places(tmp_path):
        proc = train(*(["-m"] if mode == "sweep" else []), "experiment=sgd", f"results_root={bad}", *TINY)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines() == [f"error: results_root={bad}: cannot be created: "
                                                    + records.folder_problem(bad)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_folder_problem_names_what_is_in_the_way(tmp_path):
    (tmp_path / "f").write_text("")
    assert records.folder_problem(tmp_path / "f" / "x" / "y") == f"{tmp_path / 'f'} is a file, not a folder"
    assert records.folder_problem(tmp_path / "f") == f"{tmp_path / 'f'} is a file, not a folder"
    assert records.folder_problem(tmp_path / "new" / "deeper") is None
    assert records.folder_problem(tmp_path) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]  # nothing created, the probe folder removed
    if Path("/proc/self").is_dir():
        assert records.folder_problem("/proc/x").startswith("nothing can be created in /proc (")


def test_run_task_refuses_a_results_root_that_cannot_be_created(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    outcome = cli.run_task(compose_cfg(["experiment=sgd", f"results_root={tmp_path / 'a_file' / 'r'}", *TINY]))
    assert (outcome.status, outcome.exit_code) == ("bad config", 2)
    assert capsys.readouterr().err.startswith(f"error: results_root={tmp_path / 'a_file' / 'r'}: cannot be created")


@pytest.mark.parametrize("override", ["optimizer.lr=-1", "+optimizer.lrr=0.1", "optimizer.lr=0.001"])
def test_a_rejected_config_leaves_no_hydra_run_folder(override, tmp_path):
    """Hydra makes <results_root>/hydra/runs/<time>/ before the task runs; a config rejected there removes it,
    and the results root too when the command created it."""
    proc = train("experiment=adam", f"results_root={tmp_path / 'new_root'}", override, *TINY)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: bad config: ")
    assert list(tmp_path.iterdir()) == []


def test_only_a_run_folder_holding_nothing_but_hydras_files_is_removed(tmp_path):
    run_dir = tmp_path / "hydra" / "runs" / "2026-01-01_00-00-00"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "train.log").write_text("")
    (tmp_path / "hydra" / "multirun").mkdir()
    kept = tmp_path / "hydra" / "runs" / "2026-01-01_00-00-01"
    (kept / ".hydra").mkdir(parents=True)
    (kept / "notes.txt").write_text("mine")
    assert not cli.remove_unused_run_dir(kept, "train") and (kept / "notes.txt").exists()
    assert cli.remove_unused_run_dir(run_dir, "train") and not run_dir.exists()
    assert (tmp_path / "hydra" / "runs").is_dir()  # not empty: kept
    (kept / "notes.txt").unlink()
    assert cli.remove_unused_run_dir(kept, "train")
    assert not (tmp_path / "hydra" / "runs").exists() and (tmp_path / "hydra" / "multirun").is_dir()
    (tmp_path / "hydra" / "multirun").rmdir()
    again = tmp_path / "hydra" / "runs" / "2026-01-01_00-00-02"
    (again / ".hydra").mkdir(parents=True)
    assert cli.remove_unused_run_dir(again, "train")
    assert tmp_path.is_dir() and list(tmp_path.iterdir()) == []  # a results root that was there before stays


@pytest.mark.parametrize("target, var, value, allowed", [
    ("sweep", "SCALE", "huge", "expected one of full quick smoke"),
    ("row", "SCALE", "full quick", "expected one of full quick smoke"),
    ("reproduce", "SCALE", "", "expected one of full quick smoke"),
    ("sweep", "JOBS", "0", "expected a whole number >= 1"),
    ("sweep", "JOBS", "abc", "expected a whole number >= 1"),
    ("reproduce", "JOBS", "-2", "expected a whole number >= 1"),
])
def test_a_bad_make_variable_is_named_before_python_runs(target, var, value, allowed, tmp_path):
    marker = tmp_path / "python_ran"
    proc = subprocess.run(["make", "-s", target, f"{var}={value}", f"PY=touch {marker};", f"RESULTS={tmp_path}"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"Makefile:{_line_of(var)}: *** {var}={value}: {allowed} "
                                                f"{'(conf/scale/)' if var == 'SCALE' else '(runs at once)'}.  Stop."]
    assert not marker.exists()


def _line_of(var: str) -> int:
    lines = (ROOT / "Makefile").read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if line.startswith(f"$(error {var}="))


# ----------------------------------------------------------------------------- 10. outputs inside the root read
OUTPUTS = ("table.md", "table.csv", "lag.md", "claims.md", "figures/01_accuracy_vs_rotation.png")


def _snapshot(folder: Path, leave_out: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")
            if p.is_file() and leave_out not in p.parents}


@pytest.fixture(scope="module")
def own_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("own_root")
    for row in ("sgd", "adam"):
        run(to_run_config(compose_cfg([f"experiment={row}", f"results_root={root}", *TINY])))
    return root


def make(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", *args, f"PY={sys.executable}"], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def test_analysing_another_root_writes_inside_it_and_touches_no_committed_file(own_root, monkeypatch):
    """`make table claims RESULTS=<root>` (claims.py's own default is results/: only the Makefile puts it in the
    root) and the figures' own default (make passes the same folder), one figure, to keep the test quick."""
    from bnrotation.study.analysis.tables.figures import main as figures_main

    before = _snapshot(ROOT / "results", own_root)
    proc = make("table", "claims", f"RESULTS={own_root}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    monkeypatch.chdir(ROOT)
    assert figures_main(["--results", str(own_root), "--only", "01_accuracy_vs_rotation"]) == 0
    assert all((own_root / f).is_file() for f in OUTPUTS)
    assert _snapshot(ROOT / "results", own_root) == before  # results/ and results/reference/ untouched


def test_the_committed_outputs_live_beside_the_reference_runs():
    ref = ROOT / results_mod.REFERENCE_ROOT
    assert all((ref / f).is_file() for f in (*OUTPUTS, "figures/README.md", "averaging.md", "averaging.csv"))
    tracked = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    # the reference runs; one Adam seed on two kernel paths; the reports of make test-compat and make mutants
    kept = ("results/reference/", "results/kernel-paths/", "results/compat/", "results/mutants/")
    assert not [f for f in tracked if not f.startswith(kept) and f != "results/bench.md"]
    assert results_mod.output_folder(None, results_mod.REFERENCE_ROOT) == results_mod.REFERENCE_ROOT
    assert results_mod.output_folder(None, "/tmp/x") == Path("/tmp/x")
    assert results_mod.output_folder("/tmp/review", "/tmp/x") == Path("/tmp/review")


def test_the_analysis_of_another_root_never_writes_into_the_reference_outputs(own_root, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    before = _snapshot(ROOT / "results" / "reference", own_root)
    for out in ("results/reference", "results/reference/figures", "results/reference/x"):
        assert results_mod.main(["--results", str(own_root), "--out", out]) == 2
        assert capsys.readouterr().err.startswith(f"error: OUT={out}: inside results/reference, which holds the "
                                                  "committed reference outputs")
        assert table_main(["--results", str(own_root), "--out", out]) == 2
        assert "inside results/reference" in capsys.readouterr().err
    assert _snapshot(ROOT / "results" / "reference", own_root) == before
    assert results_mod.main(["--results", "results/reference", "--out", "results/reference/figures"]) == 0
    assert capsys.readouterr().out == "results/reference/figures\n"


def test_an_out_folder_that_cannot_be_created_is_one_line(own_root, tmp_path, capsys):
    from bnrotation.study.analysis.tables.figures import main as figures_main

    for bad in _bad_places(tmp_path):
        why = records.folder_problem(bad)
        said = f"the outputs are written here, but it cannot be created: {why}"
        for main in (table_main, figures_main):
            assert main(["--results", str(own_root), "--out", str(bad)]) == 2
            assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {bad}: {said}"
        proc = make("claims", f"RESULTS={own_root}", f"OUT={bad}", timeout=60)
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines()[0] == f"error: OUT={bad}: {said}"
        assert "Traceback" not in proc.stderr and "reading" not in proc.stderr  # claims never started


@pytest.mark.parametrize("scale, root", [("quick", "results/quick"), ("smoke", "results/smoke"), ("full", "results")])
def test_make_reproduce_keeps_each_scale_in_its_own_root(scale, root):
    proc = make("-n", "reproduce", f"SCALE={scale}", timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.replace("\\\n", " ").splitlines()
    sweep = next(line for line in lines if "experiments/train.py -m" in line)
    assert f"results_root={root} " in sweep + " "
    for module in ("tables.table", "tables.figures", "claims"):
        line = next(line for line in lines if f"bnrotation.study.analysis.{module}" in line)
        assert f"--results {root} " in line


@pytest.mark.parametrize("argv, said", [
    (["scale=smoke", "optimzer.lr=1"], "optimzer: not a key of the config (did you mean optimizer?)"),
    (["-m", "experiment=adam,sgd", "scale=smoke", "scale.stepz=3"], "scale.stepz: not a key of the config (did "
                                                                    "you mean scale.steps?)"),
    (["experiment=adam", "+foo=1"], "foo: not a key of the config"),
])
def test_a_misspelt_key_of_a_run_is_one_line_and_exit_2_before_hydra(argv, said, capsys):
    """The second key of a sweep too, and one under a group's choice (scale=smoke scale.stepz=3)."""
    with pytest.raises(SystemExit) as stop:
        cli.stop_on_unknown_keys(RunConfig, argv, groups=("experiment",))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith(f"error: bad config: {said}") and err.count("\n") == 1, err


def test_the_choices_of_config_groups_and_hydras_own_keys_pass():
    cli.stop_on_unknown_keys(RunConfig, ["-m", "experiment=adam,sgd", "scale=smoke", "scale.steps=3",
                                         "task=fashion_mnist", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                                         "~averaging", "seed=0,1"], groups=("experiment",))


def test_experiments_train_py_stops_a_misspelt_key_in_one_line():
    done = train("experiment=adam", "scale=smoke", "optimizer.lrr=0.1")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == ("error: bad config: optimizer.lrr: not a key of the config (did you mean "
                                   "optimizer.lr?); keys are listed in bnrotation/study/config.py and conf/")
