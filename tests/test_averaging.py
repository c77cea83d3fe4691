"""Weight averaging, EMA and BatchNorm buffer policies: oracles (swa_utils), closed forms, failure cases."""

from __future__ import annotations

import copy
import functools
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from bnrotation import records
from bnrotation.averaging import (EMA, POLICIES, average_checkpoints, compare_states, mixture_moments,
                                  saved_checkpoints)
from bnrotation.bnstats import reestimate, running_stat_layers, weights_fingerprint
from bnrotation.study.config import ConfigError, ModelConfig, TaskConfig
from bnrotation.study.model import build_network
from bnrotation.study.run_averages import RunAverages
from bnrotation.study.task import NoisyTemplates, generator

TASK = TaskConfig(image_size=8, batch_size=32, probe_size=256)
MODEL = ModelConfig(channels=[8, 16, 16], channels_last=False)


def _task() -> NoisyTemplates:
    return NoisyTemplates.build(TASK, 0, "cpu")


def _batches(n: int = 4, seed: int = 7) -> list[torch.Tensor]:
    g = generator(seed, "reestimate")
    return [_task().sample(TASK.batch_size, g)[0] for _ in range(n)]


def _probe() -> torch.Tensor:
    return _task().fixed_set(TASK.probe_size, 0, "probe")[0]


def _train(model, steps: int, lr: float = 3e-3, on_step=None):
    """Adam on the task, ``steps`` steps from the model's current state; ``on_step(model)`` after each."""
    task, g = _task(), generator(0, "train")
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        x, y = task.sample(TASK.batch_size, g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if on_step is not None:
            on_step(model)
    return model


@pytest.fixture(scope="module")
def trajectory() -> dict[int, dict]:
    """State dicts of one training run at steps 0, 10, 20 and 60."""
    model = build_network(MODEL, TASK.num_classes, 0)
    states, done = {0: copy.deepcopy(model.state_dict())}, 0
    for step in (10, 20, 60):
        _train(model, step - done)
        done = step
        states[step] = copy.deepcopy(model.state_dict())
    return states


def _template():
    return build_network(MODEL, TASK.num_classes, 1)


def _params(m) -> dict:
    return {n: p.detach() for n, p in m.named_parameters()}


def _buffers(m) -> dict:
    return {n: b.detach() for n, b in m.named_buffers()}


def _assert_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# ----------------------------------------------------------------------------- identity
@pytest.mark.parametrize("policy", POLICIES)
def test_averaging_two_identical_checkpoints_is_the_identity(policy, trajectory):
    state = trajectory[20]
    model = _template()
    model.load_state_dict(state)
    out, prov = average_checkpoints(_template(), [state, copy.deepcopy(state)], policy=policy, batches=_batches())
    _assert_equal(_params(out), _params(model))
    if policy == "refresh":  # identity: the same as refreshing the one checkpoint
        reestimate(model, _batches())
    _assert_equal(_buffers(out), _buffers(model))
    assert prov.weights_fingerprint == weights_fingerprint(model)


@pytest.mark.parametrize("policy", ["copy", "average"])
def test_ema_of_a_constant_model_is_the_model(policy, trajectory):
    model = _template()
    model.load_state_dict(trajectory[20])
    ema = EMA(model, 0.9)
    for _ in range(3):
        ema.update(model)
    out, _ = ema.averaged(policy, model)
    _assert_equal(_params(out), _params(model))
    _assert_equal(_buffers(out), _buffers(model))


# ----------------------------------------------------------------------------- mixture: closed form
def _samples(mean: float, var: float, n: int, c: int, seed: int) -> torch.Tensor:
    """(n, c) float64 samples with exactly this population mean and variance per channel."""
    z = torch.randn(n, c, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    z = (z - z.mean(0)) / z.std(0, unbiased=False)
    return mean + math.sqrt(var) * z


def test_mixture_matches_the_law_of_total_variance_and_pooled_samples():
    c, (m1, v1), (m2, v2), (w1, w2) = 4, (-1.0, 0.5), (2.0, 3.0), (0.25, 0.75)
    mean, var = mixture_moments([torch.full((c,), m1), torch.full((c,), m2)],
                                [torch.full((c,), v1), torch.full((c,), v2)], [w1, w2])
    closed_var = w1 * v1 + w2 * v2 + w1 * w2 * (m1 - m2) ** 2
    torch.testing.assert_close(mean, torch.full((c,), w1 * m1 + w2 * m2))
    torch.testing.assert_close(var, torch.full((c,), closed_var))
    pooled = torch.cat([_samples(m1, v1, 1000, c, 0), _samples(m2, v2, 3000, c, 1)])  # weights 1:3
    torch.testing.assert_close(var.double(), pooled.var(0, unbiased=False), rtol=1e-6, atol=0)
    torch.testing.assert_close(mean.double(), pooled.mean(0), rtol=1e-6, atol=1e-9)


def test_mixture_policy_on_two_checkpoints_with_known_moments(trajectory):
    a, b = copy.deepcopy(trajectory[10]), copy.deepcopy(trajectory[60])
    layers = [n for n, _ in running_stat_layers(_template())]
    for i, layer in enumerate(layers):
        c = a[f"{layer}.running_mean"].numel()
        a[f"{layer}.running_mean"], a[f"{layer}.running_var"] = torch.full((c,), 0.0), torch.full((c,), 1.0 + i)
        b[f"{layer}.running_mean"], b[f"{layer}.running_var"] = torch.full((c,), 2.0), torch.full((c,), 3.0)
    mix, prov = average_checkpoints(_template(), [a, b], policy="mixture")
    avg, _ = average_checkpoints(_template(), [a, b], policy="average")
    for i, layer in enumerate(layers):
        m = dict(mix.named_modules())[layer]
        torch.testing.assert_close(m.running_mean, torch.full_like(m.running_mean, 1.0))
        torch.testing.assert_close(m.running_var, torch.full_like(m.running_var, (1.0 + i + 3.0) / 2 + 1.0))
        torch.testing.assert_close(dict(avg.named_modules())[layer].running_var,
                                   torch.full_like(m.running_var, (1.0 + i + 3.0) / 2))  # drops the spread
        assert int(m.num_batches_tracked) == int(b[f"{layer}.num_batches_tracked"]) == 60  # the largest count
    assert prov.weights_fingerprint is None  # statistics of two networks, estimated for neither


# ----------------------------------------------------------------------------- refresh
def test_refresh_changes_no_parameter_and_equals_reestimating_the_average(trajectory):
    ckpts = [trajectory[10], trajectory[60]]
    before = copy.deepcopy(ckpts)
    refreshed, prov = average_checkpoints(_template(), ckpts, weights=[1, 3], policy="refresh", batches=_batches())
    averaged, _ = average_checkpoints(_template(), ckpts, weights=[1, 3], policy="average")
    assert compare_states(refreshed, averaged).same_parameters
    reestimate(averaged, _batches())
    _assert_equal(_buffers(refreshed), _buffers(averaged))
    assert prov.weights_fingerprint == prov.report.weights_fingerprint == weights_fingerprint(refreshed)
    assert prov.report.batches == 4 and all(int(m.num_batches_tracked) == 4 for _, m in running_stat_layers(refreshed))
    for b, a in zip(before, ckpts):  # the constituents are not touched
        _assert_equal(a, b)


def test_weighted_average_of_parameters_is_the_weighted_sum(trajectory):
    out, _ = average_checkpoints(_template(), [trajectory[10], trajectory[60]], weights=[1, 3], policy="copy",
                                 copy_from=0)
    for n, p in out.named_parameters():
        torch.testing.assert_close(p.detach(), 0.25 * trajectory[10][n] + 0.75 * trajectory[60][n])
    _assert_equal(_buffers(out), {n: trajectory[10][n] for n in _buffers(out)})


# ----------------------------------------------------------------------------- oracles: swa_utils
def test_uniform_average_matches_averaged_model_swa_with_buffers(trajectory):
    ckpts = [trajectory[s] for s in (10, 20, 60)]
    swa = AveragedModel(_template(), use_buffers=True)
    for s in ckpts:
        m = _template()
        m.load_state_dict(s)
        swa.update_parameters(m)
    out, _ = average_checkpoints(_template(), ckpts, policy="average")
    for (n, a), (_, b) in zip(out.state_dict().items(), swa.module.state_dict().items()):
        if n.endswith("num_batches_tracked"):
            continue  # AveragedModel averages the counts; the average policy keeps the largest
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)


def test_ema_matches_averaged_model_with_an_ema_function():
    decay = 0.9
    model = build_network(MODEL, TASK.num_classes, 0)
    ema = EMA(model, decay)
    with_buffers = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
    without = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=False)

    def both(m):
        ema.update(m)
        with_buffers.update_parameters(m)
        without.update_parameters(m)
        if ema.updates == 1:  # the first update copies
            _assert_equal(_params(ema.module), _params(m))

    _train(model, 12, on_step=both)
    for name, p in ema.module.named_parameters():
        torch.testing.assert_close(p, dict(with_buffers.module.named_parameters())[name], rtol=0, atol=1e-7)
    avg_buffers, copy_buffers = ema.averaged("average", model)[0], ema.averaged("copy", model)[0]
    for name, b in _buffers(avg_buffers).items():
        if name.endswith("num_batches_tracked"):
            assert int(b) == int(dict(model.named_buffers())[name]) == 12  # the live count, explicitly
        else:
            torch.testing.assert_close(b, dict(with_buffers.module.named_buffers())[name], rtol=0, atol=1e-7)
    _assert_equal(_buffers(copy_buffers), _buffers(without.module))



def test_ema_update_is_swa_utils_ema_function_bit_for_bit():
    """Each update after the first is ``get_ema_multi_avg_fn(decay)`` applied to the same floats, to the bit."""
    decay = 0.999
    model = build_network(MODEL, TASK.num_classes, 0)
    ema = EMA(model, decay)
    oracle = [t.detach().clone() for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()]
    step_fn = get_ema_multi_avg_fn(decay)

    def both(m):
        first = ema.updates == 0
        ema.update(m)
        live = [t.detach() for t in [*m.parameters(), *m.buffers()] if t.is_floating_point()]
        if first:
            torch._foreach_copy_(oracle, live)
        else:
            step_fn(oracle, live, ema.updates)

    _train(model, 6, on_step=both)
    mine = [t for t in [*ema.module.parameters(), *ema.module.buffers()] if t.is_floating_point()]
    assert len(mine) == len(oracle) and all(torch.equal(a, b) for a, b in zip(mine, oracle))
    assert not torch.equal(mine[0], next(model.parameters()))  # six updates at decay 0.999: not the live weights


def test_an_ema_survives_torch_save_pickle_and_deepcopy(tmp_path):
    """Saved, pickled or copied mid-run, an EMA carries on exactly as the original does."""
    import io
    import pickle

    model = build_network(MODEL, TASK.num_classes, 0)
    ema = EMA(model, 0.9)
    _train(model, 3, on_step=ema.update)
    torch.save(ema, tmp_path / "ema.pt")
    copies = [torch.load(tmp_path / "ema.pt", weights_only=False), pickle.loads(pickle.dumps(ema)),
              copy.deepcopy(ema)]
    buf = io.BytesIO()
    torch.save(ema, buf)
    copies.append(torch.load(io.BytesIO(buf.getvalue()), weights_only=False))
    for c in copies:
        assert (c.decay, c.updates) == (0.9, 3)
        _assert_equal(_params(c.module), _params(ema.module))

    def all_update(m):
        for e in (ema, *copies):
            e.update(m)

    _train(model, 3, on_step=all_update)
    for c in copies:
        assert c.updates == 6
        _assert_equal(_params(c.module), _params(ema.module))
        _assert_equal(_buffers(c.module), _buffers(ema.module))


# ----------------------------------------------------------------------------- states told apart
def test_compare_states_tells_equal_weights_with_other_buffers_apart(trajectory):
    stale, _ = average_checkpoints(_template(), [trajectory[0], trajectory[60]], weights=[0, 1], policy="copy",
                                   copy_from=0)  # weights of step 60, buffers of step 0
    fresh, _ = average_checkpoints(_template(), [trajectory[60]], policy="refresh", batches=_batches(8))
    diff = compare_states(fresh, stale)
    assert diff.same_parameters and not diff.same_buffers  # equal weights, different buffers: told apart
    assert set(diff.buffers) >= {"bn1.running_mean", "bn2.running_var"}


def test_compare_states_needs_a_model_to_tell_parameters_from_buffers(trajectory):
    with pytest.raises(TypeError, match="parameters from buffers"):
        compare_states(trajectory[10], trajectory[20])
    diff = compare_states(trajectory[10], trajectory[10], model=_template())
    assert diff.same_parameters and diff.same_buffers


# ----------------------------------------------------------------------------- failure cases
@pytest.mark.parametrize("kwargs, match", [
    ({"policy": "median"}, "policy"),
    ({"policy": "refresh"}, "needs batches"),
    ({"weights": [1, -1]}, "weights"),
    ({"weights": [1]}, "1 weights for 2"),
    ({"copy_from": 2, "policy": "copy"}, "copy_from"),
])
def test_bad_arguments_are_refused(kwargs, match, trajectory):
    with pytest.raises(ValueError, match=match):
        average_checkpoints(_template(), [trajectory[10], trajectory[20]], **kwargs)


def test_checkpoint_of_another_architecture_is_refused(trajectory):
    other = build_network(ModelConfig(channels=[8, 8, 16], channels_last=False), TASK.num_classes, 0)
    with pytest.raises(ValueError, match="checkpoint 1: shapes"):
        average_checkpoints(_template(), [trajectory[10], other])
    with pytest.raises(ValueError, match="mixture"):
        EMA(_template(), 0.9).averaged("mixture", _template())


# ----------------------------------------------------------------------------- the runner and the table
FAST = ["task.probe_size=128", "task.image_size=8", "task.batch_size=16"]  # a toy size: about a second a run


class _Seen(RunAverages):
    """The runner's averages, keeping what :meth:`after_scoring` is handed (the extension point of
    ``runner.run(averages=...)``)."""

    built: list[tuple] = []  # (averaging config, model) per call of the factory

    def __init__(self, cfg, model, seen: list[dict]):
        super().__init__(cfg, model)
        self.seen = seen
        _Seen.built.append((cfg, model))

    def after_scoring(self, model, step, x, y, averaged, provenance, *, average, decay, policy):
        self.seen.append({"step": step, "average": average, "decay": decay, "policy": policy,
                          "provenance": provenance.policy, "own_copy": averaged is not model,
                          "fingerprint": provenance.weights_fingerprint, "weights": weights_fingerprint(averaged)})


@pytest.fixture(scope="module")
def averaging_run(tmp_path_factory):
    """One ``adam`` run with averaging at toy size, its averages built by the factory given to ``runner.run``;
    returns ``(results root, run folder, what after_scoring saw, the run's config)``."""
    from conftest import run_cfg
    from bnrotation.study.runner import run
    root = tmp_path_factory.mktemp("avg")
    cfg = run_cfg(["experiment=adam", "averaging.tail_steps=10", "averaging.tail_every=5", *FAST], root)
    seen: list[dict] = []
    _Seen.built.clear()
    out = run(cfg, averages=functools.partial(_Seen, seen=seen))
    return root, out, pd.DataFrame(seen), cfg


def test_runner_writes_the_averaging_table(averaging_run):
    _, out, *_ = averaging_run
    av = pd.read_parquet(out / "averaging.parquet")
    assert set(records.TABLE_COLUMNS["averaging"]) <= set(av.columns)
    assert sorted(av["step"].unique()) == [10, 20]  # the intervention steps at smoke scale
    per_step = av[av["step"] == 20]
    assert sorted(map(tuple, per_step[["average", "policy"]].drop_duplicates().values)) == sorted(
        [("live", "none")] + [("ema", p) for p in ("copy", "average", "refresh")]
        + [("tail", p) for p in POLICIES])
    assert len(per_step) == 1 + 2 * 3 + 4 and per_step["acc_eval_mode"].between(0, 1).all()
    assert set(per_step.loc[per_step["average"] == "ema", "decay"]) == {0.99, 0.999}
    assert (per_step.loc[per_step["average"] == "tail", "constituents"] == 2).all()  # snapshots at 15, 20
    assert (per_step.loc[per_step["average"] == "tail", "window_steps"] == 10).all()
    checks = pd.read_parquet(out / "checks.parquet").set_index("step")["acc_eval_mode"]
    live = av[av["average"] == "live"].set_index("step")["acc_eval_mode"]
    assert live.to_dict() == checks.loc[[10, 20]].to_dict()


def test_the_runner_builds_its_averages_with_the_factory_it_is_given(averaging_run):
    """``runner.run(cfg, averages=factory)``: the factory is called once, with the run's averaging config, and
    :meth:`RunAverages.after_scoring` is handed every averaged copy the table scores (each EMA and the tail average
    under each policy, at each averaging step; never the live model), its own module with its own provenance."""
    from bnrotation.study import runner
    _, out, seen, cfg = averaging_run
    assert len(_Seen.built) == 1 and _Seen.built[0][0] == cfg.averaging
    assert runner.RunAverages is RunAverages  # nothing replaced in the runner's module
    scored = pd.read_parquet(out / "averaging.parquet")
    keys = ["step", "average", "decay", "policy"]
    copies = scored.loc[scored["average"] != "live", keys].reset_index(drop=True)
    pd.testing.assert_frame_equal(seen[keys], copies)
    assert (seen["provenance"] == seen["policy"]).all() and seen["own_copy"].all()
    refreshed = seen[seen["policy"] == "refresh"]
    assert len(refreshed) == 2 * (2 + 1)  # two steps x (two EMA decays, the tail)
    assert (refreshed["fingerprint"] == refreshed["weights"]).all()


def test_the_averaging_audit_reaches_the_runner_through_its_argument(tmp_path):
    """``experiments/audit_averaging.py`` audits each copy the run scores, from the run's own averages: one audit
    row per scored copy, the provenance's verdict ``re-estimated`` for every ``refresh`` copy, and ``audit.csv``
    beside the tables; the runner's module is left as it was."""
    import importlib.util
    from conftest import ROOT, run_cfg
    from bnrotation.study import runner
    spec = importlib.util.spec_from_file_location("audit_averaging", ROOT / "experiments" / "audit_averaging.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    folder, audit = script.audit_run(run_cfg(["experiment=adam", "averaging.tail_steps=10", "averaging.tail_every=5",
                                              *FAST], tmp_path))
    assert runner.RunAverages is RunAverages
    scored = pd.read_parquet(folder / "averaging.parquet")
    keys = ["step", "average", "decay", "policy"]
    pd.testing.assert_frame_equal(audit[keys], scored.loc[scored["average"] != "live", keys].reset_index(drop=True))
    assert set(audit.loc[audit["policy"] == "refresh", "verdict_provenance"]) == {"re-estimated"}
    pd.testing.assert_frame_equal(pd.read_csv(folder / "audit.csv")[keys], audit[keys], check_dtype=False)


def test_averaging_changes_nothing_in_the_training_run(averaging_run, tmp_path):
    from conftest import run_cfg
    from bnrotation.study.runner import run
    _, out, *_ = averaging_run
    off = run(run_cfg(["experiment=adam", "averaging.enabled=false", "interventions=false", *FAST], tmp_path))
    pd.testing.assert_frame_equal(pd.read_parquet(out / "checks.parquet"), pd.read_parquet(off / "checks.parquet"))
    assert pd.read_parquet(off / "averaging.parquet").empty


def test_saved_checkpoints_of_a_run_are_averaged(averaging_run):
    _, out, *_ = averaging_run
    ckpts = saved_checkpoints(out, last=2)
    assert [c["step"] for c in ckpts] == [10, 20]  # the intervention steps, oldest first
    avg, prov = average_checkpoints(build_network(ModelConfig(), TASK.num_classes, 0), ckpts, policy="copy")
    for n, p in avg.named_parameters():
        torch.testing.assert_close(p.detach(), (ckpts[0]["model"][n] + ckpts[1]["model"][n]) / 2)
    assert prov.source == "buffers of constituent 1 of 2"
    with pytest.raises(FileNotFoundError, match="no saved checkpoints"):
        saved_checkpoints(out / "nowhere")


def test_make_table_writes_averaging_md(averaging_run, tmp_path):
    from bnrotation.study.analysis.tables.table import main as table_main
    root, *_ = averaging_run
    assert table_main(["--results", str(root), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "averaging.md").read_text()
    assert "`adam`" in md and "EMA 0.999 refresh" in md and "Tail 10 steps mixture" in md and "Live" in md
    csv = pd.read_csv(tmp_path / "averaging.csv")
    assert len(csv) == 1 + 2 * 3 + 4 and (csv["n_seeds"] == 1).all()


@pytest.mark.parametrize("override, key", [
    ("averaging.ema_decays=[1.5]", "averaging.ema_decays"),
    ("averaging.tail_steps=7", "averaging.tail_steps"),
    ("averaging.tail_every=0", "averaging.tail_every"),
    ("averaging.at=never", "averaging.at"),
])
def test_bad_averaging_config_names_the_key(override, key, tmp_path):
    from conftest import run_cfg
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        run_cfg(["experiment=adam", override], tmp_path)
