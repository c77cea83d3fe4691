"""The condition map's report (bnrotation.study.analysis.tables.map_report) and its sweep
(bnrotation.study.condition_map), on run folders built here whose every figure is known in closed form."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pandas as pd
import pytest
import yaml

from bnrotation import records
from bnrotation.study import condition_map as cmap
from bnrotation.study.analysis.tables import map_report as mr
from bnrotation.study.config import check_row, to_run_config
from bnrotation.study.names import OPTIMIZER_CLASSES
from bnrotation.study.rows import ROWS
from conftest import compose_cfg
from test_analysis import write_run

SCALE = {"name": "map", "steps": 300, "log_every": 100, "check_start": 200, "check_every": 100, "heldout_size": 100,
         "reestimate_batches": 2, "intervene_every": 100}
LAYERS = {"conv1": "bn1", "conv2": "bn2"}
WIDTH = 3
DEFAULT_TASK = {"noisy_templates": {"train_size": None}, "fashion_mnist": {"train_size": 60000}}


def write_map_run(root: Path, base: str, seed: int, *, knob: str | None = None, setting=None, acc_eval: float,
                  acc_train: float = 1.0, shift: float = 0.0, scale_ratio: float = 1.0, reestimated: float = 1.0,
                  said=None) -> Path:
    """One finished map run of the registered row ``base`` at ``task.<knob>=<setting>`` (None: the reference):
    every check at ``acc_eval`` / ``acc_train``; bn2's fresh mean ``shift`` running σ away from its running mean and
    bn1's fresh σ ``scale_ratio`` times its running σ (so bn2's E is ``shift``, bn1's is ``scale_ratio − 1``);
    ``said``: the setting ``run.json`` reads back, when it should differ from the config's."""
    spec = ROWS[base]
    row = cmap.map_row(base, None if knob is None else next(k for k in cmap.KNOBS if k.key == knob
                                                             and k.task == spec.task), setting)
    out = records.run_dir(root, row, seed)
    out.mkdir(parents=True)
    task_cfg = {"name": spec.task, **({knob: setting} if knob else {})}
    (out / "config.yaml").write_text(yaml.safe_dump({"row": row, "seed": seed, "scale": SCALE, "task": task_cfg,
                                                     "model": {"channels": [WIDTH, WIDTH, WIDTH]}}))
    task_info = {"name": spec.task, **DEFAULT_TASK[spec.task], **({knob: setting if said is None else said}
                                                                   if knob else {})}
    info = {"schema_version": records.SCHEMA_VERSION, "row": row, "seed": seed, "status": "done",
            "optimizer": {"class": OPTIMIZER_CLASSES[spec.optimizer],
                          "param_groups": [{"name": "conv", "lr": spec.lr, "weight_decay": spec.weight_decay}]},
            "projection": {"mode": []}, "schedule": None, "task": task_info,
            "norm_layers": {bn: {"class": "BatchNorm2d", "momentum": spec.bn_momentum, "eps": 1e-5}
                            for bn in LAYERS.values()}}
    (out / "run.json").write_text(json.dumps(info))
    base_line = dict(row=row, seed=seed)
    checks = range(SCALE["check_start"], SCALE["steps"] + 1, SCALE["check_every"])
    records.write_table(pd.DataFrame([dict(base_line, step=s, lr=spec.lr, loss=0.01, acc_train_mode=acc_train,
                                           acc_eval_mode=acc_eval) for s in checks]), out / "checks.parquet", "checks")
    steps = range(0, SCALE["steps"] + 1, SCALE["log_every"])
    records.write_table(pd.DataFrame([dict(base_line, step=s, layer=c, weight_norm=1.0 + s / 100, update_cos=0.0,
                                           grad_cos=0.0) for s in steps for c in LAYERS]),
                        out / "layers.parquet", "layers")
    var = 4.0  # running variance: σ 2 (eps aside)
    lines = []
    for s in steps:
        for conv, bn in LAYERS.items():
            for c in range(WIDTH):
                fresh_mean = shift * math.sqrt(var + 1e-5) if bn == "bn2" else 0.0
                fresh_var = (scale_ratio ** 2) * (var + 1e-5) - 1e-5 if bn == "bn1" else var
                lines.append(dict(base_line, step=s, layer=conv, norm_layer=bn, channel=c, rotation_deg=1.0,
                                  weight_norm=1.0, running_mean=0.0, running_var=var, fresh_mean=fresh_mean,
                                  fresh_var=fresh_var, lag_sigma=0.0, drift_sigma_per_step=0.0,
                                  predicted_lag_sigma=0.0, abs_mean_over_std=0.0))
    records.write_table(pd.DataFrame(lines), out / "channels.parquet", "channels")
    iv = [dict(base_line, step=s, intervention=i, k=-1, norm_layer="", acc_eval_mode=a)
          for s in range(SCALE["check_start"], SCALE["steps"] + 1, SCALE["intervene_every"])
          for i, a in (("none", acc_eval), ("reestimate", reestimated))]
    records.write_table(pd.DataFrame(iv), out / "interventions.parquet", "interventions")
    records.mark_done(out)
    return out


def write_point(root: Path, task: str, knob: str | None, setting, sgd: float, adam: float, seeds=(0, 1, 2),
                spread: float = 0.002, adam_train: float = 1.0) -> None:
    """SGD at ``sgd`` and Adam at ``adam`` (evaluation mode; training mode 1.0 unless ``adam_train``), each seed
    moved by ``spread`` × (seed − 1), so the paired differences are exact and the spread known."""
    prefix = "fmnist_" if task == "fashion_mnist" else ""
    for s in seeds:
        write_map_run(root, prefix + "sgd", s, knob=knob, setting=setting, acc_eval=sgd)
        write_map_run(root, prefix + "adam", s, knob=knob, setting=setting, acc_eval=adam + spread * (s - 1),
                      acc_train=adam_train)


def load(root):
    runs, problems = mr.load_map_runs(root)
    assert not problems
    frame = mr.per_run(runs)
    return frame, mr.per_point(frame)


# ----------------------------------------------------------------------------- the sweep
def test_every_sweep_line_composes_to_runs_of_the_registered_rows_under_names_of_their_own():
    """Each line of `python -m bnrotation.study.condition_map` composes (first value of each list) to a valid config
    whose row is the map's name for that point, which check_row accepts and whose base row is the experiment's."""
    lines = cmap.sweep_lines()
    assert len(lines) == 2 + len(cmap.KNOBS)
    for line in lines:
        args = [a.split(",")[0] if "," in a.split("=", 1)[1] and not a.startswith("row=") else a
                for a in shlex.split(line)]
        cfg = to_run_config(compose_cfg(args))
        check_row(cfg)
        base = args[0].split("=", 1)[1]
        assert cmap.base_row(cfg.row) == base and cfg.scale.steps == cmap.MAP_STEPS
        assert not cfg.averaging.enabled and cfg.scale.name == "map"
        knob = next((k for k in cmap.KNOBS if f"task.{k.key}=" in line and k.task == cfg.task.name), None)
        if knob is None:
            assert cfg.row == cmap.map_row(base)
        else:
            setting = getattr(cfg.task, knob.key)
            assert setting == knob.settings[0] and cfg.row == cmap.map_row(base, knob, setting)


def test_the_map_counts_every_run_once():
    points = 2 + sum(len(k.settings) for k in cmap.KNOBS)
    assert cmap.runs_in_map() == points * 2 * 3
    assert cmap.main(["--count"]) == 0 and cmap.main(["--bad"]) == 2


@pytest.mark.parametrize("row, base", [("map_adam+template_scale0.3", "adam"),
                                       ("map_fmnist_sgd+reference", "fmnist_sgd")])
def test_the_base_row_is_read_back_from_the_name(row, base):
    assert cmap.base_row(row) == base
    with pytest.raises(ValueError, match="not a condition-map run"):
        cmap.base_row(base)


# ----------------------------------------------------------------------------- points and the collapse
def test_points_are_read_from_the_config_and_paired_by_seed(tmp_path):
    write_point(tmp_path, "noisy_templates", None, None, sgd=0.99, adam=0.80)
    write_point(tmp_path, "noisy_templates", "template_scale", 1.2, sgd=0.99, adam=0.985)
    frame, points = load(tmp_path)
    assert [p.point.words() for p in points] == ["reference", "template_scale 1.2"]
    ref, high = points
    assert ref.deficit.n == 3 and ref.deficit.mean == pytest.approx(0.19)
    assert ref.deficit.sd == pytest.approx(0.002)  # the Adam seeds' spread, paired against a constant SGD
    assert ref.excess_gap.mean == pytest.approx(0.19)
    assert mr.collapses(ref) is True and mr.collapses(high) is False


@pytest.mark.parametrize("adam, spread, expected", [
    (0.99 - 0.051, 0.002, True),    # just beyond the floor, a small spread
    (0.99 - 0.049, 0.002, False),   # just inside the floor
    (0.99 - 0.08, 0.08, False),     # beyond the floor on average, but not beyond 2 standard errors
])
def test_the_collapse_needs_the_floor_and_two_standard_errors(tmp_path, adam, spread, expected):
    write_point(tmp_path, "noisy_templates", None, None, sgd=0.99, adam=adam, spread=spread)
    _, (point,) = load(tmp_path)
    assert mr.collapses(point) is expected


@pytest.mark.parametrize("adam, spread, adam_train, expected", [
    (0.99 - 0.08, 0.08, 1.0, "undecided"),     # both means past the floor, not beyond 2 standard errors
    (0.99 - 0.049, 0.08, 1.0, "not"),          # the same spread, the deficit's mean just inside the floor
    (0.99 - 0.051, 0.002, 1.0, "at"),          # past the floor and beyond 2 standard errors: the collapse
    (0.99 - 0.08, 0.08, 0.99 - 0.08 + 0.04, "not"),  # the deficit past the floor, Adam's mode gap (4 points) not
])
def test_a_point_past_the_floor_within_two_standard_errors_is_undecided_not_absent(tmp_path, adam, spread,
                                                                                    adam_train, expected):
    write_point(tmp_path, "noisy_templates", "template_scale", 0.3, sgd=0.99, adam=adam, spread=spread,
                adam_train=adam_train)
    frame, (point,) = load(tmp_path)
    assert mr.undecided(point) is (expected == "undecided")
    assert mr.collapses(point) is (expected == "at")
    said = {"undecided": "undecided at 0.3", "not": "at none of the settings judged: 0.3",
            "at": "at every setting judged: 0.3"}[expected]
    assert f"along template scale {said};" in mr.where_sentence([point], frame)
    verdict = {"undecided": "undecided", "not": "no", "at": "yes"}[expected]
    assert f"points | {verdict} |" in mr.table_markdown([point], frame)


def test_a_knob_with_all_three_verdicts_names_each_in_its_own_words(tmp_path):
    """The templates' own point collapses, 0.3 is undecided (one seed far off), 1.2 does not collapse."""
    write_point(tmp_path, "noisy_templates", None, None, sgd=0.99, adam=0.80)
    write_point(tmp_path, "noisy_templates", "template_scale", 0.3, sgd=0.99, adam=0.91, spread=0.08)
    write_point(tmp_path, "noisy_templates", "template_scale", 1.2, sgd=0.99, adam=0.985)
    frame, points = load(tmp_path)
    assert ("along template scale at its own (0.6), not at 1.2, undecided at 0.3;"
            in mr.where_sentence(points, frame))


def test_a_mode_gap_shared_by_both_optimizers_is_no_collapse(tmp_path):
    """Fashion-MNIST's reference as measured: both rows lose the same points to stale statistics."""
    for s in (0, 1, 2):
        write_map_run(tmp_path, "fmnist_sgd", s, acc_eval=0.85, acc_train=0.90)
        write_map_run(tmp_path, "fmnist_adam", s, acc_eval=0.85 + 0.001 * s, acc_train=0.90)
    _, (point,) = load(tmp_path)
    assert point.sgd["mode_gap"].mean == pytest.approx(0.05) and mr.collapses(point) is False


def test_the_sentence_says_where_the_collapse_lives_on_each_task(tmp_path):
    write_point(tmp_path, "noisy_templates", None, None, sgd=0.99, adam=0.80)
    write_point(tmp_path, "noisy_templates", "template_scale", 0.3, sgd=0.99, adam=0.70)
    write_point(tmp_path, "noisy_templates", "template_scale", 1.2, sgd=0.99, adam=0.985)
    write_point(tmp_path, "fashion_mnist", None, None, sgd=0.86, adam=0.855)
    write_point(tmp_path, "fashion_mnist", "pixel_noise", 2.0, sgd=0.75, adam=0.60)
    frame, points = load(tmp_path)
    sentence = mr.where_sentence(points, frame)
    assert ("lives on the templates along template scale at 0.3 and its own (0.6), not at 1.2; along train size "
            "not yet run; along num classes not yet run; on Fashion-MNIST along pixel noise at 2, not at its own (0); "
            "along train size not yet run. Both") in sentence  # a knob without a run says so
    # where both optimizers lose to stale statistics (training mode 1.0): Fashion-MNIST's two points, and not the
    # templates', where SGD's mode gap is 1 point
    assert sentence.endswith("Both optimizers' evaluation-mode accuracies fall at least 5 points below their "
                             "training-mode accuracies (each optimizer's mode gap, its mean over seeds more than 2 "
                             "standard errors from zero) on Fashion-MNIST at its own settings "
                             "and along pixel noise at 2 (at 2 with Adam's collapse on top).")
    assert sentence.startswith("Adam's collapse (its evaluation-mode accuracy at least 5 points below SGD's and its "
                               "mode gap at least 5 points above SGD's, each mean more than 2 standard errors from zero")


@pytest.mark.parametrize("sgd, expected", [(0.949, True), (0.951, False)])
def test_stale_for_both_needs_sgds_mode_gap_beyond_the_floor_too(tmp_path, sgd, expected):
    """Adam's mode gap is 20 points either way; SGD's is 5.1 or 4.9 points (training mode 1.0)."""
    write_point(tmp_path, "noisy_templates", "template_scale", 0.15, sgd=sgd, adam=0.80)
    frame, points = load(tmp_path)
    assert mr.stale_for_both(points[0]) is expected
    sentence = mr.where_sentence(points, frame)
    assert ("Both optimizers'" in sentence) is expected
    assert sentence.endswith("At no point judged does each optimizer's mode gap reach 5 points (its evaluation-mode "
                             "accuracy that far below its training-mode accuracy).") is not expected


def test_a_point_with_one_optimizers_runs_alone_is_named_as_not_yet_judged(tmp_path):
    """A map half run: the train-size points have SGD's runs and no Adam's, so the sentence does not let the
    reference point speak for the whole knob."""
    write_point(tmp_path, "noisy_templates", None, None, sgd=0.99, adam=0.80)
    for setting in (1000, 4000):
        for s in (0, 1, 2):
            write_map_run(tmp_path, "sgd", s, knob="train_size", setting=setting, acc_eval=0.99)
    frame, points = load(tmp_path)
    assert ("along train size at every setting judged: its own (fresh samples at every draw), not yet judged at "
            "1,000 and 4,000; along num classes not yet run.") in mr.where_sentence(points, frame)


def test_the_mechanism_reads_each_layers_mean_and_variance_parts(tmp_path):
    """bn2's fresh mean 0.5 running σ off (E = |d| = 0.5, log s = 0), bn1's fresh σ 1.2 times the running σ (E =
    0.2 up to eps, |log s| = log 1.2); the worst layer is bn2, and with shift 0.1 it is bn1."""
    write_map_run(tmp_path, "adam", 0, acc_eval=0.8, shift=0.5, scale_ratio=1.2)
    write_map_run(tmp_path, "adam", 1, acc_eval=0.8, shift=0.1, scale_ratio=1.2)
    frame, _ = load(tmp_path)
    first, second = frame.sort_values("seed").to_dict("records")
    assert (first["worst_layer"], second["worst_layer"]) == ("bn2", "bn1")
    assert first["e"] == pytest.approx(0.5, rel=1e-6) and first["mean_part"] == pytest.approx(0.5, rel=1e-6)
    assert first["var_part"] == pytest.approx(0.0, abs=1e-9)
    assert second["e"] == pytest.approx(0.2, rel=1e-5) and second["var_part"] == pytest.approx(math.log(1.2), rel=1e-6)
    assert first["recovered"] == pytest.approx(0.2)
    # every layer apart: bn1's variance part and bn2's mean part in each run, whichever is the worst
    assert first["e:bn1"] == pytest.approx(0.2, rel=1e-5) and first["var_part:bn1"] == pytest.approx(math.log(1.2))
    assert first["mean_part:bn1"] == pytest.approx(0.0, abs=1e-9) and second["e:bn2"] == pytest.approx(0.1, rel=1e-6)
    table = mr.mechanism_markdown(mr.per_point(frame), frame)
    assert "| bn1: E (\\|d\\|, \\|log s\\|) | bn2: E (\\|d\\|, \\|log s\\|) |" in table
    assert "| the templates | reference | Adam | 0.2σ (0σ, 0.182) | 0.3σ (0.3σ, 0) |" in table  # seeds' means


# ----------------------------------------------------------------------------- refusals
def test_a_run_whose_read_back_setting_is_not_its_names_is_refused(tmp_path):
    write_map_run(tmp_path, "adam", 0, knob="template_scale", setting=0.3, acc_eval=0.9, said=0.6)
    write_map_run(tmp_path, "adam", 1, knob="template_scale", setting=0.3, acc_eval=0.9)
    runs, problems = mr.load_map_runs(tmp_path)
    assert len(runs) == 1 and len(problems) == 1
    assert "seed=0" in problems[0] and "task.template_scale read back as 0.6, the name says 0.3" in problems[0]


def test_a_run_turning_two_knobs_is_refused(tmp_path):
    out = write_map_run(tmp_path, "adam", 0, knob="template_scale", setting=0.3, acc_eval=0.9)
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    cfg["task"]["train_size"] = 1000
    (out / "config.yaml").write_text(yaml.safe_dump(cfg))
    runs, problems = mr.load_map_runs(tmp_path)
    assert not runs and "turns task.template_scale, task.train_size; a map run turns one knob" in problems[0]


def test_a_channels_table_without_the_columns_the_mechanism_reads_is_refused_by_name(tmp_path):
    """``norm_layer`` is not among the channels table's required columns (records.TABLE_COLUMNS); a table without
    it is refused with the run, the table and the column named, and the other run is still read."""
    out = write_map_run(tmp_path, "adam", 0, acc_eval=0.9)
    write_map_run(tmp_path, "adam", 1, acc_eval=0.9)
    path = out / "channels.parquet"
    records.write_table(pd.read_parquet(path).drop(columns="norm_layer"), path, "channels")
    runs, problems = mr.load_map_runs(tmp_path)
    assert [r.seed for r in runs] == [1] and len(problems) == 1
    assert "seed=0" in problems[0] and "channels" in problems[0] and "norm_layer" in problems[0]


# ----------------------------------------------------------------------------- the headline and the command
def test_no_headline_until_the_map_is_complete(tmp_path, monkeypatch):
    small = (cmap.Knob("template_scale", "noisy_templates", (1.2,), "SNR"),)
    for module in (cmap, mr):
        monkeypatch.setattr(module, "KNOBS", small)
    write_point(tmp_path, "noisy_templates", None, None, sgd=0.99, adam=0.80)
    write_point(tmp_path, "fashion_mnist", None, None, sgd=0.86, adam=0.855)
    assert mr.headline(tmp_path) is None  # the knob's point is missing
    write_point(tmp_path, "noisy_templates", "template_scale", 1.2, sgd=0.99, adam=0.985, seeds=(0, 1))
    assert mr.headline(tmp_path) is None  # one seed short
    write_point(tmp_path, "noisy_templates", "template_scale", 1.2, sgd=0.99, adam=0.985, seeds=(2,))
    assert ("lives on the templates along template scale at its own (0.6), not at 1.2; on Fashion-MNIST not at its "
            "own settings.") in mr.headline(tmp_path)


def test_the_front_pages_say_how_much_of_the_map_is_in_until_it_is_complete(tmp_path, monkeypatch):
    """front_line: the run count and no sentence while a seed is missing (the second-to-last run in is not
    enough); the headline, with the map's run count, once the last one is."""
    small = (cmap.Knob("template_scale", "noisy_templates", (1.2,), "SNR"),)
    for module in (cmap, mr):
        monkeypatch.setattr(module, "KNOBS", small)
    assert cmap.runs_in_map() == 18
    assert mr.front_line(tmp_path).startswith("Where the collapse lives: the condition map (`make map`) has 0 of its 18 ")
    write_point(tmp_path, "noisy_templates", None, None, sgd=0.99, adam=0.80)
    write_point(tmp_path, "fashion_mnist", None, None, sgd=0.86, adam=0.855)
    write_point(tmp_path, "noisy_templates", "template_scale", 1.2, sgd=0.99, adam=0.985, seeds=(0, 1))
    line = mr.front_line(tmp_path)
    assert "has 16 of its 18 runs" in line and "lives on" not in line and "refused" not in line
    crashed = tmp_path / "runs" / "map_sgd+reference" / "seed=9"
    crashed.mkdir()  # a folder without DONE: refused, and the front line says so
    assert "has 16 of its 18 runs under" in mr.front_line(tmp_path) and "(1 folder refused" in mr.front_line(tmp_path)
    crashed.rmdir()
    write_point(tmp_path, "noisy_templates", "template_scale", 1.2, sgd=0.99, adam=0.985, seeds=(2,))
    assert mr.front_line(tmp_path) == ("Where the collapse lives, from the condition map's 18 runs: "
                                       + mr.headline(tmp_path))


def test_the_command_writes_map_md_with_the_sentence_block_and_the_figure(tmp_path):
    root, ref = tmp_path / "map", tmp_path / "reference"
    write_point(root, "noisy_templates", None, None, sgd=0.99, adam=0.80)
    write_point(root, "noisy_templates", "train_size", 1000, sgd=0.99, adam=0.97)
    write_point(root, "fashion_mnist", None, None, sgd=0.86, adam=0.855)
    write_point(root, "fashion_mnist", "train_size", 1000, sgd=0.80, adam=0.79)
    for seed in (0, 1):  # the committed runs' stand-in: 0.95 at every check but 0.5 at step 4,000
        write_run(ref, "adam", seed, rotation=5.0, norm_growth=2.0, acc_eval=0.95, lowest=0.5)
    assert mr.main(["--results", str(root), "--reference", str(ref)]) == 0
    text = (root / "map.md").read_text()
    block = text.split(f"<!-- generated by map_report: {mr.SENTENCE_BLOCK} -->\n", 1)[1].split("\n<!-- end -->")[0]
    frame, points = load(root)
    assert block == mr.where_sentence(points, frame)
    assert (root / "map.png").stat().st_size > 0 and (root / "map.pdf").exists()
    # the protocol's evidence: 11 checks to step 3,000 without the dip, 41 in all with it
    assert "| `adam` | 2 | 5.0 points (11 checks) | 0% | 6.1 points (41 checks) | 2% |" in text
    assert "| the templates | – | reference | 3 |" in text and "| the templates | train_size | 1,000 | 3 |" in text
    # the re-estimation column's steps are the interventions in the window (200 and 300), not every check
    assert "where the runner intervenes (steps 200 and 300), not at every check" in text


def test_the_command_refuses_a_root_without_runs(tmp_path, capsys):
    assert mr.main(["--results", str(tmp_path)]) == 2
    assert "no runs/ folder" in capsys.readouterr().err
    assert mr.main(["--results", str(tmp_path), "--sentence"]) == 1


def test_a_partial_map_gets_its_report_and_figure_and_says_it_is_partial(tmp_path):
    """A map committed in batches: the templates' reference point in, one Adam run of a knob's point without its
    SGD twin, Fashion-MNIST's reference with SGD alone (so its train_size column, on a log axis, has no Adam − SGD
    value at all), and the other knobs' columns empty. The report and the figure are
    written, the table counts each row's seeds where they are not paired, and map.md says how many of the map's runs
    it reads."""
    root = tmp_path / "map"
    write_point(root, "noisy_templates", None, None, sgd=0.99, adam=0.80)
    write_map_run(root, "adam", 0, knob="template_scale", setting=0.15, acc_eval=0.7)
    write_map_run(root, "fmnist_sgd", 0, acc_eval=0.86)  # Fashion-MNIST's reference (its train_size axis): SGD only
    write_point(root, "noisy_templates", "template_scale", 1.2, sgd=0.99, adam=0.97)
    assert mr.main(["--results", str(root), "--reference", str(tmp_path / "none")]) == 0
    assert (root / "map.png").stat().st_size > 0
    text = (root / "map.md").read_text()
    assert f"This map is partial: it reads 14 of its {cmap.runs_in_map()} runs." in text
    assert "Spearman's ρ over the 3 points with an Adam run (both tasks;" in text  # not Fashion-MNIST's
    assert "| the templates | template_scale | 0.15 | 0 (SGD 0, Adam 1) |" in text
    assert "| the templates | – | fresh samples at every draw (its own) | 3 |" not in text  # the reference row
    assert "| the templates | – | reference | 3 |" in text


def test_a_whole_map_does_not_call_itself_partial(tmp_path, monkeypatch):
    small = (cmap.Knob("template_scale", "noisy_templates", (1.2,), "SNR"),)
    for module in (cmap, mr):
        monkeypatch.setattr(module, "KNOBS", small)
    root = tmp_path / "map"
    write_point(root, "noisy_templates", None, None, sgd=0.99, adam=0.80)
    write_point(root, "fashion_mnist", None, None, sgd=0.86, adam=0.855)
    write_point(root, "noisy_templates", "template_scale", 1.2, sgd=0.99, adam=0.985)
    assert mr.main(["--results", str(root), "--reference", str(tmp_path / "none")]) == 0
    assert "partial" not in (root / "map.md").read_text()


def _diverge(run_dir: Path, step: int) -> None:
    """Mark a finished run as the runner marks one whose loss went non-finite at ``step`` (its rows before kept)."""
    info = json.loads((run_dir / "run.json").read_text())
    info.update(status="diverged", diverged_at_step=step)
    (run_dir / "run.json").write_text(json.dumps(info))


def _small_map(monkeypatch, settings=(1.2,)):
    small = (cmap.Knob("template_scale", "noisy_templates", settings, "SNR"),)
    for module in (cmap, mr):
        monkeypatch.setattr(module, "KNOBS", small)


def _whole_small_map_but_adam_seed_2(root: Path) -> Path:
    """Every run of :func:`_small_map`'s map but Adam seed 2 at template_scale 1.2, which is written last, at 0.6 at
    every check, and returned (to be marked diverged)."""
    write_point(root, "noisy_templates", None, None, sgd=0.99, adam=0.80)
    write_point(root, "fashion_mnist", None, None, sgd=0.86, adam=0.855)
    write_point(root, "noisy_templates", "template_scale", 1.2, sgd=0.99, adam=0.985, seeds=(0, 1))
    write_map_run(root, "sgd", 2, knob="template_scale", setting=1.2, acc_eval=0.99)
    return write_map_run(root, "adam", 2, knob="template_scale", setting=1.2, acc_eval=0.6)


def test_a_diverged_run_is_left_out_of_every_figure_counts_toward_the_whole_map_and_is_named(tmp_path, monkeypatch):
    """Adam seed 2 at template_scale 1.2 diverges after the first check (its first check kept, at 0.6): its
    figures are left out (the point's Adam mean is that of seeds 0 and 1), its seed still counts toward the whole
    map (the headline is written, not held back for good), and map.md's table names it."""
    _small_map(monkeypatch)
    root = tmp_path / "map"
    _diverge(_whole_small_map_but_adam_seed_2(root), 250)
    frame, points = load(root)
    point = next(p for p in points if p.point.knob)
    assert point.adam["acc_eval_mode"].n == 2 and point.adam["acc_eval_mode"].mean == pytest.approx(0.984)
    assert point.deficit.n == 2 and mr.seeds_in(point) == 3
    assert point.diverged == ("Adam seed 2 (step 250)",)
    assert mr.headline(root) is not None
    assert mr.front_line(root).startswith("Where the collapse lives, from the condition map's 18 runs:")
    runs, _ = mr.load_map_runs(root)
    text = mr.report_text(runs)
    assert "| the templates | template_scale | 1.2 | 2 (Adam seed 2 (step 250) diverged) |" in text
    assert "partial" not in text


def test_a_diverged_run_before_the_first_check_does_not_hold_the_sentence_back_for_good(tmp_path, monkeypatch):
    _small_map(monkeypatch)
    root = tmp_path / "map"
    run = _whole_small_map_but_adam_seed_2(root)
    for table in ("checks", "interventions"):  # nothing in the window: stopped at step 150
        frame = pd.read_parquet(run / f"{table}.parquet")
        records.write_table(frame.iloc[0:0], run / f"{table}.parquet", table)
    _diverge(run, 150)
    assert mr.headline(root) is not None


def test_runs_off_the_sweep_do_not_stand_in_for_a_missing_point(tmp_path, monkeypatch):
    """The sweep's point template_scale 1.2 never ran; three seeds of both rows at 0.3 (not in the sweep) bring the
    run count to the map's. No headline, and map.md calls itself partial."""
    _small_map(monkeypatch)
    root = tmp_path / "map"
    write_point(root, "noisy_templates", None, None, sgd=0.99, adam=0.80)
    write_point(root, "fashion_mnist", None, None, sgd=0.86, adam=0.855)
    write_point(root, "noisy_templates", "template_scale", 0.3, sgd=0.99, adam=0.80)
    assert len(mr.load_map_runs(root)[0]) == cmap.runs_in_map()
    assert mr.headline(root) is None
    assert "has 18 of its 18 runs" not in mr.front_line(root) and "lives on" not in mr.front_line(root)
    assert "This map is partial" in mr.report_text(mr.load_map_runs(root)[0])


def test_a_setting_read_back_a_rounding_away_is_the_sweeps_point(tmp_path):
    root = tmp_path / "map"
    write_point(root, "noisy_templates", "template_scale", 0.15, sgd=0.99, adam=0.80, seeds=(0, 1))
    write_point(root, "noisy_templates", "template_scale", 0.15 + 1e-12, sgd=0.99, adam=0.80, seeds=(2,))
    frame, points = load(root)
    assert [(p.point.setting, p.deficit.n) for p in points] == [(0.15, 3)]


def test_the_sentence_speaks_of_a_task_whose_reference_point_alone_is_in(tmp_path):
    """A map half run with both reference points in and no knob's point: the sentence says where the collapse is at
    each task's own settings, not that the map has no point."""
    root = tmp_path / "map"
    write_point(root, "noisy_templates", None, None, sgd=0.99, adam=0.80)
    write_point(root, "fashion_mnist", None, None, sgd=0.86, adam=0.855)
    frame, points = load(root)
    assert ("lives on the templates at its own settings; along template scale not yet run; along train size not yet "
            "run; along num classes not yet run; on Fashion-MNIST not at its own settings; along pixel noise not yet "
            "run; along train size not yet run. Both") in mr.where_sentence(points, frame)


def test_the_figure_labels_the_templates_fresh_samples_and_fashion_mnists_own_set_apart(tmp_path, monkeypatch):
    """The train-size panels: the templates' own point (an infinite set, placed beyond the largest setting) is
    labelled ∞ (fresh), Fashion-MNIST's own point its 60,000 images, never "fresh"."""
    from bnrotation.study.analysis.tables import figures

    for task in ("noisy_templates", "fashion_mnist"):
        write_point(tmp_path, task, None, None, sgd=0.99, adam=0.80)
        write_point(tmp_path, task, "train_size", 1000, sgd=0.99, adam=0.97)
    frame, points = load(tmp_path)
    saved = []
    monkeypatch.setattr(figures, "save", lambda fig, *a, **k: saved.append(fig))
    mr.figure(points, frame, tmp_path / "map.png")
    labels = {}
    for j, knob in enumerate(mr.KNOBS):
        ax = saved[0].axes[len(mr.KNOBS) + j]  # the bottom row shares the top row's ticks
        labels[knob.name] = [t.get_text() for t in ax.get_xticklabels()]
    assert labels["noisy_templates.train_size"][-1] == "∞ (fresh)"
    assert labels["fashion_mnist.train_size"][-1] == "60,000"
    assert not any("fresh" in t for t in labels["fashion_mnist.train_size"])


def test_the_protocol_evidence_counts_checks_by_mode_gap_so_real_images_training_mode_is_not_a_loss(tmp_path):
    """Fashion-MNIST's rows at training mode 90%: evaluation mode 85% at every check is a 5-point gap, not a check
    that loses 10 points (the old "below 90%" counted every one); the templates' Adam dips to 50% at step 4,000
    alone. The closing sentence reads the contrast: 5 points on the templates (at the floor), 0 on real images."""
    ref = tmp_path / "reference"
    for seed in (0, 1):
        write_run(ref, "sgd", seed, rotation=1.0, norm_growth=1.0, acc_eval=0.99)
        write_run(ref, "adam", seed, rotation=5.0, norm_growth=2.0, acc_eval=0.94, lowest=0.5)
        for row in ("fmnist_sgd", "fmnist_adam"):
            write_run(ref, row, seed, rotation=1.0, norm_growth=1.0, acc_eval=0.85, acc_train=0.90,
                      task="fashion_mnist")
    text = mr.protocol_evidence(ref)
    assert "| `fmnist_sgd` | 2 | 5.0 points (11 checks) | 0% | 5.0 points (41 checks) | 0% |" in text
    assert "| `adam` | 2 | 6.0 points (11 checks) | 0% |" in text and "(41 checks) | 2% |" in text
    assert text.endswith("Adam's mode gap on the templates is 5.0 points above SGD's, and Fashion-MNIST's two rows "
                         "are 0.0 points apart: the cut keeps the contrast the map looks for (at least 5 points on "
                         "the templates, less on real images).")


def test_a_runs_cost_is_read_from_run_json_leaving_resumed_runs_out(tmp_path):
    """Two runs timed start to end (100 s and 300 s, training 50 and 150 s) and one resumed (999 s: not one run's
    time); the median is 200 s, training half of it; the runs still to come are the map's less the three."""
    for seed, (wall, train, resumed) in enumerate([(100.0, 50.0, False), (300.0, 150.0, False), (999.0, 1.0, True)]):
        out = write_map_run(tmp_path, "adam", seed, acc_eval=0.9)
        info = json.loads((out / "run.json").read_text())
        info.update(wall_seconds=wall, timings_s={"train": train}, threads=1,
                    **({"resumes": [{"at_step": 100}]} if resumed else {}))
        (out / "run.json").write_text(json.dumps(info))
    runs, _ = mr.load_map_runs(tmp_path)
    text = mr.cost_markdown(runs)
    assert "| the templates | 2 | 200 s (100–300 s) | 50% | 1 |" in text
    assert "Fashion-MNIST" not in text
    left = cmap.runs_in_map() - 3
    assert f"{left} runs still to come: about {left * 200 / 3600:.1f} hours at each task's median" in text


def test_the_maps_reference_points_are_set_beside_the_committed_runs_of_the_same_seeds(tmp_path):
    """Committed Adam seeds 0-2 at 95% to step 3,000 (seed 3 at 10%, not a map seed, left out), the map's Adam at
    its own setting 80%: the sentence gives both; no SGD committed runs, so no SGD pair; nothing without the map's
    reference points."""
    ref = tmp_path / "reference"
    for seed in (0, 1, 2):
        write_run(ref, "adam", seed, rotation=5.0, norm_growth=2.0, acc_eval=0.95)
    write_run(ref, "adam", 3, rotation=5.0, norm_growth=2.0, acc_eval=0.10)
    root = tmp_path / "map"
    write_point(root, "noisy_templates", None, None, sgd=0.99, adam=0.80)
    _, points = load(root)
    text = mr.draw_comparison(ref, points)
    assert "`adam` 95.0% committed against 80.0% in the map." in text and "`sgd`" not in text
    assert text.startswith("The same seeds (0–2), evaluation-mode accuracy over the checks to step 3,000")
    assert mr.draw_comparison(ref, [p for p in points if p.point.knob is not None]) == ""
    assert "by chance" not in text


def test_a_map_figure_that_repeats_the_committed_whole_window_figure_is_called_a_coincidence(tmp_path):
    """Committed Adam seeds 0-2 at 95% and seed 3 at 15%: over all four seeds and the whole window 75.0%, which the
    map's Adam repeats at this rounding (another quantity); the map's SGD at 99% has no committed twin."""
    ref = tmp_path / "reference"
    for seed, acc in ((0, 0.95), (1, 0.95), (2, 0.95), (3, 0.15)):
        write_run(ref, "adam", seed, rotation=5.0, norm_growth=2.0, acc_eval=acc)
    root = tmp_path / "map"
    write_point(root, "noisy_templates", None, None, sgd=0.99, adam=0.75)
    _, points = load(root)
    text = mr.draw_comparison(ref, points)
    assert "`adam` 95.0% committed against 75.0% in the map." in text
    assert text.endswith(" In the map, `adam`'s 75.0% (and so its mode gap, 25.0 points) equals, at this "
                         "rounding, the committed runs' figure over all their 4 seeds and the whole window (the front "
                         "pages'): another quantity, the same digits by chance.")
