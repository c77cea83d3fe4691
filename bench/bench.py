"""`make bench`: what the suite's measurements cost, against the article's bare training loop.

    python bench/bench.py [--steps 300] [--rounds 2] [--process-steps 600] [--out results/bench.md]

Writes a Markdown report (default ``results/bench.md``): the machine, then one
section per measurement, each a named pair of functions in :data:`SECTIONS`
(``measure_<x>`` returns the figures, ``report_<x>`` the section's lines):

(a) the runner's full run against the bare loop in one process: both run
    ``--steps`` steps interleaved, each extrapolated to the full run from its
    per-step and per-event times, part by part;
(b) the same comparison as whole processes in alternation (Hydra's start-up
    and the imports included), on a quiet machine and beside a process that
    keeps one core busy, with OpenMP's default and passive wait policy;
(c) what each probe and the monitor cost per call and per run, and the
    monitor's share of training time on the study's network and on ResNet-20
    at one call per 100 steps; evaluation chunk sizes;
(d) the options: the seeds of a row batched into one model, and
    ``torch.compile`` (compile time, speed, agreement), each against the bare
    loop's training step measured in this run;
(e) peak memory; (f) the analysis targets' time; (g) sweep throughput per
    split of the cores, and the full sweep's time estimated from (a) and (g);
(h) the monitor's overhead on timm's resnet18 at one call per 100 steps, by
    the wall clock and by CPU time, against training without it in the same run
    (``--only h`` runs it alone).

It needs no results (it makes its own runs in a temporary folder). On a machine
others are using, read the ratios (each side measured interleaved), not the
absolute times; the report states how busy the machine was.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import runpy
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.fx as fx
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from bnrotation import records

from bnrotation.study import ensemble
from bnrotation.checkpoints import checkpoint_path, save_checkpoint
from bnrotation.study.config import EVAL_COMPILED_MIN_STEPS, RunConfig, register_configs, to_run_config
from bnrotation.study.interventions import run_interventions
from bnrotation.study.model import build_network
from bnrotation.monitor import StalenessMonitor
from bnrotation.bnstats import batch_statistics
from bnrotation.study.optim import build_optimizer
from bnrotation.evaluation import CompiledEvaluation, eval_chunk
from bnrotation.probes import accuracy, channel_dims, fresh_statistics, input_moments, pooled_chunk_moments
from bnrotation.study.rows import RESNET_ROWS, ROWS, SEEDS, SETS, SWEEP_ROWS
from bnrotation.study.runner import averaging_steps, check_steps, intervention_steps, log_steps, run
from bnrotation.study.runtime import evaluation_compiled, resolve_device
from bnrotation.study.task import NoisyTemplates, reestimation_batches

ROOT = Path(__file__).resolve().parents[1]
ROW = "adam"  # the row the ratios are measured on: Adam, lr 3e-3, as in the article's snippet
HOUR = 3600.0
# Parts of a run's time, as the report's columns.
PARTS = {"steps": "steps", "checks": "checks", "probes": "probes", "interventions": "interventions",
         "averaging": "weight averaging", "fixed": "setup, writing"}
TARGET_RATIO = 0.7  # the target: the instrumented full run within 0.7x the bare loop's time
TARGET_SWEEP_HOURS = 3.0  # and the full sweep (rows.SWEEPS) within 3 hours on 2 cores


# ----------------------------------------------------------------------------- configs and schedules
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


def full_run_backend(device: torch.device) -> str:
    """``eval_backend=<what the full run of ROW picks on device>``: the reduced runs of (a) and (b) evaluate as
    the full run does (compiled on a CPU), although ``auto`` would keep runs this short eager."""
    compiled = evaluation_compiled(compose_run([f"experiment={ROW}", f"device={device.type}"]), device)
    return f"eval_backend={'compiled' if compiled else 'eager'}"


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
# The article's snippet: experiments/minimal.py's loop, timed as it is (one copy of it). Its training-mode pass
# at a check runs on a copy of the network, so it moves no running statistic, as the suite's does not.
bare_loop = runpy.run_path(str(Path(__file__).resolve().parents[1] / "experiments" / "minimal.py"))["train"]


# ----------------------------------------------------------------------------- shared helpers
@dataclass
class Context:
    """What every section reads: the arguments, the device, a scratch folder, and earlier sections' figures."""

    args: argparse.Namespace
    device: torch.device
    tmp: Path
    results: dict = field(default_factory=dict)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def timed(fn: Callable, reps: int, sync: Callable = lambda: None) -> float:
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


def least_disturbed(rounds: list[dict]) -> dict:
    """Each part's smallest time over the rounds, and their sum as ``total``.

    Other processes only ever add time, so the smallest of repeated
    measurements is the closest to the undisturbed cost (as ``timeit`` takes
    the minimum); taking it per part keeps one disturbed stretch from
    spoiling a whole round.
    """
    parts = {p: min(r[p] for r in rounds) for p in rounds[0] if p != "total"}
    return {**parts, "total": sum(parts.values())}


def child(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd``; its wall seconds, exit status, peak RSS (bytes) and output tail."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
        _, status, usage = os.wait4(proc.pid, 0)
        log.seek(0)
        tail = log.read().decode(errors="replace")[-2000:]
    return {"wall": time.perf_counter() - t0, "rc": os.waitstatus_to_exitcode(status),
            "max_rss": usage.ru_maxrss * 1024, "tail": tail, "cmd": cmd}


def checked(c: dict, what: str) -> dict:
    """``c`` if its command exited 0, else a RuntimeError naming ``what`` and the command."""
    if c["rc"] != 0:
        raise RuntimeError(f"{what} failed ({c['rc']}): {shlex.join(c['cmd'])}\n{c['tail']}")
    return c


def train_cmd(overrides: list[str], multirun: bool = False) -> list[str]:
    return [sys.executable, str(ROOT / "experiments" / "train.py"), *(["-m"] if multirun else []), *overrides]


def progress(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fmt_s(s: float) -> str:
    if s >= HOUR:
        return f"{s / HOUR:.2f} h"
    if s >= 100:
        return f"{s / 60:.1f} min"
    return f"{s:.3g} s"


def gib(n: float) -> str:
    return f"{n / 2 ** 30:.2f} GiB"


def span(values: list[float], fmt: str = "{:.2f}") -> str:
    return "–".join(fmt.format(v) for v in (min(values), max(values))) if len(values) > 1 else fmt.format(values[0])


# ----------------------------------------------------------------------------- (a) in one process
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


def measure_in_process(ctx: Context) -> dict:
    """Runner and bare loop, ``--rounds`` times each, interleaved (ABBA), extrapolated to the full run."""
    args = ctx.args
    full = Schedule.of(compose_run([f"experiment={ROW}"]))
    cfg = compose_run([f"experiment={ROW}", *reduced_overrides(args.steps), f"results_root={ctx.tmp / 'overhead'}",
                       "progress=false", "force=true", f"threads={args.threads}", f"device={ctx.device.type}",
                       full_run_backend(ctx.device)])
    measured = Schedule.of(cfg)
    checks = set(check_steps(cfg))
    runner_rounds, bare_rounds = [], []
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for r in range(args.rounds):
        for which in (("runner", "bare") if r % 2 == 0 else ("bare", "runner")):
            if which == "runner":
                runner_rounds.append(extrapolate_runner(runner_once(cfg), measured, full))
            else:
                bare_rounds.append(extrapolate_bare(bare_loop(args.steps, checks, cfg.scale.heldout_size, ctx.device),
                                                    args.steps, full))
            progress(f"(a) round {r + 1}/{args.rounds}: {which} done")
    runner, bare = least_disturbed(runner_rounds), least_disturbed(bare_rounds)
    out = {"full": full, "measured": measured, "runner": runner_rounds, "bare": bare_rounds,
           "ratios": [a["total"] / b["total"] for a, b in zip(runner_rounds, bare_rounds)],
           "runner_best": runner, "bare_best": bare, "ratio": runner["total"] / bare["total"],
           "step_ratio": runner["steps"] / bare["steps"], "bare_step": bare["steps"] / full.steps}
    if ctx.device.type == "cuda":
        out["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
    return out


def report_in_process(ctx: Context, a: dict) -> list[str]:
    full, m = a["full"], a["measured"]
    lines = [f"Row `{ROW}`. Both ran {m.steps} steps with full-size checks ({m.checks} checks on the 4,000 held-out "
             f"samples), the runner also {m.logs} log points, {m.interventions} intervention point and "
             f"{m.averaging} weight-averaging point, interleaved over {ctx.args.rounds} rounds; each is "
             f"extrapolated to the full run ({full.steps:,} steps, {full.checks} checks, {full.logs} log points, "
             f"{full.interventions} intervention and {full.averaging} averaging points) from its per-step and "
             f"per-event times. The runner evaluates as the full run does (`{full_run_backend(ctx.device)}`; "
             "the compile counts once, in setup). The bare loop is the article's snippet written anew (default "
             "memory format, `net.train()` / `net.eval()` checks, no probes, no logging).", "",
             "| full run, extrapolated | " + " | ".join(PARTS.values()) + " | total |",
             "|---|" + "---:|" * (len(PARTS) + 1)]
    named = [(f"{who}, round {i + 1}", row) for i, (r, b) in enumerate(zip(a["runner"], a["bare"]))
             for who, row in (("runner", r), ("bare loop", b))]
    named += [("**runner, least disturbed**", a["runner_best"]), ("**bare loop, least disturbed**", a["bare_best"])]
    for name, row in named:
        lines.append(f"| {name} | {' | '.join(fmt_s(row[p]) if p in row else '-' for p in PARTS)} | "
                     f"{fmt_s(row['total'])} |")
    verdict = "meets" if a["ratio"] <= TARGET_RATIO else "misses"
    return lines + ["", f"**Runner / bare loop: {a['ratio']:.2f}x**, from each part's least disturbed round "
                    f"(rounds alone: {', '.join(f'{x:.2f}' for x in a['ratios'])}); the target is at most "
                    f"{TARGET_RATIO}x, which this {verdict}. Training steps alone: {a['step_ratio']:.2f}x "
                    "(channels-last against the default memory format); the measurements are the rest."]


# ----------------------------------------------------------------------------- (b) whole processes
def process_overrides(steps: int) -> list[str]:
    """A tenth of a full run: checks every 100 steps over the second half, one intervention and averaging point."""
    return ["scale=full", f"scale.steps={steps}", f"scale.check_start={steps // 2}", f"scale.intervene_every={steps}"]


def measure_processes(ctx: Context) -> dict:
    """The runner (``experiments/train.py``) and the bare loop (``bench.py --bare-only``) as child processes in
    alternation, ``--process-pairs`` pairs per condition: quiet; beside a process that keeps one core busy; and
    busy with OpenMP's passive wait policy (``OMP_WAIT_POLICY=PASSIVE``) in both children."""
    args = ctx.args
    steps = args.process_steps
    runner = train_cmd([f"experiment={ROW}", *process_overrides(steps), "progress=false", "force=true",
                        f"results_root={ctx.tmp / 'processes'}", f"device={ctx.device.type}",
                        full_run_backend(ctx.device),
                        f"hydra.run.dir={ctx.tmp / 'processes' / 'hydra'}"])
    bare = [sys.executable, __file__, "--bare-only", "--steps", str(steps), "--check-start", str(steps // 2),
            "--device", ctx.device.type]
    conditions = {"quiet": ({}, False), "one core busy": ({}, True),
                  "one core busy, OMP_WAIT_POLICY=PASSIVE": ({"OMP_WAIT_POLICY": "PASSIVE"}, True)}
    out = {}
    for name, (env, busy) in conditions.items():
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            pairs = []
            for r in range(args.process_pairs):
                times = {}
                for which in (("runner", "bare") if r % 2 == 0 else ("bare", "runner")):
                    c = checked(child(runner if which == "runner" else bare, env), f"(b) {which}, {name}")
                    times[which] = c["wall"]
                pairs.append(times)
                progress(f"(b) {name}: pair {r + 1}/{args.process_pairs}")
        finally:
            if burner is not None:
                burner.kill()
                burner.wait()
        out[name] = {"pairs": pairs, "ratios": [p["runner"] / p["bare"] for p in pairs]}
    return {"steps": steps, "conditions": out}


def report_processes(ctx: Context, b: dict) -> list[str]:
    steps = b["steps"]
    lines = [f"Row `{ROW}`, {steps} steps (checks every 100 from step {steps // 2} on the 4,000 held-out samples, "
             f"one intervention and one averaging point for the runner, `{full_run_backend(ctx.device)}` as in "
             "the full run), each side a whole process (Python and "
             "torch start-up, Hydra's for the runner), alternating runner and bare loop. \"One core busy\": a "
             "child process spinning on one core throughout, as another user's job would.", "",
             "| condition | pairs | runner | bare loop | runner / bare loop |", "|---|---:|---:|---:|---:|"]
    for name, c in b["conditions"].items():
        lines.append(f"| {name} | {len(c['pairs'])} | {span([p['runner'] for p in c['pairs']], '{:.0f}')} s | "
                     f"{span([p['bare'] for p in c['pairs']], '{:.0f}')} s | "
                     f"{statistics.median(c['ratios']):.2f}x ({span(c['ratios'])}) |")
    quiet, busy = (statistics.median(b["conditions"][k]["ratios"]) for k in ("quiet", "one core busy"))
    passive = statistics.median(b["conditions"]["one core busy, OMP_WAIT_POLICY=PASSIVE"]["ratios"])
    lines += ["", f"The runner loses {busy / quiet:.2f}x as much against the bare loop when one core is busy as "
              f"when the machine is quiet; with the passive wait policy {passive / quiet:.2f}x. Both sides use "
              "every core's thread; a thread that another process holds up makes the others wait at each parallel "
              "region's barrier, and the runner's measurements (evaluation chunks of 64, the probe passes) run "
              "many more, shorter parallel regions than the bare loop's whole-set checks."]
    return lines


# ----------------------------------------------------------------------------- (c) probes and the monitor
@torch.no_grad()
def layerwise_chunked_forward(model: nn.Module, x: torch.Tensor, chunk: int) -> torch.Tensor:
    """The training-mode (batch statistics) output on ``x`` (N, ...), computed in chunks of ``chunk`` samples:
    the traced graph runs chunk by chunk between BatchNorm layers; at each one the chunks' moments are pooled
    into the whole batch's, and every chunk is normalised with them. Equal to one pass to float tolerance
    (``tests/test_perf.py``). Measured in (c) against the one pass the suite uses, and kept out of the suite:
    it needs a model that traces, and its gain, if any, is within the noise of (c). Raises ``torch.fx`` errors
    for models that do not trace."""
    gm = fx.symbolic_trace(model)
    modules = dict(gm.named_modules())
    nodes = list(gm.graph.nodes)
    norms = {n for n in nodes if n.op == "call_module" and isinstance(modules[n.target], nn.modules.batchnorm._BatchNorm)}
    feeds = {n.args[0]: n for n in norms}  # the node whose output a BatchNorm layer normalises
    segments, current = [], []
    for node in nodes:  # a new segment starts at each BatchNorm layer: it needs the whole batch's moments
        if node in norms and current:
            segments.append(current)
            current = []
        current.append(node)
    segments.append(current)
    xs = list(x.split(chunk))
    env: dict = {}
    parts: dict = {n: [] for n in norms}
    at = lambda a, i: fx.node.map_arg(a, lambda n: env[n][i] if isinstance(env[n], list) else env[n])
    for segment in segments:
        pooled = {}
        for node in segment:
            if node in norms:
                chunks = parts.pop(node)
                n = sum(k for k, _, _ in chunks)
                mean, var = pooled_chunk_moments(chunks)
                pooled[node] = (mean.float(), (var * (n - 1) / n).float())  # BatchNorm normalises with the biased variance
            env[node] = getattr(gm, node.target) if node.op == "get_attr" else [None] * len(xs)
        for i in range(len(xs)):
            for node in segment:
                if node.op == "get_attr":
                    continue
                if node.op == "placeholder":
                    value = xs[i]
                elif node.op == "output":
                    value = at(node.args[0], i)
                elif node in norms:
                    m = modules[node.target]
                    value = F.batch_norm(env[node.args[0]][i], *pooled[node], m.weight, m.bias, False, 0.0, m.eps)
                elif node.op == "call_module":
                    value = modules[node.target](*at(node.args, i), **at(node.kwargs, i))
                elif node.op == "call_method":
                    value = getattr(at(node.args[0], i), node.target)(*at(node.args[1:], i), **at(node.kwargs, i))
                else:
                    value = node.target(*at(node.args, i), **at(node.kwargs, i))
                env[node][i] = value
                if node in feeds:
                    mean, var = input_moments(value)
                    count = value.numel() // value.shape[1]
                    parts[feeds[node]].append((count, mean, var))
    return torch.cat(env[nodes[-1]])


def measure_probes(ctx: Context) -> dict:
    """Seconds per call of each probe on the runner's own objects, calls per full run, and the monitor's share
    of training time on the study's network and ResNet-20."""
    args, device = ctx.args, ctx.device
    cfg = compose_run([f"experiment={ROW}", "progress=false", f"device={device.type}"])
    full = Schedule.of(cfg)
    task = NoisyTemplates.build(cfg.task, cfg.seed, device)
    fmt = torch.channels_last
    x_held, y_held = (t.contiguous(memory_format=fmt) if t.dim() == 4 else t
                      for t in task.fixed_set(cfg.scale.heldout_size, cfg.seed, "heldout"))
    chunk = eval_chunk(device, len(y_held))
    rows, monitors = [], {}
    for arch, experiment in (("the study's network", ROW), ("ResNet-20", RESNET_ROWS[0])):
        c = compose_run([f"experiment={experiment}", f"device={device.type}"])
        t = NoisyTemplates.build(c.task, c.seed, device)
        model = build_network(c.model, c.task.num_classes, c.seed, device)
        opt = build_optimizer(c.optimizer, model)
        x_probe = t.fixed_set(c.task.probe_size, c.seed, "probe")[0].contiguous(memory_format=fmt)
        gen = torch.Generator(device).manual_seed(0)

        def train_step():
            x, y = t.sample(c.task.batch_size, gen)
            loss = F.cross_entropy(model(x.contiguous(memory_format=fmt)), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        step = timed(train_step, args.reps * 5, ctx.sync)
        monitor = StalenessMonitor(model, x_probe, warn=False)
        before = monitor.snapshot()
        calls = iter(range(100, 10 ** 9, 100))
        monitor.measure(0)
        path_monitor = StalenessMonitor(model, x_probe, warn=False, evaluation_path=True)
        path_monitor.measure(0)
        plain, path = [], []
        for r in range(args.reps):  # interleaved, so that load shifts hit both alike
            for m, into in ((monitor, plain), (path_monitor, path))[:: 1 if r % 2 == 0 else -1]:
                into.append(timed(lambda: m.measure(next(calls), before), 1, ctx.sync))
        call, call_path = statistics.median(plain), statistics.median(path)
        monitors[arch] = {"step": step, "call": call, "share": call / (100 * step), "probe": len(x_probe),
                          "layers": len(monitor.layers), "call_path": call_path}
        if arch == "the study's network":
            rows += [("fresh statistics (probe set, one pass in training mode)", full.logs,
                      timed(lambda: fresh_statistics(model, x_probe), args.reps, ctx.sync)),
                     ("monitor call without the mode check, as the runner makes it at a log point", full.logs,
                      timed(lambda: StalenessMonitor(model, x_probe, warn=False, modes=False).measure(100, before),
                            args.reps, ctx.sync)),
                     (f"accuracy, evaluation mode (chunks of {chunk})", full.checks,
                      timed(lambda: accuracy(model, x_held, y_held, "eval", chunk), args.reps, ctx.sync)),
                     ("accuracy, training mode (one pass, batch statistics)", full.checks,
                      timed(lambda: accuracy(model, x_held, y_held, "train"), args.reps, ctx.sync)),
                     ("checkpoint save", full.interventions,
                      timed(lambda: save_checkpoint(checkpoint_path(ctx.tmp / "probes", 0), model, step=0),
                            args.reps, ctx.sync))]
            z = torch.randn(len(x_probe), 32, *x_probe.shape[2:], device=device).contiguous(memory_format=fmt)
            rows += [(f"moments of one layer input ({len(z)}x32x{z.shape[2]}x{z.shape[3]}), torch.var_mean", 0,
                      timed(lambda: torch.var_mean(z, dim=channel_dims(z), correction=1), args.reps * 5, ctx.sync)),
                     ("moments of the same input, corrected two-pass (`probes.input_moments`, used)", 0,
                      timed(lambda: input_moments(z), args.reps * 5, ctx.sync))]

            def train_mode_chunked():
                with batch_statistics(model):
                    return (layerwise_chunked_forward(model, x_held, 128).argmax(1) == y_held).double().mean()

            rows.append(("accuracy, training mode, layer by layer in chunks of 128 (not used)", full.checks,
                         timed(train_mode_chunked, args.reps, ctx.sync)))
            batches = reestimation_batches(task, cfg, device, 100)
            rows.append((f"intervention point ({cfg.scale.reestimate_batches} re-estimation batches, every swap)",
                         full.interventions, timed(lambda: run_interventions(model, batches, x_held, y_held, chunk,
                                                                             acc_stored=0.5), 1, ctx.sync)))
            chunks = {}
            sizes = [s for s in (4000, 1000, 256, 128, 64, 32) if s <= len(y_held)]
            for r in range(args.reps):  # interleaved, so that load shifts hit every size alike
                for s in (sizes if r % 2 == 0 else sizes[::-1]):
                    chunks.setdefault(s, []).append(timed(lambda: accuracy(model, x_held, y_held, "eval", s), 1,
                                                          ctx.sync))
    progress("(c) probes done")
    return {"rows": rows, "monitors": monitors, "chunk": chunk, "heldout": len(y_held),
            "chunks": {s: statistics.median(v) for s, v in chunks.items()}}


def report_probes(ctx: Context, c: dict) -> list[str]:
    a = ctx.results.get("a")
    total = a["runner_best"]["total"] if a else None
    lines = [f"Per call: median of {ctx.args.reps} calls after a warm-up; per run: times the calls a full run makes."
             + (" Share: of the runner's extrapolated full run in (a)." if total else ""), "",
             "| probe | per call | calls per run | per run | share |", "|---|---:|---:|---:|---:|"]
    for name, calls, sec in c["rows"]:  # calls 0: a part of a probe, or an alternative measured and not used
        share = f"{100 * calls * sec / total:.1f}%" if total and calls else "-"
        per_run = fmt_s(calls * sec) if calls else "-"
        lines.append(f"| {name} | {fmt_s(sec)} | {calls or '-'} | {per_run} | {share} |")
    lines += ["", "**The monitor's overhead** (`StalenessMonitor`, one call: a training-mode and an evaluation-mode "
              "pass over its probe batch and a pass over the paired weights) at one call per 100 training steps, "
              "against the time of those 100 steps; the target is at most 3%:", "",
              "| network | probe batch | norm layers | training step | monitor call | share of training | "
              "call with `evaluation_path=True` | its cost over the call |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for arch, m in c["monitors"].items():
        lines.append(f"| {arch} | {m['probe']} | {m['layers']} | {fmt_s(m['step'])} | {fmt_s(m['call'])} | "
                     f"{100 * m['share']:.1f}% | {fmt_s(m['call_path'])} | "
                     f"{100 * (m['call_path'] / m['call'] - 1):+.0f}% |")
    lines += ["", "`evaluation_path=True`: the same call measuring each layer's input moments along the evaluation "
              "path too (`probes.evaluation_path_pass`: its evaluation-mode pass run eagerly, with a hook per layer); "
              f"the two monitors' calls interleaved, the median of {ctx.args.reps} each."]
    best = min(c["chunks"], key=c["chunks"].get)
    lines += ["", f"Evaluation-mode accuracy on the {c['heldout']:,} held-out samples by chunk size (median of "
              f"{ctx.args.reps}, interleaved; the runner uses {c['chunk']}; training mode is one pass by the "
              "protocol):", "", "| chunk | seconds |", "|---:|---:|"]
    return lines + [f"| {s}{' (fastest)' if s == best else ''} | {sec:.3f} |" for s, sec in c["chunks"].items()]


# ----------------------------------------------------------------------------- (h) the monitor on timm's resnet18
def import_timm():
    """``timm`` with ``tests/thirdparty.py``'s torchvision shim, or None when it is not installed."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from thirdparty import torchvision_shim
        torchvision_shim()
        import timm
    except ImportError:
        return None
    finally:
        sys.path.remove(str(ROOT / "tests"))
    return timm


TARGET_MONITOR_SHARE = 0.03  # (h): one monitor call at most 3% of the 100 training steps between calls


def measure_timm(ctx: Context) -> dict:
    """timm's ``resnet18`` (random weights) at 32x32, Adam, batch 128: blocks of 100 training steps without the
    monitor (A) and with one monitor call after them (B; the suite's probe of 512 labelled samples), alternated
    ABBA ``--rounds`` x 2 times in this process, each block timed by the wall clock and by this process's CPU time,
    and within the blocks each step (on a CPU: on a GPU a step's time would need a synchronisation per step) and
    each call; then ``--reps`` calls timed alone. Skipped (empty) without timm."""
    timm = import_timm()
    if timm is None:
        progress("(h) skipped: timm is not installed")
        return {}
    args, device = ctx.args, ctx.device
    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=10).to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator(device).manual_seed(0)
    probe_size = compose_run([f"experiment={ROW}"]).task.probe_size
    x_probe = torch.randn(probe_size, 3, 32, 32, generator=gen, device=device)
    y_probe = torch.randint(0, 10, (probe_size,), generator=gen, device=device)
    batches = [(torch.randn(128, 3, 32, 32, generator=gen, device=device),
                torch.randint(0, 10, (128,), generator=gen, device=device)) for _ in range(10)]
    monitor = StalenessMonitor(model, (x_probe, y_probe), warn=False)
    steps = iter(range(1, 10 ** 9))
    per_step = device.type != "cuda"
    since = lambda t: (time.perf_counter() - t[0], time.process_time() - t[1])  # (wall, CPU) seconds since t

    def call() -> tuple[float, float]:
        """One monitor call, (wall, CPU) seconds."""
        ctx.sync()
        t = time.perf_counter(), time.process_time()
        monitor.measure(next(steps))
        ctx.sync()
        return since(t)

    def block(with_monitor: bool) -> dict:
        """100 training steps, and one call after them when ``with_monitor``: (wall, CPU) seconds of the block
        (``total``), of each step (``steps``, on a CPU) and of the call (``call``, None without)."""
        ctx.sync()
        t0 = time.perf_counter(), time.process_time()
        times = []
        for i in range(100):
            t = time.perf_counter(), time.process_time()
            x, y = batches[i % len(batches)]
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if per_step:
                times.append(since(t))
        inner = call() if with_monitor else None
        ctx.sync()
        return {"total": since(t0), "steps": times, "call": inner}

    block(True)  # warm-up: first calls allocate
    pairs, calls, steps_a = [], [], []
    for r in range(args.rounds * 2):  # ABBA, so that a drift in load hits both sides alike
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {w: block(w) for w in order}
        pairs.append((got[False]["total"], got[True]["total"]))
        calls.append(got[True]["call"])
        steps_a += got[False]["steps"]
    alone = [call() for _ in range(args.reps)]
    progress("(h) timm resnet18 done")
    return {"pairs": pairs, "steps_a": steps_a, "calls_in_blocks": calls, "calls_alone": alone, "probe": probe_size,
            "layers": len(monitor.layers), "paired": len(monitor.pairing.pairs), "eval_chunk": monitor.eval_chunk,
            "device": device.type}


def timm_figures(h: dict) -> dict:
    """(h)'s figures per clock (``wall``, ``cpu``): the median A block and the A blocks' spread (max - min over the
    median), the overhead of each pair (B / A - 1) and their median, the median step of the A blocks (the median A
    block / 100 without per-step times), the median call (every call timed, in the B blocks and alone) and its
    share of 100 median steps; and the clock the target reads (``target_clock``): CPU time on a CPU, the wall
    clock on a GPU (CPU time does not count the device's work).

    Medians on both sides of the share: other processes slow a minority of steps and calls by any amount, which
    a median passes over and a block's total (a mean over its steps) does not; a call lasts about three steps,
    so a block and a call seldom meet the same load, while the median step and the median call, both sampled
    over the whole run, do."""
    out = {}
    for k, clock in enumerate(("wall", "cpu")):
        base = [a[k] for a, _ in h["pairs"]]
        pair = [b[k] / a[k] - 1 for a, b in h["pairs"]]
        median = statistics.median(base)
        step = statistics.median(s[k] for s in h["steps_a"]) if h.get("steps_a") else median / 100
        call = statistics.median(c[k] for c in h["calls_in_blocks"] + h["calls_alone"])
        out[clock] = {"base": median, "spread": (max(base) - min(base)) / median, "pairs": pair,
                      "pair_median": statistics.median(pair), "step": step, "call": call, "share": call / (100 * step)}
    out["target_clock"] = "wall" if h.get("device") == "cuda" else "cpu"
    return out


def report_timm(ctx: Context, h: dict) -> list[str]:
    if not h:
        return ["Not measured: timm is not installed (`pip install timm==1.0.31 torchvision==0.28.0`)."]
    f = timm_figures(h)
    t = f[f["target_clock"]]
    n_calls = len(h["calls_in_blocks"]) + len(h["calls_alone"])
    names = {"wall": "wall", "cpu": "CPU (`time.process_time`)"}
    step_from = (f"the median of the A blocks' {len(h['steps_a'])} steps" if h.get("steps_a")
                 else "the median A block / 100")
    lines = [f"timm `resnet18`, random weights, 32x32 inputs, Adam, batch 128; the monitor with a labelled probe of "
             f"{h['probe']} samples ({h['paired']} of {h['layers']} BatchNorm layers paired; its evaluation-mode pass "
             f"in chunks of {h['eval_chunk']}), one call per 100 steps. {len(h['pairs'])} pairs of 100-step blocks, "
             "without the monitor (A) and with one call after the steps (B), alternated ABBA; paired overhead = B / A "
             f"- 1, per pair. One call: the median of {n_calls} calls, each timed by both clocks "
             f"({len(h['calls_in_blocks'])} at the end of the B blocks, {len(h['calls_alone'])} alone after them); "
             f"one step: {step_from}; the call's share = one call / (100 x one step).", "",
             "| clock | 100 steps (median A block) | spread of the A blocks | paired overhead per pair | median | "
             "one step | one call | one call / 100 steps |", "|---|---:|---:|---|---:|---:|---:|---:|"]
    for clock in ("wall", "cpu"):
        c = f[clock]
        lines.append(f"| {names[clock]} | {fmt_s(c['base'])} | {100 * c['spread']:.1f}% | "
                     f"{', '.join(f'{100 * v:+.1f}%' for v in c['pairs'])} | {100 * c['pair_median']:+.1f}% | "
                     f"{1000 * c['step']:.1f} ms | {1000 * c['call']:.0f} ms | {100 * c['share']:.2f}% |")
    why = ("it counts this process's own work, which other processes on a shared machine do not add to (they add "
           "the time its threads wait for a core, which the wall clock counts), so it is the closer estimate of the "
           "share on a machine of one's own, where the two clocks agree; threads that spin at a barrier while the "
           "other is held up count in it too, which is why neither column is exact under load"
           if f["target_clock"] == "cpu" else "on a GPU the work runs on the device, which this process's CPU time "
           "does not count")
    lines += ["", f"**Compared with the target of at most {100 * TARGET_MONITOR_SHARE:.0f}%: the call's share of 100 "
              f"steps by {names[f['target_clock']]}, {100 * t['share']:.2f}%.** The share, because the target is the "
              "cost of a call against the steps between calls, and medians of steps and calls, sampled over the whole "
              "run, pass over the steps and calls that other processes slowed; the paired overhead is reported as the "
              "check that nothing besides the call (slower steps after it) adds much, but a block's total is a mean "
              f"over its steps: the A blocks alone spread by {100 * t['spread']:.1f}% here, against a call of "
              f"{100 * t['share']:.1f}%. That clock, because {why}. Both clocks are reported; neither is a pass or "
              "fail."]
    return lines


# ----------------------------------------------------------------------------- (d) options
def measure_options(ctx: Context) -> dict:
    """The batched seeds' training step against one seed's, and ``torch.compile``'s training step and evaluation
    pass against eager execution: time, compile time, agreement."""
    args, device = ctx.args, ctx.device
    cfg = compose_run([f"experiment={ROW}", f"device={device.type}"])
    task = NoisyTemplates.build(cfg.task, cfg.seed, device)
    fmt = torch.channels_last
    n = len(SEEDS)

    def stepper(model, opt, batched: bool):
        gens = [torch.Generator(device).manual_seed(s) for s in range(n if batched else 1)]

        def step():
            drawn = [task.sample(cfg.task.batch_size, g) for g in gens]
            if batched:
                x = ensemble.stacked_inputs([d[0] for d in drawn]).contiguous(memory_format=fmt)
                loss = ensemble.member_losses(model(x), [d[1] for d in drawn]).sum()
            else:
                loss = F.cross_entropy(model(drawn[0][0].contiguous(memory_format=fmt)), drawn[0][1])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return step

    single = build_network(cfg.model, 10, 0, device)
    plain = timed(stepper(single, build_optimizer(cfg.optimizer, single), False), args.reps * 5, ctx.sync)
    batched_model = ensemble.stack_models([build_network(cfg.model, 10, s, device) for s in range(n)])
    batched = timed(stepper(batched_model, build_optimizer(cfg.optimizer, batched_model, members=n), True),
                    args.reps * 5, ctx.sync)
    progress("(d) batched seeds done")
    compiled = {}
    for part in ("training step", "evaluation pass"):
        model = build_network(cfg.model, 10, 0, device)
        eager = build_network(cfg.model, 10, 0, device)
        x_held = task.fixed_set(1000, 0, "heldout")[0].contiguous(memory_format=fmt)
        if part == "training step":
            opt, opt_e = build_optimizer(cfg.optimizer, model), build_optimizer(cfg.optimizer, eager)
            fn = torch.compile(model)
            run_c, run_e = stepper(fn, opt, False), stepper(eager, opt_e, False)
        else:  # as the runner evaluates: chunks, through CompiledEvaluation's one graph per network
            fn = CompiledEvaluation().forward(model.eval())
            eager.eval()
            size = eval_chunk(device, len(x_held))
            run_c = lambda: torch.cat([fn(c) for c in x_held.split(size)])  # noqa: E731
            run_e = lambda: torch.cat([eager(c) for c in x_held.split(size)])  # noqa: E731
        t0 = time.perf_counter()
        try:
            with torch.no_grad() if part == "evaluation pass" else torch.enable_grad():
                run_c()
                run_c()
        except Exception as err:  # noqa: BLE001 - a compiler that does not work here is a finding, not a crash
            compiled[part] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
            continue
        compile_s = time.perf_counter() - t0
        with torch.no_grad() if part == "evaluation pass" else torch.enable_grad():
            t_c, t_e = timed(run_c, args.reps * 3, ctx.sync), timed(run_e, args.reps * 3, ctx.sync)
        model.load_state_dict(eager.state_dict())  # the same weights and buffers: do both compute the same?
        with torch.no_grad():
            diff = float((run_c() - run_e()).abs().max()) if part == "evaluation pass" else \
                float((fn(x_held) - eager(x_held)).abs().max())
        compiled[part] = {"compile": compile_s, "compiled": t_c, "eager": t_e, "diff": diff}
        progress(f"(d) compile, {part} done")
    return {"plain": plain, "batched": batched, "seeds": n, "compiled": compiled}


def report_options(ctx: Context, d: dict) -> list[str]:
    a = ctx.results.get("a")
    bare = a["bare_step"] if a else None
    vs_bare = (lambda s: f"{s / bare:.2f}x") if bare else (lambda s: "-")
    per_seed = d["batched"] / d["seeds"]
    keep = "faster here" if per_seed < d["plain"] else "slower here"
    lines = [f"Row `{ROW}`, one training step (batch 128), median of {ctx.args.reps * 5}; \"against the bare loop\": "
             "per seed, against the bare loop's training step measured in (a).", "",
             "| training step | time | per seed | against the bare loop |", "|---|---:|---:|---:|",
             f"| one seed, the runner's step | {fmt_s(d['plain'])} | {fmt_s(d['plain'])} | {vs_bare(d['plain'])} |",
             f"| {d['seeds']} seeds as one batched model (`batch_seeds`, `make sweep BATCH=1`) | "
             f"{fmt_s(d['batched'])} | {fmt_s(per_seed)} | {vs_bare(per_seed)} |", "",
             f"Batched seeds: {d['plain'] / per_seed:.2f}x one seed's throughput, {keep}; off by default, "
             "`make sweep BATCH=1` turns it on. On a GPU, where one small network cannot fill the device, this is "
             "the lever to measure first.", "",
             "`torch.compile` (default mode, inductor), against eager execution of the same model:", "",
             "| part | compile | compiled | eager | compiled / eager | largest output difference, same weights |",
             "|---|---:|---:|---:|---:|---:|"]
    for part, c in d["compiled"].items():
        if "error" in c:
            lines.append(f"| {part} | failed: {c['error']} | - | - | - | - |")
            continue
        lines.append(f"| {part} | {fmt_s(c['compile'])} | {fmt_s(c['compiled'])} | {fmt_s(c['eager'])} | "
                     f"{c['compiled'] / c['eager']:.2f}x | {c['diff']:.1e} |")
    ev, step = d["compiled"].get("evaluation pass", {}), d["compiled"].get("training step", {})
    ev_faster = "error" not in ev and ev.get("compiled", math.inf) < ev.get("eager", 0.0)
    step_faster = "error" not in step and step.get("compiled", math.inf) < step.get("eager", 0.0)
    lines += ["", "The evaluation pass is timed as the runner makes it: chunks of the held-out set through "
              "`evaluation.CompiledEvaluation`, one compiled graph per network that every copy of the model "
              "(averaged, with fresh statistics swapped in) shares. The runner compiles its evaluation passes on a "
              f"CPU (`eval_backend=auto`: runs of {EVAL_COMPILED_MIN_STEPS:,} steps or more) and keeps the training "
              "step eager. Here the compiled evaluation pass was " +
              (f"{ev['eager'] / ev['compiled']:.2f}x as fast as eager" if ev_faster else
               "**not faster than eager: set `eval_backend=eager` on this machine**") +
              ", and the compiled training step " +
              ("was faster: worth weighing against its compile time and agreement before switching it on"
               if step_faster else "was slower: it stays eager") + "."]
    return lines


# ----------------------------------------------------------------------------- (e) peak memory
def measure_memory(ctx: Context) -> dict:
    """Peak RSS of one runner job (a child process) and of the bare loop (another), at ``--sweep-steps``."""
    args = ctx.args
    runner = checked(child(train_cmd([f"experiment={ROW}", *reduced_overrides(args.sweep_steps), "progress=false",
                                      f"results_root={ctx.tmp / 'memory'}", f"device={ctx.device.type}",
                                      f"hydra.run.dir={ctx.tmp / 'memory' / 'hydra'}"])), "(e) the runner job")
    bare = checked(child([sys.executable, __file__, "--bare-only", "--steps", str(args.sweep_steps),
                          "--device", ctx.device.type]), "(e) the bare loop job")
    progress("(e) memory done")
    return {"runner": runner, "bare": bare}


def report_memory(ctx: Context, e: dict) -> list[str]:
    lines = [f"Peak resident set size of a child process running {ctx.args.sweep_steps} steps with full-size checks "
             "and one intervention point (the runner) or checks (the bare loop); it does not grow with the number "
             "of steps.", "", "| job | peak RSS |", "|---|---:|",
             f"| runner (`experiments/train.py`, Hydra included) | {gib(e['runner']['max_rss'])} |",
             f"| bare loop | {gib(e['bare']['max_rss'])} |"]
    a = ctx.results.get("a")
    if a and "cuda_max_allocated" in a:
        lines.append(f"| CUDA max allocated, runner and bare loop in (a) | {gib(a['cuda_max_allocated'])} |")
    return lines


# ----------------------------------------------------------------------------- (f) analysis targets
def done_runs(root: Path) -> int:
    return len(list(root.glob("runs/*/*/" + records.DONE)))


def measure_analysis(ctx: Context) -> list[dict]:
    """Wall seconds of each analysis target on the committed reference runs."""
    root = Path(ctx.args.results) if ctx.args.results else ROOT / "results" / "reference"
    out = []
    for target in ("table", "figures", "claims"):
        dest = ctx.tmp / f"analysis-{target}"
        cmd = ["make", "-s", "-o", f"{ctx.args.venv}/.installed", target, f"PY={sys.executable}", f"RESULTS={root}",
               f"OUT={dest}"]
        out.append({"target": target, "where": str(root), "runs": done_runs(root), **child(cmd)})
    progress("(f) analysis targets done")
    return out


def report_analysis(ctx: Context, f: list[dict]) -> list[str]:
    lines = ["| target | results | runs | seconds | exit |", "|---|---|---:|---:|---:|"]
    for t in f:
        lines.append(f"| `make {t['target']}` | {t['where'].removeprefix(str(ROOT) + os.sep)} | {t['runs']} | "
                     f"{t['wall']:.1f} | {t['rc']} |")
    return lines


# ----------------------------------------------------------------------------- (g) sweep throughput
def splits(cores: int) -> list[tuple[int, int]]:
    """(jobs in parallel, threads per job) with jobs x threads = cores; one job at a time first."""
    return [(j, cores // j) for j in range(1, cores + 1) if cores % j == 0]


def measure_sweep(ctx: Context) -> dict:
    """The same small sweep (``--sweep-rows`` x seeds 0..n-1) at each split of the cores, and with each row's
    seeds batched (``batch_seeds``, one job per row)."""
    args = ctx.args
    rows = args.sweep_rows.split(",")
    seeds = list(range(args.sweep_seeds))
    common = [*reduced_overrides(args.sweep_steps), "interventions=false", "averaging.enabled=false",
              "progress=false", f"device={ctx.device.type}"]
    variants = [(f"{j} x {t}", j, t, f"seed={','.join(map(str, seeds))}") for j, t in splits(args.cores)]
    variants.append((f"1 x {args.cores}, seeds batched", 1, args.cores, f"batch_seeds=[{','.join(map(str, seeds))}]"))
    results = []
    for name, jobs, threads, seed_arg in variants:
        root = ctx.tmp / f"sweep-{len(results)}"
        launcher = [] if jobs == 1 else ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]
        cmd = train_cmd([seed_arg, f"experiment={','.join(rows)}", *common, f"results_root={root}",
                         f"threads={threads}", f"hydra.sweep.dir={root / 'hydra'}", *launcher], multirun=True)
        c = checked(child(cmd), f"(g) sweep {name}")
        if done_runs(root) != len(rows) * len(seeds):
            raise RuntimeError(f"(g) sweep {name} landed {done_runs(root)} of {len(rows) * len(seeds)} runs")
        results.append({"name": name, "runs": done_runs(root), "wall": c["wall"]})
        progress(f"(g) sweep {name} done")
    return {"variants": results, "rows": rows, "seeds": seeds}


def sweep_sizes() -> dict[str, int]:
    """Runs of the article's table, of `make sweep` at full scale and of each named set."""
    return {"article's table": sum(1 for spec in ROWS.values() if spec.published) * len(SEEDS),
            "`make sweep`": len(SWEEP_ROWS) * len(SEEDS),
            **{f"`SET={name}`": len(s.rows) * len(s.seeds) for name, s in SETS.items()}}


def report_sweep(ctx: Context, g: dict) -> list[str]:
    a = ctx.results.get("a")
    total = a["runner_best"]["total"] if a else None
    base = g["variants"][0]["wall"] / g["variants"][0]["runs"]
    sizes = sweep_sizes()
    lines = [f"`make sweep`'s command on {len(g['rows'])} rows x {len(g['seeds'])} seeds, {ctx.args.sweep_steps} steps "
             "with full-size checks, interventions and weight averaging off, the Hydra process and its start "
             "included; jobs in parallel through `hydra/launcher=joblib` (`make sweep JOBS=n`).", "",
             "| jobs x threads | runs | wall | per run | speed-up |"
             + "".join(f" {name}, {n} runs, estimated |" for name, n in sizes.items() if total),
             "|---|---:|---:|---:|---:|" + ("---:|" * len(sizes) if total else "")]
    best = None
    for v in g["variants"]:
        per = v["wall"] / v["runs"]
        est = {name: n * total * per / base for name, n in sizes.items()} if total else {}
        best = est if best is None or (est and est["`make sweep`"] < best["`make sweep`"]) else best
        lines.append(f"| {v['name']} | {v['runs']} | {fmt_s(v['wall'])} | {fmt_s(per)} | {base / per:.2f}x |"
                     + "".join(f" {fmt_s(s)} |" for s in est.values()))
    if total:
        hours = best["`make sweep`"] / HOUR
        lines += ["", f"Estimate: runs x the runner's extrapolated full `{ROW}` run from (a) (one job, all cores) x the "
                  "split's time per run relative to one job at a time; rows without running statistics skip the "
                  "interventions and averaging, and the sets `resnet` and `ten_seeds` run without weight averaging, "
                  f"so these are upper bounds. The full sweep's best estimate: **{hours:.1f} h** against the target "
                  f"of {TARGET_SWEEP_HOURS:.0f} h."]
    return lines


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
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            timeout=10).stdout.strip()
    return {"os": platform.platform(), "cpu": cpu, "memory": mem, "python": platform.python_version(),
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "torch": torch.__version__, "threads": threads, "mkldnn": torch.backends.mkldnn.is_available(),
            "device": f"cuda: {torch.cuda.get_device_name(device)}" if device.type == "cuda" else "cpu",
            "commit": commit}


def machine_lines(args, info: dict, load: dict) -> list[str]:
    busy = load["other_cores"]
    lines = ["# Benchmark: what the measurements cost", ""]
    if busy is None or busy > 0.25 * info["cores"]:
        said = "could not be measured" if busy is None else f"kept {busy:.2f} of {info['cores']} cores busy"
        lines += [f"> **Measured under load: other processes {said} while this ran (load average "
                  f"{load['start'][0]:.2f} at the start, {load['end'][0]:.2f} at the end). Absolute times are "
                  "inflated and noisy; the ratios are measured interleaved and are the figures to read.**", ""]
    return lines + [
        f"`{args.command}` on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, commit `{info['commit']}`, "
        f"{fmt_s(load['wall'])} in all.", "", "| machine | |", "|---|---|",
        f"| CPU | {info['cpu']}, {info['cores']} cores available |",
        f"| memory | {gib(info['memory']) if info['memory'] else 'unknown'} |",
        f"| device | {info['device']} |",
        f"| torch threads | {info['threads']} in (a), (c), (d), (h); (b) and (e) as the commands choose; (g) splits "
        f"{args.cores} cores |",
        f"| versions | torch {info['torch']} (MKLDNN {'on' if info['mkldnn'] else 'off'}), Python {info['python']} |",
        f"| OS | {info['os']} |",
        f"| other load | {'unknown' if busy is None else f'{busy:.2f} cores busy with other processes'}; "
        f"load average {load['start'][0]:.2f} (start), {load['end'][0]:.2f} (end) |", ""]


# ----------------------------------------------------------------------------- the sections
@dataclass(frozen=True)
class Section:
    """One section of the report: ``measure(ctx)`` returns its figures, ``report(ctx, figures)`` its lines."""

    key: str
    title: str
    measure: Callable[[Context], object]
    report: Callable[[Context, object], list[str]]


SECTIONS = (
    Section("a", "Runner against the bare loop, in one process", measure_in_process, report_in_process),
    Section("b", "Runner against the bare loop, as whole processes", measure_processes, report_processes),
    Section("c", "Probes and the monitor", measure_probes, report_probes),
    Section("d", "Options: batched seeds and torch.compile", measure_options, report_options),
    Section("e", "Peak memory", measure_memory, report_memory),
    Section("f", "Analysis targets", measure_analysis, report_analysis),
    Section("g", "Sweep throughput and the full sweep's time", measure_sweep, report_sweep),
    Section("h", "The monitor on timm's resnet18", measure_timm, report_timm),
)


# ----------------------------------------------------------------------------- main
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "results" / "bench.md"), help="report path (default %(default)s)")
    p.add_argument("--steps", type=int, default=300, help="steps measured for (a), >= 100 (default %(default)s)")
    p.add_argument("--rounds", type=int, default=2,
                   help="interleaved runner/bare rounds in (a); pairs of blocks in (h) x 2 (default %(default)s)")
    p.add_argument("--process-steps", type=int, default=600, help="steps per process in (b) (default %(default)s)")
    p.add_argument("--process-pairs", type=int, default=2, help="runner/bare pairs per condition in (b)")
    p.add_argument("--reps", type=int, default=3,
                   help="calls per timing in (c) and (d); calls timed alone in (h) (default %(default)s)")
    p.add_argument("--sweep-steps", type=int, default=100, help="steps per job in (e) and (g) (default %(default)s)")
    p.add_argument("--sweep-rows", default="sgd,adam", help="rows of the sweep in (g) (default %(default)s)")
    p.add_argument("--sweep-seeds", type=int, default=2, help="seeds per row in (g) (default %(default)s)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads in (a), (c), (d), (h); 0: every core available")
    p.add_argument("--cores", type=int, default=0, help="cores split into jobs x threads in (g); 0: every core")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--venv", default=".venv", help="the Makefile's VENV, for the nested `make table`")
    p.add_argument("--results", default="", help="results root timed in (f) (default: results/reference)")
    p.add_argument("--skip", default="", help="sections to leave out, e.g. 'b,e,g'")
    p.add_argument("--only", default="", help="the sections to run, leaving out every other, e.g. 'h'")
    p.add_argument("--bare-only", action="store_true", help=argparse.SUPPRESS)  # the child of (b) and (e)
    p.add_argument("--check-start", type=int, default=100, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    args.threads, args.cores = args.threads or available, args.cores or available
    if min(args.steps, args.sweep_steps, args.process_steps) < 100:
        p.error("--steps, --process-steps and --sweep-steps must be >= 100 (one check)")
    if min(args.rounds, args.reps, args.process_pairs) < 1:
        p.error("--rounds, --process-pairs and --reps must be >= 1")
    keys = [s.key for s in SECTIONS]
    for flag in ("skip", "only"):
        unknown = set(getattr(args, flag).split(",")) - {""} - set(keys)
        if unknown:
            p.error(f"--{flag}: unknown sections {sorted(unknown)}; sections are {', '.join(keys)}")
    if args.skip and args.only:
        p.error("--skip and --only: give one of them")
    if args.only:
        args.skip = ",".join(k for k in keys if k not in args.only.split(","))
    args.command = shlex.join(["python", "bench/bench.py", *(argv if argv is not None else sys.argv[1:])])
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    device = resolve_device(args.device)
    if args.bare_only:
        bare_loop(args.steps, set(range(args.check_start, args.steps + 1, 100)), 4000, device)
        return 0
    torch.set_num_threads(args.threads)
    skip = set(args.skip.split(",")) - {""}
    load = OtherLoad()
    info = machine(device, args.threads)
    progress(f"{info['cpu']}, {info['cores']} cores, {info['device']}, {args.threads} threads; "
             f"load average {load.load0[0]:.2f}")
    body = []
    with tempfile.TemporaryDirectory(prefix="bnrotation-bench-") as tmp_name:
        ctx = Context(args, device, Path(tmp_name))
        for section in SECTIONS:
            if section.key in skip:
                continue
            ctx.results[section.key] = section.measure(ctx)
        for section in SECTIONS:  # reports after every measurement: a section may read a later one's figures
            if section.key in ctx.results:
                body += [f"## ({section.key}) {section.title}", "", *section.report(ctx, ctx.results[section.key]), ""]
    loads = {"start": load.load0, "end": os.getloadavg(), "other_cores": load.cores(), "wall": time.time() - load.t0}
    text = "\n".join(machine_lines(args, info, loads) + body + [
        "## How to read and rerun", "",
        "`make bench` (or `python bench/bench.py --help`): `--steps` and `--rounds` for (a), `--process-steps` and "
        "`--process-pairs` for (b), `--reps` for (c) and (d), `--sweep-steps` for (e) and (g), `--rounds` (pairs) "
        "and `--reps` (calls alone) for (h), `--skip` to leave sections out or `--only` to run some alone. Each figure is one measurement on this machine, not a property of the code: rerun it where "
        "you run the study.", ""])
    records.atomic_write_text(args.out, text)
    progress(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
