"""The condition map's knobs (issue 49): the task keys that morph the templates towards Fashion-MNIST and back
(``task.template_scale``, ``task.num_classes``, ``task.train_size``, ``task.pixel_noise``). Each changes what it
should, with a second case beside the first; each bad value stops with a message naming the key; at their defaults
the tasks draw exactly what they drew before the knobs (an oracle: the sampler as it was written before)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bnrotation.study.config import ConfigError, TaskConfig, to_run_config
from bnrotation.study.task import STREAMS, FashionMNIST, NoisyTemplates, build_task, generator, stream_seed
from conftest import FASHION_MNIST_SAMPLE, TOY_SIZE, compose_cfg, run_cfg

SMALL = dict(image_size=4, probe_size=8)  # 3x4x4 templates: cheap, and still i.i.d. N(0, 1) values


def templates(seed: int = 0, **kw) -> NoisyTemplates:
    return build_task(TaskConfig(**{**SMALL, **kw}), seed)


def fmnist(seed: int = 0, **kw) -> FashionMNIST:
    return build_task(TaskConfig(name="fashion_mnist", image_size=8, probe_size=8, data_dir=str(FASHION_MNIST_SAMPLE),
                                 **kw), seed)


def rows_of(x: torch.Tensor) -> set[bytes]:
    """The distinct samples of a batch (N, ...), as bytes."""
    return {r.numpy().tobytes() for r in x.reshape(len(x), -1)}


# ----------------------------------------------------------------------------- defaults: the protocol, bit for bit
def old_templates_sample(task: NoisyTemplates, n: int, gen: torch.Generator):
    """The oracle: NoisyTemplates.sample as it was before the knobs (labels, then the noise, from one generator)."""
    y = torch.randint(0, task.cfg.num_classes, (n,), generator=gen)
    noise = torch.randn((n,) + tuple(task.templates.shape[1:]), generator=gen)
    return noise.add_(task.templates[y], alpha=task.cfg.template_scale), y


@pytest.mark.parametrize("stream", ["train", "heldout"])
def test_templates_at_the_defaults_draw_what_they_drew_before_the_knobs(stream):
    task = templates(seed=3)
    assert task.train_x is None and task.describe()["train_size"] is None
    x, y = task.sample(64, generator(3, stream))
    x_old, y_old = old_templates_sample(task, 64, generator(3, stream))
    assert torch.equal(y, y_old) and torch.equal(x, x_old)
    x, y = task.fixed_set(64, 3, stream)
    x_old, y_old = old_templates_sample(task, 64, generator(3, stream))
    assert torch.equal(y, y_old) and torch.equal(x, x_old)


def test_the_new_stream_leaves_every_earlier_streams_seed_where_it_was():
    """``trainset`` is appended: the index, and so the seed, of every stream before it is unchanged."""
    assert STREAMS[-1] == "trainset"
    assert len({stream_seed(5, s) for s in STREAMS}) == len(STREAMS)
    for i, s in enumerate(STREAMS[:-1]):
        state = np.random.SeedSequence([5, i]).generate_state(2, dtype=np.uint32)
        assert stream_seed(5, s) == int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def test_fashion_mnist_at_the_defaults_draws_no_noise_and_keeps_every_image():
    task = fmnist()
    assert task.train_index is None and len(task.train_y) == 300
    g1, g2 = generator(0, "train"), generator(0, "train")
    x, y = task.sample(32, g1)
    idx = torch.randint(0, 300, (32,), generator=g2)
    assert torch.equal(x, task.train_x[idx]) and torch.equal(y, task.train_y[idx])
    assert torch.equal(g1.get_state(), g2.get_state())  # nothing more drawn


# ----------------------------------------------------------------------------- task.template_scale: the SNR
@pytest.mark.parametrize("scales", [(0.6, 0.3), (0.6, 2.4)])
def test_template_scale_scales_the_signal_and_leaves_the_noise(scales):
    """Same seed, same stream: x_a − x_b = (a − b) · template[y] exactly, and the noise x − a · template[y] is
    the same at both scales; the SNR (signal over the unit noise) is the scale."""
    a, b = scales
    ta, tb = templates(template_scale=a), templates(template_scale=b)
    assert torch.equal(ta.templates, tb.templates)
    (xa, ya), (xb, yb) = ta.sample(256, generator(0, "train")), tb.sample(256, generator(0, "train"))
    assert torch.equal(ya, yb)
    torch.testing.assert_close(xa - xb, (a - b) * ta.templates[ya], rtol=0, atol=1e-5)
    torch.testing.assert_close(xa - a * ta.templates[ya], xb - b * tb.templates[yb], rtol=0, atol=1e-5)
    assert ta.describe()["template_scale"] == a and tb.describe()["template_scale"] == b


# ----------------------------------------------------------------------------- task.num_classes
@pytest.mark.parametrize("k", [2, 20])
def test_num_classes_sets_the_templates_and_labels(k):
    task = templates(num_classes=k)
    assert task.templates.shape[0] == k and task.describe()["num_classes"] == k
    _, y = task.sample(512, generator(0, "train"))
    assert set(y.tolist()) == set(range(k))


# ----------------------------------------------------------------------------- task.train_size: a finite set
@pytest.mark.parametrize("n", [16, 40])
def test_a_finite_template_set_repeats_the_same_n_samples(n):
    """Every training batch, the probe set and the re-estimation draws come from the same N samples; the
    held-out set is new samples of the task; without the knob no sample repeats."""
    task = templates(train_size=n)
    assert task.train_x.shape == (n, 3, 4, 4) and task.describe()["train_size"] == n
    kept = rows_of(task.train_x)
    assert len(kept) == n
    g = generator(0, "train")
    seen = set().union(*(rows_of(task.sample(32, g)[0]) for _ in range(20)))  # 640 draws from n
    assert seen == kept
    probe, _ = task.fixed_set(8, 0, "probe")
    assert rows_of(probe) <= kept and len(rows_of(probe)) == 8
    held, _ = task.fixed_set(64, 0, "heldout")
    assert not rows_of(held) & kept
    fresh = templates()  # the infinite set: 640 draws, 640 distinct samples
    g = generator(0, "train")
    assert len(set().union(*(rows_of(fresh.sample(32, g)[0]) for _ in range(20)))) == 640


def test_a_finite_template_set_is_the_seeds_own():
    a, b = templates(train_size=16), templates(train_size=16)
    assert torch.equal(a.train_x, b.train_x)
    assert not torch.equal(a.train_x, templates(seed=1, train_size=16).train_x)


@pytest.mark.parametrize("n", [24, 100])
def test_a_fashion_mnist_subset_repeats_the_same_n_images(n):
    task = fmnist(train_size=n)
    assert len(task.train_y) == n and len(set(task.train_index.tolist())) == n
    assert task.describe()["train_size"] == n
    full = fmnist()
    torch.testing.assert_close(task.train_x, full.train_x[task.train_index], rtol=0, atol=0)
    g = generator(0, "train")
    seen = set().union(*(rows_of(task.sample(32, g)[0]) for _ in range(20)))
    assert seen <= rows_of(task.train_x) and len(seen) <= n
    probe, _ = task.fixed_set(8, 0, "probe")
    assert rows_of(probe) <= rows_of(task.train_x)


# ----------------------------------------------------------------------------- task.pixel_noise on Fashion-MNIST
@pytest.mark.parametrize("stream", ["train", "heldout", "probe"])
def test_pixel_noise_is_added_with_the_runs_seed(stream):
    """The noise is drawn from the draw's own stream of the run's seed: two noise levels at one seed differ from
    the clean images by the same draws scaled (0.5 and 2.0: exactly 4x), and another seed draws other noise."""
    def draw(seed, sigma):
        task = fmnist(seed, pixel_noise=sigma)
        return task.sample(32, generator(seed, stream))[0] if stream == "train" else task.fixed_set(32, seed, stream)[0]

    clean, low, high = draw(0, 0.0), draw(0, 0.5), draw(0, 2.0)
    torch.testing.assert_close(high - clean, 4 * (low - clean), rtol=0, atol=1e-5)
    assert 0.4 < float((low - clean).std()) < 0.6
    assert torch.equal(low, draw(0, 0.5))  # the same seed: the same noise
    other = draw(1, 0.5) - draw(1, 0.0)
    assert not torch.allclose(other, low - clean)
    assert fmnist(pixel_noise=0.5).describe()["pixel_noise"] == 0.5


# ----------------------------------------------------------------------------- refusals, before any work
@pytest.mark.parametrize("overrides, key", [
    (["task.train_size=-1"], "task.train_size"),
    (["task.train_size=100"], "task.train_size"),  # below task.probe_size (512): the probe set is drawn from it
    (["task.pixel_noise=0.5"], "task.pixel_noise"),  # the templates' noise is template_scale's
    (["task=fashion_mnist", "task.pixel_noise=-0.1"], "task.pixel_noise"),
    (["task=fashion_mnist", "task.pixel_noise=nan"], "task.pixel_noise"),
])
def test_a_bad_knob_value_names_its_key_and_what_is_allowed(overrides, key):
    with pytest.raises(ConfigError, match=rf"^{key}: expected "):
        to_run_config(compose_cfg(["experiment=adam", "row=map_adam+x", *overrides]))


def test_a_fashion_mnist_subset_larger_than_its_file_names_the_key():
    with pytest.raises(ConfigError, match=r"^task.train_size: expected 0 or at most 300"):
        fmnist(train_size=301)


# ----------------------------------------------------------------------------- run.json reads them back
def test_a_run_records_its_knobs_in_run_json(tmp_path):
    from bnrotation.study.runner import run

    out = run(run_cfg(["experiment=adam", "row=map_adam+train_size32", *TOY_SIZE, "task.train_size=32",
                       "task.template_scale=0.3", "model.channels=[4,8,8]"], tmp_path))
    task = json.loads((out / "run.json").read_text())["task"]
    assert (task["train_size"], task["template_scale"], task["num_classes"]) == (32, 0.3, 10)


# ----------------------------------------------------------------------------- a run's fixed sets (study.task)
@pytest.mark.parametrize("channels_last", [True, False])
def test_a_runs_fixed_sets_are_its_seeds_own_in_its_memory_format_and_dtype(channels_last, tmp_path):
    """The held-out and probe sets of a run: their sizes, their own streams of the run's seed (the second case: the
    probe set is not the held-out set's first images), the model's memory format; and the run's dtype by name."""
    from bnrotation.study.task import heldout_set, memory_format, probe_set, run_dtype

    cfg = run_cfg(["experiment=adam", *TOY_SIZE, f"model.channels_last={str(channels_last).lower()}",
                   "dtype=float64", "seed=3"], tmp_path)
    task = build_task(cfg.task, cfg.seed, dtype=run_dtype(cfg))
    assert run_dtype(cfg) is torch.float64 and task.templates.dtype is torch.float64
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert memory_format(cfg) is fmt
    (hx, hy), (px, py) = heldout_set(task, cfg), probe_set(task, cfg)
    assert hx.shape == (32, 3, 8, 8) and px.shape == (16, 3, 8, 8) and hy.shape == (32,) and py.shape == (16,)
    assert hx.is_contiguous(memory_format=fmt) and px.is_contiguous(memory_format=fmt)
    for (x, y), stream in (((hx, hy), "heldout"), ((px, py), "probe")):
        want_x, want_y = task.fixed_set(len(y), 3, stream)
        assert torch.equal(x, want_x) and torch.equal(y, want_y), stream
    assert not torch.equal(px, hx[:16])


def test_a_finite_template_sets_probe_may_take_all_of_it_in_its_seeds_order_and_no_more():
    """The probe set of a finite template set: all N of them at most (the boundary, from both sides), drawn in the
    order of the seed's own stream (again the same, another seed another)."""
    task = templates(train_size=8)
    a, _ = task.fixed_set(8, 0, "probe")
    assert torch.equal(a, task.fixed_set(8, 0, "probe")[0]) and not torch.equal(a, task.fixed_set(8, 1, "probe")[0])
    assert rows_of(a) == rows_of(task.train_x)
    with pytest.raises(ConfigError) as refused:
        task.fixed_set(9, 0, "probe")
    assert str(refused.value) == ("task.probe_size: expected at most task.train_size=8 (the probe set is drawn from "
                                  "the finite training set), got 9")


def test_a_fashion_mnist_subset_keeps_the_test_files_held_out_set_and_its_own_fields_on_the_cpu():
    full, sub = fmnist(), fmnist(train_size=50)
    assert torch.equal(sub.fixed_set(20, 0, "heldout")[0], full.fixed_set(20, 0, "heldout")[0])
    on_cpu = sub.cpu()
    assert on_cpu.cfg is sub.cfg and on_cpu.norm == sub.norm
    assert all(torch.equal(getattr(on_cpu, k), getattr(sub, k)) for k in ("train_x", "train_y", "train_index"))
    with pytest.raises(ConfigError) as refused:
        sub.fixed_set(51, 0, "probe")
    assert str(refused.value) == ("task.probe_size: expected at most 50 (Fashion-MNIST's training images kept by "
                                  "task.train_size), got 51")


def test_fashion_mnist_pixel_noise_is_the_generators_normal_draws_in_the_runs_dtype():
    """The noise as its docstring gives it: ``x + pixel_noise * N(0, 1)`` drawn with the generator (float32, then
    in x's dtype, before the product: 0.3 times a float32 value rounds otherwise), so the sign and the precision of
    the sum are pinned; a fixed set comes in the run's dtype."""
    task = build_task(TaskConfig(name="fashion_mnist", image_size=8, probe_size=8, pixel_noise=0.3,
                                 data_dir=str(FASHION_MNIST_SAMPLE)), 0, dtype=torch.float64)
    base = task.train_x[:4]
    got = task._noisy(base, generator(0, "train"))
    want = base + 0.3 * torch.randn(base.shape, generator=generator(0, "train")).to(torch.float64)
    assert got.dtype is torch.float64 and torch.equal(got, want)
    assert task.fixed_set(8, 0, "probe")[0].dtype is torch.float64


def test_the_tasks_draw_from_the_generator_they_are_given_at_their_defaults_and_in_the_runs_dtype():
    """Each draw comes from the generator passed (the same seed again gives the same draw, with the global RNG
    disturbed in between), the builders' own defaults (the CPU) work, and a float64 run samples float64."""
    cfg = TaskConfig(**SMALL, train_size=16)
    finite = NoisyTemplates.build(cfg, 0)  # the defaults: CPU, float32
    for task in (finite, NoisyTemplates.build(TaskConfig(**SMALL), 0), fmnist(train_size=40)):
        a = task.sample(8, generator(0, "train"))
        torch.manual_seed(123)  # another global state: the draw must not read it
        b = task.sample(8, generator(0, "train"))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    wide = build_task(TaskConfig(**SMALL), 0, dtype=torch.float64)
    assert wide.sample(4, generator(0, "train"))[0].dtype is torch.float64
    with pytest.raises(KeyError, match="unknown random stream 'nope'; expected one of"):
        stream_seed(0, "nope")


def test_a_fashion_mnist_subset_is_the_seeds_own_and_may_keep_the_whole_file():
    a, b = fmnist(0, train_size=50), fmnist(0, train_size=50)
    torch.manual_seed(7)
    assert torch.equal(a.train_index, b.train_index)
    assert torch.equal(a.train_index, fmnist(0, train_size=50).train_index)
    assert not torch.equal(a.train_index, fmnist(1, train_size=50).train_index)
    whole = fmnist(train_size=300)  # all 300 of the sample's training file: allowed, in the seed's order
    assert sorted(whole.train_index.tolist()) == list(range(300))
    direct = FashionMNIST.build(TaskConfig(name="fashion_mnist", image_size=8, probe_size=8,
                                           data_dir=str(FASHION_MNIST_SAMPLE)), 0)  # the defaults: CPU, float32
    assert direct.train_x.dtype is torch.float32 and direct.train_x.device.type == "cpu"
    with pytest.raises(ConfigError) as refused:
        direct.fixed_set(301, 0, "probe")
    assert str(refused.value) == "task.probe_size: expected at most 300 (Fashion-MNIST's train file), got 301"


def test_the_re_estimation_batches_are_the_streams_of_seed_times_1000003_plus_step(tmp_path):
    """The formula of the docstring, written out: (seed, step) reseeds the ``reestimate`` stream, which the runner,
    the zoo and an offline diagnosis share."""
    from bnrotation.study.task import reestimation_batches

    cfg = run_cfg(["experiment=adam", *TOY_SIZE, "scale.reestimate_batches=2", "seed=2"], tmp_path)
    task = build_task(cfg.task, cfg.seed)
    got = reestimation_batches(task, cfg, torch.device("cpu"), 300)
    g = generator(2 * 1_000_003 + 300, "reestimate")
    want = [task.sample(cfg.task.batch_size, g)[0] for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
