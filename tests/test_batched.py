"""The seeds of a row trained together as one batched model (``batch_seeds``) equal separate runs step for step,
for every optimizer, projected Adam and AdamP included; each seed keeps its own folder, skips, and resumes."""

from __future__ import annotations

import json
import signal

import pandas as pd
import pytest
import torch
import yaml

from bnrotation import records

from bnrotation.study import ensemble
from bnrotation.study.config import ModelConfig, OptimizerConfig
from bnrotation.study.model import build_network
from bnrotation.study.optim import build_optimizer
from bnrotation.study.rundir import RESUME_FILE
from bnrotation.study.runner import run, run_seeds
from bnrotation.study.runtime import RunInterrupted

from test_reliability import tiny
from test_resume import interrupt_at

SEEDS = [0, 1, 2]
TABLES = ("checks", "layers", "channels", "interventions", "averaging")
# Both sides run in float64 (``dtype=float64``): the grouped kernels sum in another order than the plain ones,
# so each operation may round differently by up to 2^-53 ~ 1.1e-16 relative. Twenty steps compound it: Adam
# divides by sqrt(v), and a cosine near zero (a per-channel gradient or update cosine) turns an absolute
# difference into a large relative one. On the ResNet-20 row (the worst) the largest relative difference
# measured (AVX-512) was 1.4e-10, at a gradient cosine near zero; in float32 the same comparison differed by 1.5e-3
# on an update cosine of 0.11, more than float32 tolerances can hold on every kernel path. RTOL = 1e-7 leaves a
# margin of about 700, while a real difference (a member reading another's slice or statistics) is of
# order one: the comparison with another seed's run below fails at it. ATOL covers values that are themselves
# differences of close numbers (drift, lag, a cosine of nearly orthogonal vectors).
DTYPE = "dtype=float64"
RTOL, ATOL = 1e-7, 1e-10


def assert_tables_close(a, b, why: str) -> None:
    for name in TABLES:
        da, db = pd.read_parquet(a / f"{name}.parquet"), pd.read_parquet(b / f"{name}.parquet")
        assert list(da.columns) == list(db.columns), (why, name)
        pd.testing.assert_frame_equal(da, db, check_exact=False, rtol=RTOL, atol=ATOL, obj=f"{why} {name}")


@pytest.mark.kernels
@pytest.mark.parametrize("row, extra", [("sgd", ()), ("adam", ()), ("adamw", ()), ("adam_projected", ()),
                                        ("adamp", ("optimizer.delta=1.0",)), ("adam_cosine", ()),
                                        ("adam_groupnorm", ("model.group_norm_groups=4",)),
                                        ("resnet20_adam", ("model.channels=[8,16,16]",))])
@pytest.mark.slow
def test_a_batch_of_seeds_equals_separate_runs_step_for_step(tmp_path, row, extra):
    """AdamP with delta 1.0 projects in every member at every step: its per-member test matters."""
    name = f"{row}_variant" if extra and "channels" not in extra[0] else row  # a toy variant needs its own name
    overrides = (f"experiment={row}", f"row={name}", "averaging.tail_steps=10", "averaging.tail_every=5", DTYPE,
                 *extra)
    alone = {s: run(tiny(tmp_path / "alone", *overrides, f"seed={s}")) for s in SEEDS}
    together = run_seeds(tiny(tmp_path / "together", *overrides, f"batch_seeds={SEEDS}"))
    assert sorted(together) == SEEDS
    for s in SEEDS:
        assert together[s] == records.run_dir(tmp_path / "together", name, s)
        assert_tables_close(together[s], alone[s], f"{name} seed {s}")
        info = json.loads((together[s] / "run.json").read_text())
        assert info["batched_with_seeds"] == SEEDS and info["seed"] == s
        configs = [yaml.safe_load((d / "config.yaml").read_text()) for d in (together[s], alone[s])]
        assert [c.pop("results_root") for c in configs] != [None, None]
        assert configs[0] == configs[1]  # the seed's own config: a batch is an execution setting
    a, b = (pd.read_parquet(d / "channels.parquet").drop(columns="seed") for d in (together[0], alone[1]))
    with pytest.raises(AssertionError):  # failure case: another seed's separate run is not this member's
        pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=RTOL, atol=ATOL)


def test_a_batch_skips_finished_seeds_and_trains_the_rest(tmp_path):
    done = run(tiny(tmp_path, "experiment=adam", "seed=1"))
    stamp = (done / "run.json").stat().st_mtime_ns
    out = run_seeds(tiny(tmp_path, "experiment=adam", f"batch_seeds={SEEDS}"))
    assert out[1] is None and out[0] and out[2]
    assert (done / "run.json").stat().st_mtime_ns == stamp
    info = json.loads((out[0] / "run.json").read_text())
    assert info["batched_with_seeds"] == [0, 2]


@pytest.mark.kernels
def test_a_stopped_batch_resumes_batched_or_seed_by_seed(tmp_path, monkeypatch):
    overrides = ("experiment=adamp", "row=adamp_delta1", "optimizer.delta=1.0", DTYPE)
    reference = run_seeds(tiny(tmp_path / "ref", *overrides, f"batch_seeds={SEEDS}"))
    cfg = tiny(tmp_path / "stopped", *overrides, f"batch_seeds={SEEDS}")
    with monkeypatch.context() as m:
        interrupt_at(m, [7 * len(SEEDS)], signal.SIGTERM)  # one cross-entropy per seed and step: in step 7
        with pytest.raises(RunInterrupted):
            run_seeds(cfg)
    for s in SEEDS:
        assert (records.run_dir(tmp_path / "stopped", "adamp_delta1", s) / RESUME_FILE).exists()
    # seed 1 resumes alone from its share of the batch's state; seeds 0 and 2 resume together
    alone = run(tiny(tmp_path / "stopped", *overrides, "seed=1"))
    rest = run_seeds(tiny(tmp_path / "stopped", *overrides, "batch_seeds=[0,2]"))
    for s, out in ((1, alone), (0, rest[0]), (2, rest[2])):
        assert json.loads((out / "run.json").read_text())["resumes"][0]["at_step"] == 7
        assert_tables_close(out, reference[s], f"resumed seed {s}")


def test_member_optimizer_state_round_trips_through_the_batch():
    models = [build_network(ModelConfig(channels=[4, 8, 8]), 10, seed=s) for s in SEEDS]
    batched = ensemble.stack_models(models)
    opt = build_optimizer(OptimizerConfig(name="adamp", delta=1.0), batched, members=3)
    x = torch.randn(16, 9, 8, 8).contiguous(memory_format=torch.channels_last)
    targets = [torch.randint(0, 10, (16,)) for _ in SEEDS]
    for _ in range(3):
        opt.zero_grad()
        ensemble.member_losses(batched(x), targets).sum().backward()
        opt.step()
    plain = [build_network(ModelConfig(channels=[4, 8, 8]), 10, seed=s) for s in SEEDS]
    plain_opts = [build_optimizer(OptimizerConfig(name="adamp", delta=1.0), m) for m in plain]
    for i, (m, o) in enumerate(zip(plain, plain_opts)):
        ensemble.copy_member(batched, i, 3, m)
        ensemble.member_optimizer_state(opt, batched, i, 3, o, m)
    again = ensemble.stack_models(plain)
    opt2 = build_optimizer(OptimizerConfig(name="adamp", delta=1.0), again, members=3)
    ensemble.load_optimizer_members(opt2, again, plain_opts, plain)
    for (name, p), p2 in zip(batched.named_parameters(), again.parameters()):
        assert torch.equal(p, p2), name
        for key, value in opt.state[p].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(opt2.state[p2][key])), (name, key)


def test_stack_models_refuses_what_it_cannot_batch():
    with pytest.raises(ValueError, match="no models"):
        ensemble.stack_models([])
    odd = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.PReLU())
    with pytest.raises(ValueError, match="no batched form of PReLU"):
        ensemble.stack_models([odd, odd])
    with pytest.raises(ValueError, match="differ in structure"):
        ensemble.stack_models([torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)), torch.nn.Sequential(torch.nn.Linear(3, 4))])
