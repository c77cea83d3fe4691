"""Runs that survive the real world: a stop signal saves a resumable state at a step
boundary and the next run resumes it, bit-identical to an uninterrupted run; one process trains a run at a
time; the dense windows log what the monitor logs, at every step."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from bnrotation import records

from bnrotation.study import ensemble, rundir, runner
from bnrotation.study.rundir import RESUME_FILE
from bnrotation.study.runner import run
from bnrotation.study.runtime import RunInterrupted

from conftest import ROOT
from test_reliability import TINY, assert_same_results, tiny

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
# smoke scale at the toy size, with everything on: checks, interventions, averaging (EMA and tail), checkpoints
EVERYTHING = ("experiment=adam", "averaging.tail_steps=10", "averaging.tail_every=5")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    return run(tiny(tmp_path_factory.mktemp("uninterrupted"), *EVERYTHING))


def interrupt_at(monkeypatch, steps: list[int], signum: int = signal.SIGTERM) -> None:
    """Send ``signum`` to this process during the training steps numbered ``steps`` (1-based loss calls)."""
    real, calls = ensemble.F.cross_entropy, {"n": 0}

    def loss(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] in steps:
            os.kill(os.getpid(), signum)
        return real(*args, **kwargs)

    monkeypatch.setattr(ensemble.F, "cross_entropy", loss)


@pytest.mark.kernels
def test_a_run_stopped_at_random_steps_resumes_bit_identical(tmp_path, monkeypatch, uninterrupted):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    first = rng.randint(1, 18)
    second = rng.randint(1, 20 - first - 1)  # counted in the resumed process's own training steps
    why = f"stopped after steps {first} and {first + second} (random seed {seed})"
    cfg = tiny(tmp_path, *EVERYTHING)
    out = records.run_dir(tmp_path, "adam", 0)
    walls = [0.0]  # the wall time the saved state carries: every process's so far
    for at, signum in ((first, signal.SIGTERM), (second, signal.SIGINT)):
        with monkeypatch.context() as m:
            interrupt_at(m, [at], signum)
            with pytest.raises(RunInterrupted) as stop:
                run(cfg)
        assert stop.value.signum == signum, why
        assert (out / RESUME_FILE).exists() and not (out / records.DONE).exists(), why
        assert signal.getsignal(signum) is not None  # the previous handlers are back
        walls.append(torch.load(out / RESUME_FILE, weights_only=True)["wall_seconds"])
        assert walls[-1] > walls[-2], why
    state = torch.load(out / RESUME_FILE, weights_only=True)
    state["wall_seconds"] = before = 1000.0  # a known total for the earlier processes
    torch.save(state, out / RESUME_FILE)
    t0 = time.time()
    assert run(cfg) == out  # resumes, not skipped, not restarted
    last = time.time() - t0
    wall = json.loads((out / "run.json").read_text())["wall_seconds"]
    assert before < wall <= before + last + 0.01, why  # every process's, not the last one's
    assert not (out / RESUME_FILE).exists(), why
    info = json.loads((out / "run.json").read_text())
    assert [r["at_step"] for r in info["resumes"]] == [first, first + second], why
    assert_same_results(out, uninterrupted)


@pytest.mark.kernels
def test_a_stop_before_the_first_step_saves_step_0_and_resumes_bit_identical(tmp_path, monkeypatch, uninterrupted):
    """A stop that arrives during step 0's measurements (before any training step; under SLURM, a preemption
    right after the job starts) saves the state at step 0; the resumed run does not measure step 0 twice."""
    cfg = tiny(tmp_path, *EVERYTHING)
    out = records.run_dir(tmp_path, "adam", 0)
    real = runner._measure

    def measure(m, step, *args):
        real(m, step, *args)
        if step == 0:
            os.kill(os.getpid(), signal.SIGTERM)

    with monkeypatch.context() as m:
        m.setattr(runner, "_measure", measure)
        with pytest.raises(RunInterrupted):
            run(cfg)
    assert torch.load(out / RESUME_FILE, weights_only=True)["step"] == 0
    assert run(cfg) == out
    assert [r["at_step"] for r in json.loads((out / "run.json").read_text())["resumes"]] == [0]
    assert_same_results(out, uninterrupted)


def test_a_stop_after_the_last_step_finishes_the_run_and_passes_the_signal_on(tmp_path, monkeypatch):
    """A signal that arrives while the finished run writes its results (after the loop's last read of the flag)
    is not swallowed: the run completes, then the handler it was meant for gets it (a sweep stops)."""
    real, got = runner._finish, []

    def finish(m, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGUSR2)
        return real(m, *args, **kwargs)

    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: got.append(signum))
    try:
        with monkeypatch.context() as m:
            m.setattr(runner, "_finish", finish)
            out = run(tiny(tmp_path, "experiment=adam"))
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert (out / records.DONE).exists() and not (out / RESUME_FILE).exists()
    assert got == [signal.SIGUSR2]


def test_force_or_another_config_starts_over_instead_of_resuming(tmp_path, monkeypatch):
    cfg = tiny(tmp_path, *EVERYTHING)
    interrupt_at(monkeypatch, [3])
    with pytest.raises(RunInterrupted):
        run(cfg)
    monkeypatch.undo()
    other = tiny(tmp_path, *EVERYTHING, "task.template_scale=0.5")  # not the config that was interrupted
    out = run(other)
    assert json.loads((out / "run.json").read_text())["resumes"] == []


@pytest.mark.slow
def test_the_sweep_reports_an_interrupted_run_and_the_next_sweep_resumes_it(tmp_path, capsys):
    """A real process and a real SIGINT (Ctrl-C): exit status 130, 'interrupted' with the step, the state on
    disk; the same command again finishes the run (its task, ``cli.run_task``, in this process: the resume
    reads only what the first process left on disk)."""
    from bnrotation.study.cli import run_task

    from conftest import compose_cfg
    overrides = ["experiment=adam", f"results_root={tmp_path}", "scale=smoke", "scale.steps=400", "scale.log_every=5",
                 "scale.check_start=200", "scale.check_every=100", "scale.intervene_every=200", "task.image_size=8",
                 "task.batch_size=16", "task.probe_size=16", "scale.heldout_size=32", "model.channels=[4,8,8]",
                 "progress=false", "threads=1"]
    cmd = [sys.executable, str(ROOT / "experiments" / "train.py"), *overrides]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_json = records.run_dir(tmp_path, "adam", 0) / "run.json"
    deadline = time.time() + 120
    while not run_json.exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted: adam seed=0 stopped by SIGINT after step" in err
    assert (run_json.parent / RESUME_FILE).exists()
    capsys.readouterr()
    again = run_task(compose_cfg(overrides))
    stderr = capsys.readouterr().err
    assert again.exit_code == 0, stderr[-2000:]
    info = json.loads(run_json.read_text())
    assert info["status"] == "done" and len(info["resumes"]) == 1
    at = info["resumes"][0]["at_step"]
    assert f"resuming adam seed=0 at step {at} of 400 from {run_json.parent / RESUME_FILE}" in stderr


# ----------------------------------------------------------------------------- one process per run
@pytest.mark.slow
def test_two_processes_on_one_run_folder_train_it_once(tmp_path, capsys):
    """The second of two real processes started on the same run is refused while the first holds the lock;
    the first finishes undisturbed; a third, once the first has exited, skips the finished run.

    The first is held (SIGSTOP) from the moment its lock names it until the second has been refused, so it
    holds the lock however long the second takes to start, and a short run suffices. The third is the same
    command's task (``cli.run_task``) in this process: what it checks, the lock released by the first's exit
    and the finished run skipped, needs no third interpreter."""
    from bnrotation.study.cli import run_task

    from conftest import compose_cfg
    overrides = ["experiment=sgd", f"results_root={tmp_path}", "scale=smoke", "scale.steps=400",
                 "scale.log_every=100", "scale.check_start=300", "scale.check_every=100",
                 "scale.intervene_every=400", "averaging.enabled=false", "eval_backend=eager", "task.image_size=8",
                 "task.batch_size=16", "task.probe_size=16", "scale.heldout_size=32", "model.channels=[4,8,8]",
                 "progress=false", "threads=1"]
    cmd = [sys.executable, str(ROOT / "experiments" / "train.py"), *overrides]
    first = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = tmp_path / "locks" / "sgd" / "seed=0.lock"
    try:
        deadline = time.time() + 120
        while not (lock.exists() and lock.read_text()) and time.time() < deadline and first.poll() is None:
            time.sleep(0.005)
        first.send_signal(signal.SIGSTOP)
        assert first.poll() is None and lock.read_text(), "the first process ended before it could be held"
        second = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    finally:
        first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=240)
    assert first.returncode == 0, err[-2000:]
    assert second.returncode == 3, second.stderr[-2000:]
    assert f"is being trained by pid {first.pid}" in second.stderr
    out = records.run_dir(tmp_path, "sgd", 0)
    assert json.loads((out / "run.json").read_text())["status"] == "done"
    capsys.readouterr()
    third = run_task(compose_cfg(overrides))
    assert third.exit_code == 0 and "skip: sgd seed=0" in capsys.readouterr().err


def test_a_lock_held_by_a_dead_process_does_not_block(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from bnrotation.study.rundir import RunLock; "
        "l = RunLock(sys.argv[2], 'sgd', 0).__enter__(); print('locked', flush=True); time.sleep(60)"),
        str(ROOT / "src"), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(rundir.RunBusyError, match="is being trained by pid"):
        rundir.RunLock(tmp_path, "sgd", 0).__enter__()
    holder.kill()
    holder.wait()
    with rundir.RunLock(tmp_path, "sgd", 0):  # the kernel released it with the process
        pass


# ----------------------------------------------------------------------------- dense windows
@pytest.mark.kernels
def test_dense_windows_log_every_step_and_agree_with_the_monitor(tmp_path):
    out = run(tiny(tmp_path, "experiment=adam", "scale.dense_windows=[5,12]", "scale.dense_length=4"))
    dense = pd.read_parquet(out / "dense.parquet")
    assert sorted(dense["step"].unique()) == [5, 6, 7, 8, 9, 12, 13, 14, 15, 16]
    assert set(dense["norm_layer"]) == {"bn1", "bn2", "bn3"}
    assert len(dense) == 10 * (4 + 8 + 8)
    channels = pd.read_parquet(out / "channels.parquet")
    both = dense.merge(channels, on=["step", "norm_layer", "channel"], suffixes=("", "_log"))
    assert sorted(both["step"].unique()) == [5, 15]  # the log steps inside the windows
    for col in ("fresh_mean", "fresh_var", "running_mean", "running_var"):
        assert (both[col] == both[f"{col}_log"]).all(), col
    assert not run(tiny(tmp_path / "off", "experiment=adam")).joinpath("dense.parquet").exists() or \
        pd.read_parquet(tmp_path / "off" / "runs" / "adam" / "seed=0" / "dense.parquet").empty
    with pytest.raises(Exception, match="scale.dense_windows"):
        tiny(tmp_path, "experiment=adam", "scale.dense_windows=[18]", "scale.dense_length=4")


@pytest.mark.kernels
@pytest.mark.slow
def test_a_run_killed_without_warning_resumes_from_its_last_periodic_state(tmp_path, uninterrupted):
    """SIGKILL, which no handler sees, in a run that saves its resumable state at each measured step
    (``RESUME_EVERY_S = 0``): the next run resumes from the last measured step before the kill, not from step 0,
    and ends bit-identical to the uninterrupted run."""
    k = random.randint(11, 19)  # past the first measured steps (smoke scale: every 5 steps)
    spec = {"reference": str(tmp_path / "reference"), "overrides": [*EVERYTHING, *TINY],
            "cases": [{"root": str(tmp_path / "killed"), "kill": f"saving-step:{k}"}]}
    (tmp_path / "cases.json").write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "killed_run.py"), str(tmp_path / "cases.json")],
                          capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = records.run_dir(tmp_path / "killed", "adam", 0)
    saved = torch.load(out / RESUME_FILE, weights_only=True)["step"]
    assert 0 < saved < k, f"killed in step {k}, saved at step {saved}"
    assert run(tiny(tmp_path / "killed", *EVERYTHING)) == out
    assert [r["at_step"] for r in json.loads((out / "run.json").read_text())["resumes"]] == [saved]
    assert_same_results(out, uninterrupted)


def test_a_run_that_raises_leaves_no_resumable_state_and_is_rerun_from_scratch(tmp_path, monkeypatch):
    """The periodic state is for kills; a run that raised (a bug, a bad batch) must not resume from it."""
    cfg = tiny(tmp_path, *EVERYTHING)
    out = records.run_dir(tmp_path, "adam", 0)
    real, calls = ensemble.F.cross_entropy, {"n": 0}

    def loss(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 15:
            raise RuntimeError("planted crash in step 15")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "RESUME_EVERY_S", 0.0)
    with monkeypatch.context() as m:
        m.setattr(ensemble.F, "cross_entropy", loss)
        with pytest.raises(RuntimeError, match="planted crash"):
            run(cfg)
    assert not (out / RESUME_FILE).exists() and not (out / records.DONE).exists()
    assert run(cfg) == out
    assert json.loads((out / "run.json").read_text())["resumes"] == []


def test_a_shorter_run_is_the_longer_runs_first_steps(tmp_path, uninterrupted):
    """What lets the condition map stop at fewer steps than the article (``condition_map.MAP_STEPS``): on one
    machine, a run cut at step 15 logs, up to step 15, exactly what the same run to step 20 logs (the weights and
    statistics at every log step, and every check's loss and accuracies): the run's length changes nothing before
    its end (a constant schedule, and no measurement feeds back into training)."""
    short = run(tiny(tmp_path, *EVERYTHING, "scale.steps=15"))
    for name, keys in (("layers", ["step", "layer"]), ("channels", ["step", "norm_layer", "channel"]),
                       ("checks", ["step"])):
        a = pd.read_parquet(short / f"{name}.parquet").sort_values(keys).reset_index(drop=True).drop(columns="row")
        b = pd.read_parquet(uninterrupted / f"{name}.parquet")
        b = b[b["step"] <= 15].sort_values(keys).reset_index(drop=True).drop(columns="row")
        assert len(a) and sorted(a["step"].unique()) == sorted(b["step"].unique()), name
        pd.testing.assert_frame_equal(a, b, check_exact=True, obj=name)
