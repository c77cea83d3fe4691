"""Preemption and time-outs on a real scheduler: a one-node SLURM cluster on this machine
(Debian's slurmctld, slurmd and munge, started by ``tests/slurm/start.sh``), the sweep submitted through
``hydra/launcher=submitit_slurm``. The job gets SLURM's time-out signal mid-run; submitit's own handler
requeues it, and the requeued job resumes from the state the run saved, finishing with tables bit-identical
to an uninterrupted run.

Skipped, with the reason, where SLURM is not installed or the daemons cannot start (they need root);
``.ci/run`` installs them. SLURM holds a requeued job for about two minutes (its begin time); the test
releases that hold with ``scontrol update StartTime=now`` instead of waiting, and any other hold that leaves the job
pending (:func:`release`). A failure's message lists every queue state and reason seen, with slurmctld's log: a
clean clone's ``.ci/run`` once saw the requeued job not start again within the deadline (2026-12-05).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bnrotation import records
from bnrotation.study.runner import run

from conftest import ROOT
from test_reliability import assert_same_results, tiny

# A run long enough to be interrupted mid-way on a quiet or a busy machine (about twenty seconds on one core; the
# test polls the queue every half second). At 1,500 steps (about ten seconds) a run beside make test's workers once
# finished before the signal reached a step boundary: it completed unrequeued (a clean clone's .ci/run, 2026-12-04).
OVERRIDES = ("experiment=adam", "scale.steps=3000", "scale.log_every=250", "scale.check_start=1000",
             "scale.check_every=250", "scale.intervene_every=1500", "averaging.tail_steps=500",
             "averaging.tail_every=250")
TOOLS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol", "scancel")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = [t for t in TOOLS if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]
    if missing:
        pytest.skip(f"SLURM is not installed here (no {', '.join(missing)}): apt-get install slurmctld slurmd "
                    "slurm-client munge, as .ci/run does")
    if os.geteuid() != 0:
        pytest.skip("the one-node SLURM cluster's daemons run as root, and this test does not")
    folder = tmp_path_factory.mktemp("slurm")
    start = subprocess.run(["bash", str(ROOT / "tests" / "slurm" / "start.sh"), str(folder)], capture_output=True,
                           text=True, timeout=120)
    if start.returncode != 0:
        pytest.skip(f"the one-node SLURM cluster did not start: {start.stderr.strip()[-500:]}")
    env = {**os.environ, "SLURM_CONF": start.stdout.strip().splitlines()[-1],
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    yield env
    subprocess.run(["scancel", "--user", "root"], env=env, capture_output=True)
    subprocess.run(["pkill", "-x", "slurmd"], capture_output=True)
    subprocess.run(["pkill", "-x", "slurmctld"], capture_output=True)


def squeue(env: dict) -> list[tuple[str, str, str]]:
    """(job id, state, reason) of every job in the queue."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %T %r"], env=env, capture_output=True, text=True).stdout
    return [tuple(line.split(maxsplit=2)) for line in out.splitlines() if line.strip()]


def release(env: dict, job_id: str, reason: str) -> int:
    """Let a pending job start now, whatever holds it; 1 if it was held, else 0. A requeued job waits for its begin
    time (about two minutes); a batch launch that failed leaves it held ("launch failed requeued held"); a job step
    slow to die under load can drain the node (squeue: ReqNodeNotAvail, or Nodes_required_for_job_are_DOWN...)."""
    if "BeginTime" in reason:
        subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], env=env, capture_output=True)
    elif "Held" in reason or "held" in reason:
        subprocess.run(["scontrol", "release", job_id], env=env, capture_output=True)
    elif "NodeNotAvail" in reason or "DRAINED" in reason or "DOWN" in reason:
        node = subprocess.run(["sinfo", "-h", "-o", "%n"], env=env, capture_output=True, text=True).stdout.split()
        for name in node:
            subprocess.run(["scontrol", "update", f"nodename={name}", "state=resume"], env=env, capture_output=True)
    else:
        return 0
    return 1


def ctld_log(env: dict) -> str:
    """The last lines of the cluster's slurmctld log, for a failure's message."""
    path = Path(env["SLURM_CONF"]).parent / "log" / "slurmctld.log"
    return path.read_text(errors="replace")[-2000:] if path.exists() else f"(no {path})"


def test_a_timed_out_slurm_job_requeues_through_submitit_and_resumes_bit_identical(slurm, tmp_path):
    root = tmp_path / "results"
    reference = run(tiny(tmp_path / "reference", *OVERRIDES, "threads=1"))
    cmd = [sys.executable, str(ROOT / "experiments" / "train.py"), "-m", *OVERRIDES, "seed=0", "scale=smoke",
           "task.image_size=8", "task.batch_size=16", "task.probe_size=16", "scale.heldout_size=32",
           "model.channels=[4,8,8]", f"results_root={root}", "progress=false", "threads=1",
           "hydra/launcher=submitit_slurm", "hydra.launcher.timeout_min=30", "hydra.launcher.max_num_timeout=3",
           "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=null", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    sweep = subprocess.Popen(cmd, cwd=ROOT, env=slurm, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = records.run_dir(root, "adam", 0)
    signalled, released, deadline, seen = None, 0, time.time() + 600, set()
    try:
        while sweep.poll() is None and time.time() < deadline:
            jobs = squeue(slurm)
            running = [j for j in jobs if j[1] == "RUNNING"]
            # mid-run: the run's folder exists and its tables are not written yet
            # (at once: a toy run on a quiet machine can finish within a second of writing run.json; a signal at
            # step 0 is caught too, since stop signals are caught from before run.json is written)
            if signalled is None and running and (out / "run.json").exists() and not (out / "checks.parquet").exists():
                subprocess.run(["scancel", "--signal=USR2", running[0][0]], env=slurm, check=True)  # the time-out signal
                signalled = running[0][0]
            for job_id, state, reason in jobs:
                seen.add((state, reason))
                if state == "PENDING":
                    released += release(slurm, job_id, reason)
            time.sleep(0.5)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    log = sweep.stdout.read()
    logs = "\n".join(p.read_text(errors="replace") for p in (tmp_path / "sweep").glob(".submitit/*/*_log.*"))
    why = (f"signalled {signalled}, released {released}, queue states seen {sorted(seen)}\n"
           f"slurmctld.log: {ctld_log(slurm)}\n{logs[-3000:]}")
    assert sweep.returncode == 0, f"{log[-3000:]}\n{why}"
    assert signalled and released >= 1, why
    assert "Requeued job" in logs  # submitit's own requeue
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "done" and len(info["resumes"]) >= 1, logs[-3000:]
    assert not (out / "resume.pt").exists()
    assert_same_results(out, reference)
