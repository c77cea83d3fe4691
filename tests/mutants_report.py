"""``make mutants``: which functions mutmut mutates, and its report (``results/mutants/report.md``).

``python tests/mutants_report.py --names`` prints the mutant-name patterns ``mutmut run`` takes: the pure-logic
functions of the pairing, the lint, the refresh, the claim kinds' judges and verdicts, the commands'
input readers (``bnrotation.inputs``), and (issue 52) the signal and its rule (``bnrotation.staleness``), the evaluation
path of ``bnrotation.probes``, the calibration's signals, truth, method and scores, the zoo report's per-run and depth
tables, the Fashion-MNIST reader, the tasks' draws (``study.task``) and the per-run helpers of two claim sections
(``claims.real_images``, ``claims.carryover``), and (issue 66) every function of the library's verdict path: ``monitor``, ``check``, ``bnstats``, ``oneshot``, ``probe_batch``, ``pooling``, ``weight_rows``, ``averaging``, ``audit`` and ``checkpoints``, less :data:`OUT_OF_SCORE` and the argument parsers' help text (:func:`only_text`). ``--names --since COMMIT`` prints the patterns of the functions changed since a commit (``make mutants SINCE=``), and ``--survivors`` their surviving mutants. Text-only functions (a warning's wording, a claim's sentences, the
reports' markdown, figures, ``main``) are left out: a mutant there changes a message, which the suite checks only
where a message is the promise. ``--out FILE`` reads mutmut's results under
``mutants/`` and writes the score, per module and in all, and every surviving mutant with its diff.

The score is killed / (mutants − equivalent − CPU only − not checked), with a timeout counted as killed and a
mutant that no selected test reaches ("no tests") counted as surviving. :data:`EQUIVALENT` lists the mutants
excluded as equivalent (no input can tell them from the original), each with the reason; :data:`CPU_ONLY` those
excluded because only a machine with CUDA devices can tell them apart (``make mutants`` runs on the CPU-only torch
of the lock file), each with the machine that would.

mutmut 3 does not mutate decorated functions (``@property``, ``@dataclass`` fields' defaults): the judges'
``passed`` and ``tolerance`` properties are not in the score; tests/test_claims.py and
tests/test_mutation_targets.py judge them across their boundaries.
For the same reason the claims declared with ``@bespoke`` (the verdicts of ``claims.real_images`` and
``claims.carryover``) and the ``functools.lru_cache`` readers (``fashion_mnist.load_split``, ``task._grey_images``,
``task._normalised_images``) are out of the score; ``calibration.log_signals`` and ``truth`` keep their
``once_per_run`` cache in a decorated shell around an undecorated body (``_log_signals``, ``_truth``), which is
mutated, and ``probes.evaluation_path_pass`` holds ``torch.no_grad()`` as a block.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import functools
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The functions mutated, as mutmut names them (module.x_function, module.xǁClassǁmethod), by module.
NAMES = {
    "pairing": ["bnrotation.pairing.x_channel_axis_after__mutmut_*", "bnrotation.pairing.x__permutation__mutmut_*",
                "bnrotation.pairing.x__concatenated__mutmut_*", "bnrotation.pairing.x__cat_dim__mutmut_*",
                "bnrotation.pairing.x__decide__mutmut_*", "bnrotation.pairing.x__op_name__mutmut_*",
                "bnrotation.pairing.x__output_channel_axis__mutmut_*", "bnrotation.pairing.x__prod__mutmut_*",
                "bnrotation.pairing.xǁNormPairǁspans__mutmut_*", "bnrotation.pairing.xǁ_Placementǁ*"],
    "lint": ["bnrotation.lint.*"],
    "refresh": ["bnrotation.refresh.*"],
    "claims.kinds": ["bnrotation.study.analysis.claims.kinds.x_match_tolerance__mutmut_*",
                     "bnrotation.study.analysis.claims.kinds.x_matches__mutmut_*",
                     "bnrotation.study.analysis.claims.kinds.x_above__mutmut_*",
                     "bnrotation.study.analysis.claims.kinds.x_withhold_verdicts__mutmut_*",
                     "bnrotation.study.analysis.claims.kinds.xǁClaimǁ*",
                     "bnrotation.study.analysis.claims.kinds.xǁBespokeǁoutcome__mutmut_*",
                     "bnrotation.study.analysis.claims.kinds.xǁ*ǁjudge__mutmut_*",
                     "bnrotation.study.analysis.claims.kinds.xǁOrderingǁmeans__mutmut_*",
                     "bnrotation.study.analysis.claims.kinds.xǁRankOrderǁrows_with_runs__mutmut_*"],
    "inputs (the readers)": [f"bnrotation.inputs.x_{f}__mutmut_*" for f in (
        "load_batches", "_read_batches", "load_probe", "load_weights", "load_function", "model_from_factory",
        "build_user_model", "_prefix_hint", "parse_device", "parse_model_kwargs", "_items", "first_line", "one_line", "batch_limit",
        "thresholds_from")]
                           + ["bnrotation.inputs.xǁInputErrorǁ*"],
    # issue 52: the newer modules
    "staleness": ["bnrotation.staleness.*"],
    "probes (the evaluation path)": ["bnrotation.probes.x_pooled_chunk_moments__mutmut_*",
                                     "bnrotation.probes.x_evaluation_path_pass__mutmut_*"],
    "calibration": [f"bnrotation.study.analysis.tables.calibration.x_{f}__mutmut_*" for f in (
        "task_of", "in_sample", "out_of_sample_run", "_bn_layers", "_log_signals", "_layer_signals",
        "_with_gap_and_warmup", "_forecaster_signals", "_truth", "points", "_round_down", "choose_threshold",
        "score", "warns_at", "lead_times", "chosen_thresholds", "logged", "forecast_threshold", "_round_up",
        "early_warning", "forecast_thresholds", "score_of")],
    "zoo_report": [f"bnrotation.study.analysis.tables.zoo_report.x_{f}__mutmut_*" for f in (
        "per_run", "_count", "depth_split")],
    "fashion_mnist": [f"bnrotation.study.fashion_mnist.x_{f}__mutmut_*" for f in (
        "_path", "read_idx", "check_dir", "verify_official")],
    "task": [f"bnrotation.study.task.x_{f}__mutmut_*" for f in (
        "stream_seed", "generator", "build_task", "run_dtype", "memory_format", "heldout_set", "probe_set",
        "reestimation_batches")]
            + [f"bnrotation.study.task.xǁ{c}ǁ{m}__mutmut_*" for c, m in (
                ("NoisyTemplates", "build"), ("NoisyTemplates", "to"), ("NoisyTemplates", "cpu"),
                ("NoisyTemplates", "population"), ("NoisyTemplates", "sample"), ("NoisyTemplates", "fixed_set"),
                ("FashionMNIST", "build"), ("FashionMNIST", "_noisy"), ("FashionMNIST", "sample"),
                ("FashionMNIST", "fixed_set"), ("FashionMNIST", "cpu"))],
    "claims.real_images": ["bnrotation.study.analysis.claims.real_images.x__recovery__mutmut_*"],
    "claims.carryover": [f"bnrotation.study.analysis.claims.carryover.x_{f}__mutmut_*" for f in (
        "resnet_runs", "_halves_text", "_reestimated_text")],
    # issue 66: the modules that turn the library's measurements into a verdict
    **{m: [f"bnrotation.{m}.*"] for m in (
        "monitor", "mode_check", "verdict", "layer_measures", "check", "check_report", "bnstats", "oneshot",
        "probe_batch", "pooling", "weight_rows", "averaging", "audit", "checkpoints")},
}

ROUND_PLACES = ("round(..., max(places, 1)) for max(places, 0): places < 0 only for t >= 10, where the rounded value "
                "is a whole number (a multiple of 10), the same rounded to 0 or 1 decimal")
FAR_SCALE = ("the false-alarm rate scaled by another positive constant (the fresh count times, the stale count, or 2 "
             "for 1 when there are no fresh points): it is only compared with itself across thresholds (far < best), "
             "so the choice is the same")
# Mutants no input can tell from the original: excluded from the score, each with its reason.
UNREAD_SOURCE = ("the source of a placement or piece that holds a weight layer's channels is never read: reasons name "
                 "the source only of channels without a weight layer (pairing._decide, _concatenated)")
WHOLE_BRANCH = ("a piece has no size only when placed without shapes, and _fx_placements never concatenates without "
                "shapes (execution order always has them); with a size the rebuilt piece equals the part's one piece "
                "(offset 0, the same size and via) but for its source, which is never read")
STAGED = ("the default device (the CPU) for --device: the loaded tensors are only staged on the device before "
          "load_state_dict copies them into the model's own, so the model ends up the same for every device they "
          "load onto (only a device torch cannot load onto, which parse_device refuses first for the commands, "
          "would make the original refuse the file where the mutant reads it)")
ZERO_OFFSET = ("every piece starts at its weight layer's output channel 0: pairing makes a piece with offset 0 or "
               "copies one, and sees through no operation that slices channels")
EQUIVALENT: dict[str, str] = {
    "bnrotation.refresh.x_reestimate_if_stale__mutmut_22": "warn=None for warn=False: the monitor reads warn only as "
                                                           "a truth value",
    "bnrotation.refresh.x_reestimate_if_stale__mutmut_73": "lag.get(name, None) for math.nan: the monitor's layer table "
                                                           "has a line for every layer with running statistics, so the "
                                                           "default is never read",
    "bnrotation.refresh.x_reestimate_if_stale__mutmut_75": "lag.get(name) for lag.get(name, math.nan): as _73",
    "bnrotation.study.analysis.claims.kinds.xǁOrderingǁmeans__mutmut_5": "reindex(None) for reindex(rows): the runs are "
        "already the declared rows (check() gives NOT RUN before judging when one is missing); Spearman's rho is the "
        "same in any row order the two columns share, and the words sort the rows by accuracy",
    "bnrotation.pairing.xǁ_Placementǁseen_through__mutmut_21": UNREAD_SOURCE,
    "bnrotation.pairing.xǁ_Placementǁseen_through__mutmut_30": UNREAD_SOURCE,
    "bnrotation.pairing.xǁ_Placementǁseen_through__mutmut_26": "a piece's size after a see-through operation is read "
        "only by a concatenation, whose whole-output branch rebuilds a single piece without a size from the "
        "concatenated shapes (a norm layer fed by one piece is paired without sizes)",
    **{f"bnrotation.pairing.x__concatenated__mutmut_{i}": WHOLE_BRANCH
       for i in (8, 9, 10, 11, 13, 15, *range(17, 30))},
    "bnrotation.pairing.x__decide__mutmut_67": ZERO_OFFSET + ": a segment's offset is always Segment's default, 0",
    "bnrotation.pairing.x__concatenated__mutmut_50": ZERO_OFFSET + ": a piece without a weight layer is never made "
                                                   "a segment, and its offset (None) is the same in every call's key",
    "bnrotation.pairing.x__concatenated__mutmut_58": ZERO_OFFSET + ": as _50, with offset 1 in every call's key",
    "bnrotation.inputs.x_load_function__mutmut_4": "spec or 'XXXX' for spec or '': an empty or None spec matches "
        "SPEC neither way (module:function needs a colon), and the refusal quotes spec itself",
    "bnrotation.inputs.x_load_weights__mutmut_7": "folder = None for folder = '': folder is read only as a truth "
        "value until a Hugging Face folder replaces it with the file read",
    "bnrotation.inputs.x_load_weights__mutmut_15": STAGED + ": _pretrained_weights(folder) stages them there",
    "bnrotation.inputs.x_load_weights__mutmut_21": STAGED + ": load_checkpoint(weights) stages them there",
    "bnrotation.inputs.x_load_weights__mutmut_103": "strict=None for strict=False: nn.Module.load_state_dict reads "
        "strict only as a truth value (if strict:)",
    "bnrotation.inputs.x_load_batches__mutmut_15": "_items(batches, None) for a tensor, tuple or mapping: _items "
        "returns [batches] for those without reading spec (it names spec only when refusing any other type)",
    "bnrotation.inputs.x_load_batches__mutmut_31": "load_checkpoint(batches) for load_checkpoint(batches, "
        "map_location='cpu'): 'cpu' is load_checkpoint's default",
    # issue 52: the newer modules
    "bnrotation.probes.x_evaluation_path_pass__mutmut_7": "the caller's scratch always (never a new Scratch for "
        "None): input_moments gives the same values with and without a buffer (scratch=None: a fresh tensor)",
    "bnrotation.probes.x_evaluation_path_pass__mutmut_12": "at = [1] for [0]: the chunk index is only a key of the "
        "layer's parts, rewritten by the chunk loop; one pass has one key whatever it is",
    "bnrotation.probes.x_evaluation_path_pass__mutmut_17": "n = numel / C for numel // C: a whole number either "
        "way (float or int), and the pooling's arithmetic is float64 on both",
    "bnrotation.probes.x_evaluation_path_pass__mutmut_26": "hook(None, inp, name): the hook never reads its module",
    "bnrotation.probes.x_evaluation_path_pass__mutmut_37": "chunk > len(x) for chunk >= len(x): a chunk of exactly "
        "N splits x into one chunk, which the pooling returns as it is: the same pass",
    "bnrotation.study.analysis.tables.calibration.x__round_down__mutmut_29": ROUND_PLACES,
    "bnrotation.study.analysis.tables.calibration.x__round_up__mutmut_34": ROUND_PLACES,
    **{f"bnrotation.study.analysis.tables.calibration.x_choose_threshold__mutmut_{i}": FAR_SCALE for i in (23, 30, 31)},
    "bnrotation.study.analysis.tables.calibration.x_early_warning__mutmut_9": "t.empty and s.empty for t.empty or "
        "s.empty: the truth restricted to the log steps (t[t.step.isin(s.step)]) is empty when either is, and an "
        "empty truth has no stale point: the run adds nothing either way",
    "bnrotation.study.analysis.tables.calibration.x_early_warning__mutmut_13": "to_numpy(None) for to_numpy(bool): "
        "warming_up is a bool column (log_signals makes it with staleness.in_warmup)",
    "bnrotation.study.analysis.tables.calibration.x_early_warning__mutmut_16": "np.errstate(invalid=None): numpy "
        "compares NaN with no floating-point warning, so the state it would set is never consulted",
    "bnrotation.study.analysis.tables.calibration.x_early_warning__mutmut_20": "to_numpy(None) for to_numpy(float): "
        "the forecasters' columns are float arrays (_forecaster_signals builds them with numpy)",
    **{f"bnrotation.study.analysis.tables.calibration.x__forecaster_signals__mutmut_{i}": "reset_index(drop=None or False): the old index becomes a "
       "column 'index', which _with_gap_and_warmup's column selection drops" for i in (2, 6)},
    "bnrotation.study.analysis.tables.calibration.x__forecaster_signals__mutmut_8": "to_numpy(None) for to_numpy(float) of E: a float column already",
    "bnrotation.study.analysis.tables.calibration.x__forecaster_signals__mutmut_11": "to_numpy(None) for to_numpy(float) of the steps: integer steps give the "
        "same slope (numpy's true division)",
    "bnrotation.study.analysis.tables.calibration.x__forecaster_signals__mutmut_19": "len(out) >= 1 for > 1: with one line the slope's assignment is to an empty "
        "slice (slope[1:] of one), changing nothing",
    **{f"bnrotation.study.analysis.tables.calibration.x__with_gap_and_warmup__mutmut_{i}": "merge without on='step': the only column the signals and the "
       "checks' gaps share is step" for i in (28, 31)},
    **{f"bnrotation.study.analysis.tables.calibration.x__forecaster_signals__mutmut_{i}": "a column of None or of objects for NaN floats (rot = None, "
       "np.full(n, None), to_numpy(None) of a mapped float column, an empty Series of object dtype): every reader "
       "converts it to float first (to_numpy(float), np.asarray(..., float)), where None is NaN"
       for i in (42, 44, 73, 92, 96)},
    "bnrotation.staleness.xǁThresholdsǁwarns__mutmut_1": "np.errstate(invalid=None): as calibration.early_warning's "
        "_16",
    "bnrotation.study.analysis.tables.calibration.x__log_signals__mutmut_33": "to_numpy(None) for to_numpy(float) of "
        "the channels table's statistics: float64 columns (records' schema)",
    "bnrotation.study.analysis.tables.calibration.x_warns_at__mutmut_22": "np.errstate(invalid=None): as "
        "early_warning's _16",
    **{f"bnrotation.study.analysis.tables.calibration.x_warns_at__mutmut_{i}": "np.asarray(w) without bool: w is "
       "already a bool array (a comparison, or Thresholds.warns)" for i in (30, 32)},
    "bnrotation.study.analysis.tables.calibration.x_warns_at__mutmut_34": "to_numpy(None) for to_numpy(bool): as "
        "early_warning's _13",
    "bnrotation.study.analysis.claims.real_images.x__recovery__mutmut_19": "astype(None) for astype(float): the "
        "steps map onto acc_train_mode, a float column (NaN where a step has no check), so the column is float "
        "already",
    "bnrotation.study.analysis.tables.zoo_report.x_per_run__mutmut_52": "astype(None) (float 1.0/0.0) for "
        "astype(bool) of the filled rule_stale, which holds only True and False: & with the bool stale column gives "
        "the same truth values",
    "bnrotation.study.analysis.tables.zoo_report.x_per_run__mutmut_53": "fillna(None) for fillna(False): pandas "
        "puts None where NaN was, and astype(bool) reads None as False too",
    "bnrotation.study.fashion_mnist.x_read_idx__mutmut_67": "len(raw) <= want for len(raw) < want inside "
        "len(raw) != want: the two agree there",
    **{f"bnrotation.study.task.{k}": "torch.randint(high, size) for torch.randint(0, high, size): low defaults to 0, "
       "the same call" for k in ("xǁFashionMNISTǁsample__mutmut_7", "xǁNoisyTemplatesǁsample__mutmut_9",
                                  "xǁNoisyTemplatesǁsample__mutmut_21")},
    **{f"bnrotation.study.task.x_stream_seed__mutmut_{i}": "a mask of every bit (-1, 2**64 - 1, 2**65 - 1) for "
       "2**63 - 1: state[0] < 2**32, so (state[0] << 31) ^ state[1] < 2**63 already" for i in (22, 23, 24)},
    "bnrotation.study.task.x_stream_seed__mutmut_7": "generate_state(2) without dtype: numpy.uint32 is its default",
    "bnrotation.study.task.x_stream_seed__mutmut_11": "generate_state(3) for (2): each word of a SeedSequence's state "
        "depends on its index alone, so the first two words are the same, and only those are read",
}

DEVICE = ("a device argument dropped or None (the default device, the CPU): with every tensor on the CPU the same "
          "tensors; a CUDA machine tells them apart (tensors left on the CPU beside the run's device)")
# Mutants only a machine with CUDA devices can tell from the original: every tensor of make mutants is on the CPU
# (the lock file's torch is CPU-only). Excluded from the score as the equivalent ones are, each with its reason.
CPU_ONLY: dict[str, str] = {
    "bnrotation.inputs.x_parse_device__mutmut_17": "(device.index or 1) for (device.index or 0): killable only where "
        "torch sees exactly one CUDA device (cuda and cuda:0 then refused): with none every cuda device is refused "
        "before its index is read, with two or more index 0 and 1 are both below the count",
    # issue 52: the task's tensors are drawn on the CPU and moved to the run's device
    **{f"bnrotation.study.task.{k}": DEVICE for k in (
        "xǁFashionMNISTǁ_noisy__mutmut_6", "xǁFashionMNISTǁ_noisy__mutmut_9", "xǁFashionMNISTǁfixed_set__mutmut_62",
        "xǁFashionMNISTǁfixed_set__mutmut_63", "xǁFashionMNISTǁfixed_set__mutmut_65",
        "xǁFashionMNISTǁfixed_set__mutmut_71", "xǁFashionMNISTǁsample__mutmut_6", "xǁFashionMNISTǁsample__mutmut_11",
        "xǁNoisyTemplatesǁfixed_set__mutmut_14", "xǁNoisyTemplatesǁfixed_set__mutmut_24",
        "xǁNoisyTemplatesǁfixed_set__mutmut_25", "x_build_task__mutmut_5", "x_generator__mutmut_4",
        "x_reestimation_batches__mutmut_15", "xǁFashionMNISTǁbuild__mutmut_37", "xǁFashionMNISTǁbuild__mutmut_39",
        "xǁFashionMNISTǁbuild__mutmut_41", "xǁNoisyTemplatesǁbuild__mutmut_48", "xǁNoisyTemplatesǁcpu__mutmut_1",
        "xǁNoisyTemplatesǁsample__mutmut_1", "xǁNoisyTemplatesǁsample__mutmut_8", "xǁNoisyTemplatesǁsample__mutmut_13",
        "xǁNoisyTemplatesǁsample__mutmut_20", "xǁNoisyTemplatesǁsample__mutmut_25",
        "xǁNoisyTemplatesǁsample__mutmut_30", "xǁNoisyTemplatesǁsample__mutmut_33", "xǁNoisyTemplatesǁto__mutmut_7")},
}
EXCLUDED = {**EQUIVALENT, **CPU_ONLY}

KILLED = {"killed", "timeout"}


def changed_lines(since: str, root: Path = ROOT) -> dict[Path, set[int]]:
    """``{file: lines}`` of the Python files under ``root/src`` that differ from commit ``since``: the working
    tree's line numbers of every added or changed line (a deletion marks the line after it), and every line of an
    untracked file. Exits 2 (``SystemExit``) naming ``since`` when git does not know it."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        if done.returncode:
            why = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
            print(f"mutants_report: SINCE={since}: not a commit of this repository (git {args[0]}: {why})",
                  file=sys.stderr)
            raise SystemExit(2)
        return done.stdout
    git("rev-parse", "--verify", "--quiet", f"{since}^{{commit}}")
    out: dict[Path, set[int]] = {}
    path = None
    for line in git("diff", "-U0", "--no-color", "--no-renames", since, "--", "src").splitlines():
        if line.startswith("+++ "):
            path = None if line == "+++ /dev/null" else root / line[len("+++ b/"):]
        elif line.startswith("@@") and path is not None and path.suffix == ".py":
            start, _, count = re.match(r"@@ -\S+ \+(\S+) @@", line).group(1).partition(",")
            n = int(count) if count else 1
            out.setdefault(path, set()).update(range(int(start), int(start) + max(n, 1)))
    for name in git("ls-files", "--others", "--exclude-standard", "--", "src").splitlines():
        if name.endswith(".py"):
            out[root / name] = set(range(1, len((root / name).read_text().splitlines()) + 1))
    return out


def changed_functions(since: str, root: Path = ROOT) -> list[str]:
    """The functions changed since commit ``since``, as mutmut names them (``module.x_function``,
    ``module.xǁClassǁmethod``): the top-level functions and the methods of top-level classes (mutmut mutates no
    other) with a changed line between their ``def`` (decorators included) and their last line."""
    import ast
    names = []
    for path, lines in sorted(changed_lines(since, root).items()):
        if not path.exists():
            continue
        module = ".".join(path.relative_to(root / "src").with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text(), str(path))
        defs = [(node, f"x_{node.name}") for node in tree.body
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        defs += [(item, f"xǁ{node.name}ǁ{item.name}") for node in tree.body if isinstance(node, ast.ClassDef)
                 for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node, name in defs:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if lines & set(range(first, node.end_lineno + 1)):
                names.append(f"{module}.{name}")
    return names


def since_patterns(since: str) -> list[str]:
    """``mutmut run``'s patterns for :func:`changed_functions` (``make mutants SINCE=<commit>``)."""
    return [f"{name}__mutmut_*" for name in changed_functions(since)]


def print_survivors(folder: Path, wanted: list[str]) -> int:
    """Print each mutant of ``wanted`` (patterns) that survived or that no selected test reaches, with its diff;
    1 if there is one, 0 if every mutant was killed or excluded, 2 if mutmut left no result for them."""
    found = {k: v for k, v in results(folder, wanted).items() if k not in EXCLUDED and not only_text(k, folder)}
    if not found:
        print(f"mutants_report: no mutmut result under {folder} for these functions (outside pyproject.toml's "
              "[tool.mutmut] only_mutate, or never mutated)", file=sys.stderr)
        return 2
    survivors = sorted(k for k, v in found.items() if v in ("survived", "no tests"))
    for name in survivors:
        print(f"### {name} ({found[name]})\n{diff(name)}\n")
    killed, total = score(found)
    print(f"{len(survivors)} surviving of {len(found)} mutants; score {killed}/{total} = "
          f"{killed / total:.1%}" if total else "no mutant judged")
    return 1 if survivors else 0


def patterns() -> list[str]:
    return [p for group in NAMES.values() for p in group]


# Functions of the modules above that mutmut mutates but the score leaves out, each with its reason.
IMPORT_TIME = ("called when the module is imported (a class body's property), before mutmut's trampoline picks a "
               "mutant: every mutant runs the original, so none can be killed")
OUT_OF_SCORE: dict[str, str] = {
    "bnrotation.oneshot.x_record_field__mutmut_*": IMPORT_TIME,
}
# Functions whose mutants that change only what --help prints (an argument parser's help, description, epilog, prog
# or metavar, and inputs.add_batch_arguments's help text) are text, left out of the score as text-only functions are; their other mutants (a default, a type, a
# flag's name, required=) count.
TEXT_STRINGS = ("bnrotation.audit.x_parse_args__mutmut_*", "bnrotation.check.x_parse_args__mutmut_*")
HELP_KEYWORDS = {"help", "description", "epilog", "prog", "metavar", "formatter_class"}


@functools.cache
def _functions(path: Path) -> dict[str, str]:
    """``{name: ast dump}`` of the functions of mutmut's mutated copy ``path``, with every help keyword's value
    (:data:`HELP_KEYWORDS`) dropped."""
    import ast
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            for call in ast.walk(node):
                if isinstance(call, ast.Call):
                    call.keywords = [k for k in call.keywords if k.arg not in HELP_KEYWORDS]
                    if isinstance(call.func, ast.Name) and call.func.id == "add_batch_arguments":
                        call.args = call.args[:1]  # its second argument is the --batches help text
            out[node.name] = ast.dump(ast.Module(body=node.body, type_ignores=[]))
    return out


def only_text(name: str, folder: Path | None = None) -> bool:
    """Whether mutant ``name`` of a :data:`TEXT_STRINGS` function changes what ``--help`` prints and nothing else:
    its body and the original's are the same once every help keyword is dropped (read from mutmut's mutated copy
    under ``folder``, default mutants/)."""
    if not any(fnmatch.fnmatch(name, p) for p in TEXT_STRINGS):
        return False
    module, _, function = name.rpartition(".")
    path = (folder or ROOT / "mutants") / "src" / Path(*module.split(".")).with_suffix(".py")
    if not path.exists():
        return False
    bodies = _functions(path)
    base = function.rsplit("__mutmut_", 1)[0] + "__mutmut_orig"
    return function in bodies and bodies[function] == bodies.get(base)


def module_of(name: str) -> str | None:
    if any(fnmatch.fnmatch(name, p) for p in OUT_OF_SCORE):
        return None
    return next((m for m, group in NAMES.items() if any(fnmatch.fnmatch(name, p) for p in group)), None)


def results(folder: Path, wanted: list[str] | None = None) -> dict[str, str]:
    """``{mutant: status}`` of every mutant in scope (NAMES, or the patterns ``wanted``), from mutmut's ``.meta``
    files under ``folder``."""
    from mutmut.stats import status_by_exit_code
    out = {}
    for meta in sorted(folder.rglob("*.py.meta")):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if any(fnmatch.fnmatch(name, p) for p in wanted) if wanted is not None else module_of(name):
                out[name] = status_by_exit_code[code]
    return out


def score(found: dict[str, str]) -> tuple[int, int]:
    """(killed, total less the equivalent and CPU-only mutants), over the mutants mutmut got to ("not checked" left
    out: a run stopped part-way says so in its table)."""
    judged = {k: v for k, v in found.items() if k not in EXCLUDED and v != "not checked"}
    return sum(v in KILLED for v in judged.values()), len(judged)


def diff(name: str) -> str:
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    source = ROOT / "src" / Path(*name.split(".x")[0].split(".")).with_suffix(".py")
    try:
        return get_diff_for_mutant(name, path=source.relative_to(ROOT))
    except Exception as err:  # noqa: BLE001 - a diff mutmut cannot rebuild is named, not fatal
        return f"(no diff: {type(err).__name__}: {err})"


def earlier_parts(report: Path, modules: set[str]) -> tuple[dict[str, str], list[str]]:
    """From an earlier report: the table row of each module of ``modules`` (``{module: row}``) and the lines of its
    surviving mutants' sections, for a run that did not rerun those modules."""
    text = report.read_text()
    rows = {m: re.sub(rf"^\| {re.escape(m)} \(earlier run\) \|", f"| {m} |", line)
            for line in text.splitlines() for m in modules
            if re.match(rf"\| {re.escape(m)}( \(earlier run\))? \|", line)}  # an earlier run's own earlier rows too
    blocks = re.split(r"(?m)^(?=### `)", text.split("## Surviving mutants", 1)[-1])[1:]
    kept = [b for b in blocks if module_of(b.split("`")[1]) in modules]
    return rows, [line for b in kept for line in b.rstrip("\n").split("\n") + [""]]


def write_report(out: Path, folder: Path, note: str = "", earlier: Path | None = None) -> str:
    found = results(folder)
    if not found:
        raise SystemExit(f"mutants_report: no mutmut results under {folder}; run `make mutants`")
    text = sorted(k for k in found if only_text(k, folder))
    found = {k: v for k, v in found.items() if k not in text}
    not_run = {m for m in NAMES if all(v == "not checked" for k, v in found.items() if module_of(k) == m)}
    kept_rows, kept_survivors = earlier_parts(earlier, not_run) if earlier else ({}, [])
    found = {k: v for k, v in found.items() if module_of(k) not in kept_rows}
    lines = ["# Mutation score (`make mutants`)", "",
             f"Made by `make mutants` (mutmut {_version()}) on {dt.date.today().isoformat()}, commit "
             f"{_commit()}: `mutmut run` over the functions of tests/mutants_report.py (NAMES), each mutant "
             "with the tests of pyproject.toml's `[tool.mutmut]` that reach its function. Score: killed (a timeout "
             "counts as killed) / mutants less the equivalent ones, those only a CUDA machine can tell apart (CPU "
             "only) and those not checked; a mutant no selected test reaches counts as surviving."
             + (f" {note}" if note else ""), "",
             "| module | killed | total | equivalent | CPU only | score | survived | no tests | not checked |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for module in list(NAMES) + ["all"]:
        if module in kept_rows:
            lines.append(kept_rows[module].replace(f"| {module} |", f"| {module} (earlier run) |", 1))
            continue
        part = {k: v for k, v in found.items() if module == "all" or module_of(k) == module}
        killed, total = score(part)
        module = "all (this run)" if module == "all" and kept_rows else module
        counts = Counter(v for k, v in part.items() if k not in EXCLUDED)
        eq, cpu = sum(k in EQUIVALENT for k in part), sum(k in CPU_ONLY for k in part)
        lines.append(f"| {module} | {killed} | {total} | {eq} | {cpu} | {killed / total:.1%} | {counts['survived']} | "
                     f"{counts['no tests']} | {counts['not checked']} |" if total
                     else f"| {module} | 0 | 0 | {eq} | {cpu} | – | 0 | 0 | {counts['not checked']} |")
    others = Counter(v for v in found.values() if v not in KILLED | {"survived", "no tests", "not checked"})
    if others:
        lines += ["", "Other outcomes: " + ", ".join(f"{n} {s}" for s, n in sorted(others.items()))]
    lines += ["", "## Functions left out of the score", ""]
    lines += [f"- `{k}`: {why}" for k, why in OUT_OF_SCORE.items()]
    lines += [f"- {len(text)} mutants of {', '.join(f'`{p}`' for p in TEXT_STRINGS)} that change a string literal and "
              "nothing else (what --help prints): " + (", ".join(f"`{k.rsplit('_', 1)[-1]}`" for k in text) or "none")]
    lines += ["", "## Equivalent mutants excluded", ""]
    lines += [f"- `{k}`: {why}" for k, why in EQUIVALENT.items()] or ["None."]
    lines += ["", "## Mutants only a CUDA machine can tell apart, excluded (CPU only)", ""]
    lines += [f"- `{k}`: {why}" for k, why in CPU_ONLY.items()] or ["None."]
    survivors = [k for k, v in found.items() if v in ("survived", "no tests") and k not in EXCLUDED]
    earlier_count = sum(line.startswith("### `") for line in kept_survivors)
    lines += ["", f"## Surviving mutants ({len(survivors) + earlier_count})", ""]
    for name in survivors:
        lines += [f"### `{name}` ({found[name]})", "", "```diff", diff(name), "```", ""]
    if kept_survivors:
        lines += [f"Of the earlier run ({', '.join(sorted(kept_rows))}):", ""] + kept_survivors
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    killed, total = score(found)
    return f"mutation score {killed}/{total} = {killed / total:.1%} (written to {out})"


def _version() -> str:
    from importlib.metadata import version
    return version("mutmut")


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--names", action="store_true", help="print the mutant-name patterns for `mutmut run`")
    p.add_argument("--out", type=Path, help="write the report here")
    p.add_argument("--note", default="", help="a sentence on how this run was made, if not by make mutants alone")
    p.add_argument("--mutants", type=Path, default=ROOT / "mutants", help="mutmut's folder (default: mutants/)")
    p.add_argument("--earlier", type=Path, help="an earlier report whose rows (and surviving mutants) stand for the "
                   "modules this run did not check at all")
    p.add_argument("--since", metavar="COMMIT", help="with --names: only the functions changed since COMMIT (the "
                   "working tree against it, untracked files included); with --survivors: the survivors among them")
    p.add_argument("--survivors", action="store_true", help="print the surviving mutants (with --since: of the "
                   "changed functions) and their diffs; exit 1 if any survived")
    args = p.parse_args(argv)
    if args.names:
        names = since_patterns(args.since) if args.since else patterns()
        print(" ".join(names))  # the Makefile turns globbing off (set -f)
        return 0
    if args.survivors:
        return print_survivors(args.mutants, since_patterns(args.since) if args.since else patterns())
    if args.out is None:
        p.error("--names, --survivors or --out FILE")
    print(write_report(args.out, args.mutants, args.note, args.earlier))
    return 0


if __name__ == "__main__":
    sys.exit(main())
