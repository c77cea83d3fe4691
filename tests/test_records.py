"""Atomic writing, directly: a write cut part-way never leaves a partial file under the final name.

``tests/test_reliability.py`` kills whole runs; here each writer of
:mod:`bnrotation.records` is cut inside one write (the file object's ``write``
raises after writing half its bytes, as a full disk or an interrupt does) or at
the rename, and the final path must be absent, or unchanged if it existed, with
no temporary file left beside it.
"""

from __future__ import annotations

import os

import pandas as pd
import pytest

from bnrotation import records

CHECKS = pd.DataFrame({"row": ["adam"] * 3, "seed": [0] * 3, "step": [0, 100, 200], "lr": [3e-3] * 3,
                       "loss": [2.3, 1.0, 0.5], "acc_train_mode": [0.1, 0.9, 1.0], "acc_eval_mode": [0.1, 0.6, 0.7]})
WRITERS = {  # writer -> (write it to a path, the bytes a complete write leaves)
    "atomic_write_bytes": lambda path: records.atomic_write_bytes(path, b"0123456789" * 100),
    "atomic_write_text": lambda path: records.atomic_write_text(path, "σ per step\n" * 100),
    "write_json": lambda path: records.write_json(path, {"row": "adam", "seed": 0, "values": list(range(200))}),
    "write_table": lambda path: records.write_table(CHECKS, path, "checks"),
}


class _HalfThenFail:
    """A binary file that writes half of what it is given, then raises ``error``."""

    def __init__(self, file, error: BaseException):
        self.file, self.error = file, error

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()
        return False

    def write(self, data: bytes) -> int:
        self.file.write(data[: len(data) // 2])
        self.file.flush()
        raise self.error

    def flush(self):
        self.file.flush()

    def fileno(self):
        return self.file.fileno()


def _cut_writes(monkeypatch, error: BaseException) -> None:
    real = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: _HalfThenFail(real(fd, *a, **k), error))


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()],
                         ids=["disk_full", "interrupted"])
def test_a_write_cut_half_way_leaves_no_file_under_the_final_name(writer, error, tmp_path, monkeypatch):
    new, old = tmp_path / "new.out", tmp_path / "old.out"
    WRITERS[writer](old)  # a complete earlier version, to be replaced
    before = old.read_bytes()
    _cut_writes(monkeypatch, error)
    for path in (new, old):
        with pytest.raises(type(error)):
            WRITERS[writer](path)
    assert not new.exists()
    assert old.read_bytes() == before
    assert _leftovers(tmp_path) == []
    monkeypatch.undo()
    WRITERS[writer](new)  # the same writer, uncut, works: the cut came from the monkeypatch, not the data
    assert new.stat().st_size > 0


@pytest.mark.parametrize("writer", WRITERS)
def test_a_write_cut_at_the_rename_leaves_the_old_file(writer, tmp_path, monkeypatch):
    path = tmp_path / "file.out"
    WRITERS[writer](path)
    before = path.read_bytes()

    def fail(*_):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="Input/output"):
        WRITERS[writer](path)
    assert path.read_bytes() == before
    assert _leftovers(tmp_path) == []


def test_the_cut_write_did_write_half_its_bytes_before_failing(tmp_path, monkeypatch):
    """The fault injection itself: the temporary file really held a partial write when the error came."""
    seen = []
    real_unlink = type(tmp_path).unlink

    def spy(self, *a, **k):
        if self.name.endswith(".tmp"):
            seen.append(self.stat().st_size)
        return real_unlink(self, *a, **k)

    monkeypatch.setattr(type(tmp_path), "unlink", spy)
    _cut_writes(monkeypatch, OSError(28, "No space left on device"))
    with pytest.raises(OSError):
        records.atomic_write_bytes(tmp_path / "x.bin", b"a" * 1000)
    assert seen == [500]
