"""The finding said once and shown the same everywhere, a verdict for a claim whose premise fails, and a mode-gap
column that means the same on both tasks (issue 51)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bnrotation.study.analysis import claims, webpage
from bnrotation.study.analysis.claims import evidence, kinds, real_images, report
from bnrotation.study.analysis.claims.command import console_summary, results_blocks
from bnrotation.study.analysis.claims.finding import finding, findings
from bnrotation.study.analysis.formatting import cell
from bnrotation.study.analysis.measures import metrics
from bnrotation.study.analysis.tables import table

from test_analysis import _load, write_replication, write_run
from test_real_images import F, PASSING, write_fmnist

QUICK_LOOK = (F["sgd"], F["adam"], F["adam_bn_m0.3"])  # the rows of SET=fashion_mnist_quick


def _weighed(root: Path):
    ev = evidence.collect(root, _load(root))
    return ev, [c.check(ev) for c in real_images.CHECKS]


@pytest.fixture(scope="module")
def real_only(tmp_path_factory) -> Path:
    """The real-image quick look's three rows and nothing else, where SGD falls further than Adam in the mean while
    Adam's lowest check is the lowest: the console must not rank them the other way round."""
    root = tmp_path_factory.mktemp("real_only")
    for seed in (0, 1):
        write_run(root, F["sgd"], seed, task="fashion_mnist", rotation=0.5, norm_growth=2.0, acc_eval=0.82,
                  acc_train=0.88, lowest=0.76)
        write_run(root, F["adam"], seed, task="fashion_mnist", rotation=8.0, norm_growth=2.0, acc_eval=0.85,
                  acc_train=0.88, lowest=0.73)
        write_run(root, F["adam_bn_m0.3"], seed, task="fashion_mnist", rotation=8.0, norm_growth=2.0, acc_eval=0.87,
                  acc_train=0.88)
    return root


def test_the_real_image_quick_look_ends_with_its_finding(real_only):
    """Only Fashion-MNIST rows: the console still ends with a finding, on Fashion-MNIST, and each row's line
    gives its evaluation-mode mean as table.md does, so the lines rank SGD below Adam as the table does."""
    ev, checks = _weighed(real_only)
    lines = console_summary(ev, checks)
    assert lines[-1].startswith("finding: On Fashion-MNIST (real images), Adam, lr 3e-3 (`fmnist_adam`) loses ")
    assert "SGD, lr 0.05, momentum 0.9 (`fmnist_sgd`) loses more" in lines[-1]
    rows = table.build_table(ev.runs).set_index("row")
    for row in QUICK_LOOK:
        (line,) = [ln for ln in lines if ln.split()[:1] == [row]]
        assert f"evaluation mode {cell(rows.loc[row, 'acc_eval_mode_mean'], 'pct')}" in line, line


def test_a_findings_numbers_add_up_and_compare_the_gaps(real_only):
    """The points lost are the difference of the two percentages the sentence shows; "more" because SGD's gap
    is larger than Adam's by far more than two standard errors."""
    sentence = finding(_weighed(real_only)[0], "fashion_mnist")
    said = re.findall(r"loses (?:\w+ ?\w*, )?([\d.]+) points, from training mode's ([\d.]+)% to evaluation mode's "
                      r"([\d.]+)%", sentence)
    assert len(said) == 3  # Adam, SGD, the window test
    for points, train, evaluation in said:
        assert float(points) == pytest.approx(float(train) - float(evaluation), abs=1e-9)
    assert finding(_weighed(real_only)[0], "noisy_templates") == ""  # no `adam` row: nothing said about it


def test_the_same_sentences_in_the_console_claims_md_the_readme_and_the_page(tmp_path):
    """One sentence per task, written once: the console's finding lines, claims.md, docs/results.md's headline and the
    write-up page's first paragraph hold the same sentences, the templates' first."""
    root = write_fmnist(write_replication(tmp_path, rows=("sgd", "adam", "adam_bn_m0.3")),
                        {row: PASSING[row] for row in QUICK_LOOK})
    ev, checks, cells = claims.weigh(root, _load(root))
    sentences = findings(ev)
    assert len(sentences) == 2 and sentences[0].startswith("On the synthetic task") \
        and sentences[1].startswith("On Fashion-MNIST")
    assert [ln.removeprefix("finding: ") for ln in console_summary(ev, checks) if ln.startswith("finding: ")] \
        == sentences
    md = report.to_markdown(ev, checks, cells)
    headline = results_blocks(ev, checks, cells)["headline"]  # docs/results.md's, once the README's
    page = webpage.finding(ev)
    for sentence in sentences:
        assert sentence in md and sentence in headline and webpage.inline(sentence) in page


def test_a_claim_whose_premise_fails_is_not_called_not_run(tmp_path):
    """Adam loses nothing against SGD: the runs are there, so the window test's share is PRECONDITION FAILED, not
    NOT RUN, and claims.md's legend says what each word means."""
    rows = {row: dict(PASSING[row], acc_eval=0.90) for row in (F["sgd"], F["adam"], F["adam_bn_m0.3"])}
    root = write_fmnist(tmp_path, rows)
    ev, _ = _weighed(root)
    check = real_images.fmnist_window_test_recovers_most_accuracy.check(ev)
    assert check.verdict == kinds.PRECONDITION_FAILED == "PRECONDITION FAILED"
    assert "nothing lost to recover" in check.measured
    assert report.verdict_counts([check]) == "0 PASS, 0 FAIL, 0 NOT RUN, 1 PRECONDITION FAILED"
    md, _ = claims.build_report(root, _load(root))
    assert "NOT RUN: the runs the check needs are missing, or too few to weigh" in md
    assert "PRECONDITION FAILED: the runs exist, but what the claim presupposes does not hold on them" in md
    kinds.withhold_verdicts([check])  # below the article's scale nothing is judged, the premise included
    assert check.verdict == kinds.NOT_JUDGED and "PRECONDITION FAILED" in check.note


def test_the_mode_gap_column_counts_checks_trailing_their_own_training_mode(tmp_path):
    """Training mode at 100%: the column counts what "Checks below 90%" counts. Training mode at 88% (real images):
    every check is below 90%, and only those more than 10 points below 88% count; a gap of exactly 10 points
    does not."""
    write_run(tmp_path, "adam", 0, rotation=7.0, norm_growth=6.0, acc_eval=0.95, acc_train=1.0, lowest=0.5)
    write_run(tmp_path, F["adam"], 0, task="fashion_mnist", rotation=7.0, norm_growth=6.0, acc_eval=0.85,
              acc_train=0.88, lowest=0.70)
    write_run(tmp_path, F["sgd"], 0, task="fashion_mnist", rotation=0.5, norm_growth=2.0, acc_eval=0.78,
              acc_train=0.88)
    runs = {r.row: r for r in _load(tmp_path)}
    n = metrics.checks_below(runs["adam"])[1]
    assert metrics.checks_gap_over(runs["adam"]) == metrics.checks_below(runs["adam"]) == (1, n)
    assert metrics.checks_below(runs[F["adam"]]) == (n, n) and metrics.checks_gap_over(runs[F["adam"]]) == (1, n)
    assert metrics.checks_gap_over(runs[F["sgd"]]) == (0, n)  # 88% − 78%: exactly 10 points
    lines = table.build_table(list(runs.values())).set_index("row")
    assert lines.loc[F["adam"], "checks_gap_over_10_mean"] == pytest.approx(1 / n)
    assert "| Checks with a mode gap over 10 points |" in table.to_markdown(lines.reset_index(), tmp_path)
