"""Datasets: MNIST and Fashion-MNIST from their original IDX files, and scikit-learn's digits.

The MNIST [LeCun et al.] and Fashion-MNIST [Xiao et al.] datasets are read from the original
gzip-compressed IDX files (the numerical set-up of Schlegel et al., "CodedPaddedFL and
CodedSecAgg", Sec. VII, and of Makkonen et al., "Approximate gradient coding", Sec. IV-A).
The files live in a data directory laid out as ``<dir>/mnist/*.gz`` and
``<dir>/fashion-mnist/*.gz``; the directory is, in order of precedence, the ``data_dir``
argument, the environment variable ``$FEDNET_DATA``, or ``~/.cache/fednet``. A missing file is
downloaded only from a base URL the user names (``url`` argument, else ``$FEDNET_DATA_URL``)
with :mod:`urllib`; without one, a missing file fails at once with instructions (nothing is
fetched from a URL the user did not choose; :data:`DEFAULT_URLS` are only suggested in that
message). Every file, downloaded or not, is verified against the SHA-256 sums in
:data:`SHA256` before it is parsed.

The ``"digits"`` dataset is scikit-learn's bundled 8x8 digits (1797 images, no download), the
embedded default of the quickstart study.

IDX format (big-endian): int32 magic (2051 for images, 2049 for labels), int32 count, for
images int32 rows and int32 cols, then ``count * rows * cols`` (or ``count``) uint8 values.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import struct
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fednet.errors import DataError
from fednet.plugins import import_object, is_object_path

__all__ = [
    "Dataset",
    "DatasetError",
    "DATASETS",
    "UNAVAILABLE",
    "load_plugin_dataset",
    "SHA256",
    "FILES",
    "DEFAULT_URLS",
    "DIGITS_TEST_FRACTION",
    "DIGITS_SPLIT_SEED",
    "load_dataset",
    "PREPROCESS",
    "preprocess",
    "standardize",
    "read_idx",
    "resolve_data_dir",
    "verify_file",
    "fetch_file",
]

#: Names accepted by :func:`load_dataset`.
DATASETS = ("digits", "mnist", "fashion-mnist")

#: Data sets of DReS-FL's Table 2 (Shao et al., Sec. 6.1, Table 3) that are not on this machine and
#: cannot be downloaded here: :func:`load_dataset` refuses them with this explanation, so a study
#: naming them fails before anything runs.
UNAVAILABLE: dict[str, str] = {
    "emnist": "EMNIST (Balanced, 47 classes, 112,800 + 18,800 images; Cohen et al. 2017)",
    "cifar10": "CIFAR-10 (50,000 + 10,000 images, classified on VGG19 features in DReS-FL)",
    "cifar100": "CIFAR-100 (50,000 + 10,000 images, classified on VGG19 features in DReS-FL)",
    "svhn": "SVHN (73,257 + 26,032 images without the extra set, classified on VGG19 features in DReS-FL)",
}

#: The four files of each IDX dataset, in the order (train images, train labels, test images,
#: test labels).
FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)

#: SHA-256 of the eight original files (``../shared/data/SHA256SUMS``; the MD5s of these files
#: match the official ones).
SHA256: dict[str, str] = {
    "mnist/train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "mnist/train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "mnist/t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "mnist/t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    "fashion-mnist/train-images-idx3-ubyte.gz": "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
    "fashion-mnist/train-labels-idx1-ubyte.gz": "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
    "fashion-mnist/t10k-images-idx3-ubyte.gz": "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
    "fashion-mnist/t10k-labels-idx1-ubyte.gz": "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
}

#: Known public mirrors, suggested in the error for a missing file; never used unless named
#: (``FEDNET_DATA_URL=<base>`` then fetches ``<base>/<file name>``).
DEFAULT_URLS: dict[str, str] = {
    "mnist": "https://ossci-datasets.s3.amazonaws.com/mnist",
    "fashion-mnist": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com",
}

#: Fraction of scikit-learn's digits held out as the test set.
DIGITS_TEST_FRACTION = 0.25
#: Seed of the stratified train/test split of the digits.
DIGITS_SPLIT_SEED = 0


class DatasetError(DataError):
    """A data file is missing, cannot be downloaded, is corrupted or is not valid IDX.

    A :class:`fednet.errors.DataError` (hence a ``RuntimeError``).
    """


@dataclass(frozen=True)
class Dataset:
    """A classification dataset split into train and test sets.

    Attributes
    ----------
    x_train : ndarray, shape (m, p), float64
        Training features, pixels scaled to [0, 1] (``p = 784`` for MNIST, 64 for digits).
    y_train : ndarray, shape (m,), int64
        Training labels in ``{0, ..., n_classes - 1}``.
    x_test : ndarray, shape (m_test, p), float64
        Test features, scaled like ``x_train``.
    y_test : ndarray, shape (m_test,), int64
        Test labels.
    n_classes : int
        Number of classes (10 for all bundled datasets).
    name : str
        Dataset name (one of :data:`DATASETS`).
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    name: str

    def __post_init__(self) -> None:
        for field in ("x_train", "y_train", "x_test", "y_test"):
            arr = getattr(self, field)
            if isinstance(arr, np.ndarray):
                arr.flags.writeable = False
        if self.x_train.shape[0] != self.y_train.shape[0]:
            raise ValueError(
                f"x_train has {self.x_train.shape[0]} rows but y_train has {self.y_train.shape[0]}"
            )
        if self.x_test.shape[0] != self.y_test.shape[0]:
            raise ValueError(
                f"x_test has {self.x_test.shape[0]} rows but y_test has {self.y_test.shape[0]}"
            )

    @property
    def n_features(self) -> int:
        """Number of input features ``p``."""
        return int(self.x_train.shape[1])


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The data directory: ``data_dir``, else ``$FEDNET_DATA``, else ``~/.cache/fednet``.

    Parameters
    ----------
    data_dir : path-like or None
        Explicit directory; takes precedence.

    Returns
    -------
    Path
        The directory (not necessarily existing yet).
    """
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get("FEDNET_DATA")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "fednet"


def verify_file(path: str | os.PathLike, key: str) -> None:
    """Check the SHA-256 of ``path`` against the known sum of ``key``.

    Parameters
    ----------
    path : path-like
        The file to check.
    key : str
        ``"<dataset>/<file name>"``, a key of :data:`SHA256`.

    Raises
    ------
    DatasetError
        If the file is missing or its SHA-256 differs from the known one (the message names
        the file and both sums).
    KeyError
        If ``key`` is not a known file.
    """
    expected = SHA256[key]
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"data file {key!r} is missing: {path} does not exist")
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    got = digest.hexdigest()
    if got != expected:
        raise DatasetError(
            f"data file {key!r} at {path} is corrupted: SHA-256 {got} != expected {expected}; "
            "delete it to download it again"
        )


def fetch_file(key: str, dest: str | os.PathLike, base_url: str) -> Path:
    """Download ``<base_url>/<file name>`` to ``dest`` and verify its SHA-256.

    The download goes to a temporary file next to ``dest`` and is moved into place only once
    its checksum is correct, so a failed download leaves no partial file behind.

    Parameters
    ----------
    key : str
        ``"<dataset>/<file name>"``, a key of :data:`SHA256`.
    dest : path-like
        Where the file should end up.
    base_url : str
        Base URL (``http(s)://`` or ``file://``); the file name is appended after a ``/``.

    Returns
    -------
    Path
        ``dest``.

    Raises
    ------
    DatasetError
        If the download fails or the downloaded file has the wrong checksum.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    url = base_url.rstrip("/") + "/" + key.split("/", 1)[1]
    fd, tmp_name = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310
                    shutil.copyfileobj(response, out)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                raise DatasetError(
                    f"data file {key!r} is missing from {dest.parent} and could not be "
                    f"downloaded from {url}: {exc}"
                ) from exc
        try:
            verify_file(tmp, key)
        except DatasetError as exc:
            raise DatasetError(f"downloaded {url} is corrupted: {exc}") from exc
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dest


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Parse a gzip-compressed IDX file (images or labels).

    Parameters
    ----------
    path : path-like
        A ``*-idx3-ubyte.gz`` (images) or ``*-idx1-ubyte.gz`` (labels) file.

    Returns
    -------
    ndarray, uint8
        Shape (count, rows, cols) for images (magic 2051), (count,) for labels (magic 2049).

    Raises
    ------
    DatasetError
        If the file is not a valid IDX file (bad magic or length).
    """
    path = Path(path)
    try:
        with gzip.open(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError) as exc:
        raise DatasetError(f"{path} is not a readable gzip file: {exc}") from exc
    if len(raw) < 8:
        raise DatasetError(f"{path} is too short to be an IDX file ({len(raw)} bytes)")
    magic, count = struct.unpack(">ii", raw[:8])
    if magic == 2051:
        if len(raw) < 16:
            raise DatasetError(f"{path}: truncated IDX image header")
        rows, cols = struct.unpack(">ii", raw[8:16])
        shape, offset = (count, rows, cols), 16
    elif magic == 2049:
        shape, offset = (count,), 8
    else:
        raise DatasetError(f"{path}: bad IDX magic number {magic} (expected 2051 or 2049)")
    n = int(np.prod(shape))
    if len(raw) - offset != n:
        raise DatasetError(
            f"{path}: IDX header announces {n} values but the file holds {len(raw) - offset}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(shape)


def _load_idx_dataset(name: str, data_dir: Path, url: str | None) -> Dataset:
    base_url = url or os.environ.get("FEDNET_DATA_URL")
    missing = [f for f in FILES if not (data_dir / name / f).exists()]
    if missing and not base_url:
        raise DatasetError(
            f"{name}: {len(missing)} data file(s) missing from {data_dir / name} ({', '.join(missing)}). "
            f"Put the original gzip IDX files there, or point FEDNET_DATA (or --data-dir) at a folder holding "
            f"{name}/, or set FEDNET_DATA_URL to a base URL to download them from "
            f"(e.g. FEDNET_DATA_URL={DEFAULT_URLS[name]}); every file is checked against its SHA-256"
        )
    arrays = []
    for fname in FILES:
        key = f"{name}/{fname}"
        path = data_dir / name / fname
        if not path.exists():
            assert base_url is not None
            fetch_file(key, path, base_url)
        verify_file(path, key)
        arrays.append(read_idx(path))
    xtr, ytr, xte, yte = arrays
    if xtr.shape[0] != ytr.shape[0] or xte.shape[0] != yte.shape[0]:
        raise DatasetError(f"{name}: image and label counts differ")
    scale = 1.0 / 255.0
    return Dataset(
        x_train=xtr.reshape(xtr.shape[0], -1).astype(np.float64) * scale,
        y_train=ytr.astype(np.int64),
        x_test=xte.reshape(xte.shape[0], -1).astype(np.float64) * scale,
        y_test=yte.astype(np.int64),
        n_classes=10,
        name=name,
    )


def _load_digits() -> Dataset:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = bunch.data.astype(np.float64) / 16.0  # pixels are integers 0..16
    y = bunch.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(
        x, y, test_size=DIGITS_TEST_FRACTION, random_state=DIGITS_SPLIT_SEED, stratify=y
    )
    return Dataset(
        x_train=np.ascontiguousarray(xtr),
        y_train=np.ascontiguousarray(ytr),
        x_test=np.ascontiguousarray(xte),
        y_test=np.ascontiguousarray(yte),
        n_classes=10,
        name="digits",
    )


def load_dataset(
    name: str, data_dir: str | os.PathLike | None = None, url: str | None = None
) -> Dataset:
    """Load a dataset with pixels scaled to [0, 1] (a study's ``preprocess = "unit"``; :func:`preprocess`).

    Parameters
    ----------
    name : {"digits", "mnist", "fashion-mnist"} or "package.module:loader"
        A user's loader (:func:`load_plugin_dataset`), or
        ``"digits"``: scikit-learn's bundled 8x8 digits (1797 images, pixels 0..16 divided
        by 16), split deterministically by ``sklearn.model_selection.train_test_split`` with
        ``test_size=0.25`` (:data:`DIGITS_TEST_FRACTION`), ``random_state=0``
        (:data:`DIGITS_SPLIT_SEED`) and stratified by label: 1347 train, 450 test images.
        ``"mnist"`` / ``"fashion-mnist"``: the original IDX files (60000 train, 10000 test,
        28x28 pixels divided by 255).
    data_dir : path-like, optional
        Directory holding ``mnist/`` and ``fashion-mnist/``; default ``$FEDNET_DATA``, else
        ``~/.cache/fednet``. Ignored for ``"digits"``.
    url : str, optional
        Base URL missing files are downloaded from (``<url>/<file name>``); default
        ``$FEDNET_DATA_URL``; with neither, a missing file is an error (no default URL is
        tried). ``file://`` URLs work.

    Returns
    -------
    Dataset
        Read-only arrays; ``x`` float64 of shape (m, p), ``y`` int64 of shape (m,).

    Raises
    ------
    ValueError
        If ``name`` is not one of :data:`DATASETS`.
    DatasetError
        For a data set of :data:`UNAVAILABLE` (DReS-FL's EMNIST, CIFAR and SVHN columns), or if a
        file is missing and no download URL is set (the message says how to provide the
        data), cannot be downloaded, or fails its SHA-256 check (the message names the file).
    """
    if is_object_path(name):
        return load_plugin_dataset(name)
    if name in UNAVAILABLE:
        raise DatasetError(f"{UNAVAILABLE[name]} is not available on this machine and fednet has no loader for it: "
                           f"only {DATASETS} can be loaded (the EMNIST, CIFAR-10, CIFAR-100 and SVHN columns of "
                           f"DReS-FL's Table 2 are out of reach here)")
    if name not in DATASETS:
        raise ValueError(f"name must be one of {DATASETS}, got {name!r}")
    if name == "digits":
        return _load_digits()
    return _load_idx_dataset(name, resolve_data_dir(data_dir), url)


def load_plugin_dataset(spec: str) -> Dataset:
    """A user's data set: ``"package.module:loader"``, ``loader()`` returning a :class:`Dataset` or the tuple
    ``(x_train, y_train, x_test, y_test)``.

    The module is imported like a ``module:Class`` protocol (:func:`fednet.plugins.import_object`: ``sys.path``,
    then the study file's folder and the working folder). ``x``: (m, p) finite numbers (taken as float64, e.g.
    pixels scaled to [0, 1]; rows of images flattened by the loader); ``y``: (m,) integer class labels in
    ``{0, ..., C - 1}``, ``C = max label + 1`` over both sets.

    Parameters
    ----------
    spec : str

    Returns
    -------
    Dataset
        Read-only arrays, ``name = spec``.

    Raises
    ------
    DatasetError
        If the loader cannot be imported, raises, or returns arrays of the wrong shape, type or values (one line,
        naming ``data.dataset``).
    """
    what = f"data.dataset = {spec!r}"
    try:
        out = import_object(spec, "dataset loader")()
    except Exception as e:          # the user's code: one line naming the option
        raise DatasetError(f"{what}: {type(e).__name__}: {e}") from e
    if isinstance(out, Dataset):
        return out
    if not (isinstance(out, (tuple, list)) and len(out) == 4):
        raise DatasetError(f"{what}: the loader must return a fednet.learning.datasets.Dataset or "
                           f"(x_train, y_train, x_test, y_test), got a {type(out).__name__}")
    arrays = {}
    for key, a in zip(("x_train", "y_train", "x_test", "y_test"), out):
        a = np.asarray(a)
        want = 2 if key.startswith("x") else 1
        if a.ndim != want or a.shape[0] == 0:
            raise DatasetError(f"{what}: {key} must be a non-empty {want}-D array, got shape {a.shape}")
        if key.startswith("x"):
            if a.dtype.kind not in "biuf" or not np.isfinite(a.astype(np.float64)).all():
                raise DatasetError(f"{what}: {key} must hold finite numbers (dtype {a.dtype})")
            a = np.ascontiguousarray(a, dtype=np.float64)
        else:
            if a.dtype.kind not in "iu" or a.min() < 0:
                raise DatasetError(f"{what}: {key} must hold integer class labels >= 0 (dtype {a.dtype}, "
                                   f"min {a.min()})")
            a = np.ascontiguousarray(a, dtype=np.int64)
        arrays[key] = a
    if arrays["x_train"].shape[1] != arrays["x_test"].shape[1]:
        raise DatasetError(f"{what}: x_train has {arrays['x_train'].shape[1]} features but x_test has "
                           f"{arrays['x_test'].shape[1]}")
    n_classes = int(max(arrays["y_train"].max(), arrays["y_test"].max())) + 1
    try:
        return Dataset(n_classes=n_classes, name=spec, **arrays)
    except ValueError as e:
        raise DatasetError(f"{what}: {e}") from None


#: Input preprocessing :func:`preprocess` applies (``[data] preprocess`` of a study).
PREPROCESS = ("unit", "standardize")


def standardize(data: Dataset) -> Dataset:
    """Each feature centred and scaled by the training set's mean and standard deviation (train and test alike).

    ``x' = (x - mu) / sd`` with ``mu``, ``sd`` the per-feature mean and (population) standard deviation of
    ``x_train``; a feature constant on the training set (``sd = 0``, e.g. MNIST's border pixels) keeps
    ``sd = 1``, so it becomes 0 on the training set. The test set is scaled with the *training* statistics,
    never its own (nothing about the test set reaches training).

    The DReS-FL paper (Shao et al., NeurIPS 2022, Sec. 6.1 and App. B) does not state its preprocessing; this is
    the common alternative to pixels / 255 (issue 31, item 2). A pixel that is rarely non-zero on the training set
    has a small ``sd`` and so takes large values where it is lit (MNIST: |x'| up to 245 on the training set, 420 on
    the test set; 99.9 % of training values below 8), which matters to fixed-point and finite-field protocols:
    their capacity and resolution checks see the standardised values.

    Parameters
    ----------
    data : Dataset
        Features ``x`` of shape (m, p) and (m_test, p).

    Returns
    -------
    Dataset
        A new data set (float64, read-only), labels, ``n_classes`` and ``name`` unchanged.
    """
    mu = data.x_train.mean(axis=0)
    sd = data.x_train.std(axis=0)
    sd[sd == 0] = 1.0
    return Dataset(x_train=(data.x_train - mu) / sd, y_train=data.y_train, x_test=(data.x_test - mu) / sd,
                   y_test=data.y_test, n_classes=data.n_classes, name=data.name)


def preprocess(data: Dataset, kind: str = "unit") -> Dataset:
    """The data set under the input preprocessing ``kind`` (``[data] preprocess`` of a study).

    Parameters
    ----------
    data : Dataset
        As :func:`load_dataset` returns it: pixels scaled to [0, 1] (MNIST and Fashion-MNIST / 255, digits / 16;
        a user's loader: as it gives them).
    kind : {"unit", "standardize"}
        ``"unit"``: ``data`` itself, unchanged (fednet's default, pixels / 255); ``"standardize"``:
        :func:`standardize` (per-feature mean and standard deviation of the training set).

    Returns
    -------
    Dataset

    Raises
    ------
    ValueError
        For a ``kind`` not in :data:`PREPROCESS` (names it).
    """
    if kind == "unit":
        return data
    if kind == "standardize":
        return standardize(data)
    raise ValueError(f"kind must be one of {PREPROCESS}, got {kind!r}")
