"""The on-disk layout of a run and atomic writing (no torch: analysis imports this).

A run lives in ``<results_root>/runs/<row>/seed=<s>/`` and holds
``config.yaml``, ``run.json``, one parquet file per table and a ``DONE``
marker written last. Every file is written to a temporary name in the same
folder and renamed into place, so a kill at any moment leaves either the
complete file or none. Every table carries ``SCHEMA_VERSION`` in its parquet
metadata and ``run.json`` carries it too.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

# 2: the study's lag is the monitor's, with the layer's eps (σ = sqrt(var + eps)); the averaging table's network-wide
# median |lag| is ``lag_network_median_abs_sigma`` (was ``lag_median_abs_sigma``, the monitor's name for one layer's
# median) and the interventions table names the norm layer ``norm_layer`` (was ``layer``, the weight layer's name in
# the monitor's tables). The run reader reads schema 1 under the new names (analysis.results.read_table).
SCHEMA_VERSION = 2
DONE = "DONE"

# The columns each table must have (more may follow).
TABLE_COLUMNS = {
    "checks": ("row", "seed", "step", "lr", "loss", "acc_train_mode", "acc_eval_mode"),
    "layers": ("row", "seed", "step", "layer", "weight_norm", "update_cos", "grad_cos"),
    "channels": ("row", "seed", "step", "layer", "channel", "rotation_deg", "weight_norm", "running_mean",
                 "running_var", "fresh_mean", "fresh_var", "lag_sigma", "drift_sigma_per_step",
                 "predicted_lag_sigma", "abs_mean_over_std"),
    "interventions": ("row", "seed", "step", "intervention", "k", "norm_layer", "acc_eval_mode"),
    # average: live | ema | tail; decay: EMA decay (NaN otherwise); policy: none | copy | average | mixture | refresh
    "averaging": ("row", "seed", "step", "average", "decay", "window_steps", "policy", "acc_eval_mode"),
    # the fresh and running statistics of every norm layer at every step of the dense windows (scale.dense_windows)
    "dense": ("row", "seed", "step", "norm_layer", "channel", "fresh_mean", "fresh_var", "running_mean",
              "running_var"),
    # the optimizer-state log every scale.mechanism_every steps (bnrotation.study.mechanism), per weight layer
    "mechanism": ("row", "seed", "step", "layer", "angular_update_deg", "update_rms", "grad_rms",
                  "normalised_step_median", "normalised_step_p99", "sqrt_v_median", "eps_share_median"),
    # the training loss at every step, with scale.mechanism_every > 0 (loss spikes)
    "losses": ("row", "seed", "step", "loss"),
}
REQUIRED_TABLES = ("checks", "layers", "channels")


def run_dir(results_root: str | os.PathLike, row: str, seed: int) -> Path:
    """``<results_root>/runs/<row>/seed=<seed>``: the same run always lands in the same place."""
    return Path(results_root) / "runs" / row / f"seed={seed}"



def folder_problem(path: str | os.PathLike) -> str | None:
    """Why the folder ``path`` cannot be created and written to, in words, or None when it can.

    Finds the deepest entry of ``path`` that exists (``path`` itself, or the
    first of its parents): it must be a folder, and a folder must be creatable
    in it (tried with a probe folder, removed at once, so the answer holds for
    root too, for read-only and virtual file systems such as ``/proc``).
    Nothing else is created.

    Returns:
        ``"/tmp/f is a file, not a folder"`` (a path through a regular file),
        ``"nothing can be created in /proc (No such file or directory)"``, or None.
    """
    path = Path(path)
    existing = next((p for p in (path, *path.parents) if p.exists() or p.is_symlink()), Path("."))
    if not existing.is_dir():
        what = "a file" if existing.is_file() else "not a folder (a broken link or a special file)"
        return f"{existing} is {what}" + (", not a folder" if existing.is_file() else "")
    try:
        probe = tempfile.mkdtemp(prefix=".bnrotation-probe-", dir=existing)
    except OSError as err:
        return f"nothing can be created in {existing} ({err.strerror or err})"
    os.rmdir(probe)
    return None

def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX; a no-op where a folder cannot be fsynced)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    The file is fsynced before the rename and the folder after it, so that files
    reach the disk in the order they are written (``DONE`` last) even if the
    machine, not only the process, dies.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_json(path: str | os.PathLike, obj: dict) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def write_table(df: pd.DataFrame, path: str | os.PathLike, name: str,
                required: Sequence[str] | None = None) -> None:
    """Write one long-format table as parquet, atomically, with the schema version in its metadata.

    ``required``: the columns the table must have; None: those :data:`TABLE_COLUMNS` gives ``name`` (the runner's
    tables), none for another name. An experiment with its own layout passes its own, so that a table of its
    own that shares a runner table's name is held to its layout, not the runner's.

    Raises:
        ValueError: if a required column of table ``name`` is missing.
    """
    required = TABLE_COLUMNS.get(name, ()) if required is None else required
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"table {name!r} lacks columns {missing}")
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[b"bnrotation.schema_version"] = str(SCHEMA_VERSION).encode()
    meta[b"bnrotation.table"] = name.encode()
    table = table.replace_schema_metadata(meta)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomic_write_bytes(path, sink.getvalue().to_pybytes())


def mark_done(directory: str | os.PathLike) -> None:
    """Write the ``DONE`` marker; call it after every other file is in place."""
    atomic_write_text(Path(directory) / DONE, "")


class TableBuffer:
    """A run's long-format tables (:data:`TABLE_COLUMNS`), kept in memory until the run ends; every line
    carries the run's ``row`` and ``seed``."""

    def __init__(self, row: str, seed: int):
        self.row, self.seed = row, seed
        self.frames: dict[str, list[pd.DataFrame]] = {k: [] for k in TABLE_COLUMNS}

    def add(self, table: str, df: pd.DataFrame) -> None:
        """Append the lines of ``df`` to ``table``, with ``row`` and ``seed`` in front."""
        self.frames[table].append(df.assign(row=self.row, seed=np.int64(self.seed))[
            ["row", "seed", *[c for c in df.columns if c not in ("row", "seed")]]])

    def frame(self, table: str) -> pd.DataFrame:
        """All lines of ``table`` so far (an empty frame with its required columns when there are none)."""
        frames = self.frames[table]
        if not frames:
            return pd.DataFrame({c: pd.Series(dtype="float64") for c in TABLE_COLUMNS[table]})
        return pd.concat(frames, ignore_index=True)

    def to_bytes(self) -> dict[str, bytes]:
        """Each table as parquet bytes (for a resumable state)."""
        out = {}
        for name in TABLE_COLUMNS:
            sink = pa.BufferOutputStream()
            pq.write_table(pa.Table.from_pandas(self.frame(name), preserve_index=False), sink)
            out[name] = sink.getvalue().to_pybytes()
        return out

    def load_bytes(self, tables: dict[str, bytes]) -> None:
        """Replace the tables by :meth:`to_bytes`' output."""
        frames = {name: pq.read_table(pa.BufferReader(tables[name])).to_pandas() for name in tables}
        # a table still empty stays without frames, as in a run never stopped (an empty frame's columns are float)
        self.frames = {name: [frames[name]] if name in frames and len(frames[name]) else [] for name in TABLE_COLUMNS}
