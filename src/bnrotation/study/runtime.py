"""Where and how a run executes: threads, deterministic kernels, the device, stop signals, compiled evaluation.

None of these change what a run computes on a given machine (``deterministic`` and the compiled evaluation
change how it is computed, and are recorded in ``run.json``); the runner (:mod:`bnrotation.study.runner`) calls
them before its first step. A stop signal is caught here and read by the training loop at its next step
boundary, which saves a resumable state and raises :class:`RunInterrupted`.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable, Container, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import EVAL_COMPILED_MIN_STEPS, ConfigError, RunConfig

__all__ = ["STOP_SIGNALS", "RunInterrupted", "resolve_threads", "set_determinism", "resolve_device",
           "stop_signals", "pass_on_to_submitit", "evaluation_compiled"]

STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR2")  # SIGUSR2: submitit's default preemption / time-out signal


class RunInterrupted(Exception):
    """The run stopped on a signal at a step boundary and saved a resumable state.

    Attributes:
        signum: the signal; step: the last completed step; path: the saved state.
    """

    def __init__(self, signum: int, step: int, path: Path):
        self.signum, self.step, self.path = signum, step, path
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}; resumable state in {path}")


@dataclass
class StepClock:
    """Seconds spent in training steps, summed by :func:`measured_steps` (wall clock, ``time.perf_counter``)."""

    train_s: float = 0.0


def measured_steps(steps: int, train_step: Callable[[], torch.Tensor], at: Container[int],
                   clock: StepClock) -> Iterator[tuple[int, float]]:
    """The training loop of a run that measures at some steps (the zoo's, the frozen backbone's): for each step
    k = 1 .. ``steps``, ``train_step()`` (one optimizer step, returning its loss tensor) timed into ``clock``;
    at each step in ``at``, 0 included, yields ``(step, loss)``: the last step's loss as a float (NaN at step 0),
    read only there, so the loop does not wait for each loss. Breaking out of the loop stops training."""
    loss = None
    for step in range(steps + 1):
        if step > 0:
            t0 = time.perf_counter()
            loss = train_step()
            clock.train_s += time.perf_counter() - t0
        if step in at:
            yield step, math.nan if loss is None else float(loss.detach())


def resolve_threads(threads: int) -> int:
    """Set torch's intra-op threads for a run and return how many it uses.

    ``threads > 0`` is taken as is. ``0`` means: what the launcher gave the
    job, i.e. ``SLURM_CPUS_PER_TASK`` under SLURM, else torch's default, which
    follows ``OMP_NUM_THREADS`` (joblib's workers get cores // n_jobs).
    """
    if threads == 0 and os.environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        threads = int(os.environ["SLURM_CPUS_PER_TASK"])
    if threads > 0:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def set_determinism(on: bool, device: torch.device) -> dict:
    """Switch deterministic kernels on or off for this process; returns the flags now in force.

    ``on``: ``torch.use_deterministic_algorithms(True)`` (an op without a
    deterministic kernel raises), cuDNN deterministic with autotuning off, and
    on CUDA ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` unless already set (cuBLAS
    needs it to be deterministic). CPU kernels here are deterministic either
    way; on a GPU the switch trades speed for bitwise-repeatable runs.
    """
    if on and device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(on)
    torch.backends.cudnn.deterministic = on
    torch.backends.cudnn.benchmark = False
    return {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA when torch sees a GPU, else the CPU.

    Raises:
        ConfigError: for ``cuda`` on a machine where torch sees no GPU.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: expected auto or cpu on this machine, got 'cuda': torch sees no CUDA device")
    return torch.device(name)


def evaluation_compiled(cfg: RunConfig, device: torch.device) -> bool:
    """Whether the run's evaluation-mode passes are compiled (:func:`.evaluation.compiled_evaluation`):
    ``eval_backend`` compiled or eager, or auto: compiled on a CPU for runs of at least
    :data:`.config.EVAL_COMPILED_MIN_STEPS` steps (on a GPU unmeasured, so eager)."""
    if cfg.eval_backend != "auto":
        return cfg.eval_backend == "compiled"
    return device.type == "cpu" and cfg.scale.steps >= EVAL_COMPILED_MIN_STEPS


@contextmanager
def stop_signals():
    """Catch SIGTERM, SIGINT and SIGUSR2 for the duration of a run: each sets a flag the loop reads at the
    next step boundary. Yields ``{"signum": int | None, "previous": handler}``; the previous handlers are
    restored on exit. A signal that the loop never read (it arrived after the last step boundary) is raised again
    by :func:`bnrotation.study.runner.run_seeds` once they are. Outside the main thread (joblib's threads) nothing is
    caught."""
    caught: dict = {"signum": None, "previous": None}
    names = [n for n in STOP_SIGNALS if hasattr(signal, n)]
    try:
        previous = {n: signal.getsignal(getattr(signal, n)) for n in names}
        for n in names:
            signal.signal(getattr(signal, n), lambda signum, frame: caught.update(
                signum=signum, previous=previous[signal.Signals(signum).name]))
    except ValueError:  # not the main thread
        previous = {}
    try:
        yield caught
    finally:
        for n, handler in previous.items():
            signal.signal(getattr(signal, n), handler)


def pass_on_to_submitit(caught: dict) -> None:
    """Hand a caught stop signal (:func:`stop_signals`' flag) to submitit's handler when submitit installed the
    previous one; return at once otherwise.

    A SLURM job under submitit: its handler of the preemption / time-out signal checkpoints the Hydra job,
    requeues it and exits; the requeued job resumes from the saved states. SIGTERM, which SLURM sends before it
    kills a job it requeues or preempts, submitit ignores: this waits for the kill, writing no result, so that
    submitit waits for the requeued job's. Call it only once the resumable states are saved.
    """
    signum, previous = caught["signum"], caught["previous"]
    if callable(previous) and getattr(previous, "__module__", "").startswith("submitit"):
        previous(signum, None)
        if signum == signal.SIGTERM:
            while True:
                time.sleep(3600)
