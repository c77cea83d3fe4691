"""Why do fresh samples keep Adam rotating? The data-swap experiment (issue 64; torch-free).

The condition map (:mod:`.condition_map`) found Adam's collapse on the templates with a fresh sample at every draw
and at none of the finite training sets. This experiment asks which mechanism makes the difference, by swapping the
data source mid-run and by changing how long Adam's second moment remembers. Every arm trains the study's ``sgd``
and ``adam`` rows on the templates at the map's protocol (:data:`.condition_map.MAP_STEPS` steps), with checks from
step :data:`CHECK_START` so that the accuracy is measured on both sides of the swap, and the optimizer-state log
every :data:`MECHANISM_EVERY` steps (the ``mechanism`` and ``losses`` tables, :mod:`bnrotation.study.mechanism`):

* ``fresh``: a fresh sample at every draw (the templates' own training set);
* ``finite``: a finite set of :data:`FINITE_SIZE` samples, drawn once, throughout;
* ``fresh_to_finite``: fresh samples, then the finite set from step :data:`SWAP_STEP`;
* ``finite_to_fresh``: the finite set, then fresh samples from step :data:`SWAP_STEP`;
* ``finite_beta2_0.99`` and ``finite_beta2_0.9999`` (Adam only): the finite set throughout, with Adam's β2 at 0.99
  and 0.9999, so that its second moment remembers about 100 and 10,000 steps instead of 1,000;
* and last, Fashion-MNIST at its own settings (:data:`REAL_IMAGES`), for its margins beside the templates'.

**The swap step.** :data:`SWAP_STEP` is half the run: the committed runs' loss at their first check (step 2,000) is
already flat (Adam's about 2e-4 on the templates), and the new runs' per-step loss shows whether it had flattened
by the swap; a claim whose arm had not is PRECONDITION FAILED (:mod:`.analysis.claims.why`). Half the run leaves
1,500 steps after the swap: one and a half memories of Adam's second moment at β2 = 0.999, so that a step that grows
again once the second moment has forgotten (Molybog et al. 2023, arXiv 2304.09871) has room to show.

**A run's name** is ``why_<row>+<arm>`` (``why_adam+fresh_to_finite``); ``python -m bnrotation.study.why`` prints
the sweep, one Hydra multirun of ``experiments/train.py`` a line (``make why`` runs them).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .condition_map import MAP_STEPS
from .rows import SEEDS

__all__ = ["Arm", "ARMS", "REAL_IMAGES", "WHY_PREFIX", "ROOT", "SWAP_STEP", "FINITE_SIZE", "CHECK_START", "MECHANISM_EVERY",
           "PROTOCOL", "OPTIMIZERS", "why_row", "arm_of", "sweep_lines", "runs_in_sweep", "main"]

WHY_PREFIX = "why_"  # every run's row name starts so
ROOT = "why"  # the committed runs: results/reference/why/runs/<row>/seed=<s>/
SWAP_STEP = MAP_STEPS // 2  # the module docstring says why
FINITE_SIZE = 16000  # the map's largest finite template set
CHECK_START = 1000  # checks from here, so that five of them precede the swap
MECHANISM_EVERY = 10  # the optimizer-state log's interval, in steps: often enough to see a burst
PROTOCOL = ("scale.name=why", f"scale.steps={MAP_STEPS}", f"scale.check_start={CHECK_START}",
            f"scale.mechanism_every={MECHANISM_EVERY}", "averaging.enabled=false")
OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class Arm:
    """One arm: its ``name`` (the row-name suffix), the task overrides that make it, the rows it trains
    (``optimizers``), and in words what it is (``words``)."""

    name: str
    overrides: tuple[str, ...]
    optimizers: tuple[str, ...]
    words: str

    def line(self, optimizer: str) -> str:
        """This arm's Hydra multirun for the row ``optimizer``: every seed, each run under its own name."""
        return " ".join((f"experiment={optimizer}", *self.overrides,
                         f"row={WHY_PREFIX}${{optimizer.name}}+{self.name}", f"seed={','.join(map(str, SEEDS))}",
                         *PROTOCOL))


_FINITE = f"task.train_size={FINITE_SIZE}"
ARMS = (
    Arm("fresh", (), OPTIMIZERS, "fresh samples throughout"),
    Arm("finite", (_FINITE,), OPTIMIZERS, f"a finite set of {FINITE_SIZE:,} throughout"),
    Arm("fresh_to_finite", (_FINITE, f"task.swap_step={SWAP_STEP}", "task.swap_to=finite"), OPTIMIZERS,
        f"fresh, then the finite set from step {SWAP_STEP:,}"),
    Arm("finite_to_fresh", (_FINITE, f"task.swap_step={SWAP_STEP}", "task.swap_to=fresh"), OPTIMIZERS,
        f"the finite set, then fresh from step {SWAP_STEP:,}"),
    Arm("finite_beta2_0.99", (_FINITE, "optimizer.beta2=0.99"), ("adam",),
        "the finite set, Adam's β2 at 0.99 (memory 100 steps)"),
    Arm("finite_beta2_0.9999", (_FINITE, "optimizer.beta2=0.9999"), ("adam",),
        "the finite set, Adam's β2 at 0.9999 (memory 10,000 steps)"),
)


# Fashion-MNIST at its own settings, with the same log: its margins and per-layer costs beside the templates' (the
# sensitivity at matched staleness); no claim reads it, so it runs last.
REAL_IMAGES = Arm("fashion_mnist", (), ("fmnist_adam", "fmnist_sgd"), "Fashion-MNIST at its own settings")


def why_row(optimizer: str, arm: str) -> str:
    """A run's row name: ``why_<optimizer>+<arm>``.

    Raises:
        ValueError: an arm that is not one of :data:`ARMS`.
    """
    if arm not in {a.name for a in (*ARMS, REAL_IMAGES)}:
        raise ValueError(f"{arm!r} is not an arm of the data-swap experiment; expected one of "
                         f"{', '.join(a.name for a in (*ARMS, REAL_IMAGES))}")
    return f"{WHY_PREFIX}{optimizer}+{arm}"


def arm_of(row: str) -> tuple[str, str]:
    """``(optimizer, arm)`` of a run's row name: ``why_adam+finite_to_fresh`` -> ``('adam', 'finite_to_fresh')``.

    Raises:
        ValueError: a name that is not a data-swap run's (``why_<row>+<arm>``, the arm one of :data:`ARMS`).
    """
    if not row.startswith(WHY_PREFIX) or "+" not in row:
        raise ValueError(f"{row!r} is not a data-swap run's row name (why_<row>+<arm>)")
    optimizer, arm = row[len(WHY_PREFIX):].split("+", 1)
    why_row(optimizer, arm)
    return optimizer, arm


def sweep_lines() -> list[str]:
    """The whole experiment, one Hydra multirun a line, Adam's arms first (the ones that decide between the
    mechanisms), then SGD's."""
    return ([a.line(o) for o in ("adam", "sgd") for a in ARMS if o in a.optimizers]
            + [REAL_IMAGES.line(o) for o in REAL_IMAGES.optimizers])


def runs_in_sweep() -> int:
    """How many runs the experiment holds: every arm's rows × seeds, Fashion-MNIST's included."""
    return sum(len(a.optimizers) for a in (*ARMS, REAL_IMAGES)) * len(SEEDS)


def main(argv: list[str]) -> int:
    """``python -m bnrotation.study.why`` prints :func:`sweep_lines`; ``--count`` the number of runs."""
    if argv == ["--count"]:
        print(runs_in_sweep())
    elif not argv:
        print("\n".join(sweep_lines()))
    else:
        print("usage: python -m bnrotation.study.why [--count]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
