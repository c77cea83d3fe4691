"""The staleness zoo's table and figure: per architecture and optimizer, what the runs of ``make zoo`` (or of the
second zoo, ``make zoo2``) measured.

Reads the finished runs under ``<root>/runs/<arch>-<optimizer>/seed=<s>/`` (:mod:`bnrotation.study.zoo`'s layout,
read as :func:`.calibration.load_calibration_runs` reads it) and writes ``<root>/zoo.md`` and ``<root>/zoo.png``
(and ``.pdf``)::

    python -m bnrotation.study.analysis.tables.zoo_report --results results/reference/zoo

Per run, from its checks (``checks.parquet``: step 0, every ``check_every`` steps and the last) and its per-layer
records (``layers.parquet``):

* the final evaluation-mode accuracy on the held-out images and the final held-out mode gap (training- minus
  evaluation-mode accuracy, the same images);
* the worst E: the largest, over the checks past the monitor's warm-up, of the worst layer's median E
  (:mod:`bnrotation.staleness`, in units of the running σ);
* the accuracy re-estimation recovers (re-estimated minus stored, held-out), at the last check and at its
  largest over the checks;
* the truth's stale checks (re-estimation recovers at least the run's ``stale_recovery``) and the rule's warnings
  at them (recall) and elsewhere (false alarms), from each check's ``stale`` and ``rule_stale``, with checks inside
  the monitor's warm-up left out of the rule's columns.

A row of the table is the mean ± sample standard deviation over seeds (n); the counts are summed over seeds. An
architecture without BatchNorm (the GroupNorm control) has no running statistics: the monitor refuses it, and its
row says so (the refusal run.json records).

Runs made with ``evaluation_path=true`` (their ``layers`` table holds ``eval_path_error_median_sigma``) add a second
table and figure, ``zoo_eval_path.png``: a layer's own lag, or lag carried through depth (:func:`depth_split`). Per
check past the warm-up, each layer's median E against its training-path statistics (its own lag) and along the
evaluation path (the lag it meets: its own and what the layers above it carry); a layer is over when its median E
is at least the rule's E threshold (:class:`bnrotation.staleness.Thresholds`), and carried when it is over along the
evaluation path but not on its own. Exit status 2 with one line when the root has no ``runs/`` folder or
no finished zoo run; 1 when a folder was refused (named on stderr); else 0.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from .... import records
from ....helptext import plain
from ....staleness import Thresholds
from ...constants import SECOND_ZOO
from ..formatting import cell
from ..results import Run, say_refused
from ..stats import SeedStat
from .calibration import diverged_runs, finished_runs, load_calibration_runs

__all__ = ["COLUMNS", "load_zoo_runs", "per_run", "table_markdown", "depth_split", "depth_markdown", "depth_figure",
           "report_text", "main"]

# (per-run column, title, unit): the table's mean ± sd columns, in order
COLUMNS = (("acc_eval_mode", "eval-mode acc., final", "pct"),
           ("gap", "mode gap, final", "pct"),
           ("worst_e", "worst median E", "sigma"),
           ("recovered", "recovered by re-est., final", "pct"),
           ("recovered_max", "recovered, largest", "pct"))


def load_zoo_runs(root: str | Path) -> tuple[list[Run], list[str]]:
    """The finished, non-diverged zoo runs under ``root`` (their ``run.json`` names an ``arch``), and one line per
    folder refused."""
    return load_calibration_runs([root], lambda r: "arch" in r.info)


def per_run(runs: list[Run]) -> pd.DataFrame:
    """One line per run: ``arch``, ``optimizer``, ``seed``, ``refused`` (the monitor's refusal, or None), the
    :data:`COLUMNS` (fractions 0..1 and σ; NaN where the run has no BatchNorm), and the counts ``checks``,
    ``stale``, ``warned_stale`` (the rule at a stale check), ``fresh`` and ``warned_fresh``, over the checks past the
    monitor's warm-up; ``cpu_s``, the run's CPU seconds (``run.json``'s ``timings_s.cpu``: this process's, one
    thread; NaN where it is not recorded)."""
    lines = []
    for r in runs:
        checks = r.tables["checks"].sort_values("step")
        last = checks.iloc[-1]
        judged = checks[~checks["warming_up"].astype(bool)] if "warming_up" in checks else checks
        layers = r.tables.get("layers", pd.DataFrame())
        layers = layers[layers["step"].isin(judged["step"])] if len(layers) else layers
        worst = (layers.groupby("step")["eval_error_median_sigma"].max().max()
                 if len(layers) and "eval_error_median_sigma" in layers else math.nan)
        stale, warned = judged["stale"].astype(bool), judged["rule_stale"].fillna(False).astype(bool)
        lines.append({
            "arch": r.info["arch"], "optimizer": r.info["optimizer_name"], "seed": r.seed,
            "refused": r.info.get("monitor", {}).get("refused"),
            "acc_eval_mode": float(last["acc_eval_mode"]),
            "gap": float(last["acc_train_mode"] - last["acc_eval_mode"]),
            "worst_e": float(worst),
            "recovered": float(last["recovered"]),
            "recovered_max": float(checks["recovered"].max()),
            "checks": len(judged), "stale": int(stale.sum()), "warned_stale": int((stale & warned).sum()),
            "fresh": int((~stale).sum()), "warned_fresh": int((~stale & warned).sum()),
            "cpu_s": float(r.info.get("timings_s", {}).get("cpu", math.nan))})
    return pd.DataFrame(lines)


def _count(k: int, n: int) -> str:
    return f"{k}/{n}" if n else "–"


def zoo_name(runs: list[Run]) -> tuple[str, str]:
    """The zoo's name and the command that runs it: the second zoo's (``make zoo2``) when every run is of one of
    :data:`bnrotation.study.constants.SECOND_ZOO`'s architectures, else the first's (``make zoo``)."""
    if runs and all(r.info["arch"] in SECOND_ZOO.archs for r in runs):
        return "The second staleness zoo", "make zoo2"
    return "The staleness zoo", "make zoo"


def table_markdown(runs: list[Run], root: str | Path) -> str:
    """The zoo as a markdown table: one line per architecture and optimizer, in the order the runs sort."""
    frame = per_run(runs)
    name, command = zoo_name(runs)
    truth = " or ".join(cell(x, "pct", digits=0).replace("%", " points")
                        for x in sorted({r.info["stale_recovery"] for r in runs}))  # each run's own X
    out = [f"{name}: {len(runs)} finished runs under `{root}` (`{command}`; `bnrotation.study.zoo`). "
           "Held-out accuracies at the last check; mode gap: training- minus evaluation-mode accuracy on the same "
           "held-out images; worst median E: the largest over the checks past the warm-up of the worst layer's "
           "median E, in running σ; recovered: re-estimated minus stored evaluation-mode accuracy. Mean ± sample "
           f"standard deviation over seeds (n). Stale: checks where re-estimation recovers at least {truth} (the "
           "truth); the rule's warnings at stale checks (recall) and at fresh ones (false alarms), checks in the "
           "monitor's warm-up left out, summed over seeds. CPU s: what a run costs, its process's CPU seconds on one "
           "thread (run.json), mean over seeds.\n",
           "| architecture | optimizer | seeds | " + " | ".join(t for _, t, _ in COLUMNS)
           + " | stale checks | rule at stale | rule at fresh | CPU s |",
           "|---|---|---:|" + "---:|" * (len(COLUMNS) + 4)]
    for (arch, opt), g in frame.groupby(["arch", "optimizer"], sort=True):
        refused = g["refused"].dropna()
        stats = [(SeedStat.of(g[k]), unit) for k, _, unit in COLUMNS]
        cells = [cell(stat.mean, unit, stat.sd, spread_sign=False) for stat, unit in stats]
        if len(refused):
            cells[1:] = ["–"] * (len(COLUMNS) - 1)
            counts = ["the monitor refuses it: no running statistics", "–", "–"]
        else:
            counts = [_count(int(g["stale"].sum()), int(g["checks"].sum())),
                      _count(int(g["warned_stale"].sum()), int(g["stale"].sum())),
                      _count(int(g["warned_fresh"].sum()), int(g["fresh"].sum()))]
        cost = cell(float(g["cpu_s"].mean()), "plain", digits=0)
        out.append(f"| `{arch}` | {opt} | {len(g)} | " + " | ".join(cells + counts + [cost]) + " |")
    return "\n".join(out) + "\n"


def depth_split(runs: list[Run], threshold: float | None = None) -> pd.DataFrame:
    """One line per check past the warm-up of each run whose ``layers`` table holds the evaluation path: ``arch``,
    ``optimizer``, ``seed``, ``step``, the truth's ``stale`` and ``recovered``, ``layers`` (its BatchNorm layers),
    ``own`` and ``met`` (the worst layer's median E, in running σ, against the training-path statistics and along
    the evaluation path), ``over_own`` and ``over_met`` (layers whose median E is at least ``threshold``, by default
    the rule's, on each path), and ``carried`` (layers over along the evaluation path and not on their own).
    Empty without such runs."""
    t = Thresholds().eval_error_sigma if threshold is None else threshold
    lines = []
    for r in runs:
        layers = r.tables.get("layers", pd.DataFrame())
        if "eval_path_error_median_sigma" not in layers:
            continue
        checks = r.tables["checks"]
        judged = checks[~checks["warming_up"].astype(bool)] if "warming_up" in checks else checks
        for _, c in judged.sort_values("step").iterrows():
            at = layers[layers["step"] == c["step"]]
            own, met = at["eval_error_median_sigma"], at["eval_path_error_median_sigma"]
            lines.append({"arch": r.info["arch"], "optimizer": r.info["optimizer_name"], "seed": r.seed,
                          "step": int(c["step"]), "stale": bool(c["stale"]), "recovered": float(c["recovered"]),
                          "layers": len(at), "own": float(own.max()), "met": float(met.max()),
                          "over_own": int((own >= t).sum()), "over_met": int((met >= t).sum()),
                          "carried": int(((met >= t) & (own < t)).sum())})
    return pd.DataFrame(lines)


def _runs(n: int) -> str:
    return f"{n} run{'s' * (n != 1)}"


def depth_markdown(runs: list[Run]) -> str:
    """:func:`depth_split` as a markdown table: per architecture, optimizer and truth (stale or fresh checks), the
    mean over its checks of the worst median E on each path and of the share of layers over the threshold; ``""``
    without runs that measured the evaluation path."""
    frame = depth_split(runs)
    if frame.empty:
        return ""
    t = Thresholds().eval_error_sigma
    out = ["## A layer's own lag, or lag carried through depth\n",
           f"The runs made with `evaluation_path=true` ({_runs(frame.groupby(['arch', 'optimizer', 'seed']).ngroups)}). "
           "Per check past the warm-up, each BatchNorm layer's median E against its training-path statistics (own) "
           "and along the evaluation path, with every layer above it normalising with its running statistics (met; "
           f"Huang et al., CVPR 2022). Over: at least the rule's E threshold, {cell(t, 'sigma')}; carried: over "
           "along the evaluation path but not on its own. Means over the checks of each truth, seeds pooled.\n",
           "| architecture | optimizer | truth | checks | worst median E, own | worst median E, met | layers over, own "
           "| layers over, met | layers carried |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for (arch, opt, stale), g in frame.groupby(["arch", "optimizer", "stale"], sort=True):
        share = lambda k: cell(float((g[k] / g["layers"]).mean()), "pct", digits=0)
        out.append(f"| `{arch}` | {opt} | {'stale' if stale else 'fresh'} | {len(g)} | {cell(g['own'].mean(), 'sigma')} "
                   f"| {cell(g['met'].mean(), 'sigma')} | {share('over_own')} | {share('over_met')} | "
                   f"{share('carried')} |")
    return "\n".join(out) + "\n"


def depth_figure(runs: list[Run], path: Path) -> Path | None:
    """``path`` (``.png`` and ``.pdf``): for each architecture and optimizer that measured the evaluation path, at
    the check where re-estimation recovered the most (over its seeds), each layer's median E on both paths in the
    order the monitor lists the layers (the order of the forward pass), the rule's E threshold dotted. None
    without such runs."""
    frame = depth_split(runs)
    if frame.empty:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from .figures import apply_style, save

    by_run = {(r.info["arch"], r.info["optimizer_name"], r.seed): r for r in runs}
    groups = list(frame.groupby(["arch", "optimizer"], sort=True))
    apply_style()
    fig, axes = plt.subplots(len(groups), 1, figsize=(7.2, 2.2 * len(groups)), constrained_layout=True,
                             squeeze=False)
    for ax, ((arch, opt), g) in zip(axes[:, 0], groups):
        worst = g.loc[g["recovered"].idxmax()]
        layers = by_run[(arch, opt, worst["seed"])].tables["layers"]
        at = layers[layers["step"] == worst["step"]].reset_index(drop=True)
        ax.plot(at.index, at["eval_error_median_sigma"], marker=".", lw=1, label="own (training path)")
        ax.plot(at.index, at["eval_path_error_median_sigma"], marker=".", lw=1, label="met (evaluation path)")
        ax.axhline(Thresholds().eval_error_sigma, ls=":", lw=0.8, color="grey")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        own_worst = at.loc[at["eval_error_median_sigma"].idxmax(), "norm_layer"]
        ax.set_title(f"{arch}, {opt}, seed {worst['seed']}, step {worst['step']}: re-estimation recovers "
                     f"{100 * worst['recovered']:.0f} points; the worst own E at {own_worst}", fontsize=8)
        ax.set_ylabel("median E (running σ)", fontsize=7)
        ax.legend(fontsize=6, loc="upper left")
    axes[-1, 0].set_xlabel("BatchNorm layer, in forward order")
    save(fig, path.parent, path.stem)
    plt.close(fig)
    return path


def report_text(runs: list[Run], root: str | Path) -> str:
    """``zoo.md``: :func:`table_markdown` and its figure, and :func:`depth_markdown` and its figure where runs
    measured the evaluation path."""
    text = table_markdown(runs, root)
    left = diverged_runs(finished_runs([root])[0])
    if left:
        text += f"\nDiverged (a non-finite loss), left out of the table: {', '.join(left)}.\n"
    text += f"\n![{zoo_name(runs)[0]}](zoo.png)\n"
    depth = depth_markdown(runs)
    return text + ("\n" + depth + "\n![Own and met E by depth](zoo_eval_path.png)\n" if depth else "")


def figure(runs: list[Run], path: Path) -> Path:
    """``path`` (``.png``, and its ``.pdf`` twin: :func:`.figures.save`): per run with BatchNorm, the worst median E
    against the largest accuracy re-estimation recovers, a colour per architecture and a marker per optimizer, the
    truth's 5-point line dashed and the rule's E threshold dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ...constants import STALE_RECOVERY  # the zoo's default X, read where the zoo reads it (no torch)
    from .figures import apply_style, save

    frame = per_run(runs)
    frame = frame[frame["refused"].isna()]
    apply_style()
    fig, ax = plt.subplots(figsize=(7.2, 4.4), constrained_layout=True)
    colours = dict(zip(sorted(frame["arch"].unique()), plt.get_cmap("tab10").colors))
    markers = {"sgd": "o", "adam": "^"}
    for (arch, opt), part in frame.groupby(["arch", "optimizer"], sort=True):
        ax.scatter(part["worst_e"], 100 * part["recovered_max"], marker=markers.get(opt, "s"),
                   color=colours[arch], alpha=0.85, label=f"{arch}, {opt}")
    ax.axhline(100 * STALE_RECOVERY, ls="--", lw=0.8, color="grey")
    ax.axvline(Thresholds().eval_error_sigma, ls=":", lw=0.8, color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("worst layer's median E, largest over the checks (running σ)")
    ax.set_ylabel("accuracy re-estimation recovers, largest (points)")
    ax.set_title(f"{zoo_name(runs)[0]}: one point per run")
    ax.legend(fontsize=6, ncol=2, loc="upper left", title="architecture, optimizer (o SGD, ^ Adam)",
              title_fontsize=7)
    save(fig, path.parent, path.stem)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """Write ``<results>/zoo.md`` and ``zoo.png`` (or under ``--out``) and print the table; exit status as the module
    docstring says."""
    p = argparse.ArgumentParser(description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default="results/zoo",
                   help="the zoo's results root, holding runs/<arch>-<opt>/seed=<s>/")
    p.add_argument("--out", default=None, help="where to write zoo.md and zoo.png (default: the results root)")
    args = p.parse_args(argv)
    root = Path(args.results)
    if not (root / "runs").is_dir():
        print(f"error: --results {root}: no runs/ folder (expected <root>/runs/<arch>-<optimizer>/seed=<s>/)",
              file=sys.stderr)
        return 2
    runs, problems = load_zoo_runs(root)
    if say_refused(problems, runs, f"--results {root}: no finished zoo run"):
        return 2
    out = Path(args.out) if args.out else root
    text = report_text(runs, root)
    records.atomic_write_text(out / "zoo.md", text)
    figure(runs, out / "zoo.png")
    depth_figure(runs, out / "zoo_eval_path.png")
    print(text)
    print(f"wrote {out / 'zoo.md'} and {out / 'zoo.png'} from {len(runs)} runs", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
