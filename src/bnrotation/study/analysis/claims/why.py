"""Why do fresh samples keep Adam rotating? Each candidate mechanism's predictions, committed before any run of the
data-swap experiment (issue 64; no torch).

The experiment (:mod:`bnrotation.study.why`) trains Adam and SGD on the templates with fresh samples, a finite set,
a swap from one to the other at :data:`...why.SWAP_STEP`, and (Adam only) the finite set with β2 at 0.99 and 0.9999.
Adam's step does not change when the whole gradient is scaled, so a mechanism must say why the ratio |m̂| / √v̂
moves. Each candidate below predicts, for every arm against the ``finite`` arm (Adam, β2 = 0.999), the direction of
three quantities over the late window (:data:`..tables.why_report.LATE`) at the last convolution: the rotation rate
(the angular update per step), Adam's normalised step |m̂| / (√v̂ + ε) (its median over the layer's weights) and the
mode gap (training- minus evaluation-mode accuracy). Each also has a signature of its own.

A direction is one of :data:`DIRECTIONS`, judged on the seed means, paired arms compared by Welch's standard error of
the difference (:class:`.kinds.Gap`, :data:`.kinds.Z` standard errors): ``up`` above, ``down`` below, ``same`` the
two means within a factor of :data:`SAME_FACTOR` (the mode gap: within :data:`SAME_GAP`, the map's collapse floor),
``not up`` / ``not down`` not beyond Z standard errors that way. A mechanism PASSes when every prediction and its
signature hold; else FAIL, with the predictions that failed named. A FAIL is a finding. NOT RUN until every arm a
check reads has every seed of the sweep; PRECONDITION FAILED when the loss had not flattened by the swap on the
``finite`` arm (its median over the 100 steps before the swap above :data:`FLAT_LOSS` of its first 100 steps'), so
that the swap did not come after the loss flattened, as the issue asks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from .... import records
from ...rows import SEEDS
from ...why import ARMS, SWAP_STEP, runs_in_sweep
from ..results import Run
from ..formatting import listed
from ..stats import SeedStat
from ..tables import why_report
from .evidence import Evidence
from .kinds import NOT_RUN, PASS, PRECONDITION_FAILED, WHY, Z, Bespoke, Gap, Outcome
from ..report.section import Column, Section, to_markdown as to_section_markdown

__all__ = ["DIRECTIONS", "SAME_FACTOR", "SAME_GAP", "FLAT_LOSS", "Mechanism", "MECHANISMS", "CHECKS", "Assessment",
           "ARMS_SECTION", "WHY_SECTION", "assess", "holds", "mechanism_table", "predictions_table", "sentence", "summary"]

DIRECTIONS = ("up", "down", "same", "not up", "not down")
SAME_FACTOR = 1.5  # "same": the two means within this factor of each other
SAME_GAP = 0.05  # "same" for the mode gap (a fraction): within 5 points, the map's collapse floor
FLAT_LOSS = 0.01  # the loss has flattened by the swap: its median before the swap below 1% of its first steps'
BASELINE = "finite"  # every arm's prediction is against this arm, Adam at β2 = 0.999
QUANTITIES = ("rotation_deg_per_step", "normalised_step", "mode_gap")
FAILED = {"up": "not up", "down": "not down", "same": "not the same", "not up": "up", "not down": "down"}
WORDS = {"rotation_deg_per_step": "rotation", "normalised_step": "normalised step", "mode_gap": "mode gap"}


@dataclass(frozen=True)
class Mechanism:
    """A candidate: its ``name`` (the claim's), what it says (``says``), its predictions
    ``{arm: (rotation, normalised step, mode gap)}`` against :data:`BASELINE`, each one of :data:`DIRECTIONS`, and
    its ``signature``: a further test of its own, ``(words, function of the arms' stats -> (bool | None, measured
    words))``."""

    name: str
    title: str
    says: str
    predictions: dict
    signature_words: str

    def __post_init__(self) -> None:
        arms = {a.name for a in ARMS} - {BASELINE}
        if set(self.predictions) != arms:
            raise ValueError(f"{self.name}: predictions for {sorted(self.predictions)}, expected {sorted(arms)}")
        for arm, dirs in self.predictions.items():
            if len(dirs) != len(QUANTITIES) or any(d not in DIRECTIONS for d in dirs):
                raise ValueError(f"{self.name}: {arm}: expected {len(QUANTITIES)} of {DIRECTIONS}, got {dirs}")


MECHANISMS = (
    Mechanism("why_a_gradient_noise_floor_keeps_adam_rotating", "a gradient noise floor",
              "a gradient noise floor: fresh samples keep each coordinate's gradient from shrinking against Adam's "
              "second moment, so the normalised step stays large; the current data decides, not β2's memory",
              {"fresh": ("up", "up", "up"), "fresh_to_finite": ("same", "same", "same"),
               "finite_to_fresh": ("up", "up", "up"), "finite_beta2_0.99": ("same", "same", "same"),
               "finite_beta2_0.9999": ("same", "same", "same")},
              "on fresh samples the normalised step in the late window keeps at least 1/1.5 of its value at steps "
              "500-1,000, while on the finite set it falls below that"),
    Mechanism("why_memorisation_shrinks_adams_steps", "memorisation",
              "memorisation: on a finite set the gradient decays while the second moment still remembers larger "
              "gradients, so the steps shrink; a shorter memory (β2 0.99) keeps them larger, a longer (0.9999) "
              "smaller",
              {"fresh": ("up", "up", "up"), "fresh_to_finite": ("not up", "not up", "same"),
               "finite_to_fresh": ("up", "up", "up"), "finite_beta2_0.99": ("up", "up", "not down"),
               "finite_beta2_0.9999": ("down", "down", "not up")},
              "on the finite set the gradient's RMS in the late window is below half its value at steps 500-1,000"),
    Mechanism("why_loss_spikes_keep_adam_rotating", "loss spikes",
              "loss spikes: bursts of large steps on hard fresh samples; the median step does not change, the "
              "rotation comes in bursts",
              {"fresh": ("up", "same", "up"), "fresh_to_finite": ("same", "same", "same"),
               "finite_to_fresh": ("up", "same", "up"), "finite_beta2_0.99": ("same", "same", "same"),
               "finite_beta2_0.9999": ("same", "same", "same")},
              "on fresh samples the largest tenth of the logged steps carries more than half of the late window's "
              "rotation, and the loss's spikes (maximum over median, per 100 steps) exceed the finite set's"),
    Mechanism("why_adams_steps_grow_again_once_v_forgets", "regrowth once v forgets",
              "Molybog et al. 2023 (arXiv 2304.09871): after the gradient shrinks, the normalised step grows again "
              "once the second moment has forgotten the larger gradients (about 1/(1 − β2) = 1,000 steps)",
              {"fresh": ("up", "up", "up"), "fresh_to_finite": ("not down", "not down", "not down"),
               "finite_to_fresh": ("up", "up", "up"), "finite_beta2_0.99": ("not down", "not down", "not down"),
               "finite_beta2_0.9999": ("not up", "not up", "not up")},
              f"on fresh_to_finite the normalised step over the last 400 steps exceeds its value over steps "
              f"{SWAP_STEP + 100:,}-{SWAP_STEP + 500:,}, just after the swap"),
)


def holds(direction: str, a: SeedStat, b: SeedStat, gap_quantity: bool = False) -> bool:
    """Whether ``a`` (an arm) stands to ``b`` (the baseline) as ``direction`` says (:data:`DIRECTIONS`).

    ``same``: the means within a factor :data:`SAME_FACTOR` (``gap_quantity``: within :data:`SAME_GAP`, absolute);
    the others compare the difference with :data:`.kinds.Z` Welch standard errors (:class:`.kinds.Gap`).

    Raises:
        ValueError: an unknown direction.
    """
    if direction == "same":
        if gap_quantity:
            return abs(a.mean - b.mean) < SAME_GAP
        lo, hi = sorted((a.mean, b.mean))
        return lo > 0 and hi / lo < SAME_FACTOR
    up, down = Gap(a, b).passed, Gap(b, a).passed
    try:
        return {"up": up, "down": down, "not up": not up, "not down": not down}[direction]
    except KeyError:
        raise ValueError(f"direction {direction!r}: expected one of {DIRECTIONS}") from None


def _signature(mech: Mechanism, arms: dict) -> tuple[bool, str]:
    """Each mechanism's signature, on the Adam arms' stats: (holds, measured words)."""
    f, d = arms[("adam", "fresh")], arms[("adam", BASELINE)]
    if mech.name == "why_a_gradient_noise_floor_keeps_adam_rotating":
        kept = {k: s["normalised_step"].mean / s["normalised_step_early"].mean for k, s in (("fresh", f),
                                                                                            ("finite", d))}
        return (kept["fresh"] >= 1 / SAME_FACTOR > kept["finite"],
                f"late normalised step / early: fresh {kept['fresh']:.2f}, finite {kept['finite']:.2f}")
    if mech.name == "why_memorisation_shrinks_adams_steps":
        r = d["grad_rms_late"].mean / d["grad_rms_early"].mean
        return r < 0.5, f"finite: late gradient RMS / early {r:.2f}"
    if mech.name == "why_loss_spikes_keep_adam_rotating":
        share = f["burst_share"].mean
        spikes = Gap(f["loss_spike"], d["loss_spike"])
        return (share > 0.5 and spikes.passed,
                f"fresh: top tenth carries {share:.2f} of the rotation; loss spike fresh {f['loss_spike'].mean:.2f} "
                f"against finite {d['loss_spike'].mean:.2f} ({spikes.words()})")
    fd = arms[("adam", "fresh_to_finite")]
    grows = Gap(fd["normalised_step_end"], fd["normalised_step_after_swap"])
    return grows.passed, (f"fresh_to_finite: normalised step {fd['normalised_step_after_swap'].mean:.3g} after the "
                          f"swap, {fd['normalised_step_end'].mean:.3g} at the end ({grows.words()})")


@dataclass(frozen=True)
class Assessment:
    """One mechanism weighed on the Adam arms' stats: each prediction as ``(arm, quantity, direction, arm's mean,
    baseline's mean, held)`` (:data:`QUANTITIES`, :func:`holds`), and whether its signature held, with the
    signature's measured words."""

    predictions: tuple[tuple[str, str, str, float, float, bool], ...]
    signature: bool
    signature_words: str

    @property
    def failed(self) -> list[str]:
        """What failed, in words: ``"<arm>'s <quantity> <what it did instead>"`` (:data:`FAILED`) per prediction,
        then ``its signature``."""
        return ([f"{arm}'s {WORDS[q]} {FAILED[d]}" for arm, q, d, _, _, ok in self.predictions if not ok]
                + ["its signature"] * (not self.signature))

    @property
    def held(self) -> int:
        """How many of the predictions held (the signature not counted)."""
        return sum(ok for *_, ok in self.predictions)


def assess(mech: Mechanism, arms: dict) -> Assessment:
    """Weigh ``mech``'s predictions and signature on ``arms`` (:func:`..tables.why_report.per_arm`'s stats; every
    Adam arm present), each arm against :data:`BASELINE`."""
    base = arms[("adam", BASELINE)]
    found = tuple((arm, q, d, arms[("adam", arm)][q].mean, base[q].mean,
                   holds(d, arms[("adam", arm)][q], base[q], gap_quantity=q == "mode_gap"))
                  for arm, dirs in mech.predictions.items() for q, d in zip(QUANTITIES, dirs))
    return Assessment(found, *_signature(mech, arms))


def _short(arms: dict) -> list[str]:
    """The Adam arms without every seed of the sweep, as ``'adam+<arm> (k of n seeds)'``."""
    short = []
    for a in ARMS:
        got = arms.get(("adam", a.name))
        if got is None or not got.complete:
            short.append(f"adam+{a.name} ({0 if got is None else len(set(got.seeds) & set(SEEDS))} of "
                         f"{len(SEEDS)} seeds)")
    return short


def _flat(arms: dict) -> bool:
    """The precondition: the finite arm's loss before the swap below :data:`FLAT_LOSS` of its first steps'."""
    base = arms[("adam", BASELINE)]
    return base["loss_before_swap"].mean < FLAT_LOSS * base["loss_start"].mean


def _judge(mech: Mechanism, ev: Evidence) -> Outcome:
    return _outcome(mech, *why_report.load(ev.root))


def _outcome(mech: Mechanism, arms: dict, problems: list[str], root: Path) -> Outcome:
    """``mech``'s claim weighed on ``arms`` (:func:`..tables.why_report.load`: the arms, the folders refused, the
    folder read)."""
    registered = "Predicted against the finite arm: " + "; ".join(
        f"{arm}: " + ", ".join(f"{WORDS[q]} {d}" for q, d in zip(QUANTITIES, dirs))
        for arm, dirs in mech.predictions.items()) + f". Signature: {mech.signature_words}."
    where = f"{registered} Runs under `{root}` (`make why RESULTS={root.parent}`)." + (
        f" Refused: {'; '.join(problems)}." if problems and (root / "runs").is_dir() else "")
    tolerance = ("every direction over the late window against the finite arm (Adam, β2 0.999): up/down beyond "
                 f"{Z:g} Welch standard errors, same within a factor {SAME_FACTOR:g} (the mode gap: "
                 f"{SAME_GAP * 100:g} points), and the signature; fixed before the runs")
    short = _short(arms)
    if short:
        return Outcome(f"runs missing: {', '.join(short)}", tolerance, None, where)
    base = arms[("adam", BASELINE)]
    if not _flat(arms):
        return Outcome(f"finite arm's loss before the swap {base['loss_before_swap'].mean:.3g} against "
                       f"{base['loss_start'].mean:.3g} at the start", tolerance, None,
                       "The loss had not flattened by the swap. " + where, unmet=True)
    a = assess(mech, arms)
    measured = [f"{arm} {WORDS[q]} {m:.3g} vs {b:.3g} ({d}: {'yes' if ok else 'no'})"
                for arm, q, d, m, b, ok in a.predictions]
    note = (f"The mechanism: {mech.says}. Its signature measured: {a.signature_words}."
            + (f" Fails on: {'; '.join(a.failed)}." if a.failed else "") + f" {where}")
    return Outcome("; ".join(measured), tolerance, not a.failed, note)


def mechanism_table(ev_root: str | Path) -> pd.DataFrame:
    """The front pages' table of the data swap, one line per mechanism of :data:`MECHANISMS` on the runs under
    ``<ev_root>/why/`` (read once): ``mechanism``, ``verdict`` (its claim's, :data:`CHECKS`, weighed on the same
    read), ``held`` and ``predicted`` (how many of its predictions held, of how many), ``failed_on`` (the
    predictions that failed, in words), ``signature_held`` (bool) and ``signature`` (``'held'`` or ``'not held'``,
    with its measured words). The counts are NaN, the words empty and ``signature_held`` None where the claim is
    not weighed (runs missing, or the loss not flat by the swap)."""
    ev = Evidence(Path(ev_root), [], pd.DataFrame({"row": [], "seed": []}))
    loaded = why_report.load(ev_root)
    arms = loaded[0]
    weighed = not _short(arms) and _flat(arms)
    lines = []
    for mech, claim in zip(MECHANISMS, CHECKS):
        on_this_read = replace(claim, evaluate=lambda _, mech=mech: _outcome(mech, *loaded))
        line = {"mechanism": mech.title, "verdict": on_this_read.check(ev).verdict, "held": math.nan,
                "predicted": math.nan, "failed_on": "", "signature_held": None, "signature": ""}
        if weighed:
            a = assess(mech, arms)
            line |= {"held": a.held, "predicted": len(a.predictions),
                     "failed_on": "; ".join(f for f in a.failed if f != "its signature"),
                     "signature_held": a.signature,
                     "signature": f"{'held' if a.signature else 'not held'}: {a.signature_words}"}
        lines.append(line)
    return pd.DataFrame(lines, columns=["mechanism", "verdict", "held", "predicted", "failed_on", "signature_held",
                                        "signature"])


def predictions_table() -> pd.DataFrame:
    """The registered predictions: one row per mechanism and arm, the direction of each quantity against the
    finite arm (columns ``mechanism``, ``arm``, ``rotation``, ``normalised step``, ``mode gap``)."""
    return pd.DataFrame([{"mechanism": m.title, "arm": arm, **dict(zip(WORDS.values(), dirs))}
                         for m in MECHANISMS for arm, dirs in m.predictions.items()])


def _claim(mech: Mechanism) -> Bespoke:
    words = (f"If {mech.title} keeps Adam rotating, each arm's rotation, normalised step and mode gap move against "
             "the finite arm's as its predictions say, and its signature holds.")
    return Bespoke(mech.name, words, "beyond the article: issue 64's data swap, predicted before its runs",
                   lambda ev: _judge(mech, ev), (), WHY)


CHECKS = tuple(_claim(m) for m in MECHANISMS)


def sentence(table: pd.DataFrame, runs_in: int, runs_wanted: int) -> str:
    """The front pages' sentence (at most 30 words), from :func:`mechanism_table`: which mechanisms the runs
    support, and where none does, the one closest (most predictions held, then its signature); while a claim is
    NOT RUN, how many runs are in."""
    if (table["verdict"] == NOT_RUN).any():
        return f"The data swap has {runs_in} of its {runs_wanted} runs in; no mechanism is judged until every arm is."
    if (table["verdict"] == PRECONDITION_FAILED).any():
        return "The loss had not flattened by the swap on the finite set, so the data swap judges no mechanism."
    held = list(table.loc[table["verdict"] == PASS, "mechanism"])
    failed = list(table.loc[table["verdict"] != PASS, "mechanism"])
    if held:
        return f"The data swap supports {listed(held)}" + (f"; {listed(failed)} fail." if failed else ".")
    best = table.sort_values(["held", "signature_held"], ascending=False, kind="stable").iloc[0]
    return (f"The data swap supports none of its {len(table)} mechanisms; {best['mechanism']} comes closest, "
            f"{int(best['held'])} of {int(best['predicted'])} predictions held, its signature "
            f"{'held' if best['signature_held'] else 'not'}.")


def summary(ev_root: str | Path, table: pd.DataFrame | None = None) -> tuple[str, pd.DataFrame]:
    """The front pages' :func:`sentence` and :func:`mechanism_table` of the runs under ``<ev_root>/why/``
    (``table``: that table, where already made)."""
    stats, _, _ = why_report.load(ev_root)
    table = mechanism_table(ev_root) if table is None else table
    return sentence(table, sum(len(s.seeds) for s in stats.values()), runs_in_sweep()), table


PROTOCOL_FROM_ROOT = "../../../docs/PROTOCOL.md"  # from results/reference/why/why.md
WHY_HEADING = "The data swap *(beyond the article: issue 64)*"  # docs/PROTOCOL.md's heading that defines it
JUDGING_HEADING = "Judging a replication"
ARMS_SECTION = Section(
    "The arms", lambda stats: why_report.arms_table(stats),
    "Each arm over steps 2,000–3,000 at the last convolution, mean ± sd over seeds; Fashion-MNIST at its own "
    "settings, for its margins.",
    (Column("optimizer", "Optimizer", WHY_HEADING), Column("arm", "Arm", WHY_HEADING),
     Column("data", "Training data", WHY_HEADING), Column("n", "Seeds (n)", WHY_HEADING, "count"),
     Column("rotation_deg_per_step", "Angular update (°/step)", WHY_HEADING, "plain", sd="rotation_deg_per_step_sd"),
     Column("normalised_step", "Normalised step", WHY_HEADING, "plain", sd="normalised_step_sd"),
     Column("mode_gap", "Mode gap", WHY_HEADING, "pct", 1, sd="mode_gap_sd", difference=True),
     Column("margin_eval", "Margin, evaluation mode", WHY_HEADING, "plain", sd="margin_eval_sd"),
     Column("burst_share", "Burst share", WHY_HEADING, "pct", 0, sd="burst_share_sd"),
     Column("loss_spike", "Loss spike", WHY_HEADING, "x", 1, sd="loss_spike_sd")))
WHY_SECTION = Section(
    "Why fresh samples keep Adam rotating", mechanism_table,
    "Each mechanism's predictions for the data swap's arms, registered before the runs, against the finite set; "
    "Adam, templates, steps 2,000–3,000, last convolution.",
    (Column("mechanism", "Mechanism", WHY_HEADING), Column("verdict", "Verdict", JUDGING_HEADING),
     Column("held", "Predictions held", WHY_HEADING, "count"), Column("predicted", "Of", WHY_HEADING, "count"),
     Column("failed_on", "Failed on", WHY_HEADING), Column("signature", "Signature", WHY_HEADING)))


# ----------------------------------------------------------------------------- why.md (python -m ...claims.why)
def report_text(root: Path, stats: dict, problems: list[str], runs: list[Run] | None = None) -> str:
    """``why.md``: the table of arms (means and sds over seeds, unrounded until here) and the folders refused."""
    n = sum(len(s.seeds) for s in stats.values())
    table = mechanism_table(root.parent)
    text = [f"# Why do fresh samples keep Adam rotating? The data swap\n",
            sentence(table, n, runs_in_sweep()) + "\n", to_section_markdown(WHY_SECTION, table, PROTOCOL_FROM_ROOT),
            f"![The rotation rate and Adam's normalised step, four arms, the swap at step {SWAP_STEP:,}](why.png)\n",
            f"From {n} runs under `{root}`; `tables/why_report.py` defines each quantity. What stale statistics cost, "
            "layer by layer, on both tasks: [map.md](../map/map.md#what-stale-statistics-cost-layer-by-layer).\n",
            to_section_markdown(ARMS_SECTION, why_report.arms_table(stats), PROTOCOL_FROM_ROOT),
            "\n## The predictions, committed before the runs\n", why_report.markdown_table(predictions_table())]
    costs = why_report.cost_table(runs or [])
    if not costs.empty:
        text += ["\n## What a run costs\n", "Runs that ran start to end in one process (`run.json`); the log is the "
                 "optimizer-state log with the per-step losses, the checks hold the margins.\n",
                 why_report.markdown_table(costs)]
    if problems:
        text += ["\n## Refused\n", *[f"- {p}" for p in problems]]
    return "\n".join(text) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write ``<results>/why.md``; exit 2 when the folder holds no finished run of the experiment."""
    import argparse
    import sys

    p = argparse.ArgumentParser(description="the data swap's table of arms (issue 64)")
    p.add_argument("--results", default="results/why", help="the experiment's root, holding runs/why_<row>+<arm>/")
    args = p.parse_args(argv)
    root = Path(args.results)
    runs, problems = why_report.load_why_runs(root)
    if not runs:
        print(f"--results {root}: no finished data-swap run (expected <root>/runs/why_<row>+<arm>/seed=<s>/)"
              + (f"; {'; '.join(problems)}" if problems else ""), file=sys.stderr)
        return 2
    stats = why_report.per_arm([why_report.per_run(r) for r in runs])
    why_report.figure(why_report.curves(runs), root / "why.png")
    records.atomic_write_text(root / "why.md", report_text(root, stats, problems, runs))
    print(f"wrote {root / 'why.md'} from {len(runs)} runs", file=sys.stderr)
    return 0




if __name__ == "__main__":
    raise SystemExit(main())
