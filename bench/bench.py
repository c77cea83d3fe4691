"""`make bench`: what the suite's measurements cost, against the article's bare training loop.

    python bench/bench.py [--steps 300] [--rounds 3] [--sweep-steps 100] [--out results/bench.md]

Writes a Markdown report (default ``results/bench.md``) with the machine, device,
threads and torch version, and

(a) the runner's full-scale run time against a bare loop of the same network,
    data and check schedule with no probes and no logging (the article's
    snippet, written anew below: default memory format, ``net.train()`` /
    ``net.eval()`` checks). Both run ``--steps`` steps, interleaved in this
    process (runner, bare, bare, runner, ...) so that a busy machine slows both
    alike; each is extrapolated to the full run from its own per-step and
    per-event times (6,000 steps, 41 checks, 61 log points, 9 intervention
    points for the runner; 6,000 steps and 41 checks for the bare loop);
(b) the cost of each probe per call and per full run, and the evaluation
    chunk size;
(c) peak memory (RSS of a child process running one job; CUDA max allocated);
(d) the time of ``make table`` (and ``make figures`` / ``make claims`` where
    those targets exist) on the results present and on the bench's own runs;
(e) sweep throughput: jobs in parallel x threads per job against one job at
    a time, at ``--sweep-steps`` steps.

It needs no results: it makes its own runs in a temporary folder. Timings on
a machine that other processes keep busy are noisy; the report measures how
many cores others used while it ran and says so at the top.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's sources, whatever the venv's editable install points at

from hydra import compose, initialize_config_dir  # noqa: E402

from bnrotation import records  # noqa: E402
from bnrotation.checkpoints import checkpoint_path, save_checkpoint  # noqa: E402
from bnrotation.config import RunConfig, register_configs, to_run_config  # noqa: E402
from bnrotation.model import build_model  # noqa: E402
from bnrotation.probes import accuracy, channel_cosines, cosine, fresh_statistics, rotation_deg  # noqa: E402
from bnrotation.interventions import run_interventions  # noqa: E402
from bnrotation.monitor import StalenessMonitor  # noqa: E402
from bnrotation.probes import eval_chunk  # noqa: E402
from bnrotation.runner import (averaging_steps, check_steps, intervention_steps, log_steps,  # noqa: E402
                               resolve_device, run)
from bnrotation.task import reestimation_batches  # noqa: E402
from bnrotation.task import NoisyTemplates  # noqa: E402

ROW = "adam"  # the row the ratio is measured on: Adam, lr 3e-3, as in the article's snippet
HOUR = 3600.0
# Parts of a run's time, as the report's columns.
PARTS = {"steps": "steps", "checks": "checks", "probes": "probes", "interventions": "interventions",
         "averaging": "weight averaging", "fixed": "setup, writing"}


# ----------------------------------------------------------------------------- configs
def compose_run(overrides: list[str]) -> RunConfig:
    """The config ``experiments/train.py <overrides>`` would get."""
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return to_run_config(compose(config_name="config", overrides=overrides))


def reduced_overrides(steps: int) -> list[str]:
    """Full-scale sizes (4,000 held-out samples, 200 re-estimation batches) over ``steps`` steps.

    Log points and checks every 100 steps from step 100, one intervention
    point at the last step: every kind of event runs at least once.
    """
    if steps < 100:
        raise SystemExit(f"--steps/--sweep-steps must be >= 100 (one check), got {steps}")
    return ["scale=full", f"scale.steps={steps}", "scale.check_start=100", f"scale.intervene_every={steps}"]


@dataclass
class Schedule:
    """How many of each event a run has."""

    steps: int
    logs: int
    checks: int
    interventions: int
    averaging: int = 0

    @classmethod
    def of(cls, cfg: RunConfig) -> "Schedule":
        return cls(cfg.scale.steps, len(log_steps(cfg)), len(check_steps(cfg)),
                   len(intervention_steps(cfg)) if cfg.interventions else 0, len(averaging_steps(cfg)))

    def calls(self, timer: str) -> int | None:
        """Events behind one of the runner's timers (run.json ``timings_s``); None for an unknown timer."""
        return {"train": self.steps, "probes": self.logs, "checks": self.checks,
                "interventions": self.interventions, "averaging": self.averaging}.get(timer)


# ----------------------------------------------------------------------------- the bare loop
def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout, momentum=0.03),
                         nn.ReLU())


def bare_loop(steps: int, checks: set[int], heldout: int, device: torch.device, seed: int = 0) -> dict:
    """The article's snippet, written anew: same network, data, optimizer and check schedule.

    No probes, no logging, default memory format; a check is two passes over
    the held-out set, ``net.train()`` then ``net.eval()``, as the article wrote
    it (its training-mode pass moves the running statistics; the suite's does
    not, and costs the same).

    Returns:
        seconds: ``{"setup", "train", "checks"}``, and ``checks``: the number run.
    """
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    k = 10
    templates = torch.randn(k, 3, 32, 32, device=device)

    def batch(n: int):
        y = torch.randint(0, k, (n,), device=device)
        return 0.6 * templates[y] + torch.randn(n, 3, 32, 32, device=device), y

    net = nn.Sequential(_block(3, 32), nn.MaxPool2d(2), _block(32, 64), nn.MaxPool2d(2), _block(64, 64),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, k)).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    x_val, y_val = batch(heldout)

    def acc(train_mode: bool) -> float:
        net.train(train_mode)
        with torch.no_grad():
            a = (net(x_val).argmax(1) == y_val).float().mean().item()
        net.train()
        return a

    sync()
    seconds = {"setup": time.perf_counter() - t0, "train": 0.0, "checks": 0.0}
    mark = time.perf_counter()
    for step in range(1, steps + 1):
        x, y = batch(128)
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step in checks:
            sync()
            t1 = time.perf_counter()
            seconds["train"] += t1 - mark
            acc(True), acc(False)
            mark = time.perf_counter()
            seconds["checks"] += mark - t1
    sync()
    seconds["train"] += time.perf_counter() - mark
    return {"seconds": seconds, "checks": len([s for s in checks if s <= steps])}


# ----------------------------------------------------------------------------- (a) runner vs bare loop
def runner_once(cfg: RunConfig) -> dict:
    """One runner run; its own timings (run.json ``timings_s``) and wall time, in seconds."""
    t0 = time.perf_counter()
    out = run(cfg)
    wall = time.perf_counter() - t0
    info = json.loads((out / "run.json").read_text())
    return {"wall": wall, **info["timings_s"]}


def extrapolate_runner(t: dict, measured: Schedule, full: Schedule) -> dict:
    """Full-run seconds from a reduced run's timings: per-step and per-event costs times the full counts.

    Each timer of run.json's ``timings_s`` (train, probes, checks,
    interventions, averaging) is scaled by its events' count in the full run
    over their count in the measured one; ``fixed`` (setup, writing the tables,
    and any timer this bench does not know) is taken as is.
    """
    parts = {"fixed": t["wall"]}
    for timer, seconds in t.items():
        if timer == "wall":
            continue
        parts["fixed"] -= seconds
        n, n_full = measured.calls(timer), full.calls(timer)
        if n is None:
            parts["fixed"] += seconds
        else:
            parts["steps" if timer == "train" else timer] = n_full * seconds / n if n else 0.0
    parts["fixed"] = max(parts["fixed"], 0.0)
    return {**parts, "total": sum(parts.values())}


def extrapolate_bare(b: dict, steps: int, full: Schedule) -> dict:
    s = b["seconds"]
    parts = {"steps": full.steps * s["train"] / steps, "checks": full.checks * s["checks"] / b["checks"],
             "fixed": s["setup"]}
    return {**parts, "total": sum(parts.values())}


def overhead(args, device: torch.device, tmp: Path) -> dict:
    """Runner and bare loop, ``args.rounds`` times each, interleaved (ABBA), extrapolated to the full run."""
    full_cfg = compose_run([f"experiment={ROW}"])
    full = Schedule.of(full_cfg)
    cfg = compose_run([f"experiment={ROW}", *reduced_overrides(args.steps), f"results_root={tmp / 'overhead'}",
                       "progress=false", "force=true", f"threads={args.threads}", f"device={device.type}"])
    measured = Schedule.of(cfg)
    checks = set(check_steps(cfg))
    runner_rounds, bare_rounds = [], []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for r in range(args.rounds):
        order = ("runner", "bare") if r % 2 == 0 else ("bare", "runner")
        for which in order:
            if which == "runner":
                runner_rounds.append(extrapolate_runner(runner_once(cfg), measured, full))
            else:
                bare_rounds.append(extrapolate_bare(bare_loop(args.steps, checks, cfg.scale.heldout_size, device),
                                                    args.steps, full))
            progress(f"(a) round {r + 1}/{args.rounds}: {which} done")
    ratios = [a["total"] / b["total"] for a, b in zip(runner_rounds, bare_rounds)]
    runner, bare = least_disturbed(runner_rounds), least_disturbed(bare_rounds)
    out = {"full": full, "measured": measured, "runner": runner_rounds, "bare": bare_rounds, "ratios": ratios,
           "runner_best": runner, "bare_best": bare, "ratio": runner["total"] / bare["total"],
           "step_ratio": runner["steps"] / bare["steps"]}
    if device.type == "cuda":
        out["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
    return out


def least_disturbed(rounds: list[dict]) -> dict:
    """Each part's smallest time over the rounds, and their sum as ``total``.

    Other processes only ever add time, so the smallest of repeated
    measurements is the closest to the undisturbed cost (as ``timeit`` takes
    the minimum); taking it per part keeps one disturbed stretch from
    spoiling a whole round.
    """
    parts = {p: min(r[p] for r in rounds) for p in rounds[0] if p != "total"}
    return {**parts, "total": sum(parts.values())}


# ----------------------------------------------------------------------------- (b) probes
def timed(fn, reps: int, sync) -> float:
    """Median seconds of ``reps`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def probe_costs(args, device: torch.device, tmp: Path, a: dict | None) -> dict:
    """Seconds per call of each probe on the runner's own objects, and calls per full run."""
    cfg = compose_run([f"experiment={ROW}", "progress=false", f"results_root={tmp / 'probes'}",
                       f"device={device.type}"])
    full = Schedule.of(cfg)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    task = NoisyTemplates.build(cfg.task, cfg.seed, device)
    model = build_model(cfg.model, cfg.task.num_classes, cfg.seed, device)
    cl = torch.channels_last if cfg.model.channels_last else torch.contiguous_format
    x_held, y_held = task.fixed_set(cfg.scale.heldout_size, cfg.seed, "heldout")
    x_held = x_held.contiguous(memory_format=cl)
    x_probe, _ = task.fixed_set(cfg.task.probe_size, cfg.seed, "probe")
    x_probe = x_probe.contiguous(memory_format=cl)
    x, y = task.sample(cfg.task.batch_size, torch.Generator(device).manual_seed(0))
    F.cross_entropy(model(x.contiguous(memory_format=cl)), y).backward()  # gradients for the gradient cosine
    before = {n: c.weight.detach().clone() * 0.99 for n, c, _, _ in model.blocks()}
    monitor = StalenessMonitor(model, x_probe, warn=False, modes=False, running_statistics_only=False)
    monitor.measure(0)
    log_step = iter(range(100, 10 ** 9, 100))

    def cosines():
        for name, conv, _, _ in model.blocks():
            w, wb = conv.weight.detach(), before[name]
            cosine(w - wb, wb), channel_cosines(w - wb, wb).cpu(), cosine(conv.weight.grad, wb)

    def rotations():
        for name, conv, _, _ in model.blocks():
            rotation_deg(before[name], conv.weight).cpu()

    reps, out, chunk = args.reps, tmp / "probes", eval_chunk(device, len(y_held))
    out.mkdir(parents=True, exist_ok=True)
    rows = [
        ("fresh statistics (probe set, one pass)", full.logs,
         timed(lambda: fresh_statistics(model, x_probe), reps, sync)),
        ("rotation, 3 conv layers", full.logs, timed(rotations, reps, sync)),
        ("update and gradient cosines, 3 conv layers", full.logs, timed(cosines, reps, sync)),
        ("log point, all of the above and its table rows", full.logs,
         timed(lambda: monitor.measure(next(log_step), before), reps, sync)),
        (f"accuracy, evaluation mode (chunks of {chunk})", full.checks,
         timed(lambda: accuracy(model, x_held, y_held, "eval", chunk), reps, sync)),
        ("accuracy, training mode (one pass, batch statistics)", full.checks,
         timed(lambda: accuracy(model, x_held, y_held, "train"), reps, sync)),
        ("checkpoint save", full.interventions,
         timed(lambda: save_checkpoint(checkpoint_path(out, 0), model, step=0, row=cfg.row, seed=cfg.seed),
               reps, sync)),
    ]
    if a:  # measured in (a), in the runner itself
        per_call = a["runner_best"]["interventions"] / full.interventions
        if full.averaging:
            rows.append(("weight averaging: evaluations of the averages under each BatchNorm policy",
                         full.averaging, a["runner_best"].get("averaging", 0.0) / full.averaging))
    else:
        sync()
        t0 = time.perf_counter()
        run_interventions(model, reestimation_batches(task, cfg, device, 100), x_held, y_held, chunk,
                          acc_stored=0.5)
        sync()
        per_call = time.perf_counter() - t0
    rows.append((f"intervention point (re-estimation, {cfg.scale.reestimate_batches} batches, and the "
                 "evaluations of each swap)", full.interventions, per_call))
    chunks = {}
    sizes = sorted({cfg.scale.heldout_size, 1000, 500, 250, 128, 64} & set(range(1, cfg.scale.heldout_size + 1)),
                   reverse=True)
    for r in range(reps):  # interleaved, so that load shifts hit every size alike
        for c in (sizes if r % 2 == 0 else sizes[::-1]):
            sync()
            t0 = time.perf_counter()
            accuracy(model, x_held, y_held, "eval", c)
            sync()
            chunks.setdefault(c, []).append(time.perf_counter() - t0)
    progress("(b) probes done")
    return {"rows": rows, "chunks": {c: statistics.median(v) for c, v in chunks.items()},
            "heldout": cfg.scale.heldout_size, "chunk": chunk}


# ----------------------------------------------------------------------------- child processes
def child(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd``; its wall seconds, exit status, peak RSS (bytes) and output tail."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        tail = log.read().decode(errors="replace")[-2000:]
    return {"wall": time.perf_counter() - t0, "rc": proc.returncode, "max_rss": usage.ru_maxrss * 1024,
            "tail": tail, "cmd": cmd}


def train_cmd(overrides: list[str], multirun: bool = False) -> list[str]:
    return [sys.executable, str(ROOT / "experiments" / "train.py"), *(["-m"] if multirun else []), *overrides]


def peak_memory(args, device: torch.device, tmp: Path) -> dict:
    """Peak RSS of one runner job (a child process) and of the bare loop (another), at ``--sweep-steps``."""
    runner = child(train_cmd([f"experiment={ROW}", *reduced_overrides(args.sweep_steps), "progress=false",
                              f"results_root={tmp / 'memory'}", f"threads={args.threads}",
                              f"device={device.type}", f"hydra.run.dir={tmp / 'memory' / 'hydra'}"]))
    bare = child([sys.executable, __file__, "--bare-only", "--steps", str(args.sweep_steps),
                  "--threads", str(args.threads), "--device", device.type])
    for name, c in (("runner", runner), ("bare loop", bare)):
        if c["rc"] != 0:
            raise RuntimeError(f"(c) the {name} job failed ({c['rc']}): {shlex.join(c['cmd'])}\n{c['tail']}")
    progress("(c) memory done")
    return {"runner": runner, "bare": bare}


# ----------------------------------------------------------------------------- (d) analysis targets
def make_targets() -> list[str]:
    text = (ROOT / "Makefile").read_text()
    return [t for t in ("table", "figures", "claims") if re.search(rf"^{t}:", text, re.M)]


def done_runs(root: Path) -> int:
    return len(list(root.glob("runs/*/*/" + records.DONE)))


def analysis_times(args, tmp: Path, own_results: Path) -> list[dict]:
    """Wall seconds of each analysis target on the results present and on the bench's own runs."""
    roots = []
    candidates = [Path(args.results)] if args.results else [ROOT / "results", ROOT / "results" / "reference"]
    for candidate in candidates:
        if done_runs(candidate):
            roots.append((candidate, str(candidate)))
            break
    if done_runs(own_results):
        roots.append((own_results, "the bench's own runs (e)"))
    out = []
    for target in make_targets():
        for root, where in roots:
            dest = tmp / f"analysis-{target}-{len(out)}"
            dest.mkdir(parents=True)
            cmd = ["make", "-s", "-o", f"{args.venv}/.installed", target, f"PY={sys.executable}",
                   f"RESULTS={root}", f"OUT={dest}"]
            c = child(cmd)
            out.append({"target": target, "where": where, "runs": done_runs(root), **c})
    progress("(d) analysis targets done")
    return out


# ----------------------------------------------------------------------------- (e) sweep throughput
def splits(cores: int) -> list[tuple[int, int]]:
    """(jobs in parallel, threads per job) with jobs x threads = cores; one job at a time first."""
    return [(j, cores // j) for j in range(1, cores + 1) if cores % j == 0]


def sweep_throughput(args, device: torch.device, tmp: Path) -> dict:
    """The same small sweep (``--sweep-rows`` x seeds 0..n-1) at each split of the cores."""
    rows = args.sweep_rows.split(",")
    seeds = list(range(args.sweep_seeds))
    results = []
    for jobs, threads in splits(args.cores):
        root = tmp / f"sweep-{jobs}x{threads}"
        launcher = [] if jobs == 1 else ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]
        cmd = train_cmd([f"experiment={','.join(rows)}", f"seed={','.join(map(str, seeds))}",
                         *reduced_overrides(args.sweep_steps), "interventions=false", "averaging.enabled=false",
                         "progress=false",
                         f"results_root={root}", f"threads={threads}", f"device={device.type}",
                         f"hydra.sweep.dir={root / 'hydra'}", *launcher], multirun=True)
        c = child(cmd)
        n = done_runs(root)
        if c["rc"] != 0 or n != len(rows) * len(seeds):
            raise RuntimeError(f"(e) sweep {jobs}x{threads} landed {n} of {len(rows) * len(seeds)} runs "
                               f"(exit {c['rc']}): {shlex.join(cmd)}\n{c['tail']}")
        results.append({"jobs": jobs, "threads": threads, "runs": n, "wall": c["wall"], "root": root})
        progress(f"(e) sweep {jobs}x{threads} done")
    return {"splits": results, "rows": rows, "seeds": seeds}


# ----------------------------------------------------------------------------- the machine
class OtherLoad:
    """Cores that *other* processes kept busy while the bench ran: (all busy CPU time - ours) / wall."""

    def __init__(self):
        self.t0, self.busy0, self.own0 = time.time(), self._busy(), self._own()
        self.load0 = os.getloadavg()

    @staticmethod
    def _busy() -> float | None:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def cores(self) -> float | None:
        busy = self._busy()
        if busy is None or self.busy0 is None:
            return None
        return max(0.0, (busy - self.busy0) - (self._own() - self.own0)) / max(time.time() - self.t0, 1e-9)


def machine(device: torch.device, threads: int) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        names = re.findall(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = names[0] if names else cpu
    except OSError:
        pass
    try:
        mem = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) * 1024
    except (OSError, AttributeError):
        mem = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "host": platform.node(), "os": platform.platform(), "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory": mem, "python": platform.python_version(), "torch": torch.__version__,
        "device": (f"cuda: {torch.cuda.get_device_name(device)}" if device.type == "cuda" else "cpu"),
        "threads": threads, "mkldnn": torch.backends.mkldnn.is_available(), "commit": commit,
    }


# ----------------------------------------------------------------------------- the report
def fmt_s(s: float) -> str:
    if s >= HOUR:
        return f"{s / HOUR:.2f} h"
    if s >= 100:
        return f"{s / 60:.1f} min"
    return f"{s:.3g} s"


def gib(n: float) -> str:
    return f"{n / 2 ** 30:.2f} GiB"


def report(args, info: dict, load: dict, a: dict | None, b: dict | None, c: dict | None,
           d: list[dict] | None, e: dict | None) -> str:
    lines = ["# Benchmark: what the measurements cost", ""]
    busy = load["other_cores"]
    if busy is None or busy > 0.25 * info["cores"]:
        said = "could not be measured" if busy is None else f"kept {busy:.2f} of {info['cores']} cores busy"
        lines += [f"> **Measured under load: other processes {said} while this ran "
                  f"(load average {load['start'][0]:.2f} at the start, {load['end'][0]:.2f} at the end). "
                  "Absolute times are inflated and noisy; the runner/bare ratio is measured interleaved and "
                  "is the figure to read. Rerun `make bench` on a quiet machine before quoting times.**", ""]
    lines += [f"`{args.command}` on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, commit "
              f"`{info['commit']}`, {fmt_s(load['wall'])} in all.", "",
              "| machine | |", "|---|---|",
              f"| CPU | {info['cpu']}, {info['cores']} cores available |",
              f"| memory | {gib(info['memory']) if info['memory'] else 'unknown'} |",
              f"| device | {info['device']} |",
              f"| torch threads | {info['threads']} in (a)-(c), MKLDNN {'on' if info['mkldnn'] else 'off'}; (e) splits "
              f"{args.cores} cores |",
              f"| versions | torch {info['torch']}, Python {info['python']} |",
              f"| OS | {info['os']} |",
              f"| other load | {'unknown' if busy is None else f'{busy:.2f} cores busy with other processes'}; "
              f"load average {load['start'][0]:.2f} (start), {load['end'][0]:.2f} (end) |", ""]
    if a:
        full, m = a["full"], a["measured"]
        lines += ["## (a) Runner against the bare loop", "",
                  f"Row `{ROW}`. Both ran {m.steps} steps with full-size checks ({m.checks} checks on the "
                  f"4,000 held-out samples), the runner also {m.logs} log points and {m.interventions} "
                  f"intervention point, interleaved over {args.rounds} rounds; each is extrapolated to the full "
                  f"run ({full.steps:,} steps, {full.checks} checks, {full.logs} log points, "
                  f"{full.interventions} intervention points) from its per-step and per-event times. The bare "
                  "loop is the article's snippet written anew (default memory format, `net.train()` / "
                  "`net.eval()` checks, no probes, no logging).", "",
                  "| full run, extrapolated | " + " | ".join(PARTS.values()) + " | total |",
                  "|---|" + "---:|" * (len(PARTS) + 1)]
        named = [(f"{who}, round {i + 1}", row) for i, (r, bl) in enumerate(zip(a["runner"], a["bare"]))
                 for who, row in (("runner", r), ("bare loop", bl))]
        named += [("**runner, least disturbed**", a["runner_best"]), ("**bare loop, least disturbed**", a["bare_best"])]
        for name, row in named:
            cells = [fmt_s(row[p]) if p in row else "-" for p in PARTS]
            lines.append(f"| {name} | {' | '.join(cells)} | {fmt_s(row['total'])} |")
        target = "meets" if a["ratio"] <= 1.0 else "misses"
        lines += ["", f"**Runner / bare loop: {a['ratio']:.2f}x**, from each part's least disturbed round (rounds "
                  f"alone: {', '.join(f'{x:.2f}' for x in a['ratios'])}); the target is at most 1.0x, which this "
                  f"{target}. Training steps alone: {a['step_ratio']:.2f}x (channels-last against the default "
                  "memory format).", ""]
    if b:
        runner_total = a["runner_best"]["total"] if a else None
        lines += ["## (b) Probes", "",
                  f"Per call: median of {args.reps} calls after a warm-up; per run: times the calls a full run "
                  "makes." + (" Share: of the runner's extrapolated full run in (a)." if runner_total else ""),
                  "", "| probe | per call | calls per run | per run | share |", "|---|---:|---:|---:|---:|"]
        for name, calls, sec in b["rows"]:
            share = f"{100 * calls * sec / runner_total:.1f}%" if runner_total else "-"
            lines.append(f"| {name} | {fmt_s(sec)} | {calls} | {fmt_s(calls * sec)} | {share} |")
        best = min(b["chunks"], key=b["chunks"].get)
        lines += ["", f"Evaluation-mode accuracy on the {b['heldout']:,} held-out samples by chunk size "
                  f"(median of {args.reps}, interleaved; the runner uses {b['chunk']}; training mode must be "
                  "one pass by the protocol):", "",
                  "| chunk | seconds |", "|---:|---:|"]
        lines += [f"| {ch}{' (fastest)' if ch == best else ''} | {sec:.3f} |" for ch, sec in b["chunks"].items()]
        lines.append("")
    if c:
        lines += ["## (c) Peak memory", "",
                  f"Peak resident set size of a child process running {args.sweep_steps} steps with full-size "
                  "checks and one intervention point (the runner) or checks (the bare loop); it does not grow "
                  "with the number of steps.", "",
                  "| job | peak RSS |", "|---|---:|",
                  f"| runner (`experiments/train.py`, Hydra included) | {gib(c['runner']['max_rss'])} |",
                  f"| bare loop | {gib(c['bare']['max_rss'])} |"]
        if a and "cuda_max_allocated" in a:
            lines.append(f"| CUDA max allocated, runner and bare loop in (a) | {gib(a['cuda_max_allocated'])} |")
        lines.append("")
    if d is not None:
        lines += ["## (d) Analysis targets", ""]
        if not d:
            lines += ["No results to analyse and no analysis target ran.", ""]
        else:
            lines += ["| target | results | runs | seconds | exit |", "|---|---|---:|---:|---:|"]
            for t in d:
                where = t["where"].removeprefix(str(ROOT) + os.sep)
                lines.append(f"| `make {t['target']}` | {where} | {t['runs']} | {t['wall']:.1f} | {t['rc']} |")
            missing = [x for x in ("figures", "claims") if x not in make_targets()]
            if missing:
                lines.append("")
                lines.append(f"No `make {'` or `make '.join(missing)}` target in this Makefile yet.")
            lines.append("")
    if e:
        first = e["splits"][0]
        per_job = {(s["jobs"], s["threads"]): s["wall"] / s["runs"] for s in e["splits"]}
        base = per_job[(first["jobs"], first["threads"])]
        runner_total = a["runner_best"]["total"] if a else None
        sizes = sweep_sizes()
        lines += ["## (e) Sweep throughput", "",
                  f"`make sweep`'s command on {len(e['rows'])} rows x {len(e['seeds'])} seeds, {args.sweep_steps} "
                  "steps with full-size checks, interventions and weight averaging off, the Hydra process and "
                  "its start included; "
                  "jobs in parallel through `hydra/launcher=joblib` (`make sweep JOBS=n`).", "",
                  "| jobs x threads | runs | wall | per run | speed-up |"
                  + "".join(f" {name}, {n} runs, estimated |" for name, n in sizes.items() if runner_total),
                  "|---|---:|---:|---:|---:|" + ("---:|" * len(sizes) if runner_total else "")]
        for s in e["splits"]:
            pj = per_job[(s["jobs"], s["threads"])]
            est = "".join(f" {fmt_s(n * runner_total * pj / base)} |" for n in sizes.values()) if runner_total else ""
            lines.append(f"| {s['jobs']} x {s['threads']} | {s['runs']} | {fmt_s(s['wall'])} | {fmt_s(pj)} | "
                         f"{base / pj:.2f}x |{est}")
        if runner_total:
            mismatch = "" if args.threads == args.cores else \
                f", not the {args.cores} of the first split: a rough estimate"
            lines += ["", f"Estimate: runs x the runner's extrapolated full `{ROW}` run from (a) (one job, "
                      f"{args.threads} threads{mismatch}) x the split's time per run relative to one job at a "
                      "time; rows "
                      "without running statistics (GroupNorm, LayerNorm) skip the interventions and cost less. "
                      "The issue's target: the article's 21 runs within 2.5 h on 2 cores."]
        lines.append("")
    lines += ["## How to read and rerun", "",
              "`make bench` (or `python bench/bench.py --help`); `--steps` sets the steps measured for (a), "
              "`--rounds` the interleaved rounds, `--sweep-steps` the steps per job in (c) and (e). Each "
              "figure is one measurement on this machine, not a property of the code: rerun it where you run "
              "the study.", ""]
    return "\n".join(lines)


def sweep_sizes() -> dict[str, int]:
    """Runs in the article's table (rows with published figures x seeds) and in `make sweep` (every row)."""
    from bnrotation.rows import ROWS, SEEDS, SWEEP_ROWS
    return {"article's table": sum(1 for spec in ROWS.values() if spec.published) * len(SEEDS),
            "`make sweep`": len(SWEEP_ROWS) * len(SEEDS)}


def progress(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- main
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "results" / "bench.md"), help="report path (default %(default)s)")
    p.add_argument("--steps", type=int, default=300, help="steps measured for (a), >= 100 (default %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved runner/bare rounds (default %(default)s)")
    p.add_argument("--reps", type=int, default=3, help="calls per probe timing in (b) (default %(default)s)")
    p.add_argument("--sweep-steps", type=int, default=100, help="steps per job in (c) and (e) (default %(default)s)")
    p.add_argument("--sweep-rows", default="sgd,adam", help="rows of the sweep in (e) (default %(default)s)")
    p.add_argument("--sweep-seeds", type=int, default=2, help="seeds per row in (e) (default %(default)s)")
    p.add_argument("--threads", type=int, default=0, help="torch threads in (a)-(c); 0: every core available")
    p.add_argument("--cores", type=int, default=0, help="cores split into jobs x threads in (e); 0: every core")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--venv", default=".venv", help="the Makefile's VENV, for the nested `make table`")
    p.add_argument("--results", default="", help="results root timed in (d); default: results/, else "
                   "results/reference/, whichever has finished runs")
    p.add_argument("--skip", default="", help="sections to leave out, e.g. 'c,d,e'")
    p.add_argument("--bare-only", action="store_true", help=argparse.SUPPRESS)  # the child of (c)
    args = p.parse_args(argv)
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    args.threads, args.cores = args.threads or available, args.cores or available
    if args.steps < 100 or args.sweep_steps < 100:
        p.error("--steps and --sweep-steps must be >= 100 (one check)")
    if args.rounds < 1 or args.reps < 1:
        p.error("--rounds and --reps must be >= 1")
    args.command = shlex.join(["python", "bench/bench.py", *(argv if argv is not None else sys.argv[1:])])
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.bare_only:
        bare_loop(args.steps, set(range(100, args.steps + 1, 100)), 4000, device)
        return 0
    skip = set(args.skip.split(",")) - {""}
    load = OtherLoad()
    info = machine(device, args.threads)
    progress(f"{info['cpu']}, {info['cores']} cores, {info['device']}, {args.threads} threads; "
             f"load average {load.load0[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="bnrotation-bench-") as tmp_name:
        tmp = Path(tmp_name)
        a = overhead(args, device, tmp) if "a" not in skip else None
        b = probe_costs(args, device, tmp, a) if "b" not in skip else None
        c = peak_memory(args, device, tmp) if "c" not in skip else None
        e = sweep_throughput(args, device, tmp) if "e" not in skip else None
        own = e["splits"][0]["root"] if e else tmp / "overhead"
        d = analysis_times(args, tmp, own) if "d" not in skip else None
        loads = {"start": load.load0, "end": os.getloadavg(), "other_cores": load.cores(),
                 "wall": time.time() - load.t0}
        text = report(args, info, loads, a, b, c, d, e)
    out = Path(args.out)
    records.atomic_write_text(out, text)
    progress(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
