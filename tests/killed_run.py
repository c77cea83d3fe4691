"""Kill smoke runs at chosen points (a helper of ``test_reliability.py``, not a test).

    python tests/killed_run.py CASES.json

``CASES.json`` holds ``{"reference": <root>, "overrides": [...], "cases": [{"root", "kill"}, ...]}``.
The driver first trains the run uninterrupted into ``reference``, then forks
one child per case; each child trains the same run into its own ``root`` and
dies at the point ``kill`` names:

* ``write:<file>:<n>:<fraction>``: SIGKILL during the n-th write of ``<file>``
  (``config.yaml``, ``checks.parquet``, ``step=10.pt``, ``DONE``, ...) by the
  suite's own writer, once ``fraction`` of the bytes have gone to whatever file
  it opened (the file object it gets from ``os.fdopen`` writes that much, then
  the process dies);
* ``step:<k>``: SIGKILL in training step k (the k-th training loss);
* ``saving-step:<k>``: the same, in a run that saves its resumable state at every measured step
  (``runner.RESUME_EVERY_S = 0``), as a long run does every ten minutes;
* ``xfsz:<bytes>``: every file is limited to ``<bytes>`` (``RLIMIT_FSIZE``) and
  SIGXFSZ gets its default action back (Python ignores it), so the kernel kills the process in the
  middle of the first write that grows a file past the limit, whatever code
  does the writing;
* ``fsize:<file>``: not killed: every file is limited to one byte less than
  ``<file>`` in the reference run and SIGXFSZ is ignored, as on a full disk,
  so that write fails with an ``OSError``; the child exits with status 3 when
  the run raised it.

Faults are injected inside the child only; the suite's code has no hooks for
them. The parent prints ``{"<root>": <wait status>, ...}`` as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import signal
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from conftest import run_cfg  # noqa: E402  (composes the real configs)

from bnrotation import checkpoints, records

from bnrotation.study import ensemble, runner  # noqa: E402
from bnrotation.study.config import RunConfig  # noqa: E402


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _DyingFile:
    """A file object that writes ``fraction`` of what it is given, then SIGKILLs the process."""

    def __init__(self, f, fraction: float):
        self.f, self.fraction = f, fraction

    def write(self, data) -> None:
        data = bytes(data)
        self.f.write(data[: int(len(data) * self.fraction)])
        self.f.flush()
        die()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()

    def __getattr__(self, name):
        return getattr(self.f, name)


def kill_during_write(target: str, nth: int, fraction: float) -> None:
    """The n-th write of ``target`` through ``records.atomic_write_bytes`` dies ``fraction`` of the way."""
    real_write, real_fdopen, state = records.atomic_write_bytes, os.fdopen, {"n": 0, "armed": False}

    def write(path, data: bytes) -> None:
        if Path(path).name == target:
            state["n"] += 1
            state["armed"] = state["n"] == nth
        real_write(path, data)
        if state["armed"]:
            raise SystemExit(f"the suite wrote {path} without os.fdopen: the kill point was never reached")

    def fdopen(fd, *args, **kwargs):
        f = real_fdopen(fd, *args, **kwargs)
        return _DyingFile(f, fraction) if state["armed"] else f

    records.atomic_write_bytes = checkpoints.atomic_write_bytes = write
    os.fdopen = fdopen


def kill_in_step(k: int) -> None:
    """Patch the training loss: the k-th call dies."""
    real, seen = ensemble.F.cross_entropy, {"n": 0}

    def loss(*args, **kwargs):
        seen["n"] += 1
        if seen["n"] == k:
            die()
        return real(*args, **kwargs)

    ensemble.F.cross_entropy = loss


def child(cfg: RunConfig, kill: str, reference: str) -> None:
    kind, *args = kill.split(":")
    if kind == "write":
        kill_during_write(args[0], int(args[1]), float(args[2]))
    elif kind == "step":
        kill_in_step(int(args[0]))
    elif kind == "saving-step":
        runner.RESUME_EVERY_S = 0.0
        kill_in_step(int(args[0]))
    elif kind == "xfsz":
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it by default
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(args[0]), int(args[0])))
    elif kind == "fsize":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (Python's default) a too-large write fails: EFBIG
        limit = next(Path(reference).rglob(args[0])).stat().st_size - 1
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    else:
        raise SystemExit(f"unknown kill point {kill!r}")
    try:
        runner.run(cfg)
    except OSError:
        os._exit(3)
    os._exit(0)


def main(cases_file: str) -> None:
    spec = json.loads(Path(cases_file).read_text())
    torch.set_num_threads(1)  # no worker threads: forking below is safe
    cfg = run_cfg(spec["overrides"], Path(spec["reference"]))
    runner.run(cfg)
    status = {}
    for case in spec["cases"]:
        pid = os.fork()
        if pid == 0:
            try:
                child(dataclasses.replace(cfg, results_root=case["root"]), case["kill"], spec["reference"])
            except BaseException:  # noqa: BLE001 - report, and never return into the parent's loop
                traceback.print_exc()
            os._exit(4)
        status[case["root"]] = os.waitpid(pid, 0)[1]
    print(json.dumps(status))


if __name__ == "__main__":
    main(sys.argv[1])
