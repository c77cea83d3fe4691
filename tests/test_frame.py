"""The frame every experiment runs on (bnrotation.study.rundir.run_in_folder): a toy experiment built on it in a few
lines, read back through the analysis's run reader; and the second case beside it: a crash mid-train, a finished run
with another config, a finished run met again, a resumable state, a table the layout does not allow.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import pandas as pd
import pytest

from bnrotation import records
from bnrotation.study import rundir
from bnrotation.study.analysis.results import RUNNER, BadRunError, Layout, load_run
from bnrotation.study.rundir import Experiment, RunExistsError, Trained, claim, run_in_folder


# ----------------------------------------------------------------------------- the toy experiment, in a few lines
@dataclass
class Toy:
    """The toy's schema: a row, a seed, a knob that changes its results, and the frame's keys."""

    row: str = "toy"
    seed: int = 0
    gain: float = 1.0
    results_root: str = "results/toy"
    force: bool = False


SCORES = ("row", "seed", "step", "score")
LOSSES = ("row", "seed", "step", "loss")


def train(cfg: Toy) -> Trained:
    steps = range(3)
    tables = {"scores": pd.DataFrame({"row": cfg.row, "seed": cfg.seed, "step": steps,
                                      "score": [cfg.gain * s for s in steps]}),
              "losses": pd.DataFrame({"row": cfg.row, "seed": cfg.seed, "step": steps, "loss": [1.0, 0.5, 0.25]})}
    return Trained(tables, {"steps_trained": len(steps)})


TOY = Experiment(Toy, train, {"scores": SCORES, "losses": LOSSES}, set_up=lambda cfg: {"gain": cfg.gain})
TOY_LAYOUT = Layout(TOY.tables, ("scores", "losses"), (), lambda info: [] if info.get("gain") else ["no gain"])


def test_a_toy_experiment_on_the_frame_is_read_back_by_the_run_reader(tmp_path):
    out = run_in_folder(Toy(seed=3, gain=2.0, results_root=str(tmp_path)), TOY)
    assert out == records.run_dir(tmp_path, "toy", 3)
    assert sorted(p.name for p in out.iterdir()) == ["DONE", "config.yaml", "losses.parquet", "run.json",
                                                     "scores.parquet"]
    run = load_run(out, ("scores", "losses"), TOY_LAYOUT)
    assert (run.row, run.seed, run.info["status"], run.info["gain"], run.info["steps_trained"]) == ("toy", 3, "done",
                                                                                                   2.0, 3)
    assert {"schema_version", "started_at", "ended_at", "wall_seconds"} <= set(run.info)
    assert run.config["gain"] == 2.0 and run.tables["scores"]["score"].tolist() == [0.0, 2.0, 4.0]
    with pytest.raises(BadRunError, match="expected integer keys scale.*a run of another experiment\\? pass its "
                                          "results.Layout"):  # not a runner's run: its layout refuses it, and says so
        load_run(out, ("checks",), RUNNER)


def test_a_layout_needs_only_its_tables_and_a_misspelt_table_is_refused_before_any_file_is_read(tmp_path):
    """Layout's scale keys and row check have defaults (none, nothing against the row); a table the layout does not
    have is the caller's typo: a ValueError naming it, not an empty ``tables`` (the second case: a folder that does
    not even exist still gets the typo first)."""
    out = run_in_folder(Toy(results_root=str(tmp_path)), TOY)
    run = load_run(out, ("scores",), Layout(TOY.tables, tuple(TOY.tables)))
    assert run.tables["scores"]["score"].tolist() == [0.0, 1.0, 2.0]
    for where in (out, tmp_path / "nowhere"):
        with pytest.raises(ValueError, match="table 'score' not in the layout's tables \\(losses, scores\\)"):
            load_run(where, ("score",), Layout(TOY.tables, tuple(TOY.tables)))


def test_an_experiments_table_named_like_a_runner_table_is_held_to_its_own_layout(tmp_path):
    """A toy table called ``checks`` with the toy's own columns is written: the frame holds it to the experiment's
    layout, not to the runner's ``checks`` columns (which it lacks)."""
    own = {"checks": SCORES}
    toy = Experiment(Toy, lambda cfg: {"checks": train(cfg).tables["scores"]}, own)
    out = run_in_folder(Toy(results_root=str(tmp_path)), toy)
    assert (out / "DONE").exists()
    assert load_run(out, ("checks",), Layout(own, ("checks",))).tables["checks"]["score"].tolist() == [0.0, 1.0, 2.0]


def test_a_train_function_may_return_its_tables_alone(tmp_path):
    just_tables = Experiment(Toy, lambda cfg: train(cfg).tables, TOY.tables)
    run = load_run(run_in_folder(Toy(results_root=str(tmp_path)), just_tables), ("scores",),
                   Layout(TOY.tables, ("scores", "losses"), (), lambda info: []))
    assert run.info["status"] == "done" and len(run.tables["scores"]) == 3


# ----------------------------------------------------------------------------- the second case
def test_a_crash_mid_train_leaves_no_done_and_no_table_and_is_rerun_from_scratch(tmp_path):
    def crashing(cfg):
        raise RuntimeError("killed mid-train")

    cfg = Toy(results_root=str(tmp_path))
    with pytest.raises(RuntimeError, match="killed mid-train"):
        run_in_folder(cfg, Experiment(Toy, crashing, TOY.tables))
    out = records.run_dir(tmp_path, "toy", 0)
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "run.json"]
    info = json.loads((out / "run.json").read_text())
    assert (info["status"], info["error"]) == ("failed", "RuntimeError: killed mid-train") and "ended_at" in info
    with pytest.raises(BadRunError, match="no DONE marker"):
        load_run(out, ("scores",), TOY_LAYOUT)
    (out / "stray.txt").write_text("left by the crashed run")
    assert run_in_folder(cfg, TOY) == out and not (out / "stray.txt").exists()  # rerun from scratch
    assert load_run(out, ("scores", "losses"), TOY_LAYOUT).info["status"] == "done"


def test_a_stop_from_the_keyboard_mid_train_says_interrupted(tmp_path):
    def stopped(cfg):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_in_folder(Toy(results_root=str(tmp_path)), Experiment(Toy, stopped, TOY.tables))
    info = json.loads((records.run_dir(tmp_path, "toy", 0) / "run.json").read_text())
    assert (info["status"], info["error"]) == ("interrupted", "KeyboardInterrupt")


def test_a_table_against_the_layout_is_refused_before_any_table_is_written(tmp_path):
    def bad(cfg):
        tables = dict(train(cfg).tables)
        tables["losses"] = tables["losses"].drop(columns="loss")
        return tables

    cfg = Toy(results_root=str(tmp_path))
    with pytest.raises(ValueError, match=r"table 'losses' lacks columns \['loss'\]"):
        run_in_folder(cfg, Experiment(Toy, bad, TOY.tables))
    with pytest.raises(ValueError, match="table 'extra' is not one of this experiment's tables"):
        run_in_folder(cfg, Experiment(Toy, lambda c: {**train(c).tables, "extra": pd.DataFrame()}, TOY.tables))
    out = records.run_dir(tmp_path, "toy", 0)
    assert not list(out.glob("*.parquet")) and not (out / records.DONE).exists()


def test_a_finished_run_is_skipped_refused_with_another_config_and_replaced_with_force(tmp_path):
    calls = []

    def counted(cfg):
        calls.append(cfg.gain)
        return train(cfg)

    exp = dataclasses.replace(TOY, train=counted)
    out = run_in_folder(Toy(results_root=str(tmp_path)), exp)
    assert run_in_folder(Toy(results_root=str(tmp_path)), exp) is None and calls == [1.0]  # skipped, not trained
    with pytest.raises(RunExistsError, match=r"a finished run with a different config \(keys \['gain'\]\)"):
        run_in_folder(Toy(gain=5.0, results_root=str(tmp_path)), exp)
    assert calls == [1.0] and (out / records.DONE).exists()
    assert run_in_folder(Toy(gain=5.0, results_root=str(tmp_path), force=True), exp) == out
    assert calls == [1.0, 5.0] and load_run(out, ("scores",), TOY_LAYOUT).config["gain"] == 5.0


def test_a_resumable_state_with_the_same_config_is_kept_and_resumed_another_is_started_over(tmp_path):
    cfg = Toy(results_root=str(tmp_path))
    with claim([cfg], Toy) as (folder,):
        folder.start()
        (folder.path / rundir.RESUME_FILE).write_bytes(b"state")  # stopped: no DONE, a resumable state
    with claim([cfg], Toy) as (folder,):
        assert folder.resume and (folder.path / rundir.RESUME_FILE).read_bytes() == b"state"
        folder.finish(train(cfg), TOY.tables)
    assert not (folder.path / rundir.RESUME_FILE).exists() and (folder.path / records.DONE).exists()
    other = Toy(gain=2.0, results_root=str(tmp_path), row="toy2")
    with claim([other], Toy) as (folder,):
        folder.start()
        (folder.path / rundir.RESUME_FILE).write_bytes(b"state")
    with claim([Toy(gain=3.0, results_root=str(tmp_path), row="toy2")], Toy) as (folder,):
        assert not folder.resume and list(folder.path.iterdir()) == []


def test_several_runs_are_all_locked_before_any_folder_is_touched(tmp_path):
    a, b = Toy(seed=0, results_root=str(tmp_path)), Toy(seed=1, results_root=str(tmp_path))
    crashed = records.run_dir(tmp_path, "toy", 0)
    crashed.mkdir(parents=True)
    (crashed / "run.json").write_text("{}")
    with rundir.RunLock(tmp_path, "toy", 1):
        with pytest.raises(rundir.RunBusyError):
            with claim([a, b], Toy):
                pass
    assert (crashed / "run.json").exists()  # seed 0's folder untouched: seed 1 was busy


def test_the_run_reader_reads_each_experiments_runs_with_its_own_layout(tmp_path):
    """Given several experiments' layouts, the reader picks the one whose marker the run's run.json has (the
    runner's has none); a run of none of them is refused by name."""
    from bnrotation.study.analysis.results import FROZEN, ZOO

    out = run_in_folder(Toy(results_root=str(tmp_path)), TOY)
    marked = dataclasses.replace(TOY_LAYOUT, marker="gain")
    assert load_run(out, ("scores",), (RUNNER, ZOO, marked)).tables["scores"]["score"].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(BadRunError, match="expected integer keys scale"):  # no marker of theirs: a runner's run
        load_run(out, ("checks",), (RUNNER, ZOO))
    with pytest.raises(BadRunError, match=r"run.json: a run of another experiment \(it has none of the keys 'mode', "
                                          r"'arch'\)"):
        load_run(out, ("checks",), (FROZEN, ZOO))
