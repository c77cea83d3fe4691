"""``make table``: the article's table, rebuilt from the parquet results (no torch).

    python -m bnrotation.study.analysis.tables.table --results results/reference

Writes ``<out>/table.md`` and ``<out>/table.csv`` (``<out>``: ``--out``, else the
results root read, :func:`..results.output_folder`): per row the mean over
seeds, the seed spread (sample standard deviation, n - 1), the number of seeds
it rests on, the published figure beside each measured one, and how many runs
diverged. Also ``<out>/lag.md``, measured against predicted lag (:mod:`..measures.lag`).
A diverged run (non-finite loss, ``status: diverged``) stopped early, so its
partial measurements are not comparable: it is counted in the ``diverged``
column and left out of every mean and spread, never averaged in. Both files
carry the results' schema version (``schema_version``).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ....helptext import plain
from .... import records
from ...article import FAIL_BELOW
from ...rows import ROWS, SETS, SWEEPS, TASKS, expected_seeds, network_label, row_order
from ..formatting import cell, schema_versions, seed_ranges
from ..measures import metrics
from ..results import ALL_TABLES, Run, add_results_arguments, command_inputs, count, once_per_run, scale_note
from ..stats import over_seeds
from . import lag_report, monitor_report
from .averaging_report import write_averaging


@dataclass(frozen=True)
class Column:
    """One column of the table: the per-run value ``key`` (:func:`run_metrics`), its header, the attribute of
    :class:`bnrotation.study.rows.Published` that holds the article's figure (None: not in the article), and how a
    cell prints (:func:`..formatting.cell`: ``unit``, decimals of the mean and of the spread)."""

    key: str
    header: str
    published: str | None
    unit: str
    digits: int
    spread_digits: int


COLUMNS = (
    Column("rotation_per_100_deg", "Rotation per 100 steps", "rotation_deg_per_100", "deg", 2, 2),
    Column("norm_growth", "Norm growth", "norm_growth", "x", 2, 2),
    Column("acc_eval_mode", "Evaluation-mode accuracy", "acc_eval_mode", "pct", 1, 1),
    Column("checks_below_90", f"Checks below {cell(FAIL_BELOW, 'pct', digits=0)}", "checks_below_90", "pct", 0, 1),
    Column("checks_gap_over_10", f"Checks with a mode gap over {metrics.MODE_GAP_OVER * 100:g} points", None, "pct",
           0, 1),
    Column("acc_train_mode", "Training-mode accuracy", None, "pct", 1, 1),
    Column("acc_reestimated_final", "Eval. accuracy after re-estimation, final step", None, "pct", 1, 1),
)


def run_wall_seconds(info: dict) -> float | None:
    """A finished run's wall time in seconds, over every process that worked on it: ``run.json``'s
    ``wall_seconds``, which sums the processes of a resumed run, or the sum of its ``timings_s`` parts where
    that is larger (runs resumed by versions whose ``wall_seconds`` held the last process only)."""
    wall = info.get("wall_seconds")
    parts = sum((info.get("timings_s") or {}).values())
    return None if wall is None else max(float(wall), float(parts))


def lowest_check(run: Run) -> tuple[float, int]:
    """Column "Lowest check": (the lowest evaluation-mode accuracy of ``run``'s checks in its check window, in
    [0, 1]; the step of that check, the first such step on a tie); ``(nan, -1)`` for a run without checks."""
    checks = metrics.in_window(run, run.tables["checks"])
    if checks.empty:
        return math.nan, -1
    at = checks["acc_eval_mode"].idxmin()
    return float(checks.at[at, "acc_eval_mode"]), int(checks.at[at, "step"])


def lowest_cell(line: pd.Series) -> str:
    """The table's Lowest check cell of one line of :func:`build_table`: ``'9.0% (seed 2, step 5,600)'``, the
    seed left out where the row has one run, ``'–'`` where it has no check."""
    if math.isnan(line["lowest_check"]):
        return "–"
    seed = f"seed {line['lowest_check_seed']}, " if line["n_seeds"] > 1 else ""
    return f"{cell(line['lowest_check'], 'pct', digits=1)} ({seed}step {int(line['lowest_check_step']):,})"


@once_per_run
def run_metrics(run: Run) -> dict:
    """One run's value for every column. Kept per run (:func:`..results.once_per_run`): the table, the claims'
    evidence and the figures share the dict, so a caller that adds to it copies it first."""
    below, n_checks = metrics.checks_below(run)
    gap_over, _ = metrics.checks_gap_over(run)
    return {
        "row": run.row, "seed": run.seed, "diverged": run.diverged, "arch": run.arch,
        "network": network_label(run.arch), "task": TASKS.get(run.task, run.task), "last_conv": metrics.last_conv(run),
        "rotation_per_100_deg": metrics.rotation_per_100_deg(run),
        "norm_growth": metrics.norm_growth(run),
        "acc_eval_mode": metrics.acc_eval_mode(run),
        "acc_train_mode": metrics.acc_train_mode(run),
        "checks_below": below, "n_checks": n_checks, "checks_gap_over": gap_over,
        **dict(zip(("lowest_check", "lowest_check_step"), lowest_check(run))),
        "acc_reestimated_final": metrics.final_reestimated_acc(run),
        "wall_seconds": run_wall_seconds(run.info),
        "scale": run.scale["name"],
    }


def _versions(versions: set) -> int | str:
    """A row's ``schema_version`` cell: its runs' one version, or several as ``'1,2'`` (None, unknown, left out)."""
    known = sorted(v for v in versions if v is not None)
    return known[0] if len(known) == 1 else ",".join(map(str, known))


def _split(table: pd.DataFrame) -> list[str]:
    """Every schema version in :func:`build_table`'s ``schema_version`` cells."""
    return [v for cell_ in table["schema_version"] for v in str(cell_).split(",") if v] if len(table) else []


def build_table(runs: list[Run], seeds_expected: int | None = None) -> pd.DataFrame:
    """One line per row: ``<col>_mean``, ``<col>_std``, ``<col>_published`` for each column, plus
    ``n_seeds``, ``seeds_expected`` (how many), ``seeds``, ``seeds_missing`` (expected seeds with no run,
    finished or diverged), ``diverged``, ``diverged_seeds``, ``label``, ``network`` (the network in words,
    :func:`bnrotation.study.rows.network_label`) and ``arch`` (``model.arch``), ``task`` (the task in words,
    :data:`bnrotation.study.rows.TASKS`, from :attr:`..results.Run.task`), ``last_conv`` (the layer of the
    rotation and norm columns, :func:`..measures.metrics.last_conv`), ``scale`` (the runs' scale name),
    ``wall_seconds_mean`` (mean wall time of a finished run, seconds), ``schema_version`` (the schema version
    the row's runs were written with; several as ``'1,2'``).

    The seeds a row should have are those its sweeps run (:func:`bnrotation.study.rows.expected_seeds`, at the runs'
    scale: the default sweep's 0-2, and 3-9 for the rows of the ``ten_seeds`` set at full scale), or seeds
    0 to ``seeds_expected`` − 1 for every row when given.

    Means and spreads are over the runs that finished; ``n_seeds`` and ``seeds``
    count those only, and runs that diverged are counted in ``diverged``
    (their seeds in ``diverged_seeds``), never averaged in. "Checks below 90%"
    pools all checks of the row's finished runs (41 x seeds), as the article
    does; its spread is that of the per-seed shares. ``lowest_check`` (in [0, 1]), ``lowest_check_step`` and
    ``lowest_check_seed``: the lowest evaluation-mode check over the row's finished runs (:func:`lowest_check`),
    nan and -1 where none has a check.
    """
    per_run = pd.DataFrame([run_metrics(r) for r in runs])
    written = {(r.row, r.seed): r.info.get("schema_version") for r in runs}  # each run's schema version
    lines = []
    if per_run.empty:
        return pd.DataFrame()
    per_run["checks_below_90"] = per_run["checks_below"] / per_run["n_checks"].replace(0, np.nan)
    per_run["checks_gap_over_10"] = per_run["checks_gap_over"] / per_run["n_checks"].replace(0, np.nan)
    for row, runs_of_row in sorted(per_run.groupby("row"), key=lambda kv: row_order(kv[0])):
        spec = ROWS.get(row)
        g = runs_of_row[~runs_of_row["diverged"].astype(bool)]  # finished runs only
        diverged = runs_of_row[runs_of_row["diverged"].astype(bool)]
        scale = runs_of_row["scale"].iloc[0]
        expected = (expected_seeds(row, scale) if seeds_expected is None else tuple(range(seeds_expected)))
        missing = sorted(set(expected) - set(runs_of_row["seed"]))
        line = {"row": row, "label": spec.label if spec else row, "network": runs_of_row["network"].iloc[0],
                "task": runs_of_row["task"].iloc[0],
                "arch": runs_of_row["arch"].iloc[0], "last_conv": runs_of_row["last_conv"].iloc[0], "n_seeds": len(g),
                "seeds_expected": len(expected), "seeds": ",".join(map(str, sorted(g["seed"]))),
                "seeds_missing": ",".join(map(str, missing)),
                "diverged": len(diverged), "diverged_seeds": ",".join(map(str, sorted(diverged["seed"]))),
                "scale": scale,
                "schema_version": _versions({written[(row, s)] for s in runs_of_row["seed"]}),
                "wall_seconds_mean": float(g["wall_seconds"].mean())}
        for col in COLUMNS:
            line |= over_seeds(g, [col.key])
            has_figure = spec and spec.published and col.published
            line[f"{col.key}_published"] = getattr(spec.published, col.published) if has_figure else math.nan
        lowest = g.loc[g["lowest_check"].idxmin()] if g["lowest_check"].notna().any() else None
        line |= {"lowest_check": math.nan if lowest is None else float(lowest["lowest_check"]),
                 "lowest_check_step": -1 if lowest is None else int(lowest["lowest_check_step"]),
                 "lowest_check_seed": -1 if lowest is None else int(lowest["seed"])}
        total = g["n_checks"].sum()
        line["checks_below_90_mean"] = float(g["checks_below"].sum() / total) if total else math.nan
        line["checks_gap_over_10_mean"] = float(g["checks_gap_over"].sum() / total) if total else math.nan
        lines.append(line)
    return pd.DataFrame(lines)


def _seed_list(text) -> list[int]:
    return [int(s) for s in str(text).split(",") if s.strip() not in ("", "nan")]


def seeds_cell(line: pd.Series) -> str:
    """The table's Seeds cell: which seeds the row's finished runs are and how many, ``'0–9 (10)'``; with the
    seeds its sweeps run that have no run yet, ``'0–4 (5; to run: seeds 5–9)'``."""
    text = f"{seed_ranges(_seed_list(line['seeds']))} ({line['n_seeds']})"
    missing = _seed_list(line.get("seeds_missing", ""))
    return text[:-1] + f"; to run: seed{'s' if len(missing) > 1 else ''} {seed_ranges(missing)})" if missing else text


def cell_parts(line: pd.Series, col: Column) -> tuple[str, str]:
    """One cell of the table as ``table.md`` prints it, in two parts: the measured ``mean ± spread`` of
    ``line`` (one line of :func:`build_table`) and the published figure (``''`` where the article gives none),
    in ``col``'s unit and decimals (:func:`..formatting.cell`). The write-up page (:mod:`..webpage`) prints the same."""
    measured = cell(line[f"{col.key}_mean"], col.unit, line[f"{col.key}_std"], digits=col.digits,
                    spread_digits=col.spread_digits, spread_sign=False)
    published = line[f"{col.key}_published"]
    return measured, "" if math.isnan(published) else cell(published, col.unit, digits=col.digits)


def to_markdown(table: pd.DataFrame, root: Path, skipped: list[str] = (), scale: str = "") -> str:
    """The table as markdown: ``measured ± spread [published]`` in each cell; ``scale`` (one sentence on the
    runs' scale, :func:`..results.scale_note`) in the header; ``skipped`` (bad runs left out with ``--skip-bad``)
    listed under it."""
    heads = [col.header for col in COLUMNS]
    layers = "; ".join(f"`{layer}` in {network}" for network, layer in
                       dict.fromkeys(zip(table["network"], table["last_conv"])) if isinstance(layer, str)) \
        if len(table) else ""
    out = [f"# The rotation study's table, measured\n",
           f"Rebuilt by `make table` from the runs under `{root}` ({schema_versions(_split(table))}). "
           "Each cell: mean over seeds ± sample standard deviation over seeds, and [the published figure]. "
           + (scale + " " if scale else "") +
           (f"Rotation and norm growth are those of each run's last conv layer ({layers}); the published figures "
            "are the study's network's only. " if layers else "") +
           f"Seeds: those of the row's finished runs (how many), and any its sweeps run (`rows.py`: "
           f"{seed_ranges(SWEEPS['full'].seeds)} in the default sweep, {seed_ranges(SETS['ten_seeds'].seeds)} more "
           "for the rows of the `ten_seeds` set) that have no run yet. "
           "\"Checks below 90%\" pools every check of the row's runs, as the article does; it means nothing where "
           "training mode itself is near 90% (Fashion-MNIST). \"Checks with a mode gap over "
           f"{metrics.MODE_GAP_OVER * 100:g} points\" pools them the same way and counts the checks whose "
           "evaluation-mode accuracy trails the same check's training-mode accuracy by more than that: on a task "
           "whose training mode is 100%, the article's checks below 90%; on any task, the checks where the running "
           "statistics cost more than that. "
           "Lowest check: the lowest evaluation-mode accuracy at any check of the row's runs, with its seed and step. "
           "Runs that diverged (non-finite loss) are counted under Diverged and left out of every mean. "
           "Minutes per run: mean wall time of the row's finished runs, over every process of a resumed run, as "
           "`run.json` records it (it depends on the machine and on what else ran beside it).\n",
           "| Row | Network | Task | Seeds | " + " | ".join(heads) + " | Lowest check | Diverged | Minutes per run |",
           "|---|---|---|---|" + "---:|" * len(heads) + "---:|---:|---:|"]
    for _, r in table.iterrows():
        seeds = seeds_cell(r)
        cells = []
        for col in COLUMNS:
            measured, published = cell_parts(r, col)
            cells.append(measured + (f" [{published}]" if published else ""))
        diverged = f"{r['diverged']} (seeds {r['diverged_seeds']})" if r["diverged"] else "0"
        wall = r.get("wall_seconds_mean", math.nan)
        minutes = "–" if wall is None or math.isnan(wall) else f"{wall / 60:.{0 if wall >= 600 else 1}f}"
        out.append(f"| {r['label']} (`{r['row']}`) | {r['network']} | {r['task']} | {seeds} | " + " | ".join(cells)
                   + f" | {lowest_cell(r)} | {diverged} | {minutes} |")
    if skipped:
        out += ["", f"Left out with --skip-bad ({len(skipped)}):", ""] + [f"- {p}" for p in skipped]
    return "\n".join(out) + "\n"


def write_tables(root: Path, runs: list[Run], out: Path, skipped: list[str] = (), seeds: int | None = None) -> None:
    """What ``make table`` writes from ``runs`` (read from ``root``) into ``out``: ``table.md`` and ``table.csv``,
    ``lag.md`` (:func:`.lag_report.write_lag`), ``averaging.md`` and ``.csv`` where runs logged averaged models
    (:func:`.averaging_report.write_averaging`), and ``monitor.md`` (:func:`.monitor_report.write_monitor`); ``skipped``
    names the bad entries left out, ``seeds`` the seeds each row should have (:func:`build_table`). Prints the
    table and what it wrote."""
    table = build_table(runs, seeds)
    md = to_markdown(table, root, skipped, scale_note(runs))
    records.atomic_write_text(out / "table.md", md)
    records.atomic_write_text(out / "table.csv", table.to_csv(index=False))
    lag_report.write_lag(runs, out, root)
    print(md)
    print(f"wrote {out / 'table.md'}, {out / 'table.csv'} and {out / 'lag.md'} from {count(len(runs), 'run')} under {root}"
          + (f", leaving out {len(skipped)} bad entries (listed above)" if skipped else ""), file=sys.stderr)
    averaging_md = write_averaging(runs, out, root)  # averaged weights under each buffer policy
    if averaging_md is not None:
        print(f"wrote {averaging_md} and {averaging_md.with_suffix('.csv')}", file=sys.stderr)
    print(f"wrote {monitor_report.write_monitor(runs, out, root)}", file=sys.stderr)  # the monitor's rule on these runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_results_arguments(p)
    p.add_argument("--out", default=None, help="folder for table.md, table.csv, lag.md and averaging.md/.csv "
                   "(default: the results root read)")
    p.add_argument("--seeds", type=int, default=None, help="seeds each row should have, 0 to SEEDS - 1 "
                   "(default: the seeds its sweeps run, from rows.py)")
    args = p.parse_args(argv)
    skipped: list[str] = []
    found = command_inputs(args, ALL_TABLES, skipped=skipped, allow_all_diverged=True)  # the table counts diverged runs
    if found is None:
        return 2
    root, runs, out = found
    write_tables(root, runs, out, skipped, args.seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
