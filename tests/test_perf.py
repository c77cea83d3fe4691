"""The fast paths change no result: reused intervention evaluations, evaluation chunks; the bench's arithmetic."""

from __future__ import annotations

import copy
import math
import importlib.util
import sys

import pytest
import torch

from bnrotation.bnstats import batch_statistics, reestimate, running_stat_layers, swapped_statistics
from bnrotation.study.config import ModelConfig, TaskConfig
from bnrotation.study.model import build_network
from bnrotation.probes import accuracy
from bnrotation.study.interventions import run_interventions
from bnrotation.evaluation import EVAL_CHUNK, EVAL_CHUNK_BYTES, eval_chunk
from bnrotation.study.task import NoisyTemplates, generator

from conftest import ROOT, compose_cfg


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench", ROOT / "bench" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def stale():
    """A model whose stored statistics are wrong, labels its re-estimated twin gets all right, the batches."""
    model = build_network(ModelConfig(), 10, seed=0)
    task = NoisyTemplates.build(TaskConfig(), seed=0)
    g = generator(0, "reestimate")
    batches = [task.sample(32, g)[0].contiguous(memory_format=torch.channels_last) for _ in range(4)]
    x, _ = task.fixed_set(256, 0, "heldout")
    x = x.contiguous(memory_format=torch.channels_last)
    twin = copy.deepcopy(model)
    reestimate(twin, batches)
    twin.eval()
    with torch.no_grad():
        y = twin(x).argmax(1)  # the re-estimated statistics score 100% by construction
    with torch.no_grad():
        model.bn2.running_mean += 3.0  # stale statistics in the middle layer
    return model, batches, x, y


def test_reused_intervention_evaluations_equal_recomputed_ones(stale):
    model, batches, x, y = stale
    df = run_interventions(model, batches, x, y, chunk=64).table
    acc = {(r.intervention, r.k, r.norm_layer): r.acc_eval_mode for r in df.itertuples()}
    total = sum(m.num_features for _, m in running_stat_layers(model))
    stored = accuracy(model, x, y, "eval")
    assert acc[("reestimate", -1, "")] == 1.0 and stored < 0.9  # the oracle separates the two
    assert acc[("none", -1, "")] == stored
    with swapped_statistics(model, {}):
        assert acc[("top_k", 0, "")] == accuracy(model, x, y, "eval")
    fresh_model = copy.deepcopy(model)
    reestimate(fresh_model, batches)
    fresh = {n: (m.running_mean, m.running_var) for n, m in running_stat_layers(fresh_model)}
    with swapped_statistics(model, fresh):
        assert acc[("top_k", total, "")] == accuracy(model, x, y, "eval") == 1.0
    given = run_interventions(model, batches, x, y, chunk=64, acc_stored=stored).table
    assert given.equals(df)


def test_evaluation_accuracy_in_training_batch_chunks_equals_one_pass(stale):
    model, _, x, y = stale
    assert accuracy(model, x, y, "eval", chunk=eval_chunk(torch.device("cpu"), len(y))) == \
        accuracy(model, x, y, "eval", chunk=len(y))


def test_eval_chunk_is_small_on_cpu_and_everything_on_a_gpu():
    assert eval_chunk(torch.device("cpu"), 4000) == EVAL_CHUNK == 64
    assert eval_chunk(torch.device("cpu"), 64) == 64
    assert eval_chunk(torch.device("cuda"), 4000) == 4000


def test_eval_chunk_grows_only_while_the_weights_outweigh_a_chunks_activations():
    """Doubled from EVAL_CHUNK while the weights exceed the chunk's largest activation and the doubled chunk's
    stays within EVAL_CHUNK_BYTES: timm's resnet18 at 32x32 (43 MiB, 64 KiB per sample) gets 128; small weights,
    or a large activation per sample, keep 64; never more than the samples."""
    cpu, kib, mib = torch.device("cpu"), 1 << 10, 1 << 20
    assert EVAL_CHUNK_BYTES == 8 * mib
    assert eval_chunk(cpu, 512, 43 * mib, 64 * kib) == 128
    assert eval_chunk(cpu, 512, 43 * mib, 128 * kib) == 64  # 128 samples would hold 16 MiB
    assert eval_chunk(cpu, 512, 1 * mib, 64 * kib) == 64  # the weights read per chunk are less than its activations
    assert eval_chunk(cpu, 100, 43 * mib, 16 * kib) == 100  # never past the samples
    assert eval_chunk(cpu, 40000, 43 * mib, 1 * kib) == 8192  # 8192 samples of 1 KiB hold 8 MiB
    assert eval_chunk(cpu, 40000, 5 * mib, 1 * kib) == 8192  # 4096 samples hold 4 MiB, less than the weights
    assert eval_chunk(cpu, 40000, 3 * mib, 1 * kib) == 4096
    assert eval_chunk(torch.device("cuda"), 512, 43 * mib, 64 * kib) == 512


@pytest.mark.parametrize("arch", ["convnet", "resnet20"])
def test_the_monitor_evaluates_the_suites_networks_in_chunks_of_eval_chunk(arch):
    """On the suite's networks, at the suite's probe size, the monitor's evaluation-mode pass keeps the chunk
    `make bench` (c) chose, EVAL_CHUNK: what the runs measure through it is unchanged."""
    from bnrotation.monitor import StalenessMonitor

    cfg = ModelConfig(arch=arch, channels=[16, 32, 64] if arch == "resnet20" else [32, 64, 64])
    model = build_network(cfg, 10, seed=0)
    x = torch.randn(TaskConfig().probe_size, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    monitor = StalenessMonitor(model, x, warn=False)
    monitor(0)
    assert monitor.eval_chunk == EVAL_CHUNK


def test_bench_extrapolates_per_step_and_per_event(bench):
    full = bench.Schedule(6000, 61, 41, 9, averaging=9)
    measured = bench.Schedule(300, 4, 3, 1, averaging=1)
    t = {"wall": 22.0, "train": 3.0, "probes": 4.0, "checks": 6.0, "interventions": 5.0, "averaging": 1.0,
         "unknown": 0.5}
    got = bench.extrapolate_runner(t, measured, full)
    assert got == pytest.approx({"steps": 60.0, "probes": 61.0, "checks": 82.0, "interventions": 45.0,
                                 "averaging": 9.0, "fixed": 3.0, "total": 260.0})
    bare = bench.extrapolate_bare({"seconds": {"setup": 1.0, "train": 6.0, "checks": 3.0}, "checks": 3},
                                  300, full)
    assert bare["total"] == pytest.approx(120.0 + 41.0 + 1.0)


def test_bench_schedule_of_the_full_run_and_its_reduced_run(bench):
    from bnrotation.study.config import to_run_config
    full = bench.Schedule.of(to_run_config(compose_cfg(["experiment=adam"])))
    assert full == bench.Schedule(6000, 61, 41, 9, averaging=9)
    reduced = to_run_config(compose_cfg(["experiment=adam", *bench.reduced_overrides(300)]))
    assert bench.Schedule.of(reduced) == bench.Schedule(300, 4, 3, 1, averaging=1)
    assert reduced.scale.heldout_size == 4000 and reduced.scale.reestimate_batches == 200
    with pytest.raises(SystemExit, match="100"):
        bench.reduced_overrides(50)


def test_bench_splits_cores_into_jobs_and_threads(bench):
    assert bench.splits(2) == [(1, 2), (2, 1)]
    assert bench.splits(4) == [(1, 4), (2, 2), (4, 1)]


def test_bare_loop_runs_its_checks(bench):
    out = bench.bare_loop(3, {2, 3}, heldout=32, device=torch.device("cpu"))
    assert out["checks"] == 2 and all(v >= 0 for v in out["seconds"].values())


def test_bench_timm_section_reads_the_call_share_by_cpu_time_on_a_cpu_and_by_the_wall_on_a_gpu(bench):
    """(h)'s figures from made-up timings: the paired overhead per pair and its median, the median step of the A
    blocks, the median call over the calls in the B blocks and alone, its share of 100 median steps, and the clock
    the report compares with the target (stated, never asserted); without per-step times (a GPU) the median A
    block / 100 is the step."""
    h = {"pairs": [((10.0, 20.0), (10.4, 20.5)), ((12.0, 22.0), (12.2, 22.6)), ((11.0, 21.0), (11.3, 21.5)),
                   ((10.0, 20.0), (10.3, 20.4))],
         "steps_a": [(0.1, 0.2)] * 300 + [(0.5, 0.4)] * 99,  # one slowed step in four: the median passes over them
         "calls_in_blocks": [(0.30, 0.55), (0.32, 0.58), (0.31, 0.56), (0.29, 0.54)],
         "calls_alone": [(0.28, 0.53), (0.33, 0.57), (0.30, 0.55)], "probe": 512, "layers": 20, "paired": 20,
         "eval_chunk": 128, "device": "cpu"}
    f = bench.timm_figures(h)
    assert f["target_clock"] == "cpu"
    assert f["wall"]["base"] == 10.5 and f["cpu"]["base"] == 20.5
    assert f["cpu"]["step"] == 0.2 and f["cpu"]["call"] == 0.55 and math.isclose(f["cpu"]["share"], 0.55 / 20)
    assert math.isclose(f["wall"]["share"], 0.30 / 10)
    assert f["wall"]["pairs"] == pytest.approx([0.04, 0.2 / 12, 0.3 / 11, 0.03])
    assert math.isclose(f["wall"]["spread"], 2.0 / 10.5)
    text = "\n".join(bench.report_timm(None, h))
    assert f"by CPU (`time.process_time`), {100 * 0.55 / 20:.2f}%" in text and "assert" not in text
    gpu = h | {"device": "cuda", "steps_a": []}
    assert bench.timm_figures(gpu)["target_clock"] == "wall"
    assert math.isclose(bench.timm_figures(gpu)["wall"]["share"], 0.30 / 10.5)
    assert "by wall, " in "\n".join(bench.report_timm(None, gpu))


def test_bench_takes_each_parts_least_disturbed_round(bench):
    rounds = [{"steps": 10.0, "checks": 5.0, "total": 15.0}, {"steps": 30.0, "checks": 2.0, "total": 32.0}]
    assert bench.least_disturbed(rounds) == {"steps": 10.0, "checks": 2.0, "total": 12.0}


@pytest.mark.parametrize("arch", ["convnet", "resnet20"])
def test_bench_layerwise_chunked_training_pass_equals_one_pass(bench, arch):
    """The alternative (c) times against the one training-mode pass computes the same outputs, ragged last
    chunk included, so the timing compares like with like."""
    cfg = ModelConfig(arch=arch, channels=[16, 32, 64] if arch == "resnet20" else [32, 64, 64])
    model = build_network(cfg, 10, seed=0)
    x = torch.randn(50, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    with torch.no_grad(), batch_statistics(model):
        one = model(x)
        chunked = bench.layerwise_chunked_forward(model, x, 16)
    assert torch.allclose(chunked, one, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_compiled_evaluation_equals_eager_and_one_graph_serves_every_model_of_a_structure():
    """Through ``compiled_evaluation``'s :class:`CompiledEvaluation` the evaluation-mode accuracy and outputs equal
    eager execution (outputs to 1e-5), for the live model and for another instance with other weights and running
    statistics, which runs through the same compiled graph; flags are restored. The choice is explicit: inside the
    block a pass that is not handed the compiled evaluation runs eagerly and compiles nothing."""
    import torch._dynamo.utils as dynamo_utils

    from bnrotation.evaluation import compiled_evaluation, evaluation_forward
    from bnrotation.study.provenance import compile_cache_per_kernel_path

    # As the runner does: torch's on-disk cache does not tell CPU kernel paths apart, so code compiled by an
    # earlier `make test` under AVX2 would be handed to `make test-kernels`' default path and fail to run there.
    compile_cache_per_kernel_path()
    models = [build_network(ModelConfig(), 10, seed=s) for s in (0, 1)]
    for m in models[1].modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
    models[0].train()
    models[1].eval()
    x = torch.randn(40, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (40,))
    eager = [(evaluation_forward(m, x), accuracy(m, x, y, "eval", 16)) for m in models]
    dynamo_utils.counters.clear()
    with compiled_evaluation() as compiled:
        assert torch.equal(evaluation_forward(models[0], x), eager[0][0])  # not handed it: eager
        assert accuracy(models[0], x, y, "eval", 16) == eager[0][1]
        assert not dynamo_utils.counters["stats"]["unique_graphs"]
        got = [(evaluation_forward(m, x, compiled=compiled), accuracy(m, x, y, "eval", 16, compiled)) for m in models]
        graphs = dynamo_utils.counters["stats"]["unique_graphs"]
    assert compiled.failed is None
    assert models[0].training and not models[1].training  # flags as they were
    for (out_e, acc_e), (out_c, acc_c) in zip(eager, got):
        assert torch.allclose(out_c, out_e, atol=1e-5) and acc_c == acc_e
    assert graphs <= 3  # chunk sizes 40, 16 and the ragged 8; the second model compiled nothing new
