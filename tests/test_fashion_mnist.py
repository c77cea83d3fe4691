"""Fashion-MNIST: the idx reader, the task built on it, and its refusals, on the committed sample
(tests/data/fashion_mnist_sample: the official files' first 300 training and 100 test images); the full files
only where they are installed."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bnrotation.study import fashion_mnist as fm
from bnrotation.study.config import ConfigError, TaskConfig
from bnrotation.study.task import FashionMNIST, build_task, generator
from conftest import FASHION_MNIST_SAMPLE, TOY_SIZE, run_cfg

SAMPLE = FASHION_MNIST_SAMPLE
SAMPLE_SIZES = {"train": 300, "test": 100}


def task(size: int = 28, folder: Path = SAMPLE, **kw) -> FashionMNIST:
    return build_task(TaskConfig(name="fashion_mnist", image_size=size, data_dir=str(folder), **kw), seed=0)


def copy_sample(tmp_path: Path) -> Path:
    folder = tmp_path / "fm"
    shutil.copytree(SAMPLE, folder)
    return folder


def rewrite(path: Path, change) -> None:
    """Rewrite the gzipped idx file at ``path`` with ``change(raw bytes) -> bytes``."""
    path.write_bytes(gzip.compress(change(gzip.decompress(path.read_bytes()))))


# ----------------------------------------------------------------------------- the reader
@pytest.mark.parametrize("split", ["train", "test"])
def test_sample_splits_read_with_their_shapes_dtypes_and_labels(split):
    s = fm.load_split(SAMPLE, split)
    n = SAMPLE_SIZES[split]
    assert s.images.shape == (n, 28, 28) and s.images.dtype == np.uint8
    assert s.labels.shape == (n,) and s.labels.dtype == np.int64
    assert set(s.labels.tolist()) == set(range(10))  # every class in the sample
    assert s.images.max() > 200 and s.images.min() == 0  # grey levels, not noise or zeros
    assert [p.name for p in s.files] == [f"{stem}.gz" for stem in fm.FILES[split]]


def test_reader_matches_the_upstream_readers_arithmetic():
    """The upstream reader (`utils/mnist_reader.py`: the bytes after a 16-byte header, reshaped to 784) gives
    the same arrays."""
    stem = fm.FILES["test"][0]
    raw = gzip.decompress((SAMPLE / f"{stem}.gz").read_bytes())
    upstream = np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(-1, 784)
    np.testing.assert_array_equal(fm.read_idx(SAMPLE / f"{stem}.gz", 3).reshape(-1, 784), upstream)


def test_an_unzipped_copy_reads_the_same(tmp_path):
    folder = copy_sample(tmp_path)
    for stem in fm.FILES["test"]:
        (folder / stem).write_bytes(gzip.decompress((folder / f"{stem}.gz").read_bytes()))
        (folder / f"{stem}.gz").unlink()
    np.testing.assert_array_equal(fm.load_split(folder, "test").images, fm.load_split(SAMPLE, "test").images)


# ----------------------------------------------------------------------------- refusals: one line, naming the file
def _labels(folder: Path, split: str = "train") -> Path:
    return folder / f"{fm.FILES[split][1]}.gz"


def _images(folder: Path, split: str = "train") -> Path:
    return folder / f"{fm.FILES[split][0]}.gz"


BAD_FILES = {
    "missing": (lambda f: _images(f).unlink(), "no such file"),
    "truncated": (lambda f: rewrite(_images(f), lambda raw: raw[:-784]), "truncated"),
    "bytes beyond": (lambda f: rewrite(_images(f), lambda raw: raw + b"\0"), "bytes beyond the data"),
    "not gzip": (lambda f: _images(f).write_bytes(b"not a gzip file at all"), "cannot be read"),
    "wrong magic": (lambda f: rewrite(_images(f), lambda raw: b"\0\0\x08\x01" + raw[4:]), "not an idx file"),
    "wrong size images": (lambda f: rewrite(_images(f), lambda raw: raw[:4] + np.array([300, 14, 56], ">u4")
                                            .tobytes() + raw[16:]), "expected 28x28"),
    "fewer labels": (lambda f: rewrite(_labels(f), lambda raw: raw[:4] + np.array([299], ">u4").tobytes()
                                       + raw[8:-1]), "labels, expected one per image"),
    "label 10": (lambda f: rewrite(_labels(f), lambda raw: raw[:-1] + b"\x0a"), "expected labels 0-9"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_file_is_refused_in_one_line_naming_it(case, tmp_path):
    folder = copy_sample(tmp_path)
    spoil, words = BAD_FILES[case]
    spoil(folder)
    fm.load_split.cache_clear()
    with pytest.raises(fm.DataError) as err:
        fm.check_dir(folder)
    message = str(err.value)
    assert "\n" not in message and words in message
    assert str(folder / fm.FILES["train"][1 if "label" in case else 0]) in message
    assert isinstance(err.value, ConfigError)  # a run stops with it, exit 2, before training


def test_a_missing_folder_names_the_package_and_the_command(tmp_path):
    with pytest.raises(fm.DataError, match=r"task.data_dir=.*no such folder.*apt-get install dataset-fashion-mnist"):
        fm.load_split(tmp_path / "nowhere", "train")


def test_a_split_too_small_for_the_run_is_refused():
    with pytest.raises(fm.DataError, match=r"100 images, expected at least 4,000 .*held-out"):
        fm.check_dir(SAMPLE, {"test": 4000})
    with pytest.raises(ConfigError, match=r"scale.heldout_size: expected at most 100"):
        task().fixed_set(101, 0, "heldout")
    with pytest.raises(ConfigError, match=r"task.probe_size: expected at most 300"):
        task().fixed_set(301, 0, "probe")


def test_the_check_command_exits_2_on_bad_files_and_0_on_good_ones(tmp_path):
    """``python -m bnrotation.study.fashion_mnist DIR``: the sample's files are not the official ones (checksums), so
    it says which and exits 2; a missing folder exits 2 with one line."""
    cmd = [sys.executable, "-m", "bnrotation.study.fashion_mnist"]
    sample = subprocess.run([*cmd, str(SAMPLE)], capture_output=True, text=True)
    assert sample.returncode == 2 and sample.stderr.count("SHA-256") == 4
    gone = subprocess.run([*cmd, str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert gone.returncode == 2 and len(gone.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(not Path(fm.DEFAULT_DIR).is_dir(), reason=f"{fm.PACKAGE} is not installed ({fm.INSTALL})")
def test_the_installed_files_are_the_official_ones():
    assert fm.verify_official(fm.DEFAULT_DIR) == []
    for split, n in fm.OFFICIAL_COUNTS.items():
        s = fm.load_split(fm.DEFAULT_DIR, split)
        assert s.images.shape == (n, 28, 28) and np.bincount(s.labels).tolist() == [n // 10] * 10


# ----------------------------------------------------------------------------- the task
def test_training_images_are_normalised_with_their_own_statistics():
    t = task()
    x = t.train_x.double()
    assert abs(float(x.mean())) < 1e-6 and abs(float(x.std()) - 1.0) < 1e-6
    raw = fm.load_split(SAMPLE, "train").images.astype(np.float64) / 255.0
    assert t.norm == pytest.approx((raw.mean(), raw.std(ddof=1)), rel=1e-6)
    held, _ = t.fixed_set(100, 0, "heldout")  # the test images, with the training images' statistics
    test_raw = fm.load_split(SAMPLE, "test").images.astype(np.float64) / 255.0
    assert float(held.double().mean()) == pytest.approx((test_raw.mean() - t.norm[0]) / t.norm[1], abs=1e-5)


def _rows(x: torch.Tensor) -> set[bytes]:
    return {bytes(r.numpy().tobytes()) for r in x.reshape(len(x), -1)}


def test_held_out_images_come_from_the_test_file_and_probe_and_batches_from_the_training_file():
    t = task()
    train, test = _rows(t.train_x), _rows(t.fixed_set(100, 0, "heldout")[0])
    assert not train & test  # no image in both files
    held, y_held = t.fixed_set(64, 0, "heldout")
    probe, _ = t.fixed_set(64, 0, "probe")
    batch, y = t.sample(128, generator(0, "train"))
    assert _rows(held) <= test and _rows(probe) <= train and _rows(batch) <= train
    assert len(_rows(held)) == 64 and len(_rows(probe)) == 64  # distinct images: a permutation's first n
    assert batch.shape == (128, 1, 28, 28) and y.dtype == torch.int64 and y_held.shape == (64,)
    assert int(y.min()) >= 0 and int(y.max()) <= 9


def test_fixed_sets_follow_their_stream_and_seed():
    t = task()
    a, _ = t.fixed_set(32, 0, "heldout")
    assert torch.equal(a, t.fixed_set(32, 0, "heldout")[0])
    assert not torch.equal(a, t.fixed_set(32, 1, "heldout")[0])
    assert not torch.equal(t.fixed_set(32, 0, "probe")[0], t.fixed_set(32, 1, "probe")[0])


def test_a_smaller_size_averages_the_pixels():
    """task.image_size=14 divides 28: each pixel is the mean of a 2x2 block of the original (before the
    normalisation, which is affine, so it commutes with the mean)."""
    big, small = task(28), task(14)
    blocks = big.train_x.reshape(-1, 1, 14, 2, 14, 2).mean(dim=(3, 5)) * big.norm[1] + big.norm[0]
    torch.testing.assert_close(small.train_x * small.norm[1] + small.norm[0], blocks, rtol=0, atol=1e-6)
    assert task(8).train_x.shape[1:] == (1, 8, 8)  # any other size: resized bilinearly


def test_a_toy_run_on_the_sample_records_its_task(tmp_path):
    from bnrotation.study.runner import run

    out = run(run_cfg(["experiment=fmnist_adam", *TOY_SIZE, "model.channels=[4,8,8]"], tmp_path))
    info = json.loads((out / "run.json").read_text())
    assert info["task"]["name"] == "fashion_mnist" and info["task"]["image_shape"] == [1, 8, 8]
    assert (info["task"]["train_size"], info["task"]["test_size"]) == (300, 100)
    assert info["model"]["class"] == "ConvNet"


def test_a_run_with_no_data_stops_before_training_with_exit_2(tmp_path):
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "experiments" / "train.py"), "experiment=fmnist_adam",
                           "scale=smoke", f"results_root={tmp_path}", f"task.data_dir={tmp_path / 'none'}",
                           "progress=false"], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "no such folder" in done.stderr and "dataset-fashion-mnist" in done.stderr
    assert not list(tmp_path.glob("runs/*/*/*.parquet"))


def test_a_templates_row_cannot_be_run_on_fashion_mnist_under_its_own_name(tmp_path):
    with pytest.raises(ConfigError, match=r"task.name: 'fashion_mnist' changes what row 'adam' means"):
        from bnrotation.study.config import check_row
        check_row(run_cfg(["experiment=adam", "task=fashion_mnist"], tmp_path))


# ----------------------------------------------------------------------------- second cases (issue 52, make mutants)
def test_a_split_holding_just_enough_passes_and_one_too_few_names_its_images_file_and_its_use(tmp_path):
    fm.check_dir(SAMPLE, {"train": 300, "test": 100})  # exactly enough, both splits
    for split, got, use in (("train", 300, "probe set and batches"), ("test", 100, "held-out set")):
        with pytest.raises(fm.DataError) as err:
            fm.check_dir(SAMPLE, {split: got + 1})
        assert str(err.value) == (f"{SAMPLE / fm.FILES[split][0]}: {got} images, expected at least {got + 1} for "
                                  f"this run's {use}")
    folder = copy_sample(tmp_path)  # a test split of one image: enough when nothing more is asked
    rewrite(_images(folder, "test"), lambda raw: raw[:4] + np.array([1, 28, 28], ">u4").tobytes() + raw[16:16 + 784])
    rewrite(_labels(folder, "test"), lambda raw: raw[:4] + np.array([1], ">u4").tobytes() + raw[8:9])
    fm.load_split.cache_clear()
    fm.check_dir(folder)
    assert len(fm.load_split(folder, "test").labels) == 1


def test_every_official_file_missing_or_not_official_is_one_line_naming_it(tmp_path):
    gone = tmp_path / "nowhere"
    assert fm.verify_official(gone) == [f"{gone / name}: missing" for name in fm.OFFICIAL]
    lines = fm.verify_official(SAMPLE)  # the sample's files are cut from the official ones: none matches
    assert len(lines) == len(fm.OFFICIAL)
    for line, (name, sha256) in zip(lines, fm.OFFICIAL.items()):
        assert line.startswith(f"{SAMPLE / name}: SHA-256 ")
        assert line.endswith(f", expected {sha256} (the official file)")


def test_the_readers_refusals_give_the_bytes_they_found_and_the_shape_they_expected(tmp_path):
    """Each refusal of :func:`read_idx` in full, on unzipped files built byte by byte; and a header with nothing
    after it (no items) is a valid, empty file, not a short one."""
    def idx(name: str, raw: bytes) -> Path:
        (tmp_path / name).write_bytes(raw)
        return tmp_path / name

    labels = b"\0\0\x08\x01" + np.array([3], ">u4").tobytes()
    assert fm.read_idx(idx("none", b"\0\0\x08\x01" + np.array([0], ">u4").tobytes()), 1).shape == (0,)
    cases = {"empty": (b"", 1, "not an idx file of 1-dimensional unsigned bytes (expected magic 00 00 08 01, got "
                                  "nothing)"),
             "magic": (b"\0\0\x08\x03" + bytes(8), 1, "not an idx file of 1-dimensional unsigned bytes (expected "
                                                      "magic 00 00 08 01, got 00 00 08 03)"),
             "short": (labels + b"\1\2", 1, "2 bytes of data, expected 3 for shape 3 (truncated)"),
             "long": (labels + b"\1\2\3\4", 1, "4 bytes of data, expected 3 for shape 3 (bytes beyond the data)"),
             "images": (b"\0\0\x08\x03" + np.array([2, 2, 3], ">u4").tobytes() + bytes(11), 3,
                        "11 bytes of data, expected 12 for shape 2x2x3 (truncated)")}
    for name, (raw, ndim, words) in cases.items():
        path = idx(name, raw)
        with pytest.raises(fm.DataError) as err:
            fm.read_idx(path, ndim)
        assert str(err.value) == f"{path}: {words}", name
    bad = idx("bad.gz", b"not a gzip file at all")
    with pytest.raises(fm.DataError) as err:
        fm.read_idx(bad, 1)
    assert str(err.value).startswith(f"{bad}: cannot be read (BadGzipFile: ")
