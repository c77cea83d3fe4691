"""docs/PROTOCOL.md is the protocol a reviewer checks the suite against (issue 12, point 14): every config
value it states is the config's, every function it names exists, its published figures are the registry's,
and it cites what a clone holds. Also README's Determinism section and `make help`."""

from __future__ import annotations

import importlib
import math
import re
import subprocess
import sys

import pytest
import yaml
from omegaconf import OmegaConf

from bnrotation.rows import PUBLISHED_ROWS, ROWS, SEEDS, SETS, SWEEP_ROWS, SWEEPS

from conftest import ROOT, compose_cfg

PROTOCOL = (ROOT / "docs" / "PROTOCOL.md").read_text()
README = (ROOT / "README.md").read_text()
CODE = re.compile(r"^(?:task|model|optim|probes|bnstats|averaging|runner|records|checkpoints|rows|diagnose|config|"
                  r"interventions|monitor|provenance|article|names|"
                  r"cli|analysis\.[a-z_]+)(?:\.[A-Za-z_][A-Za-z0-9_]*)+$")
KEY_VALUE = re.compile(r"^([a-z_]+(?:\.[a-z_0-9]+)+)=(.+)$")
FILES = (".md", ".parquet", ".yaml", ".py", ".csv")


def _ticked() -> list[str]:
    return re.findall(r"`([^`\n]+)`", PROTOCOL)


def _resolve(name: str):
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):  # the longest importable module prefix, then attributes
        try:
            obj = importlib.import_module("bnrotation." + ".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(name)


def test_every_function_the_protocol_names_exists():
    names = [t for t in _ticked() if CODE.match(t) and not t.endswith(FILES)]
    assert len(names) > 60  # every definition says where it lives
    missing = []
    for name in names:
        try:
            _resolve(name)
        except (AttributeError, ModuleNotFoundError):
            missing.append(name)
    assert not missing


def test_every_config_value_the_protocol_states_is_the_configs():
    cfg = OmegaConf.to_container(compose_cfg(["experiment=adam"]), resolve=False)
    stated = [KEY_VALUE.match(t).groups() for t in _ticked() if KEY_VALUE.match(t)]
    assert len(stated) > 25
    wrong = []
    for key, text in stated:
        want = yaml.safe_load(text)
        if isinstance(want, str) and re.fullmatch(r"[0-9.]+e-?[0-9]+", want):
            want = float(want)  # YAML 1.1 reads 1e-05 as text
        got = OmegaConf.select(OmegaConf.create(cfg), key, default="<missing>")
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        same = math.isclose(got, want) if isinstance(want, float) and isinstance(got, (int, float)) else got == want
        if not same:
            wrong.append(f"{key}: protocol {want!r}, config {got!r}")
    assert not wrong


def test_the_published_figures_are_the_registrys():
    for row in PUBLISHED_ROWS:
        spec = ROWS[row]
        p = spec.published
        line = f"| {spec.label} | {p.rotation_deg_per_100:.2f}° | {p.norm_growth:.2f}× | {100 * p.acc_eval_mode:.1f}% " \
               f"| {100 * p.checks_below_90:.0f}% |"
        assert line in PROTOCOL, row
    window = ROWS["adam_bn_m0.3"].published
    assert f"{window.rotation_deg_per_100:.2f}° per 100 steps, {100 * window.acc_eval_mode:.1f}%, " \
           f"{100 * window.checks_below_90:.0f}% of checks" in PROTOCOL


def test_the_protocol_cites_what_a_clone_holds_and_counts_the_runs_the_sweep_makes():
    for gone in ("seeds/", "shared/", "Write your own code", "000_dfe744f8d99ebd95", "002_bed0d9f46231aa5f"):
        assert gone not in PROTOCOL
    assert 'Pradeep (2026), *Batch norm\'s running statistics describe a\nnetwork that has already moved*' in PROTOCOL
    assert f"{len(SWEEP_ROWS)} rows × {len(SEEDS)} seeds = {len(SWEEP_ROWS) * len(SEEDS)} runs" in PROTOCOL
    assert f"{len(PUBLISHED_ROWS) + 1} rows × {len(SEEDS)} seeds = {(len(PUBLISHED_ROWS) + 1) * len(SEEDS)} runs" \
        in PROTOCOL  # the article's table and its window test
    assert "## Beyond the article" in PROTOCOL
    for row in SWEEP_ROWS:
        assert f"| {row} " in PROTOCOL, row


def test_readme_determinism_agrees_with_the_switch():
    section = README[README.index("### Determinism"):README.index("## Figures, claims and notebooks")]
    assert "`deterministic`" in section and "`runner.set_determinism`" in section
    assert "sets\nneither" not in section and "not switched on here" not in section
    import bnrotation.runner as runner
    doc = runner.set_determinism.__doc__
    for flag in ("use_deterministic_algorithms", "cuDNN deterministic", "CUBLAS_WORKSPACE_CONFIG=:4096:8"):
        assert flag in doc
    for flag in ("torch.use_deterministic_algorithms(True)", "torch.backends.cudnn.deterministic =",
                 "CUBLAS_WORKSPACE_CONFIG=:4096:8"):
        assert flag in section


def test_make_help_lists_out_rows_and_seeds_with_their_defaults():
    out = subprocess.run(["make", "-s", "help", f"PY={sys.executable}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60).stdout
    assert "OUT=<folder>" in out and "[the results root they read]" in out
    assert "ROWS=<row,row,...> SEEDS=<s,s,...>" in out
    for sweep in [*SWEEPS.values(), *SETS.values()]:  # every sweep rows.py declares, with its rows and seeds
        assert f"{','.join(sweep.rows)} {','.join(map(str, sweep.seeds))}" in out
    assert ",".join(SWEEP_ROWS) in out and ",".join(map(str, SEEDS)) in out
