"""IDX loader, SHA-256 verification, download path, digits split."""

from __future__ import annotations

import functools
import gzip
import http.server
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from fednet.learning.datasets import (
    SHA256,
    DatasetError,
    fetch_file,
    load_dataset,
    read_idx,
    resolve_data_dir,
    verify_file,
)

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_mnist_idx_label_counts(data_dir: Path) -> None:
    ds = load_dataset("mnist", data_dir)
    assert ds.x_train.shape == (60000, 784) and ds.x_test.shape == (10000, 784)
    assert ds.x_train.dtype == np.float64 and ds.y_train.dtype == np.int64
    assert np.bincount(ds.y_train).tolist() == MNIST_TRAIN_COUNTS
    assert np.bincount(ds.y_test).tolist() == MNIST_TEST_COUNTS
    assert ds.x_train.min() == 0.0 and ds.x_train.max() == 1.0
    assert ds.n_classes == 10 and ds.name == "mnist"
    with pytest.raises(ValueError):
        ds.x_train[0, 0] = 2.0  # read-only


def test_fashion_label_counts(data_dir: Path) -> None:
    ds = load_dataset("fashion-mnist", data_dir)
    assert np.bincount(ds.y_train).tolist() == [6000] * 10
    assert np.bincount(ds.y_test).tolist() == [1000] * 10
    assert 0.0 <= ds.x_test.min() and ds.x_test.max() <= 1.0


def test_read_idx_header(data_dir: Path) -> None:
    images = read_idx(data_dir / "mnist" / "t10k-images-idx3-ubyte.gz")
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8


def test_read_idx_rejects_bad_magic(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gz"
    with gzip.open(bad, "wb") as fh:
        fh.write(b"\x00\x00\x08\x04\x00\x00\x00\x01\x05")
    with pytest.raises(DatasetError, match="magic"):
        read_idx(bad)


def _copy(data_dir: Path, tmp: Path, name: str = "mnist") -> Path:
    dest = tmp / name
    shutil.copytree(data_dir / name, dest)
    for p in dest.iterdir():
        p.chmod(0o644)
    return tmp


def test_corrupted_file_named_in_error(data_dir: Path, tmp_path: Path) -> None:
    root = _copy(data_dir, tmp_path)
    target = root / "mnist" / "t10k-labels-idx1-ubyte.gz"
    raw = bytearray(target.read_bytes())
    raw[100] ^= 0xFF
    target.write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match="t10k-labels-idx1-ubyte.gz.*corrupted"):
        load_dataset("mnist", root)
    with pytest.raises(DatasetError, match="corrupted"):
        verify_file(target, "mnist/t10k-labels-idx1-ubyte.gz")


def test_missing_file_without_network_named(data_dir: Path, tmp_path: Path) -> None:
    root = _copy(data_dir, tmp_path)
    (root / "mnist" / "train-labels-idx1-ubyte.gz").unlink()
    url = (tmp_path / "nowhere").as_uri()
    with pytest.raises(DatasetError, match="train-labels-idx1-ubyte.gz.*missing"):
        load_dataset("mnist", root, url=url)
    assert not (root / "mnist" / "train-labels-idx1-ubyte.gz").exists()
    assert not list((root / "mnist").glob("*.part"))  # no partial file left


def test_download_via_file_url(data_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    ds = load_dataset("mnist", root, url=(data_dir / "mnist").as_uri())
    assert np.bincount(ds.y_test).tolist() == MNIST_TEST_COUNTS
    for key in SHA256:
        if key.startswith("mnist/"):
            verify_file(root / key, key)


def test_download_via_local_http_server(data_dir: Path, tmp_path: Path) -> None:
    srv = tmp_path / "srv"
    srv.mkdir()
    shutil.copy(data_dir / "mnist" / "t10k-labels-idx1-ubyte.gz", srv)
    # a server that serves the wrong bytes under the train-labels name
    shutil.copy(data_dir / "mnist" / "t10k-labels-idx1-ubyte.gz", srv / "train-labels-idx1-ubyte.gz")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(srv))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        key = "mnist/t10k-labels-idx1-ubyte.gz"
        dest = fetch_file(key, tmp_path / "cache" / key, base)
        assert np.bincount(read_idx(dest)).tolist() == MNIST_TEST_COUNTS
        wrong = tmp_path / "wrong"
        with pytest.raises(DatasetError, match="train-labels-idx1-ubyte.gz.*corrupted"):
            fetch_file("mnist/train-labels-idx1-ubyte.gz", wrong / "train-labels-idx1-ubyte.gz", base)
        assert not any(wrong.iterdir())  # nothing left behind
    finally:
        server.shutdown()
        server.server_close()


def test_data_dir_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FEDNET_DATA", str(tmp_path))
    assert resolve_data_dir() == tmp_path
    assert resolve_data_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("FEDNET_DATA")
    assert resolve_data_dir() == Path.home() / ".cache" / "fednet"


def test_unknown_name() -> None:
    with pytest.raises(ValueError, match="'cifar'"):
        load_dataset("cifar")


def test_digits_deterministic_stratified_split() -> None:
    a, b = load_dataset("digits"), load_dataset("digits")
    assert a.x_train.shape == (1347, 64) and a.x_test.shape == (450, 64)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert 0.0 <= a.x_train.min() and a.x_train.max() == 1.0
    # stratified: each class's test share within one example of 25 %
    full = np.bincount(a.y_train) + np.bincount(a.y_test)
    assert np.all(np.abs(np.bincount(a.y_test) - 0.25 * full) <= 1)
