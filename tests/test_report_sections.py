"""The report's sections (analysis/claims/front.py) and their one renderer (analysis/report): each front-page
table pinned cell by cell on a few hand-made runs where a wrong definition gives another cell, and every
generated sentence at most 30 words."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from bnrotation import records
from bnrotation.study.analysis.claims import outofsample
from bnrotation.study.analysis.claims.kinds import ARTICLE, CALIBRATION, FAIL, MAP, NOT_RUN, PASS, Check
from bnrotation.study.analysis.claims import front
from bnrotation.study.analysis.report.section import (MAX_WORDS, Column, Section, anchor, sentences, shown, to_html,
                                                      to_latex, to_markdown, words)
from bnrotation.study.analysis.tables import map_report
from test_analysis import _load, write_run

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = (ROOT / "docs" / "PROTOCOL.md").read_text()


def _section(columns=(Column("acc", "Accuracy", "Checks", "pct", 1, sd="sd"), Column("name", "Name", "Checks")),
             caption="A caption."):
    return Section("Title", lambda frame: frame, caption, columns)


# ----------------------------------------------------------------------------- the renderer
def test_a_cell_is_rounded_once_when_rendered_and_a_difference_from_unrounded_values():
    """90.03% - 85.45% is 4.58 points, printed 4.6, not 90.0 - 85.5 = 4.5; the frame keeps the unrounded value."""
    gap = Column("gap", "Mode gap", "Measured quantities", "pct", 1, difference=True)
    frame = pd.DataFrame({"gap": [0.9003 - 0.8545]})
    section = _section((gap,))
    assert shown(section, frame).iloc[0, 0] == "4.6 points"
    assert frame["gap"].iloc[0] == pytest.approx(0.0458)
    # a difference with its spread over seeds: in points, the spread after it, no % on the value
    spread_gap = Column("gap", "Mode gap", "Measured quantities", "pct", 1, sd="gap_sd", difference=True)
    frame = pd.DataFrame({"gap": [0.283, 0.2], "gap_sd": [0.101, math.nan]})
    assert list(shown(_section((spread_gap,)), frame).iloc[:, 0]) == ["28.3 ± 10.1 points", "20.0 points"]


def test_markdown_latex_and_html_render_the_same_cells():
    frame = pd.DataFrame({"acc": [0.9003, 0.05], "sd": [0.0123, math.nan], "name": ["a|b", None]})
    md = to_markdown(_section(), frame)
    assert md.splitlines()[0] == "**Title.** A caption."
    assert "| [Accuracy](docs/PROTOCOL.md#checks) | [Name](docs/PROTOCOL.md#checks) |" in md
    assert "|---:|---|" in md
    assert "| 90.0% ± 1.2 | a\\|b |" in md and "| 5.0% | – |" in md  # a literal | escaped, no sd left out
    tex = to_latex(_section(), frame)
    assert all(rule in tex for rule in ("\\toprule", "\\midrule", "\\bottomrule"))  # booktabs
    assert "90.0\\% ± 1.2 & a|b \\\\" in tex and "\\caption{Title. A caption.}" in tex
    assert "\\texttt{adam\\_bn}" in to_latex(_section(), frame.assign(name=["`adam_bn`", "x"]))
    html = to_html(_section(), frame.assign(name=["<b>", "x"]))
    assert "<caption>Title. A caption.</caption>" in html and "&lt;b&gt;" in html and ">90.0% ± 1.2<" in html


def test_a_section_without_rows_says_so_and_one_without_columns_or_with_a_long_caption_is_refused():
    empty = pd.DataFrame(columns=["acc", "sd", "name"])
    assert to_markdown(_section(), empty).rstrip().endswith("No runs yet.")
    with pytest.raises(ValueError, match="no column"):
        _section(columns=())
    with pytest.raises(ValueError, match="a caption of 31 words"):
        _section(caption=" ".join(["word"] * 31))
    _section(caption=" ".join(["word"] * MAX_WORDS))  # the limit itself is allowed


def test_every_front_column_links_a_heading_of_the_protocol():
    headings = {anchor(h) for h in re.findall(r"^#+ (.+)$", PROTOCOL, re.M)}
    for section in front.FRONT:
        assert set(section.legend) == {c.header for c in section.columns}
        for header, link in section.legend.items():
            assert link.split("#", 1)[1] in headings, (section.title, header, link)
    assert anchor("The published table (steps 2,000–6,000, 3 seeds)") == "the-published-table-steps-20006000-3-seeds"


def test_sentences_are_split_where_they_end_and_counted_by_words():
    assert sentences("**Title.** Adam, lr 3e-3. Re-estimation at 0.5 points? `x` too.") == [
        "**Title.**", "Adam, lr 3e-3.", "Re-estimation at 0.5 points?", "`x` too."]
    assert words("In 94 runs, Adam's evaluation mode") == 6


# ----------------------------------------------------------------------------- the article's rows
def _diverge(root: Path, row: str, seed: int) -> None:
    path = records.run_dir(root, row, seed) / "run.json"
    info = json.loads(path.read_text())
    path.write_text(json.dumps(info | {"status": "diverged"}))


def test_the_row_table_counts_finished_runs_and_takes_the_mode_gap_from_unrounded_means(tmp_path):
    """Adam: seeds 0-1 finished, seed 2 diverged (left out of the means, named in the cell); SGD: the sweep's seeds
    and seed 7 outside it (counted, averaged in); the mode gap from the means before rounding."""
    for seed, acc in ((0, 0.8545), (1, 0.8545), (2, 0.10)):
        write_run(tmp_path, "adam", seed, rotation=7.0, norm_growth=5.0, acc_eval=acc, acc_train=0.9003)
    _diverge(tmp_path, "adam", 2)
    for seed, acc in ((0, 0.99), (1, 0.98), (2, 0.97), (7, 0.50)):
        write_run(tmp_path, "sgd", seed, rotation=0.4, norm_growth=1.1, acc_eval=acc)
    table = front.row_table(_load(tmp_path), ("sgd", "adam", "adamw")).set_index("row")
    adam, sgd = table.loc["Adam, lr 3e-3 (`adam`)"], table.loc["SGD, lr 0.05, momentum 0.9 (`sgd`)"]
    assert adam["seeds"] == "0, 1 (2; to run: seeds 3–9); diverged: seed 2"  # adam runs ten seeds
    assert adam["acc_eval_mode"] == pytest.approx(0.8545) and adam["acc_eval_mode_sd"] == pytest.approx(0.0)
    assert adam["mode_gap"] == pytest.approx(0.0458)
    assert sgd["seeds"] == "0–2, 7 (4; to run: seeds 3–6, 8, 9)"
    assert sgd["acc_eval_mode"] == pytest.approx((0.99 + 0.98 + 0.97 + 0.50) / 4)
    assert list(table.index) == ["SGD, lr 0.05, momentum 0.9 (`sgd`)", "Adam, lr 3e-3 (`adam`)"]  # no adamw run
    cells = shown(front.ARTICLE_SECTION, table.reset_index()).set_index("Row")
    assert cells.loc["Adam, lr 3e-3 (`adam`)", "Mode gap"] == "4.6 points"
    assert cells.loc["Adam, lr 3e-3 (`adam`)", "Evaluation mode"] == "85.5% ± 0.0"
    assert cells.loc["Adam, lr 3e-3 (`adam`)", "Published"] == "60.0%"
    assert cells.loc["Adam, lr 3e-3 (`adam`)", "Published rotation"] == "7.73°"


def test_the_row_table_leaves_re_estimation_empty_for_the_row_that_logged_none(tmp_path):
    """One of two rows recovered: the row whose runs logged no re-estimation reads '–', the other its last one."""
    for seed in (0, 1, 2):
        write_run(tmp_path, "adam", seed, rotation=7.0, norm_growth=5.0, acc_eval=0.7, reestimated=0.95)
        write_run(tmp_path, "sgd", seed, rotation=0.4, norm_growth=1.1, acc_eval=0.99)
        path = records.run_dir(tmp_path, "sgd", seed) / "interventions.parquet"
        iv = pd.read_parquet(path)
        records.write_table(iv[iv["intervention"] != "reestimate"], path, "interventions")
    cells = shown(front.ARTICLE_SECTION, front.row_table(_load(tmp_path), ("sgd", "adam"))).set_index("Row")
    assert cells.loc["Adam, lr 3e-3 (`adam`)", "Re-estimated"] == "95.0%"
    assert cells.loc["SGD, lr 0.05, momentum 0.9 (`sgd`)", "Re-estimated"] == "–"


def test_no_runs_give_an_empty_row_table():
    assert front.row_table([], ("sgd", "adam")).empty


# ----------------------------------------------------------------------------- where the collapse lives
def _point(task, knob, setting, sgd, adam, seeds=(0, 1, 2), train=1.0):
    """Map runs of one point: per seed SGD's and Adam's evaluation-mode accuracies (``sgd``, ``adam``: one value
    per seed, None for a seed without that run), training mode ``train``."""
    lines = []
    for optimizer, accs in (("sgd", sgd), ("adam", adam)):
        for seed, acc in zip(seeds, accs):
            if acc is None:
                continue
            lines.append({"task": task, "knob": knob, "setting": setting, "optimizer": optimizer, "seed": seed,
                          "diverged": False, "diverged_at_step": None, "train_set": math.inf,
                          "acc_eval_mode": acc, "acc_train_mode": train, "mode_gap": train - acc,
                          **{c: 0.0 for c in map_report.COLUMNS if c not in ("acc_eval_mode", "acc_train_mode",
                                                                             "mode_gap")}})
    return lines


T, SCALE_KNOB, CLASSES = "noisy_templates", "noisy_templates.template_scale", "noisy_templates.num_classes"


def test_each_setting_of_a_knob_is_marked_by_the_map_s_rules():
    """The templates' own point and 0.3 collapse (0.3 with both stale too), 1.2 is no, 0.15 has one Adam run
    unfinished (2 of 3 seeds), 5 classes is undecided (seeds that disagree), and a seed outside the sweep (7) does
    not make 20 classes whole."""
    frame = pd.DataFrame(
        _point(T, None, math.nan, (0.99, 0.98, 1.0), (0.70, 0.60, 0.75))
        + _point(T, SCALE_KNOB, 0.3, (0.60, 0.65, 0.62), (0.30, 0.25, 0.35))
        + _point(T, SCALE_KNOB, 1.2, (1.0, 1.0, 1.0), (1.0, 0.99, 1.0))
        + _point(T, SCALE_KNOB, 0.15, (0.99, 0.99, 0.99), (0.50, 0.60, None))
        + _point(T, CLASSES, 5.0, (1.0, 1.0, 1.0), (0.60, 1.0, 1.0))
        + _point(T, CLASSES, 20.0, (1.0, 1.0, 1.0), (0.99, 0.99, 0.99), seeds=(0, 1, 7)))
    table = front.collapse_by_knob(frame).set_index("knob")
    scale, classes = table.loc["template scale"], table.loc["num classes"]
    assert scale["collapse"] == "0.15 (2 of 3 seeds), 0.3, 0.6 (own)"
    assert scale["both stale"] == "0.3" and scale["no"] == "1.2" and scale["undecided"] == ""
    assert classes["undecided"] == "5" and classes["collapse"] == "10 (own)"
    assert classes["no"] == "20 (2 of 3 seeds)"
    assert list(table.index) == ["template scale", "num classes"]  # knobs without a run are left out
    cells = shown(front.MAP_SECTION, table.reset_index()).set_index("Knob")
    assert cells.loc["template scale", "Undecided"] == "–"


def test_a_point_with_one_row_only_is_pending_and_no_runs_give_no_line():
    frame = pd.DataFrame(_point(T, None, math.nan, (0.99, 0.98, 1.0), (0.70, 0.60, 0.75))
                         + _point(T, SCALE_KNOB, 0.3, (0.60, 0.65, 0.62), (None, None, None)))
    assert front.collapse_by_knob(frame).set_index("knob").loc["template scale", "pending"] == "0.3 (0 of 3 seeds)"
    assert front.collapse_by_knob(pd.DataFrame()).empty


# ----------------------------------------------------------------------------- the verdicts
def _check(name, verdict, section=ARTICLE):
    return Check(name, "claim", "–", "–", "–", verdict, section=section)


def test_the_verdicts_count_each_section_and_set_superseded_claims_apart():
    """A superseded claim (scored on the truth's own gap) counts under superseded, not under its PASS."""
    old, new = next(iter(outofsample.SUPERSEDED.items()))
    checks = [_check("a", PASS), _check("b", FAIL), _check(old, PASS, CALIBRATION), _check(new, FAIL, CALIBRATION),
              _check("m", NOT_RUN, MAP)]
    cells = [("adam", "acc", _check("adam:acc", PASS))]
    table = front.verdict_table(checks, cells).set_index("section")
    assert table.loc["The article's claims", [PASS, FAIL]].tolist() == [1, 1]
    assert table.loc[front.TABLE_CELLS_SECTION, PASS] == 1
    rule = table.loc["The monitor's rule out of sample"]
    assert (rule[PASS], rule[FAIL], rule["superseded"]) == (0, 1, 1)
    assert table.loc["Where does the collapse live? The condition map", NOT_RUN] == 1
    assert "Does it carry over? ResNet-20" not in table.index  # a section without a check has no line
    bare = front.verdict_table([], []).set_index("section")
    assert list(bare.index) == ["The article's claims"] and bare.iloc[0].sum() == 0


# ----------------------------------------------------------------------------- the README's first screen
def test_every_generated_sentence_of_the_readme_has_at_most_30_words():
    """Every sentence make claims writes into the README outside a table row: the opening, each section's title
    and caption, a table's 'No runs yet.'."""
    from bnrotation.study.analysis.claims import BLOCK
    readme = (ROOT / "README.md").read_text()
    said = [s for m in BLOCK.finditer(readme) for line in m["text"].splitlines()
            if line and not line.startswith("|") for s in sentences(line)]
    assert len(said) >= 1 + 2 * len(front.FRONT)  # the opening, then a title and a caption per table
    long = [s for s in said if words(s) > MAX_WORDS]
    assert not long, long
    opening = readme.split("<!-- generated by make claims:")[0].split("\n\n", 1)[1]  # the typed sentence above
    assert len(sentences(opening)) == 1 and words(opening) <= MAX_WORDS


def test_no_front_table_has_more_than_ten_rows():
    from bnrotation.study.analysis.claims import BLOCK
    readme = (ROOT / "README.md").read_text()
    for m in BLOCK.finditer(readme):
        rows = [ln for ln in m["text"].splitlines() if ln.startswith("|")][2:]
        assert len(rows) <= 10, m["name"]


def test_the_readme_s_row_cells_are_table_md_s():
    """One number, one source: each accuracy and rotation the README's row tables print is the cell table.md prints
    for the same row (both from build_table), the published figure beside it the same too."""
    from bnrotation.study.analysis.claims import BLOCK
    readme = {m["name"]: m["text"] for m in BLOCK.finditer((ROOT / "README.md").read_text())}
    table_md = (ROOT / "results" / "reference" / "table.md").read_text().splitlines()
    head = next(ln for ln in table_md if ln.startswith("| Row |"))
    columns = [c.strip() for c in head.strip("|").split("|")]
    lines = {cells[0]: dict(zip(columns, cells)) for ln in table_md if ln.startswith("| ") and ln != head
             for cells in [[c.strip() for c in ln.strip().strip("|").split(" | ")]]}
    pairs = {"Training mode": "Training-mode accuracy", "Evaluation mode": "Evaluation-mode accuracy",
             "Rotation per 100 steps": "Rotation per 100 steps"}
    compared = 0
    for block in ("rows", "images"):
        rows = [ln for ln in readme[block].splitlines() if ln.startswith("| ")]
        headers = [re.sub(r"\[(.*?)\]\(.*?\)", r"\1", c).strip() for c in rows[0].strip("|").split(" | ")]
        for ln in rows[1:]:
            got = dict(zip(headers, (c.strip() for c in ln.strip().strip("|").split(" | "))))
            want = lines[got["Row"]]
            for ours, theirs in pairs.items():
                measured, _, published = want[theirs].partition(" [")
                assert got[ours] == measured, (got["Row"], ours)
                if ours == "Evaluation mode":
                    assert got["Published"] == (published.rstrip("]") or "–"), got["Row"]
                compared += 1
    assert compared == 3 * 14  # seven rows on each task
