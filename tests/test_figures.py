"""Figures a reader can trust without their captions: n and, below the article's scale, a
warning inside every image; rows without running statistics set apart; published marks off the data; one panel
per row where bands overlapped. On synthetic results (tests/test_analysis.py), whose every value is known."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.markers import MarkerStyle

from bnrotation.study.analysis.tables import figures

from test_analysis import SCALE, _load, cosine_lr, resnet_layers, write_replication, write_resnet_run, write_run

matplotlib.use("Agg")
DRAW = {name: draw for name, _, draw in figures.FIGURES}
ROWS_DRAWN = ("sgd", "adam", "adam_projected")  # adam and adam_projected fail their checks (60%, 31%)
AVERAGING = pd.DataFrame([dict(step=s, average=a, decay=d, window_steps=w, policy=p, acc_eval_mode=acc)
                          for s in (2000, 3000)  # inside both scales' check windows
                          for a, d, w, p, acc in (("live", math.nan, -1, "none", 0.6),
                                                  ("ema", 0.999, -1, "copy", 0.4),
                                                  ("ema", 0.999, -1, "refresh", 1.0))])


def _data(root, scale: dict, resnet: bool = False):
    write_replication(root, seeds=(0, 1), rows=ROWS_DRAWN, **{r: {"averaging": AVERAGING, "scale": scale}
                                                               for r in ROWS_DRAWN})
    for seed in (0, 1):  # a norm without running statistics: nothing to go stale
        write_run(root, "adam_groupnorm", seed, rotation=2.0, norm_growth=6.0, acc_eval=0.98, scale=scale)
        # cosine decay: failing while the rate is high (the first quarter of the run)
        lr = lambda s, steps=scale["steps"]: cosine_lr(s, steps=steps)  # noqa: E731
        acc = lambda s, steps=scale["steps"]: 0.8 if s < steps / 4 else 0.99  # noqa: E731
        write_run(root, "adam_cosine", seed, rotation=1.8, norm_growth=2.0, acc_eval=0.97, acc_eval_at=acc,
                  lr_at=lr, scale=scale)
        if resnet:  # the other network: Adam failing, its lag growing with depth; cosine decay
            grows = {conv: 1.0 + i for i, conv in enumerate(resnet_layers())}
            write_resnet_run(root, "resnet20_adam", seed, rotation=8.0, norm_growth=3.0, acc_eval=0.5,
                             lag_scale=grows, scale=scale)
            write_resnet_run(root, "resnet20_adam_cosine", seed, rotation=2.0, norm_growth=2.0, acc_eval=0.97,
                             acc_eval_at=acc, lr_at=lr, lag_scale=grows, scale=scale)
    figures.apply_style()
    return figures.load_data(root, _load(root))


@pytest.fixture(scope="module")
def at_scale(tmp_path_factory):
    return _data(tmp_path_factory.mktemp("at_scale"), SCALE)


@pytest.fixture(scope="module")
def below_scale(tmp_path_factory):
    return _data(tmp_path_factory.mktemp("below_scale"), dict(SCALE, name="short", steps=3000), resnet=True)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """The study's rows and two ResNet-20 rows in one root, at the article's scale."""
    return _data(tmp_path_factory.mktemp("mixed"), SCALE, resnet=True)


NEEDS_RESNET = ("10_lag_by_depth", "12_top_k_both_networks")  # not drawn without ResNet-20 runs
NEEDS_FASHION_MNIST = ("13_accuracy_vs_rotation_both_tasks",)  # not drawn without Fashion-MNIST runs


def _texts(fig) -> list[str]:
    """The figure's own texts (outside every axes), line breaks undone."""
    return [" ".join(t.get_text().split()) for t in fig.texts]


@pytest.mark.parametrize("name", DRAW)
def test_every_image_states_n_and_warns_when_the_runs_are_not_at_the_articles_scale(name, at_scale, below_scale,
                                                                                    mixed):
    for d, warned in ((at_scale, False), (below_scale, True), (mixed, False)):
        if name in NEEDS_RESNET and d is at_scale:
            with pytest.raises(figures.Skip, match="ResNet-20"):
                DRAW[name](d)
            continue
        if name in NEEDS_FASHION_MNIST:  # drawn in test_both_tasks_in_one_plot_and_skipped_without_real_images
            with pytest.raises(figures.Skip, match="no Fashion-MNIST runs of the article's rows"):
                DRAW[name](d)
            continue
        fig, caption = DRAW[name](d)
        texts = _texts(fig)
        assert [t for t in texts if t.startswith("n = ")], (name, texts)  # in the image, not only the caption
        warning = [t for t in texts if t.startswith("Not the article's scale:")]
        assert bool(warning) == warned, name
        if warned:
            assert "3,000 steps" in warning[0] and "6,000 steps" in warning[0]
            assert "orientation only" in warning[0]
        matplotlib.pyplot.close(fig)


def _is_marker(collection, marker: str) -> bool:
    m = MarkerStyle(marker)
    want, got = m.get_path().transformed(m.get_transform()).vertices, collection.get_paths()[0].vertices
    return want.shape == got.shape and np.allclose(want, got)


@pytest.mark.parametrize("name", ["01_accuracy_vs_rotation", "02_accuracy_vs_norm_growth"])
def test_rows_without_running_statistics_are_squares_with_a_legend_entry(name, at_scale):
    fig, _ = DRAW[name](at_scale)
    legend = fig.axes[0].get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert "Adam, lr 3e-3, GroupNorm (8 groups): no running statistics" in labels
    assert any(label.startswith("one run, no running statistics") for label in labels)
    handles = dict(zip(labels, legend.legend_handles))
    gn = handles["Adam, lr 3e-3, GroupNorm (8 groups): no running statistics"]
    sgd = handles["SGD, lr 0.05, momentum 0.9"]
    assert _is_marker(gn, "s") and _is_marker(sgd, "o")
    squares = [c for c in fig.axes[0].collections if isinstance(c, PathCollection) and _is_marker(c, "s")]
    assert len(squares) == 1  # the two GroupNorm runs, and no other
    matplotlib.pyplot.close(fig)


def test_the_articles_82_percent_is_a_key_entry_not_text_over_the_data(at_scale):
    fig, _ = DRAW["06_single_layer_fresh_statistics"](at_scale)
    assert all(not ax.texts for ax in fig.axes)
    assert any("article: 82%" in t.get_text() for legend in fig.legends for t in legend.get_texts())
    matplotlib.pyplot.close(fig)


def test_top_k_figure_has_one_panel_per_failing_row_and_no_overlapping_bands(at_scale):
    fig, caption = DRAW["07_top_k_channels"](at_scale)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    titles = [" ".join(ax.get_title().split()) for ax in panels]
    assert [t.startswith(label) for t, label in zip(titles, ["Adam, lr 3e-3 18", "Adam, lr 3e-3, radial part "
                                                                                   "projected out 18"])] == [True] * 2
    # k to 90% (the grid k where acc + (1 - acc) * share first reaches 0.9): 4 for adam (60%), 8 for the
    # projected row (31%); the same at every failing check, so no range
    for ax, k in zip(panels, (4, 8)):
        assert not [c for c in ax.collections if isinstance(c, PolyCollection)]  # no band
        # 2 seeds x 9 intervention steps (2000, 2500, ..., 6000) = 18 failing checks, each a thin line
        assert " ".join(ax.get_title().split()).endswith(f"18 failing checks; k to 90%: {k}")
        assert len(ax.lines) == 18 + 1 + 1  # the checks, their median, the 90% line
    matplotlib.pyplot.close(fig)


# ----------------------------------------------------------------------------- two networks in one root
def test_figures_that_mix_networks_name_each_rows_network(mixed, at_scale):
    fig, _ = DRAW["01_accuracy_vs_rotation"](mixed)
    legend = fig.axes[0].get_legend()
    handles = dict(zip([t.get_text() for t in legend.get_texts()], legend.legend_handles))
    assert _is_marker(handles["ResNet-20, Adam, lr 3e-3"], "^")  # shares Adam's colour: a triangle tells it apart
    assert _is_marker(handles["Adam, lr 3e-3 (the study's ConvNet)"], "o")
    assert handles["ResNet-20, Adam, lr 3e-3"].get_facecolor()[0][:3].tolist() == \
        handles["Adam, lr 3e-3 (the study's ConvNet)"].get_facecolor()[0][:3].tolist()
    assert any(label.startswith("one run, ResNet-20, BatchNorm (filled triangle") for label in handles)
    texts = _texts(fig)
    assert any("2 of ResNet-20" in t for t in texts if t.startswith("n = "))  # the footnote counts each network
    matplotlib.pyplot.close(fig)
    fig, _ = DRAW["01_accuracy_vs_rotation"](at_scale)  # one network: labels as they were
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "Adam, lr 3e-3" in labels and not any("ResNet-20" in label or "ConvNet" in label for label in labels)
    matplotlib.pyplot.close(fig)


def test_each_networks_panels_keep_their_own_layers_and_channels(mixed):
    fig, _ = DRAW["06_single_layer_fresh_statistics"](mixed)
    ticks = {" ".join(ax.get_title().split()): len(ax.get_xticks()) for ax in fig.axes if ax.get_visible()}
    assert ticks["ResNet-20, Adam, lr 3e-3 18 failing checks"] == 23  # stored, 21 layers, all fresh
    assert ticks["Adam, lr 3e-3 (the study's ConvNet) 18 failing checks"] == 5  # stored, bn1-bn3, all fresh
    matplotlib.pyplot.close(fig)
    fig, caption = DRAW["07_top_k_channels"](mixed)
    titles = [" ".join(ax.get_title().split()) for ax in fig.axes if ax.get_visible()]
    assert any(t.endswith("of 42") and t.startswith("ResNet-20") for t in titles)
    assert any(t.endswith("of 16") and t.startswith("Adam, lr 3e-3 (the study's ConvNet)") for t in titles)
    assert "all channels of the row's network (the study's ConvNet: 16, ResNet-20: 42)" in caption
    matplotlib.pyplot.close(fig)


def test_lag_by_depth_cosine_and_both_networks_top_k(mixed):
    fig, caption = DRAW["10_lag_by_depth"](mixed)
    assert len(fig.axes) == 2 and all(len(ax.get_xticks()) == 21 for ax in fig.axes)
    assert "(n = 4 runs, 2 rows × 2 seeds; 21 BatchNorm layers per run" in caption
    assert any("ρ of the median with depth +1.00" in t.get_text() for t in fig.legends[0].get_texts())
    matplotlib.pyplot.close(fig)
    fig, caption = DRAW["11_cosine_mid_run"](mixed)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "Adam, lr 3e-3, cosine decay to 0 (the study's ConvNet)" in labels
    assert any(label.startswith("ResNet-20: triangles, dashed") for label in labels)
    assert "(n = 4 runs, 2 rows × 2 seeds; 1 row of the study's ConvNet, 1 of ResNet-20; 41 checks per run" in caption
    matplotlib.pyplot.close(fig)
    fig, caption = DRAW["12_top_k_both_networks"](mixed)
    assert [ax.get_title() for ax in fig.axes] == ["the study's ConvNet: 16 channels", "ResNet-20: 42 channels"]
    assert "54 failing checks in all" in caption  # 9 intervention steps x 2 seeds x 3 failing rows
    matplotlib.pyplot.close(fig)


@pytest.fixture(scope="module")
def both_tasks(tmp_path_factory):
    """Two of the article's rows on the templates (2 seeds) and their Fashion-MNIST twins (3 seeds)."""
    root = write_replication(tmp_path_factory.mktemp("both_tasks"), seeds=(0, 1), rows=("sgd", "adam"))
    for seed in (0, 1, 2):
        write_run(root, "fmnist_sgd", seed, rotation=0.5, norm_growth=2.0, acc_eval=0.9, acc_train=0.91,
                  task="fashion_mnist")
        write_run(root, "fmnist_adam", seed, rotation=8.0, norm_growth=3.0, acc_eval=0.6, acc_train=0.9,
                  task="fashion_mnist")
    figures.apply_style()
    return figures.load_data(root, _load(root))


def test_both_tasks_in_one_plot_and_skipped_without_real_images(both_tasks):
    fig, caption = DRAW["13_accuracy_vs_rotation_both_tasks"](both_tasks)
    n = "noisy templates: n = 4 runs, 2 rows × 2 seeds; Fashion-MNIST: n = 6 runs, 2 rows × 3 seeds"
    assert f"({n})" in caption and any(t.startswith(n) for t in _texts(fig))  # n per task, in caption and image
    points = [c for c in fig.axes[0].collections if isinstance(c, PathCollection)]
    diamonds, circles = ([c for c in points if _is_marker(c, m)] for m in ("D", "o"))
    assert sorted(len(c.get_offsets()) for c in diamonds) == [3, 3] and len(circles) == 2  # one point per run
    sgd = next(c for c in diamonds if np.allclose(c.get_offsets()[:, 1], 0.9))
    assert np.allclose(sgd.get_facecolor()[0][:3], both_tasks.palette["sgd"])  # a twin in its row's colour
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["SGD, lr 0.05, momentum 0.9", "Adam, lr 3e-3", "one run on noisy templates",
                      "one run on Fashion-MNIST"]
    matplotlib.pyplot.close(fig)
    fig, _ = DRAW["01_accuracy_vs_rotation"](both_tasks)  # the central figure tells the tasks apart too
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(label.startswith("one run on Fashion-MNIST (filled diamond") for label in labels)
    assert sum(_is_marker(c, "D") for c in fig.axes[0].collections if isinstance(c, PathCollection)) == 2
    matplotlib.pyplot.close(fig)
