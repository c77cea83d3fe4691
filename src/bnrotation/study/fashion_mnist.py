"""Fashion-MNIST read from its idx files, with numpy alone (PROTOCOL.md, "Task: Fashion-MNIST").

Xiao, Rasul and Vollgraf (2017), *Fashion-MNIST: a Novel Image Dataset for Benchmarking Machine Learning
Algorithms*, arXiv:1708.07747: 60,000 training and 10,000 test images, 28x28 grey levels (uint8), labels 0-9.
Debian's package ``dataset-fashion-mnist`` installs the four files, gzipped, in :data:`DEFAULT_DIR`
(``make data`` installs it where it can). The files are in LeCun's idx format: a 4-byte magic number
``0x00 0x00 <type> <ndim>`` (type 0x08: unsigned bytes), ``ndim`` big-endian uint32 sizes, then the values in
C order. Each file is read whole and checked against its own header (and the labels against the images)
before anything trains, so a missing, truncated or wrong-sized file is refused with one line that names it
(:class:`DataError`).

No torch here: the config check imports this module before the runner does.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import ConfigError

__all__ = ["DEFAULT_DIR", "FILES", "OFFICIAL", "OFFICIAL_COUNTS", "DataError", "Split", "read_idx", "load_split",
           "check_dir", "verify_official"]

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"  # where dataset-fashion-mnist puts the files
PACKAGE = "dataset-fashion-mnist"
INSTALL = f"apt-get install {PACKAGE}"
IMAGE_SIDE = 28
NUM_CLASSES = 10
# The idx files of each split (the upstream names, gzipped as Debian ships them; an unzipped copy is read too).
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


# The SHA-256 of each official gzipped file (upstream's release, as Debian 0.0~git20200523.55506a9-1 packages it).
OFFICIAL = {
    "train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    "train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    "t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    "t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
}
# The official files' sizes (Xiao et al. 2017): images per split.
OFFICIAL_COUNTS = {"train": 60_000, "test": 10_000}


class DataError(ConfigError):
    """A data file is missing, unreadable, truncated or not what its name promises.

    The message is one line: the file, what was expected and what was found, and (for a missing folder) the
    package and the command that install it. A :class:`~bnrotation.study.config.ConfigError`, so that a run stops
    with it (exit status 2) before any training.
    """


def _path(folder: Path, stem: str) -> Path:
    """``stem.gz`` in ``folder``, else the unzipped ``stem``; the ``.gz`` name when neither exists."""
    for name in (f"{stem}.gz", stem):
        if (folder / name).is_file():
            return folder / name
    return folder / f"{stem}.gz"


def read_idx(path: str | Path, ndim: int) -> np.ndarray:
    """The array an idx file holds, checked against its own header.

    Args:
        path: an idx file, gzipped (``.gz``) or not.
        ndim: the number of dimensions expected (3 for images, 1 for labels).

    Returns:
        uint8 array of the header's shape: (N, rows, cols) for images, (N,) for labels.

    Raises:
        DataError: the file is missing or unreadable, its magic number is not that of ``ndim``-dimensional
            unsigned bytes, or its length is not the header's (truncated, or bytes beyond the data).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file (expected the Fashion-MNIST idx file; `{INSTALL}` installs it, "
                        f"or set task.data_dir)")
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise DataError(f"{path}: cannot be read ({type(err).__name__}: {err}); expected a gzipped idx file") from None
    head = 4 + 4 * ndim
    if len(raw) < head or raw[:4] != bytes((0, 0, 0x08, ndim)):
        raise DataError(f"{path}: not an idx file of {ndim}-dimensional unsigned bytes (expected magic "
                        f"00 00 08 {ndim:02x}, got {raw[:4].hex(' ') or 'nothing'})")
    shape = tuple(int(v) for v in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    want = head + int(np.prod(shape))
    if len(raw) != want:
        raise DataError(f"{path}: {len(raw) - head:,} bytes of data, expected {want - head:,} for shape "
                        f"{'x'.join(map(str, shape))} ({'truncated' if len(raw) < want else 'bytes beyond the data'})")
    return np.frombuffer(raw, dtype=np.uint8, offset=head).reshape(shape)


@dataclass(frozen=True)
class Split:
    """One split as read: ``images`` (N, 28, 28) uint8 and ``labels`` (N,) int64 in 0..9, and their files."""

    images: np.ndarray  # (N, 28, 28) uint8
    labels: np.ndarray  # (N,) int64
    files: tuple[Path, Path]


@functools.lru_cache(maxsize=4)
def load_split(folder: str | Path, split: str) -> Split:
    """The ``train`` or ``test`` split of the files in ``folder`` (cached per process: several seeds trained
    together read it once).

    Raises:
        DataError: an unknown split; a file missing or malformed (:func:`read_idx`); images that are not
            28x28; labels outside 0-9, or not one per image.
    """
    if split not in FILES:
        raise DataError(f"split {split!r}: expected one of {', '.join(FILES)}")
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"task.data_dir={folder}: no such folder (expected the Fashion-MNIST idx files; "
                        f"`{INSTALL}` installs them in {DEFAULT_DIR}, or `make data`)")
    img_path, lab_path = (_path(folder, stem) for stem in FILES[split])
    images, labels = read_idx(img_path, 3), read_idx(lab_path, 1)
    if images.shape[1:] != (IMAGE_SIDE, IMAGE_SIDE):
        raise DataError(f"{img_path}: images of {images.shape[1]}x{images.shape[2]}, expected "
                        f"{IMAGE_SIDE}x{IMAGE_SIDE}")
    if len(labels) != len(images):
        raise DataError(f"{lab_path}: {len(labels):,} labels, expected one per image of {img_path.name} "
                        f"({len(images):,})")
    if len(labels) and int(labels.max()) >= NUM_CLASSES:
        raise DataError(f"{lab_path}: label {int(labels.max())}, expected labels 0-{NUM_CLASSES - 1}")
    return Split(images, labels.astype(np.int64), (img_path, lab_path))


def check_dir(folder: str | Path, need: dict[str, int] | None = None) -> None:
    """Read and check both splits in ``folder`` (as :func:`load_split`), and that each holds enough items.

    Args:
        need: the fewest items each split must hold (``{"train": 512, "test": 4000}``), named in the error.

    Raises:
        DataError: as :func:`load_split`, or a split smaller than ``need`` says.
    """
    for split in FILES:
        got = len(load_split(folder, split).labels)
        want = (need or {}).get(split, 1)
        if got < want:
            raise DataError(f"{Path(folder) / FILES[split][0]}: {got:,} images, expected at least {want:,} "
                            f"for this run's {'probe set and batches' if split == 'train' else 'held-out set'}")


def verify_official(folder: str | Path) -> list[str]:
    """Each official gzipped file in ``folder`` checked against its published SHA-256.

    Returns:
        One line per file that differs or is missing; empty when all four are the official ones.
    """
    problems = []
    for name, sha256 in OFFICIAL.items():
        path = Path(folder) / name
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != sha256:
            problems.append(f"{path}: SHA-256 {digest}, expected {sha256} (the official file)")
    return problems


def main(argv: list[str] | None = None) -> int:
    """``python -m bnrotation.study.fashion_mnist [DIR]``: check the four files in DIR (default :data:`DEFAULT_DIR`)
    against their headers and published checksums; one line each and exit status 2 if any is wrong."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    folder = argv[0] if argv else DEFAULT_DIR
    try:
        check_dir(folder)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    problems = verify_official(folder)
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    if not problems:
        sizes = ", ".join(f"{split} {len(load_split(folder, split).labels):,}" for split in FILES)
        print(f"Fashion-MNIST: the official files in {folder} ({sizes} images)")
    return 2 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
