"""The data-swap experiment's measurements, per run and per arm (issue 64; no torch).

Reads the runs of :mod:`bnrotation.study.why` (``<root>/why/runs/why_<row>+<arm>/seed=<s>/``) and reduces each to
the scalars its claims (:mod:`..claims.why`) weigh, every one over the late window :data:`LATE` (the map's check
window, steps 2,000 to 3,000, at least 500 steps after the swap) and at the layer :func:`claim_layer` (the last
convolution, as the map reads):

* ``rotation_deg_per_step``: the mean over the window's logged steps of the angular update, the angle between a
  layer's weight before and after one optimizer step (degrees; the ``mechanism`` table's median over the layer's
  output channels);
* ``normalised_step``: the mean of Adam's normalised step |m̂| / (√v̂ + ε), its median over the layer's weights
  (NaN for SGD);
* ``mode_gap``: the mean over the window's checks of training- minus evaluation-mode accuracy on the held-out set
  (a fraction);
* ``margin_eval``: the mean over the window's checks of the held-out set's median output margin in evaluation mode
  (the true class's logit minus the largest other; the ``checks`` table's ``margin_eval_median``);
* ``burst_share``: the share of the window's summed angular update carried by its largest :data:`BURST_TOP` of
  logged steps (a uniform rotation gives :data:`BURST_TOP`);
* ``loss_spike``: the mean over the window's :data:`SPIKE_WINDOW`-step windows of the per-step loss's maximum over
  its median;
* ``normalised_step_early``, ``grad_rms_late`` / ``grad_rms_early``: the normalised step over steps :data:`EARLY`
  (before the swap), and the layer's gradient RMS in the window against those steps;
* ``normalised_step_after_swap`` and ``normalised_step_end``: the normalised step over the first and the last
  400 steps of the window after the swap (:data:`AFTER_SWAP`, :data:`END`), for a step that grows again once the
  second moment has forgotten (Molybog et al. 2023, arXiv 2304.09871);
* ``loss_before_swap`` / ``loss_start``: the median per-step loss over the 100 steps before the swap against the
  first 100 steps (has the loss flattened by the swap?).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .... import records
from ...rows import SEEDS
from ...why import ARMS, MAP_STEPS, REAL_IMAGES, ROOT, SWAP_STEP, arm_of, runs_in_sweep
from ..results import SCALE_KEYS, BadRunError, Layout, Run, find_run_dirs, load_run
from ..stats import SeedStat

__all__ = ["WHY", "LATE", "EARLY", "AFTER_SWAP", "END", "BURST_TOP", "SPIKE_WINDOW", "METRICS", "load_why_runs",
           "claim_layer", "per_run", "per_arm"]

LATE = (MAP_STEPS - 1000, MAP_STEPS)  # the late window, inclusive: the map's check window
EARLY = (500, 1000)  # before the swap, after the first fast descent
AFTER_SWAP = (SWAP_STEP + 100, SWAP_STEP + 500)  # just after the swap, once β1's memory has passed
END = (MAP_STEPS - 400, MAP_STEPS)
BURST_TOP = 0.1  # the largest tenth of the logged steps
SPIKE_WINDOW = 100  # steps
METRICS = ("rotation_deg_per_step", "normalised_step", "normalised_step_early", "mode_gap", "margin_eval",
           "burst_share", "loss_spike", "grad_rms_late", "grad_rms_early", "normalised_step_after_swap",
           "normalised_step_end", "loss_before_swap", "loss_start")


def _contradicts_arm(info: dict) -> list[str]:
    """What a run's ``run.json`` says against its arm: a finite training set where the arm has fresh samples
    throughout, or none where it has one."""
    try:
        _, arm = arm_of(info["row"])
    except ValueError as err:
        return [str(err)]
    finite = (info.get("task") or {}).get("train_size")
    if (arm == "fresh") != (finite is None):
        return [f"task.train_size read back as {finite!r}, the arm {arm!r} "
                f"{'has fresh samples throughout' if arm == 'fresh' else 'has a finite set'}"]
    return []


WHY = Layout(records.TABLE_COLUMNS, records.REQUIRED_TABLES, SCALE_KEYS, _contradicts_arm)


def load_why_runs(root: str | Path) -> tuple[list[Run], list[str]]:
    """The finished data-swap runs under ``root`` (the experiment's folder, ``<results>/why``) and one line per
    folder refused: without ``DONE``, contradicting its arm, or without the optimizer-state log."""
    if not (Path(root) / "runs").is_dir():
        return [], [f"{root}: no runs/ folder"]
    runs, problems = [], []
    for path in find_run_dirs(root):
        try:
            run = load_run(path, ("checks", "mechanism", "losses"), WHY)
            if "mechanism" not in run.tables or "losses" not in run.tables:
                raise BadRunError(f"{path}: no mechanism or losses table (run with scale.mechanism_every > 0)")
            runs.append(run)
        except BadRunError as err:
            problems.append(str(err))
    return runs, problems


def claim_layer(mechanism: pd.DataFrame) -> str:
    """The layer the claims read: the last weight layer in the log's order (the last convolution, ``conv3``)."""
    return str(mechanism["layer"].drop_duplicates().iloc[-1])


def _between(df: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    return df[(df["step"] >= window[0]) & (df["step"] <= window[1])]


def burst_share(angles: np.ndarray, top: float = BURST_TOP) -> float:
    """The share of ``angles``' sum (one angular update per logged step, degrees) carried by its largest ``top``
    fraction of values (at least one); NaN for no values or a zero sum."""
    a = np.sort(np.asarray(angles, float))[::-1]
    total = a.sum()
    if not len(a) or total <= 0:
        return math.nan
    return float(a[:max(1, math.ceil(top * len(a)))].sum() / total)


def loss_spike(losses: pd.DataFrame, window: tuple[int, int], length: int = SPIKE_WINDOW) -> float:
    """The mean over ``window``'s consecutive whole ``length``-step windows (a shorter rest left out) of the
    per-step loss's maximum over its median (1 for a constant loss); NaN where no window has a positive median."""
    w = _between(losses, window)
    ratios = []
    for _, part in w.groupby((w["step"] - window[0]) // length):
        med = part["loss"].median()
        if med > 0 and len(part) == length:
            ratios.append(part["loss"].max() / med)
    return float(np.mean(ratios)) if ratios else math.nan


def per_run(run: Run) -> dict:
    """One run's scalars (the module docstring defines each), with its ``optimizer``, ``arm`` and ``seed``."""
    optimizer, arm = arm_of(run.row)
    mech, checks, losses = run.tables["mechanism"], run.tables["checks"], run.tables["losses"]
    layer = mech[mech["layer"] == claim_layer(mech)]
    late = _between(layer, LATE)
    gap = _between(checks, LATE)
    out = {"optimizer": optimizer, "arm": arm, "seed": run.seed, "layer": claim_layer(mech),
           "rotation_deg_per_step": late["angular_update_deg"].mean(),
           "normalised_step": late["normalised_step_median"].mean(),
           "normalised_step_early": _between(layer, EARLY)["normalised_step_median"].mean(),
           "mode_gap": (gap["acc_train_mode"] - gap["acc_eval_mode"]).mean(),
           "margin_eval": gap["margin_eval_median"].mean() if "margin_eval_median" in gap else math.nan,
           "burst_share": burst_share(late["angular_update_deg"].to_numpy()),
           "loss_spike": loss_spike(losses, LATE),
           "grad_rms_late": late["grad_rms"].mean(), "grad_rms_early": _between(layer, EARLY)["grad_rms"].mean(),
           "normalised_step_after_swap": _between(layer, AFTER_SWAP)["normalised_step_median"].mean(),
           "normalised_step_end": _between(layer, END)["normalised_step_median"].mean(),
           "loss_before_swap": _between(losses, (SWAP_STEP - 99, SWAP_STEP))["loss"].median(),
           "loss_start": _between(losses, (1, 100))["loss"].median()}
    return {k: (float(v) if isinstance(v, (np.floating, float)) else v) for k, v in out.items()}


@dataclass(frozen=True)
class ArmStats:
    """One arm of one optimizer over its seeds: each metric of :data:`METRICS` as a :class:`..stats.SeedStat`,
    and the seeds it has (``seeds``) against the sweep's (:data:`...rows.SEEDS`)."""

    optimizer: str
    arm: str
    metrics: dict
    seeds: tuple[int, ...]

    @property
    def complete(self) -> bool:
        """Every seed of the sweep is in (a seed outside the sweep does not count)."""
        return set(SEEDS) <= set(self.seeds)

    def __getitem__(self, metric: str) -> SeedStat:
        return self.metrics[metric]


def per_arm(rows: list[dict]) -> dict[tuple[str, str], ArmStats]:
    """``{(optimizer, arm): ArmStats}`` over :func:`per_run`'s rows, only the sweep's seeds counted."""
    df = pd.DataFrame(rows)
    out = {}
    if df.empty:
        return out
    df = df[df["seed"].isin(SEEDS)]
    for (opt, arm), g in df.groupby(["optimizer", "arm"], sort=False):
        g = g.sort_values("seed")
        out[(opt, arm)] = ArmStats(opt, arm, {m: SeedStat.of(g[m], g["seed"]) for m in METRICS},
                                   tuple(int(s) for s in g["seed"]))
    return out


ARMS_METRICS = ("rotation_deg_per_step", "normalised_step", "mode_gap", "margin_eval", "burst_share", "loss_spike")


def arms_table(stats: dict[tuple[str, str], ArmStats]) -> pd.DataFrame:
    """The table of arms: one row per arm and optimizer in :data:`...why.ARMS`' order, its seeds (n), and the
    mean and sd over seeds (``<metric>_sd``) of the rotation, the normalised step, the mode gap, the margin in
    evaluation mode, the burst share and the loss spike; unrounded."""
    lines = []
    for arm in (*ARMS, REAL_IMAGES):
        for opt in (o.removeprefix("fmnist_") for o in arm.optimizers):
            s = stats.get((opt, arm.name))
            line = {"optimizer": opt, "arm": arm.name, "data": arm.words, "n": 0 if s is None else len(s.seeds)}
            for m in ARMS_METRICS:
                st = None if s is None else s[m]
                line[m] = math.nan if st is None else st.mean
                line[f"{m}_sd"] = math.nan if st is None else st.sd
            lines.append(line)
    return pd.DataFrame(lines)


def load(ev_root: str | Path) -> tuple[dict[tuple[str, str], ArmStats], list[str], Path]:
    """The arms under ``<ev_root>/why/``, the folders refused, and that folder."""
    root = Path(ev_root) / ROOT
    runs, problems = load_why_runs(root)
    return per_arm([per_run(r) for r in runs]), problems, root


FOUR_ARMS = ("fresh", "finite", "fresh_to_finite", "finite_to_fresh")  # the figure's arms
SMOOTH = 100  # steps: the figure's curves are means over this many steps of logs


def curves(runs: list[Run]) -> pd.DataFrame:
    """Per run and logged step, at the claims' layer: ``optimizer``, ``arm``, ``seed``, ``step``, the angular update
    (degrees per step) and Adam's normalised step, each the mean over the logs of the last :data:`SMOOTH` steps."""
    frames = []
    for r in runs:
        optimizer, arm = arm_of(r.row)
        mech = r.tables["mechanism"]
        layer = mech[mech["layer"] == claim_layer(mech)].sort_values("step")
        window = max(1, SMOOTH // max(1, int(layer["step"].diff().median() or 1)))
        frames.append(pd.DataFrame({
            "optimizer": optimizer, "arm": arm, "seed": r.seed, "step": layer["step"].to_numpy(),
            "angular_update_deg": layer["angular_update_deg"].rolling(window, min_periods=1).mean().to_numpy(),
            "normalised_step": layer["normalised_step_median"].rolling(window, min_periods=1).mean().to_numpy()}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["optimizer", "arm", "seed", "step", "angular_update_deg", "normalised_step"])


def figure(frame: pd.DataFrame, path: Path) -> Path:
    """Two panels against the step: the rotation rate (Adam solid, SGD dashed) and Adam's normalised step, for
    :data:`FOUR_ARMS`, means over seeds, the swap marked; written to ``path`` (PNG) and beside it as PDF."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .figures import save  # matplotlib's and seaborn's import only where a figure is drawn

    fig, axes = plt.subplots(2, 1, figsize=(7.5, 6.0), sharex=True, constrained_layout=True)
    colours = dict(zip(FOUR_ARMS, ("tab:red", "tab:blue", "tab:purple", "tab:orange")))
    for (optimizer, arm), g in frame[frame["arm"].isin(FOUR_ARMS)].groupby(["optimizer", "arm"]):
        mean = g.groupby("step")[["angular_update_deg", "normalised_step"]].mean()
        n = g["seed"].nunique()
        style = "-" if optimizer == "adam" else "--"
        axes[0].plot(mean.index, mean["angular_update_deg"], style, color=colours[arm], lw=1.2,
                     label=f"{optimizer.upper() if optimizer == 'sgd' else 'Adam'}, {arm} (n = {n})")
        if optimizer == "adam":
            axes[1].plot(mean.index, mean["normalised_step"], color=colours[arm], lw=1.2, label=f"{arm} (n = {n})")
    for ax in axes:
        ax.axvline(SWAP_STEP, color="grey", lw=0.8, ls=":")
        ax.set_yscale("log")
    axes[0].text(SWAP_STEP, 1.0, " swap", transform=axes[0].get_xaxis_transform(), va="top", fontsize=8)
    axes[0].set_ylabel("angular update\n(degrees per step)")
    axes[1].set_ylabel("Adam's normalised step\n|m̂| / (√v̂ + ε), median")
    axes[1].set_xlabel("step")
    axes[0].legend(fontsize=7, ncol=2)
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle("The last convolution's rotation and Adam's step, fresh against finite data", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.set_dpi(150)
    save(fig, path.parent, path.stem)  # without time stamps: the same runs give the same bytes
    plt.close(fig)
    return path


def markdown_table(df: pd.DataFrame, digits: int = 3) -> str:
    """``df`` as a Markdown table, numbers at ``digits`` significant digits (rounded here, once)."""
    def fmt(v):
        return "–" if isinstance(v, float) and math.isnan(v) else f"{v:.{digits}g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def cost_table(runs: list[Run]) -> pd.DataFrame:
    """What a run costs, from each ``run.json`` of a run that ran start to end in one process: its wall seconds,
    and the seconds and share of the wall time of the optimizer-state log (``timings_s['mechanism']``) and of the
    checks (where the margins are measured), per optimizer; median and range over the runs."""
    lines = []
    for r in runs:
        t = r.info.get("timings_s") or {}
        wall = r.info.get("wall_seconds")
        if r.info.get("resumes") or not isinstance(wall, (int, float)):
            continue
        lines.append({"optimizer": arm_of(r.row)[0], "wall_s": float(wall),
                      "log_s": float(t.get("mechanism", math.nan)), "checks_s": float(t.get("checks", math.nan))})
    df = pd.DataFrame(lines, columns=["optimizer", "wall_s", "log_s", "checks_s"])
    out = []
    for opt, g in df.groupby("optimizer"):
        out.append({"optimizer": opt, "runs": len(g), "wall (s), median": g["wall_s"].median(),
                    "wall (s), range": f"{g['wall_s'].min():,.0f}–{g['wall_s'].max():,.0f}",
                    "log (s), median": g["log_s"].median(), "log's share": (g["log_s"] / g["wall_s"]).median(),
                    "checks (s), median": g["checks_s"].median()})
    return pd.DataFrame(out)
