"""Find, validate and load run folders (no torch).

A run is refused, with a message naming its folder, when it has no ``DONE``
marker, when ``run.json`` is unreadable or of a newer schema, when a table is
missing, truncated or lacks a column, or when the settings read back in
``run.json`` contradict what its row means (:mod:`bnrotation.study.rows`): the
article's window test first ran with a momentum patched into a file that was
never loaded, and that mistake must be impossible to miss.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import yaml

from ... import records
from ..rows import (FROZEN_TABLES, ROWS, ZOO_REQUIRED, check_against_frozen_row, check_against_row,
                    check_against_zoo_row, row_order)

ALL_TABLES = tuple(records.TABLE_COLUMNS)  # every table a run may hold, the optional ones too
SCALE_KEYS = ("steps", "log_every", "check_start")  # what the table's columns read from config.yaml
# What the published figures depend on: a run whose scale differs in any of these is not the article's protocol.
PROTOCOL_KEYS = ("steps", "log_every", "check_start", "check_every", "heldout_size")


class BadRunError(ValueError):
    """A run folder cannot be used; the message names the folder and what is wrong."""


def _nothing_against(info: dict) -> list[str]:
    """A layout without a row check: nothing its ``run.json`` says is against its row."""
    return []


@dataclass(frozen=True)
class Layout:
    """What a finished run folder of one experiment holds, for :func:`load_run` to check: ``columns``, each table
    it may hold and the columns that table must have (the experiment's table layout, which its writer,
    :class:`bnrotation.study.rundir.Experiment`, holds too); ``required``, the tables every run has; ``scale_keys``,
    the integer keys of its ``config.yaml``'s ``scale`` section (none by default); ``contradicts(info)``, one line per
    thing its ``run.json`` says against its row (nothing by default); ``marker``, a ``run.json`` key that only this experiment's runs have, by which
    :func:`load_run` tells its runs from another experiment's ("" for the runner's, whose runs have none)."""

    columns: Mapping[str, tuple[str, ...]]
    required: tuple[str, ...]
    scale_keys: tuple[str, ...] = ()
    contradicts: Callable[[dict], list[str]] = _nothing_against
    marker: str = ""


def _against_registered_row(info: dict) -> list[str]:
    """A runner's run against its row of :data:`bnrotation.study.rows.ROWS` (an unregistered row: nothing)."""
    return check_against_row(info, ROWS[info["row"]]) if info["row"] in ROWS else []


RUNNER = Layout(records.TABLE_COLUMNS, records.REQUIRED_TABLES, SCALE_KEYS, _against_registered_row)
# The frozen-backbone experiment's runs (bnrotation.study.frozen): their own tables, no scale section; their run.json
# names the BatchNorm mode.
FROZEN = Layout(FROZEN_TABLES, tuple(FROZEN_TABLES), (), check_against_frozen_row, marker="mode")
# The staleness zoo's runs (bnrotation.study.zoo): the runner's tables (no channels by default), no scale section;
# their run.json names the timm architecture.
ZOO = Layout(records.TABLE_COLUMNS, ZOO_REQUIRED, (), check_against_zoo_row, marker="arch")


def layout_of(info: dict, layouts: tuple[Layout, ...]) -> Layout | None:
    """Which of ``layouts`` wrote the run whose ``run.json`` is ``info``: the first whose marker it has, else the
    first without a marker (the runner's); None when there is neither."""
    marked = [layout for layout in layouts if layout.marker and layout.marker in info]
    return (marked or [layout for layout in layouts if not layout.marker] or [None])[0]


@dataclass
class Run:
    """One finished run: its folder, ``run.json``, resolved config and tables; ``derived`` keeps the measures of
    :func:`once_per_run`."""

    path: Path
    info: dict
    config: dict
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    derived: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def row(self) -> str:
        return self.info["row"]

    @property
    def seed(self) -> int:
        return int(self.info["seed"])

    @property
    def arch(self) -> str:
        """The network the run trained: ``model.arch`` in its ``config.yaml`` (``convnet``, ``resnet20``); where
        the config does not say (runs written before the suite had two networks), its row's, else ``convnet``."""
        return self._configured("model", "arch", "convnet")

    @property
    def task(self) -> str:
        """The task the run trained on: ``task.name`` in its ``config.yaml`` (``noisy_templates``,
        ``fashion_mnist``); where the config does not say (runs written before the suite had two tasks), its
        row's (:attr:`bnrotation.study.rows.RowSpec.task`), else ``noisy_templates``."""
        return self._configured("task", "name", "noisy_templates", "task")

    def _configured(self, group: str, key: str, default: str, field: str | None = None) -> str:
        """``<group>.<key>`` of the run's ``config.yaml``; else its row's ``field`` (``key`` when None); else
        ``default``."""
        value = (self.config.get(group) or {}).get(key)
        if value:
            return str(value)
        spec = ROWS.get(self.row)
        return getattr(spec, field or key) if spec else default

    @property
    def diverged(self) -> bool:
        return self.info.get("status") == "diverged"

    @property
    def scale(self) -> dict:
        """The run's ``scale`` settings that the published figures depend on (:data:`PROTOCOL_KEYS`), and its name."""
        scale = self.config["scale"]
        return {"name": scale.get("name", "?"), **{k: scale.get(k) for k in PROTOCOL_KEYS}}


def once_per_run(measure):
    """Decorator: ``measure(run, *args)`` is computed once per run and arguments and kept in ``run.derived``, so
    that the reports that ask for the same per-run measure (the table, ``lag.md``, the claims and their findings)
    compute it once. ``args`` must be hashable (names, numbers, tuples). The value is shared by every caller: none
    may change it in place. A run whose ``info``, ``config`` or one of whose tables is replaced by another object
    is measured afresh; a table changed in place is not noticed."""
    @functools.wraps(measure)
    def once(run: Run, *args, **kwargs):
        inputs = (run.info, run.config, *run.tables.values())
        kept = run.derived.get("inputs")
        if kept is None or len(kept) != len(inputs) or any(a is not b for a, b in zip(kept, inputs)):
            run.derived.clear()
            run.derived["inputs"] = inputs  # held, so that no new object can take an old one's identity
        key = (measure, args, tuple(sorted(kwargs.items())))
        if key not in run.derived:
            run.derived[key] = measure(run, *args, **kwargs)
        return run.derived[key]
    return once


def protocol_scale() -> dict:
    """The article's protocol (PROTOCOL.md; ``conf/scale/full.yaml``): :data:`PROTOCOL_KEYS` of the full scale."""
    from ..config import ScaleConfig  # its defaults are the full scale; hydra and omegaconf only, no torch

    full = ScaleConfig()
    return {"name": full.name, **{k: getattr(full, k) for k in PROTOCOL_KEYS}}


def at_protocol_scale(runs: list[Run]) -> bool:
    """Whether every run ran the article's steps, check window and held-out size, so that the published
    figures can be compared with the measured ones."""
    want = {k: v for k, v in protocol_scale().items() if k != "name"}
    return all({k: r.scale[k] for k in PROTOCOL_KEYS} == want for r in runs)


def describe_scale(scale: dict) -> str:
    """``scale full: 6,000 steps, checks every 100 steps from step 2,000 (41 checks) on 4,000 held-out samples``."""
    try:
        n_checks = (scale["steps"] - scale["check_start"]) // scale["check_every"] + 1
        checks = f"{n_checks:,} check{'s' * (n_checks != 1)}"
        return (f"scale {scale['name']}: {scale['steps']:,} steps, checks every {scale['check_every']:,} steps from "
                f"step {scale['check_start']:,} ({checks}) on {scale['heldout_size']:,} held-out samples")
    except (TypeError, KeyError, ZeroDivisionError):
        return f"scale {scale.get('name', '?')}: " + ", ".join(f"{k} {scale.get(k)}" for k in PROTOCOL_KEYS)


def scale_note(runs: list[Run]) -> str:
    """One sentence for a report's header: the runs' scale, and a warning when it is not the article's."""
    if not runs:
        return ""
    here = describe_scale(runs[0].scale)
    if at_protocol_scale(runs):
        return f"The runs are at the article's protocol ({here})."
    return (f"**Not the article's scale.** These runs are at {here}; the article's figures are for "
            f"{describe_scale(protocol_scale())}. The published figures are shown for orientation only, "
            "and no claim gets a verdict against them.")


def count(n: int, noun: str) -> str:
    """``1 run``, ``2 runs``."""
    return f"{n:,} {noun}{'s' * (n != 1)}"


def check_one_scale(runs: list[Run]) -> None:
    """Refuse a results root whose runs differ in scale: a mean over seeds of different lengths means nothing.

    Raises:
        BadRunError: naming one run of each of the first two scales found.
    """
    first = {}
    for r in runs:
        key = tuple(r.scale[k] for k in PROTOCOL_KEYS)
        first.setdefault(key, r)
        if len(first) > 1:
            a, b = first.values()
            differ = ", ".join(f"scale.{k} {a.scale[k]} against {b.scale[k]}" for k in PROTOCOL_KEYS
                               if a.scale[k] != b.scale[k])
            raise BadRunError(f"{a.path} and {b.path} ran different scales ({differ}); keep one scale per "
                              "results root (results_root=...)")


def say_refused(problems: list[str], runs: list, empty: str) -> bool:
    """Print each of ``problems`` (a folder refused, one line each) on stderr as ``refused: <line>``, then
    ``error: <empty>`` when ``runs`` is empty; True when it is (the command then exits 2, having judged nothing)."""
    for line in problems:
        print(f"refused: {line}", file=sys.stderr)
    if not runs:
        print(f"error: {empty}", file=sys.stderr)
    return not runs


def find_run_dirs(root: str | Path) -> list[Path]:
    """Every ``runs/<row>/seed=<s>`` folder under ``root``, in row-registry order."""
    dirs = [p for p in Path(root).glob("runs/*/seed=*") if p.is_dir()]
    return sorted(dirs, key=lambda p: (row_order(p.parent.name), p.name))


def has_runs(root: str | Path) -> bool:
    """Whether ``root`` holds at least one finished run (a ``DONE`` marker)."""
    return any((p / records.DONE).exists() for p in find_run_dirs(root))


REFERENCE_ROOT = Path("results/reference")  # the committed reference runs
OWN_ROOT = Path("results")  # where `make sweep` writes by default


def default_results_root() -> Path:
    """The results root an analysis command reads when none is given: ``results`` if it holds any run folder
    (finished or not: a crashed run there is reported, never replaced by the reference runs), else the
    committed ``results/reference``."""
    return OWN_ROOT if find_run_dirs(OWN_ROOT) else REFERENCE_ROOT


def output_folder(out: str | Path | None, root: str | Path) -> Path:
    """The folder an analysis command writes into: ``out`` when given (``OUT=``), else the results root it read.

    Outputs go inside the root, beside its ``runs/``: ``table.md``, ``table.csv``, ``lag.md``,
    ``averaging.md``/``.csv``, ``claims.md`` and ``figures/``. The committed reference outputs therefore live
    in ``results/reference/``, your own runs' in ``results/`` (ignored by git), and ``RESULTS=/tmp/x`` writes
    into ``/tmp/x``: analysing another root never touches a committed file.
    """
    return Path(out) if out not in (None, "") else Path(root)


def output_problem(out: str | Path, root: str | Path) -> str | None:
    """Why an analysis of ``root`` cannot write into the folder ``out``, in one line, or None when it can:
    the folder cannot be created (:func:`records.folder_problem`), or it lies inside :data:`REFERENCE_ROOT`,
    which holds the committed reference outputs, while ``root`` is another results root."""
    why = records.folder_problem(out)
    if why:
        return f"{out}: the outputs are written here, but it cannot be created: {why}"
    reference = REFERENCE_ROOT.resolve()
    if Path(out).resolve().is_relative_to(reference) and Path(root).resolve() != reference:
        return (f"{out}: inside {REFERENCE_ROOT}, which holds the committed reference outputs; only an analysis "
                f"of {REFERENCE_ROOT} writes there (the runs read are under {root}); pass OUT=<another folder>")
    return None

def describe_root(root: str | Path, asked: bool) -> str:
    """One line naming the results root a command reads, and why that one."""
    root = Path(root)
    if asked:
        why = "as asked"
    elif root == REFERENCE_ROOT:
        why = f"the committed reference runs: no run under {OWN_ROOT}/runs; RESULTS=<root> reads another"
    else:
        why = f"your own runs; RESULTS={REFERENCE_ROOT} reads the committed reference runs"
    return f"reading {root} ({why})"


# Columns renamed by schema 2, per table: {old name: new name}; read_table reads a schema-1 table under the new names.
# Schema-1 values were computed without the layer's eps (σ = sqrt(fresh var), where schema 2 divides by sqrt(fresh var
# + eps)) and are read as they are: the averaging table's network-wide median |lag|, the lags that ranked the
# interventions' top-k channels and, in runs written before the monitor took the layer's eps, the channels' lag_sigma
# and the layers' lag columns. They agree with schema 2's where a channel's variance is large against eps (1e-5 by
# default), and differ where it is not.
SCHEMA_1_NAMES = {"averaging": {"lag_median_abs_sigma": "lag_network_median_abs_sigma"},
                  "interventions": {"layer": "norm_layer"}}


def read_table(path: Path, name: str, columns: tuple[str, ...] | None = None) -> pd.DataFrame:
    """Read one parquet table and check its schema version and columns (``columns``, by default the runner's
    table of that name's, :data:`bnrotation.records.TABLE_COLUMNS`). A schema-1 table's renamed columns are read
    under their schema-2 names (:data:`SCHEMA_1_NAMES`; their values as schema 1 computed them, without the
    layer's eps).

    Raises:
        BadRunError: naming the file, for a missing, unreadable or truncated
            file, a schema version that is missing or newer, or a missing column.
    """
    if not path.exists():
        raise BadRunError(f"{path}: table {name!r} is missing")
    try:
        with pq.ParquetFile(path) as file:  # faster than pq.read_table, which plans a dataset for one file
            table = file.read()
    except Exception as err:  # noqa: BLE001 - pyarrow raises several kinds for a damaged file
        raise BadRunError(f"{path}: unreadable parquet ({type(err).__name__}: {err})") from err
    raw = (table.schema.metadata or {}).get(b"bnrotation.schema_version")
    if raw is None:
        raise BadRunError(f"{path}: no bnrotation.schema_version in its parquet metadata; "
                          "not a table this suite wrote")
    version = int(raw) if raw.isdigit() else None
    if version is None or version > records.SCHEMA_VERSION:
        raise BadRunError(f"{path}: schema version {raw.decode(errors='replace')!r}, this suite reads up to "
                          f"{records.SCHEMA_VERSION}; update the suite")
    df = table.to_pandas()
    if version == 1:
        df = df.rename(columns=SCHEMA_1_NAMES.get(name, {}))
    missing = [c for c in (records.TABLE_COLUMNS[name] if columns is None else columns) if c not in df.columns]
    if missing:
        raise BadRunError(f"{path}: missing columns {missing}")
    return df


def _parse(file: Path, parse, error: type[Exception]):
    """``parse`` of ``file``'s text. Raises BadRunError naming the file if it cannot be read or parsed."""
    try:
        return parse(file.read_text())
    except (OSError, UnicodeDecodeError, error) as err:
        raise BadRunError(f"{file}: unreadable ({err})") from err


def _load_yaml(text: str):
    """``yaml.safe_load`` of ``text``, by libyaml's parser where PyYAML has it (the same objects, ten times faster)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_run(path: str | Path, tables: tuple[str, ...] = records.REQUIRED_TABLES,
             layout: Layout | tuple[Layout, ...] = RUNNER) -> Run:
    """Load and validate one run folder of ``layout``'s experiment (the runner's by default), with its tables
    ``tables`` (those of them it holds, and every one it must). ``layout`` may be several experiments' layouts
    (``(RUNNER, ZOO)``): the run is read with the one that wrote it (:func:`layout_of`).

    Raises:
        BadRunError: naming the folder and what is wrong.
        ValueError: a table of ``tables`` that no layout of ``layout`` has (a misspelt name: the caller's
            mistake, raised before any file is read).
    """
    known = {t for one in (layout if isinstance(layout, tuple) else (layout,)) for t in one.columns}
    if unknown := [t for t in tables if t not in known]:
        raise ValueError(f"load_run: table{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))} not in the "
                         f"layout's tables ({', '.join(sorted(known))})")
    path = Path(path)
    if not path.is_dir():
        raise BadRunError(f"{path}: no such run folder (expected <results root>/runs/<row>/seed=<s>)")
    if not (path / records.DONE).exists():
        raise BadRunError(f"{path}: no DONE marker (the run crashed, was killed, or is still running); "
                          "rerun it (make sweep reruns it from scratch)")
    info = _parse(path / "run.json", json.loads, json.JSONDecodeError)
    if not isinstance(info, dict):
        raise BadRunError(f"{path / 'run.json'}: expected a JSON object, got {type(info).__name__}")
    version = info.get("schema_version")
    if not isinstance(version, int) or version > records.SCHEMA_VERSION:
        raise BadRunError(f"{path / 'run.json'}: schema version {version!r}, this suite reads up to "
                          f"{records.SCHEMA_VERSION}; update the suite")
    if info.get("status") not in ("done", "diverged"):
        raise BadRunError(f"{path / 'run.json'}: status {info.get('status')!r}, expected done or diverged")
    if path.parent.name != info.get("row") or path.name != f"seed={info.get('seed')}":
        raise BadRunError(f"{path}: run.json says row {info.get('row')!r} seed {info.get('seed')!r}, "
                          "which does not match the folder")
    if isinstance(layout, tuple):
        layouts, layout = layout, layout_of(info, layout)
        if layout is None:
            raise BadRunError(f"{path / 'run.json'}: a run of another experiment (it has none of the keys "
                              f"{', '.join(repr(x.marker) for x in layouts)}); not read here")
    config = _parse(path / "config.yaml", _load_yaml, yaml.YAMLError)
    if not isinstance(config, dict):
        raise BadRunError(f"{path / 'config.yaml'}: expected a mapping of config keys")
    scale = config.get("scale") if layout.scale_keys else {}
    if not isinstance(scale, dict) or not all(isinstance(scale.get(k), int) for k in layout.scale_keys):
        raise BadRunError(f"{path / 'config.yaml'}: expected integer keys scale.{{{','.join(layout.scale_keys)}}} "
                          "(the check window and probe interval)"
                          + ("; a run of another experiment? pass its results.Layout to load_run"
                             if layout is RUNNER and "scale" not in config else ""))
    problems = layout.contradicts(info)
    if problems:
        raise BadRunError(f"{path}: what ran contradicts row {info['row']!r}: " + "; ".join(problems))
    run = Run(path, info, config)
    for name in tables:
        file = path / f"{name}.parquet"
        if name in layout.required or file.exists():
            run.tables[name] = read_table(file, name, layout.columns[name])
    return run


def load_runs(root: str | Path, skip_bad: bool = False,
              tables: tuple[str, ...] = records.REQUIRED_TABLES, skipped: list[str] | None = None) -> list[Run]:
    """Every valid run under ``root``.

    Stray files in ``root/runs`` and folders not named ``seed=<s>`` are reported.
    With ``skip_bad``, one line per problem is also appended to ``skipped``
    (when given), so that the caller can print it beside the table.

    Raises:
        BadRunError: for the first bad run, unless ``skip_bad``; then every bad
            run is reported on stderr and left out, never silently.
        FileNotFoundError: if ``root`` has no ``runs`` folder.
    """
    root = Path(root)
    if not (root / "runs").is_dir():
        raise FileNotFoundError(f"{root}: no runs/ folder; run `make sweep` or pass RESULTS=results/reference")
    problems = [f"{p}: stray entry, expected runs/<row>/seed=<s>/ folders"
                for p in sorted((root / "runs").glob("*")) if not p.is_dir()]
    problems += [f"{p}: stray entry, expected seed=<s>/ folders"
                 for p in sorted((root / "runs").glob("*/*")) if not p.name.startswith("seed=") or not p.is_dir()]
    runs = []
    for d in find_run_dirs(root):
        try:
            runs.append(load_run(d, tables))
        except BadRunError as err:
            problems.append(str(err))
    if problems and not skip_bad:
        more = problems[1:]
        also = (f" (also: {more[0]}" + (f"; and {len(more) - 1} more" if len(more) > 1 else "") + ")") if more else ""
        raise BadRunError(problems[0] + also + "; pass --skip-bad (make table SKIP_BAD=1) to tabulate the other "
                          "runs and list every problem")
    check_one_scale(runs)
    for p in problems:
        print(f"warning: skipped: {p}", file=sys.stderr)
    if skipped is not None:
        skipped.extend(problems)
    return runs


def add_results_arguments(parser) -> None:
    """``--results`` and ``--skip-bad``, the options every analysis command shares."""
    parser.add_argument("--results", default=None,
                        help="results root holding runs/ (default: results if it has runs, else results/reference)")
    parser.add_argument("--skip-bad", action="store_true", help="report bad runs and use the others")


def runs_for_command(results: str | None, skip_bad: bool, tables: tuple[str, ...],
                     skipped: list[str] | None = None, allow_all_diverged: bool = False
                     ) -> tuple[Path, list[Run]] | None:
    """The results root (``results``, else :func:`default_results_root`) and its runs, for a command line,
    after printing a first line that names the root (:func:`describe_root`);
    with ``skip_bad``, what was left out is appended to ``skipped`` (see :func:`load_runs`).

    Figures and claims measure finished runs; a diverged run (non-finite loss) stopped early and is left out of
    every mean, so a root whose runs all diverged leaves them nothing to measure. ``allow_all_diverged``
    (``make table``, which counts diverged runs) accepts such a root.

    Returns:
        None, after printing the reason on stderr in one line, when the root has no ``runs`` folder, a bad run
        (unless ``skip_bad``), no finished run, or (unless ``allow_all_diverged``) only diverged runs.
    """
    root = Path(results) if results else default_results_root()
    print(describe_root(root, asked=bool(results)), file=sys.stderr)
    try:
        runs = load_runs(root, skip_bad=skip_bad, tables=tables, skipped=skipped)
    except (BadRunError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return None
    if not runs:
        print(f"error: no finished runs under {root}/runs", file=sys.stderr)
        return None
    if not allow_all_diverged and all(r.diverged for r in runs):
        which = ", ".join(f"{r.row} seed={r.seed} at step {r.info.get('diverged_at_step')}" for r in runs[:3])
        more = f" and {len(runs) - 3} more" if len(runs) > 3 else ""
        print(f"error: every run under {root}/runs diverged (non-finite loss: {which}{more}); a diverged run is "
              "left out of every measurement, so there is nothing to draw or check (make table lists them)",
              file=sys.stderr)
        return None
    return root, runs


def command_inputs(args, tables: tuple[str, ...], subfolder: str = "", skipped: list[str] | None = None,
                   allow_all_diverged: bool = False) -> tuple[Path, list[Run], Path] | None:
    """What an analysis command (table, figures, claims) works on, from its ``--results``, ``--skip-bad`` and
    ``--out`` arguments: the results root, its runs (:func:`runs_for_command`) and the folder to write into
    (``--out``, else ``<root>/<subfolder>``: :func:`output_folder`).

    Returns:
        None, after printing the reason on stderr in one line, when the runs cannot be read or the folder
        cannot be written (:func:`output_problem`).
    """
    found = runs_for_command(args.results, args.skip_bad, tables, skipped, allow_all_diverged)
    if found is None:
        return None
    root, runs = found
    out = Path(args.out) if args.out else output_folder(None, root) / subfolder
    problem = output_problem(out, root)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return None
    return root, runs, out


def main(argv: list[str] | None = None) -> int:
    """``python -m bnrotation.study.analysis.results [--results R] [--out O]``: print the folder the analysis of
    that root writes into (:func:`output_folder`), for the Makefile; exit status 2 with one line naming the
    folder when it cannot be written there (:func:`output_problem`). Reads no run."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--results", default=None, help="results root (default: as the analysis commands pick it)")
    p.add_argument("--out", default=None, help="the folder asked for (OUT=); default: the results root")
    args = p.parse_args(argv)
    root = Path(args.results) if args.results else default_results_root()
    out = output_folder(args.out, root)
    problem = output_problem(out, root)
    if problem:
        print(f"error: OUT={problem}" if args.out else f"error: {problem}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
