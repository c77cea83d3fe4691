"""The frozen-backbone runs, read back (no torch): per-run figures, the claim's test, the docs' table.

The runs are :mod:`bnrotation.study.frozen`'s, under ``<reference root>/frozen/runs/<row>/seed=<s>/``
(:data:`bnrotation.study.rows.FROZEN_ROOT`), rows :data:`bnrotation.study.rows.FROZEN_ROWS`. A run without ``DONE``, or
whose ``run.json`` says another row, mode or seed than its folder, is refused by name.

    python -m bnrotation.study.analysis.tables.frozen --results results/reference/frozen   # writes <results>/frozen.md
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ....helptext import plain
from .... import records
from ...rows import FROZEN_ROOT, FROZEN_ROWS, FROZEN_SEEDS
from ..formatting import cell
from ..stats import SeedStat

__all__ = ["FrozenRun", "load_frozen_runs", "per_run", "judge", "FrozenVerdict", "table_markdown", "main",
           "DISPLACEMENT_FLOOR_SIGMA", "DROP_FLOOR", "Z"]

TABLES = ("accuracy", "statistics", "monitor")
# The claim's tolerances, fixed before the runs (the claim's text in analysis/registry.py says why):
Z = 2.0  # a mean differs from its reference when it does by more than Z standard errors over seeds
DISPLACEMENT_FLOOR_SIGMA = 0.1  # σ: the monitor's default lag threshold (monitor.Thresholds.lag_sigma)
DROP_FLOOR = 0.01  # "degrades": at least 1 point of evaluation-mode accuracy on the original task


@dataclass
class FrozenRun:
    """One finished frozen-backbone run: its folder, ``run.json`` and tables (``accuracy``, ``statistics``,
    ``monitor``)."""

    path: Path
    row: str
    seed: int
    info: dict
    tables: dict[str, pd.DataFrame]


class BadFrozenRun(ValueError):
    """A frozen-backbone run folder that is unfinished or contradicts its row; the message names it."""


def read_run(path: Path) -> FrozenRun:
    """The run in ``path`` (``.../runs/<row>/seed=<s>``).

    Raises:
        BadFrozenRun: no ``DONE``, a missing table, or a ``run.json`` whose row, mode or seed is not its folder's.
    """
    row, seed_part = path.parent.name, path.name
    if not (path / records.DONE).exists():
        raise BadFrozenRun(f"{path}: no DONE marker (unfinished or killed run); rerun the frozen sweep")
    info = json.loads((path / "run.json").read_text())
    seed = int(seed_part.removeprefix("seed="))
    spec = FROZEN_ROWS.get(row)
    if spec is None or info.get("row") != row or info.get("seed") != seed or info.get("mode") != spec.mode:
        raise BadFrozenRun(f"{path}: run.json says row {info.get('row')!r}, mode {info.get('mode')!r}, seed "
                           f"{info.get('seed')!r}; the folder is row {row!r} (mode "
                           f"{spec.mode if spec else '?'!r}), seed {seed}")
    tables = {}
    for name in TABLES:
        if not (path / f"{name}.parquet").exists():
            raise BadFrozenRun(f"{path}: no {name}.parquet")
        tables[name] = pd.read_parquet(path / f"{name}.parquet")
    return FrozenRun(path, row, seed, info, tables)


def load_frozen_runs(root: str | Path) -> tuple[list[FrozenRun], list[str]]:
    """The finished runs under ``root/runs/`` of the rows :data:`.rows.FROZEN_ROWS`, and one line per folder
    refused (:func:`read_run`)."""
    runs, problems = [], []
    for row in FROZEN_ROWS:
        for path in sorted((Path(root) / "runs" / row).glob("seed=*")):
            try:
                runs.append(read_run(path))
            except BadFrozenRun as err:
                problems.append(str(err))
    return runs, problems


def per_run(runs: list[FrozenRun]) -> pd.DataFrame:
    """One line per run: ``row``, ``seed`` and, at the last log point unless said otherwise,

    * ``displacement_sigma``: the running statistics' displacement from the pre-trained ones, mean over the
      BatchNorm layers of the per-layer mean over channels of (|Δ running mean| + |Δ running σ|) / pre-trained
      σ (:func:`bnrotation.study.frozen.statistics_move`); ``mean_displacement_sigma`` and
      ``std_displacement_sigma`` its two parts;
    * ``max_displacement_sigma``: the largest of any layer at any log point;
    * ``peak_drift_sigma_per_100``: the largest drift of any layer between two log points (σ per 100 steps);
    * ``late_drift_sigma_per_100``: the mean over layers of the drift over the last log interval;
    * ``acc_original_start``, ``acc_original_end``: evaluation-mode accuracy on the original task with the
      pre-trained head at step 0 and at the end; ``acc_original_drop`` the first minus the second;
    * ``acc_original_train_mode``, ``acc_shifted_eval_mode``, ``acc_shifted_train_mode`` (end);
    * ``stale_shifted``, ``stale_original``: the share of log points at which the monitor's rule fired on
      the shifted and on the original probe; ``lag_shifted_sigma``, ``lag_original_sigma``: its largest
      per-layer median |lag| of the running mean at the end (σ); ``gap_shifted``, ``gap_original``: its mode gap
      (training- minus evaluation-mode accuracy on the probe, with the new head) at the end;
    * ``pretrained_acc``: the pre-trained network's evaluation-mode accuracy on the original task.
    """
    lines = []
    for r in runs:
        st, acc, mon = r.tables["statistics"], r.tables["accuracy"], r.tables["monitor"]
        last = int(st["step"].max())
        end = st[st["step"] == last]
        orig, shifted = acc[acc["task"] == "original"].sort_values("step"), acc[acc["task"] == "shifted"]
        shifted_end = shifted[shifted["step"] == last].iloc[0]
        stale = mon.groupby(["probe", "step"])["stale"].first()
        mon_end = mon[mon["step"] == last].groupby("probe")["lag_median_abs_sigma"].max()
        gap_end = mon[mon["step"] == last].groupby("probe")["mode_gap"].first()
        lines.append({
            "row": r.row, "seed": r.seed,
            "displacement_sigma": float(end["displacement_sigma"].mean()),
            "mean_displacement_sigma": float(end["mean_displacement_sigma"].mean()),
            "std_displacement_sigma": float(end["std_displacement_sigma"].mean()),
            "max_displacement_sigma": float(st["displacement_sigma"].max()),
            "peak_drift_sigma_per_100": float(st["drift_sigma_per_100"].max()),
            "late_drift_sigma_per_100": float(end["drift_sigma_per_100"].mean()),
            "acc_original_start": float(orig["acc_eval_mode"].iloc[0]),
            "acc_original_end": float(orig["acc_eval_mode"].iloc[-1]),
            "acc_original_drop": float(orig["acc_eval_mode"].iloc[0] - orig["acc_eval_mode"].iloc[-1]),
            "acc_original_train_mode": float(orig["acc_train_mode"].iloc[-1]),
            "acc_shifted_eval_mode": float(shifted_end["acc_eval_mode"]),
            "acc_shifted_train_mode": float(shifted_end["acc_train_mode"]),
            "stale_shifted": float(stale.get("shifted", pd.Series(dtype=float)).mean()),
            "stale_original": float(stale.get("original", pd.Series(dtype=float)).mean()),
            "lag_shifted_sigma": float(mon_end.get("shifted", math.nan)),
            "lag_original_sigma": float(mon_end.get("original", math.nan)),
            "gap_shifted": float(gap_end.get("shifted", math.nan)),
            "gap_original": float(gap_end.get("original", math.nan)),
            "pretrained_acc": float(r.info.get("pretrained", {}).get("acc_eval_mode", math.nan)),
            "steps": last,
        })
    return pd.DataFrame(lines)


def _stat(frame: pd.DataFrame, row: str, column: str) -> SeedStat:
    g = frame[frame["row"] == row].sort_values("seed")
    return SeedStat.of(g[column], g["seed"])


@dataclass
class FrozenVerdict:
    """The claim's test on the runs (:func:`judge`): ``passed`` (None: too few runs to judge), the measured
    figures and the tolerance, in words."""

    passed: bool | None
    measured: str
    tolerance: str
    note: str = ""


def judge(runs: list[FrozenRun], problems: tuple[str, ...] | list[str] = ()) -> FrozenVerdict:
    """The frozen-backbone claim: freezing a layer does not freeze its BatchNorm, and evaluation on the
    original task degrades when the statistics follow the new data. PASS when all of these hold:

    1. ``norm_eval``: every running statistic stays the pre-trained one exactly (displacement 0 at every log
       point of every run: no forward pass in evaluation mode writes a buffer), and so does its original-task
       accuracy;
    2. ``bn_train``: the mean displacement over seeds minus :data:`Z` standard errors is at least
       :data:`DISPLACEMENT_FLOOR_SIGMA` (the monitor's lag threshold: a move the suite counts as stale);
    3. ``bn_train``: the original task's evaluation-mode accuracy drops from step 0 to the end by at least
       :data:`DROP_FLOOR` and by more than :data:`Z` standard errors over seeds (the drop is paired within a
       run: the same held-out set, the same weights).

    Every run asserted its backbone unchanged at each log point (``run.json``: ``backbone_unchanged``); one that
    did not is a FAIL. Fewer than two seeds of ``bn_train`` or of ``norm_eval``: no verdict (None).
    """
    train, evalm = "frozen_bn_train", "frozen_norm_eval"
    frame = per_run(runs)
    have = {row: sorted(frame.loc[frame["row"] == row, "seed"]) if len(frame) else [] for row in (train, evalm)}
    tolerance = (f"norm_eval: displacement exactly 0σ and original-task accuracy unchanged; bn_train: mean "
                 f"displacement − {Z:g} SE ≥ {cell(DISPLACEMENT_FLOOR_SIGMA, 'sigma')} (the monitor's lag "
                 f"threshold) and original-task drop ≥ {cell(DROP_FLOOR, 'pct', digits=0)} and > {Z:g} SE over seeds")
    note = ("; ".join(problems) + ". ") if problems else ""
    if any(len(s) < 2 for s in have.values()):
        return FrozenVerdict(None, f"runs: {have[train]} seeds of `{train}`, {have[evalm]} of `{evalm}`", tolerance,
                             note + "Fewer than two seeds of a row: no spread, no verdict.")
    disp, drop = _stat(frame, train, "displacement_sigma"), _stat(frame, train, "acc_original_drop")
    still = frame[frame["row"] == evalm]
    eval_max_disp = float(still["max_displacement_sigma"].max())
    eval_drop = float(still["acc_original_drop"].abs().max())
    unchanged = all(r.info.get("backbone_unchanged") is True for r in runs)
    moves = disp.mean - Z * disp.se >= DISPLACEMENT_FLOOR_SIGMA
    degrades = drop.mean >= DROP_FLOOR and drop.mean - Z * drop.se > 0
    stays = eval_max_disp == 0.0 and eval_drop == 0.0
    measured = (f"bn_train: displacement {disp.describe('sigma')}, original-task accuracy drop "
                f"{drop.describe('pct')}; norm_eval: largest displacement {cell(eval_max_disp, 'sigma')}, largest "
                f"accuracy change {cell(eval_drop, 'pct')}; backbone unchanged in every run: {unchanged}")
    failed = [what for what, ok in (("norm_eval statistics moved", stays), ("bn_train statistics did not move "
              "enough", moves), ("original task did not degrade enough", degrades), ("a backbone moved", unchanged))
              if not ok]
    if failed:
        note += "Fails on: " + "; ".join(failed) + "."
    return FrozenVerdict(bool(stays and moves and degrades and unchanged), measured, tolerance, note.strip())


COLUMNS = (("displacement_sigma", "displacement at the end", "sigma"),
           ("mean_displacement_sigma", "… of the running mean", "sigma"),
           ("std_displacement_sigma", "… of the running σ", "sigma"),
           ("peak_drift_sigma_per_100", "peak drift, per 100 steps", "sigma"),
           ("late_drift_sigma_per_100", "drift over the last interval, per 100 steps", "sigma"),
           ("acc_original_start", "original task, eval mode, step 0", "pct"),
           ("acc_original_end", "original task, eval mode, end", "pct"),
           ("acc_original_train_mode", "original task, train mode, end", "pct"),
           ("acc_shifted_eval_mode", "shifted task, eval mode, end", "pct"),
           ("acc_shifted_train_mode", "shifted task, train mode, end", "pct"),
           ("stale_shifted", "monitor STALE on the shifted probe (share of log points)", "pct"),
           ("stale_original", "monitor STALE on the original probe (share of log points)", "pct"),
           ("lag_shifted_sigma", "monitor lag (running mean) on the shifted probe, end", "sigma"),
           ("lag_original_sigma", "monitor lag (running mean) on the original probe, end", "sigma"),
           ("gap_shifted", "monitor mode gap on the shifted probe, end", "pct"),
           ("gap_original", "monitor mode gap on the original probe, end", "pct"))


def table_markdown(runs: list[FrozenRun], root: str | Path) -> str:
    """The frozen-backbone figures as a markdown table: one column per row (BatchNorm mode), one line per
    quantity (:data:`COLUMNS`), mean ± sample standard deviation over seeds with n; then the claim's verdict."""
    frame = per_run(runs)
    rows = [r for r in FROZEN_ROWS if len(frame) and (frame["row"] == r).any()]
    steps = ", ".join(str(s) for s in sorted(int(s) for s in frame["steps"].unique())) if len(frame) else "–"
    out = [f"Frozen-backbone runs under `{root}` ({len(runs)} runs; fine-tuning steps: {steps}). Mean ± sample "
           "standard deviation over seeds (n). Displacement (from the pre-trained statistics) and drift (between log "
           "points, per 100 steps): mean over the BatchNorm layers of the mean over channels of (|Δ running mean| + "
           "|Δ running σ|) / the earlier running σ (`bnrotation.study.frozen.running_drift`).\n",
           "| | " + " | ".join(f"`{r}`" for r in rows) + " |", "|---|" + "---|" * len(rows)]
    for key, title, unit in COLUMNS:
        out.append(f"| {title} | " + " | ".join(
            _stat(frame, r, key).describe(unit).replace(" seeds)", ")") for r in rows) + " |")
    v = judge(runs)
    verdict = {True: "PASS", False: "FAIL", None: "NOT RUN"}[v.passed]
    out += ["", f"Claim `frozen_backbone_batchnorm_follows_new_data`: **{verdict}**. {v.measured}. "
                f"Tolerance: {v.tolerance}." + (f" {v.note}" if v.note else "")]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=f"results/reference/{FROZEN_ROOT}",
                   help="the frozen-backbone results root, holding runs/<row>/seed=<s>/")
    p.add_argument("--out", default=None, help="where to write frozen.md (default: the results root)")
    args = p.parse_args(argv)
    root = Path(args.results)
    if not (root / "runs").is_dir():
        print(f"error: --results {root}: no runs/ folder (expected <root>/runs/<row>/seed=<s>/ of "
              f"{', '.join(FROZEN_ROWS)})", file=sys.stderr)
        return 2
    runs, problems = load_frozen_runs(root)
    for line in problems:
        print(f"refused: {line}", file=sys.stderr)
    if not runs:
        print(f"error: {root}: no finished frozen-backbone run", file=sys.stderr)
        return 2
    text = table_markdown(runs, root)
    out = Path(args.out) if args.out else root
    records.atomic_write_text(out / "frozen.md", text)
    print(text)
    missing = [(r, s) for r in FROZEN_ROWS for s in FROZEN_SEEDS if not any(x.row == r and x.seed == s for x in runs)]
    print(f"wrote {out / 'frozen.md'} from {len(runs)} runs; missing: {missing or 'none'}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
