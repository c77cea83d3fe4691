"""``claims.md`` as markdown: the summary, every check, the table cell by cell, theory and findings (no torch).

Rendering only: the checks come from :mod:`.registry` weighed by
:mod:`.kinds`, the findings from :mod:`.findings`.
"""

from __future__ import annotations

import numpy as np

from ...article import FAIL_BELOW
from ...rows import PUBLISHED_SEEDS, row_order
from ..formatting import cell, schema_versions, seed_ranges
from ..measures import metrics, theory
from ..results import count, scale_note
from .evidence import Evidence
from .finding import findings as task_findings
from .findings import findings
from .kinds import (ALPHA, ARTICLE, CALIBRATION, FAIL, FASHION_MNIST, FROZEN, MAP, MEASURED, WHY, NOT_JUDGED, NOT_RUN,
                    PASS, PRECONDITION_FAILED, RESNET, Z, Check)


def md_cell(text: str) -> str:
    """Text for a markdown table cell: a literal | would end the cell."""
    return str(text).replace("|", "\\|")


def label(c: Check) -> str:
    """A check's name as headings and summaries show it, marked when it is exploratory (no verdict)."""
    return f"`{c.name}`" + (" *(exploratory)*" if c.exploratory else "")


def check_block(c: Check) -> list[str]:
    """One check as a section: verdict, claim, published, measured, tolerance and note."""
    return [f"### {label(c)}: {c.verdict}\n", f"{c.claim}\n", f"- Published: {c.published}",
            f"- Measured: {c.measured}", f"- Tolerance: {c.tolerance}"] + ([f"- Note: {c.note}"] if c.note else []) \
        + [""]


def theory_lines(ev: Evidence) -> list[str]:
    """Per row, the rotational-equilibrium prediction (:func:`..measures.theory.predict`) beside the measured rotation."""
    lines = ["| Row | Prediction | Per step | Net per 100 steps (random walk) | Summed over 100 steps | "
             "Measured per 100 steps | Equilibrium norm per channel, predicted / measured at the end |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for row in sorted(ev.per_run["row"].unique(), key=row_order):
        run = ev.runs_of(row)[0]
        fan_in = metrics.last_conv_fan_in(run)
        last = metrics.last_conv(run)
        pred = theory.predict(run.config["optimizer"], fan_in=fan_in)
        measured = ev.stat(row, "rotation_per_100_deg").describe("deg")
        if not pred.applies:
            lines.append(f"| `{row}` | none: {pred.reason} | – | – | – | {measured} | – |")
            continue
        norms = [float(r.tables["channels"].query(f"layer == '{last}'").pipe(
            lambda c: c[c["step"] == c["step"].max()])["weight_norm"].median()) for r in ev.runs_of(row)]
        lines.append(f"| `{row}` | {pred.formula} ({pred.source}); equilibrium after ~1/(2ηλ) = "
                     f"{pred.equilibrium_steps:,.0f} steps | {pred.per_step_rad:.2e} rad "
                     f"({pred.per_step_rad * theory.RAD_TO_DEG:.3f}°) | {pred.net_deg_per_100:.2f}° | "
                     f"{pred.path_deg_per_100:.1f}° | {measured} | {pred.equilibrium_norm:.2f} / "
                     f"{float(np.mean(norms)):.2f} ({last}, median channel) |")
    return lines


# The sections of claims.md after the article's own, in order: their heading and what they are.
SECTIONS = {
    RESNET: ("Does it carry over? ResNet-20",
             "The study ran one small network. These checks ask whether its mechanism carries over to a residual "
             "network, ResNet-20 (16×16 images, the study's protocol otherwise; rows `resnet20_*`). Each tolerance was "
             "fixed before the ResNet-20 runs existed, and each check gives its reason; an *exploratory* check "
             "measures without one (MEASURED, no PASS or FAIL). Where the study's network has the same measurement it "
             "is shown beside, without a verdict: its runs existed before these rules. NOT RUN: the rows' runs are "
             "missing."),
    FASHION_MNIST: ("Does it happen on real images? Fashion-MNIST",
                    "The article's seven rows again on real images: Fashion-MNIST (28×28 grey, the official split; "
                    "rows `fmnist_*`), the study's network and protocol otherwise. Each tolerance was fixed before the "
                    "Fashion-MNIST runs existed (`analysis/claims/real_images.py`), and each check gives its reason; "
                    "training mode is no longer 100% on real images, so the rules compare a row with its own training "
                    "mode or with SGD's row. Where the templates' runs have the same measurement it is shown beside, "
                    "without a verdict. NOT RUN: the rows' runs are missing; PRECONDITION FAILED: they exist, but the "
                    "claim's premise does not hold on them."),
    FROZEN: ("Beyond the article: a frozen backbone",
             "Convolutions frozen after pre-training, a new head fine-tuned on noisier data, BatchNorm in training "
             "mode, in evaluation mode or re-estimated (`bnrotation.study.frozen`; its runs under `frozen/` beside these). "
             "The tolerance was fixed before the runs."),
    CALIBRATION: ("The monitor's rule out of sample",
                  "The rule's thresholds were chosen on the synthetic runs only (`calibration.md`, `make calibrate`); "
                  "these checks score them unchanged on the runs of another task and on the frozen backbone. The first "
                  "two keep their history: fixed before the Fashion-MNIST rows and the staleness zoo under `zoo/` ran, "
                  "they were judged with the rule fed the held-out gap, the truth's own. The `shipped_rule_*` checks "
                  "score the rule as it ships, fed the monitor's probe gap: on the first zoo, looked at since, and on "
                  "the second zoo under `zoo2/`, whose checks and forecasters were committed before its first run. "
                  "A FAIL is a finding. NOT RUN: their runs are missing."),
    MAP: ("Where does the collapse live? The condition map",
          "One property of one task turned at a time, towards the other task where the two differ (the number of "
          "classes, 10 in both, is turned either way), SGD and Adam at every setting "
          "(`bnrotation.study.condition_map`, `make map`; its runs under `map/` beside these, its table `map/map.md`). "
          "For each knob, the direction Adam's evaluation-mode accuracy should move, against SGD's and against its "
          "own training mode, if that property is the cause; each was committed before any map run "
          "(`analysis/claims/condition_map.py`), with its reasoning in its note. The map's runs have a protocol of "
          "their own, shorter than the article's (`map/map.md` says which and why). \"Deficit\" is SGD's "
          "evaluation-mode accuracy minus Adam's, paired by seed: the map's \"Adam − SGD\" with its sign turned. The "
          "mode-gap half of each prediction is Adam's own mode gap, as registered, not its excess over SGD's, which "
          "the map's collapse rule uses. A FAIL is a finding about the prediction's two ends alone: the collapse "
          "did not move that way between them. Where both optimizers lose to stale statistics at the deeper end "
          "(the note says so), it says nothing about whether the property matters; the map's table gives the "
          "settings between. NOT RUN: the runs of one end or the other are not all in."),
    WHY: ("Why do fresh samples keep Adam rotating? The data swap",
          "The templates with fresh samples, a finite set, a swap from one to the other mid-run, and (Adam) the "
          "finite set at β2 0.99 and 0.9999 (`bnrotation.study.why`, `make why`; its runs under `why/`). Each "
          "candidate mechanism predicts, per arm against the finite arm, the direction of the rotation rate, "
          "Adam's normalised step and the mode gap, plus a signature of its own; each was committed before any "
          "run (`analysis/claims/why.py`). A FAIL is a finding. NOT RUN: an arm's runs are not all in."),
}


def section_lines(section: str, checks: list[Check]) -> list[str]:
    """One section of :data:`SECTIONS` in ``claims.md``: its heading, what its checks are, then each (``checks``:
    that section's)."""
    title, intro = SECTIONS[section]
    out = [f"## {title}\n", f"{intro}\n"]
    for c in checks:
        out += check_block(c)
    return out


def summary_line(checks: list[Check]) -> str:
    """``'**3 PASS, 1 FAIL, 2 NOT RUN**'``, with ``', 2 exploratory (MEASURED, no verdict)'`` when any are."""
    measured = sum(c.verdict == MEASURED for c in checks)
    return (f"**{verdict_counts(checks)}**"
            + (f", {measured} exploratory (MEASURED, no verdict)" if measured else ""))


def verdict_counts(checks) -> str:
    """``'3 PASS, 1 FAIL, 2 NOT RUN'``, and ``', 1 PRECONDITION FAILED'``, ``', 24 not judged at this scale'``
    when any are (``checks``: any iterable of :class:`.Check`)."""
    checks = list(checks)
    counts = {v: sum(c.verdict == v for c in checks) for v in (PASS, FAIL, NOT_RUN, PRECONDITION_FAILED, NOT_JUDGED)}
    return (f"{counts[PASS]} PASS, {counts[FAIL]} FAIL, {counts[NOT_RUN]} NOT RUN"
            + "".join(f", {counts[v]} {v}" for v in (PRECONDITION_FAILED, NOT_JUDGED) if counts[v]))


# What each verdict word means, as claims.md's legend and the write-up page's say it.
VERDICTS = {PASS: "the measured figure is within the check's tolerance",
            FAIL: "it is not; the note says why",
            NOT_RUN: "the runs the check needs are missing, or too few to weigh (one seed: no spread to set the "
                     "tolerance)",
            PRECONDITION_FAILED: "the runs exist, but what the claim presupposes does not hold on them (a row that "
                                 "loses nothing has nothing to recover), so there is nothing to weigh",
            MEASURED: "an exploratory check: measured, with no tolerance fixed in advance",
            NOT_JUDGED: "runs below the article's scale: measured, weighed against nothing"}


def legend() -> str:
    """The verdict words and what each means (:data:`VERDICTS`), in one sentence."""
    return "**Verdicts.** " + "; ".join(f"{v}: {meaning}" for v, meaning in VERDICTS.items()) + "."


def to_markdown(ev: Evidence, checks: list[Check], cells: list[tuple[str, str, Check]]) -> str:
    """The whole of ``claims.md``: ``checks`` (named claims: the article's, then those of the section "Does it
    carry over? ResNet-20") and ``cells`` ((row, column title, check) of the article's table) as weighed on
    ``ev``."""
    beyond = {section: [c for c in checks if c.section == section] for section in SECTIONS}
    checks = [c for c in checks if c.section == ARTICLE]
    seeds = ev.per_run.groupby("row")["seed"].apply(seed_ranges)
    intervene_every = int(ev.runs[0].config["scale"]["intervene_every"])
    k100 = theory.random_walk_factor(100, 0.9)
    out = ["# The article's claims, checked against the measured results\n",
           f"Generated by `make claims` from {count(len(ev.runs), 'run')} under `{ev.root}` (parquet only; "
           f"{schema_versions(r.info.get('schema_version') for r in ev.runs)}). Seeds per row: "
           + ", ".join(f"`{r}` {seeds[r]}" for r in sorted(seeds.index, key=row_order)) + ".\n",
           "Measured figures are means over seeds ± the sample standard deviation over seeds (n − 1), with n. "
           + scale_note(ev.runs) + " A failing check is "
           f"an intervention step (every {intervene_every:,} steps in the window, and the last) whose evaluation-mode "
           f"accuracy with the stored statistics is below {cell(FAIL_BELOW, 'pct', digits=0)}. Per-channel "
           "quantities are medians over the layer's channels at each logged step, averaged over the steps in the "
           f"window; the middle layer is {metrics.MIDDLE_CONV} (→ {metrics.MIDDLE_NORM}); cosines are of the last "
           f"conv layer ({metrics.LAST_CONV}), the layer the table's rotation and norm columns use."
           + (" The article's claims are weighed on the study's network only; the ResNet-20 runs have a section of "
              "their own, at the end, and their rotation and norm are those of their last conv layer "
              "(layer3.2.conv2)." if any(r.arch == "resnet20" for r in ev.runs) else "") + "\n",
           f"**Tolerances.** A measured mean matches a published one (a mean of {PUBLISHED_SEEDS} seeds) when they "
           f"differ by at most {Z:g} · s · √(1/n + 1/{PUBLISHED_SEEDS}): two standard errors of the difference of "
           "two means, the measured seed spread s standing in for the article's, never tighter than the rounding of "
           "the published figure; one seed gives no spread, so no verdict (NOT RUN). \"A above B\" needs the "
           "difference of the means to exceed two standard errors (one seed per side: the sign alone, said where "
           "it happens). An ordering across rows needs a Spearman rank correlation beyond the exact one-sided "
           f"{cell(ALPHA, 'pct', digits=0)} critical value for the number of rows. Claims about a model rather than a "
           "mean (the lag formula) use a factor fixed in advance, with the seed spread shown beside it.\n",
           legend() + "\n",
           "## The finding\n",
           *[f"{sentence}\n" for sentence in task_findings(ev)],
           "## Summary\n",
           f"Named checks: **{verdict_counts(checks)}**. Table cells: {verdict_counts(c for _, _, c in cells)}.\n",
           "| Check | Verdict | Published | Measured |", "|---|---|---|---|"]
    out += [f"| `{c.name}` | {c.verdict} | {md_cell(c.published)} | {md_cell(c.measured)} |" for c in checks]
    for section, these in beyond.items():
        if these:
            out += ["", f"{SECTIONS[section][0]} (its own section, at the end): {summary_line(these)}.\n",
                    "| Check | Verdict | Measured |", "|---|---|---|"]
            out += [f"| {label(c)} | {c.verdict} | {md_cell(c.measured)} |" for c in these]
    out += ["", "## Checks\n"]
    for c in checks:
        out += check_block(c)
    out += ["## The article's table, cell by cell\n",
            "Each published cell against the measured row mean, with the tolerance rule above.\n",
            "| Row | Column | Published | Measured | Tolerance | Verdict |", "|---|---|---:|---|---|---|"]
    out += [f"| `{row}` | {title} | {md_cell(c.published)} | {md_cell(c.measured)} | {md_cell(c.tolerance)} | "
            f"{c.verdict} |"
            for row, title, c in cells]
    out += ["", "## Theory beside measurement\n",
            "The rotational-equilibrium literature predicts the angular update per step once weight decay balances "
            f"the norm: √(2ηλ/(1+α)) for SGD with momentum α and L2 decay ({theory.WAN_2021}) and "
            f"√(2ηλ(1−β1)/(1+β1)) for AdamW ({theory.KOSSON_2024}), in radians per step. The table "
            "measures the net angle over 100 steps, which is less than the per-step angles summed (100 × per step, "
            "an upper bound by the triangle inequality) when steps do not all turn the same way; in the same "
            f"random-walk model the net angle over 100 steps is k(100, β) ≈ {k100:.1f} times the per-step angle for "
            "β = 0.9 (`theory.random_walk_factor`). Rows without weight decay (SGD and every Adam row but AdamW) "
            "have no equilibrium and no prediction.\n", *theory_lines(ev), "",
            "## Findings on the article's open questions\n", *findings(ev)]
    for section, these in beyond.items():
        if these:
            out += section_lines(section, these)
    return "\n".join(out) + "\n"
