"""Batched Monte Carlo of approximate gradient coding (Makkonen et al., Sec. IV).

Runs thousands of independent federated-learning simulations of the scheme at once: every
array carries a leading simulation axis and a round is a handful of batched matrix products,
so the paper's 1000 simulations x 50 rounds take well under a minute per setting instead of
hours (measured: 13 settings in 494 s on a shared 2-core machine at load 10, one torch thread).

Computation in dual form: ``beta^(0) = 0`` and every step ``X^T v`` lies in the row span of the
simulation's ``X`` (M x F), so ``beta = X^T phi`` with ``phi`` (M x L); logits, gradient norms
and test predictions only need the Gram matrices ``X X^T`` and ``X_test X^T``, computed once per
simulation, and the train and test logits are updated incrementally from ``(X X^T) v``. Exact
(up to float32 rounding); checked against a plain per-simulation eq. (10)-(11) implementation in
``tests/test_approx_gc_batch.py``.

Set-up (Makkonen et al., Sec. IV-A): ``N = 10`` clients, MNIST, ``M = 300`` training examples
(``K = 30`` per class drawn uniformly at random from the 60 000, independently for every
simulation), multinomial logistic regression with an intercept on standardised pixels
(``(x - 0.1307) / 0.3081``, the usual MNIST normalisation, also used by the authors' code),
model initialised at zero, SGD with learning rate ``eta_t = 0.1 * 0.97^t`` applied to the
estimator of eq. (11) divided by ``M``: ``beta <- beta - eta_t g_hat / M``, with
``g_hat = sum_i I_i sum_{j in S_i} W_j g_j`` and ``g_j`` the gradient of the cross-entropy of
example ``j``. Clients straggle independently with probability ``p`` in every round.

Recorded per simulation and round ``t``: the test accuracy of ``beta^(t)`` (``t = 0..R``,
on ``n_test`` test images drawn at random for each simulation), the exact
conditional second moment ``E||g_hat^(t) / M||^2`` over the straggler draws at ``beta^(t)``
(``||g||^2 + p/(1-p) sum_i ||sum_{j in S_i} g_j / d_j||^2``, divided by ``M^2``; computed from
the Gram matrix of the per-example gradients, ``<g_j, g_k> = <x_j, x_k> <r_j, r_k>``), the
realised ``||g_hat^(t) / M||^2``, and the number of responding clients.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fednet.codes.approx_gc import PLACEMENTS, example_weights, share_randomly
from fednet.learning.heterogeneity import make_partition

__all__ = [
    "MNIST_MEAN",
    "MNIST_STD",
    "AGCSetting",
    "AGCBatchResult",
    "prepare_pixels",
    "simulate_batch",
    "simulate_study",
]

#: Mean and standard deviation of MNIST pixels in [0, 1] (standardisation of Sec. IV's model).
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081


@dataclass(frozen=True)
class AGCSetting:
    """One scenario of the study.

    Attributes
    ----------
    name : str
        Label for plots and tables.
    setting : {"iid", "single-class", "dirichlet", "homogeneous"}
        Initial partition (:func:`fednet.learning.heterogeneity.make_partition`).
    c : float
        Privacy parameter (fraction of non-private data), in [0, 1]; 0 means no sharing.
    d : int
        Replication factor of the randomized sharing, in ``{0, ..., N - 1}``.
    alpha : float, optional
        Dirichlet concentration (``"dirichlet"`` only).
    placement : {"bernoulli", "subset"}
        Placement rule of :func:`fednet.codes.approx_gc.share_randomly`.
    """

    name: str
    setting: str
    c: float = 0.0
    d: int = 0
    alpha: float | None = None
    placement: str = "bernoulli"

    def __post_init__(self) -> None:
        if not (0.0 <= self.c <= 1.0):
            raise ValueError(f"c must lie in [0, 1], got {self.c!r}")
        if int(self.d) != self.d or self.d < 0:
            raise ValueError(f"d must be a non-negative integer, got {self.d!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.setting == "dirichlet" and (self.alpha is None or self.alpha <= 0):
            raise ValueError(f"alpha must be positive for setting='dirichlet', got {self.alpha!r}")


@dataclass
class AGCBatchResult:
    """Per-simulation, per-round records of :func:`simulate_batch`.

    Attributes
    ----------
    setting : AGCSetting
    p : float
        Straggling probability.
    accuracy : ndarray, shape (S, R + 1)
        Test accuracy of ``beta^(t)``, ``t = 0..R`` (column ``R``: after the last round).
    second_moment : ndarray, shape (S, R)
        ``E||g_hat^(t) / M||^2`` over the straggler draws at ``beta^(t)`` (exact).
    sq_norm : ndarray, shape (S, R)
        Realised ``||g_hat^(t) / M||^2``.
    responders : ndarray, shape (S, R), int
        Number of responding clients per round.
    shared_examples : ndarray, shape (S,), int
        Number of example copies transmitted in the offline sharing (``sum_j (d_j - 1)``).
    held_examples : ndarray, shape (S, N), int
        ``|S_i|`` per client after sharing.
    wall_s : float
        Wall-clock seconds attributed to this setting (its rounds plus an equal share of the
        set-up the settings of one :func:`simulate_study` call share).
    """

    setting: AGCSetting
    p: float
    accuracy: np.ndarray
    second_moment: np.ndarray
    sq_norm: np.ndarray
    responders: np.ndarray
    shared_examples: np.ndarray
    held_examples: np.ndarray
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)

    def mean_accuracy(self) -> np.ndarray:
        """Average test accuracy per round over the simulations, shape (R + 1,)."""
        return self.accuracy.mean(axis=0)

    def mean_second_moment(self) -> np.ndarray:
        """Average ``E||g_hat / M||^2`` per round, shape (R,)."""
        return self.second_moment.mean(axis=0)


def prepare_pixels(x: np.ndarray, dtype: type = np.float32) -> np.ndarray:
    """Standardise pixels in [0, 1] and append an intercept column.

    Parameters
    ----------
    x : ndarray, shape (m, 784)
        Pixels in [0, 1].
    dtype : numpy dtype
        Output dtype (float32 for speed).

    Returns
    -------
    ndarray, shape (m, 785)
        ``[(x - MNIST_MEAN) / MNIST_STD, 1]``.
    """
    x = np.asarray(x)
    out = np.empty((x.shape[0], x.shape[1] + 1), dtype=dtype)
    out[:, :-1] = (x - MNIST_MEAN) / MNIST_STD
    out[:, -1] = 1.0
    return out


def simulate_batch(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    setting: AGCSetting,
    p: float,
    **kwargs: Any,
) -> AGCBatchResult:
    """Run ``n_sims`` independent simulations of one setting (see :func:`simulate_study`).

    Parameters
    ----------
    x_train, y_train, x_test, y_test : ndarray
        As in :func:`simulate_study`.
    setting : AGCSetting
    p : float
    **kwargs
        Keyword arguments of :func:`simulate_study`.

    Returns
    -------
    AGCBatchResult
    """
    return simulate_study(x_train, y_train, x_test, y_test, [setting], p, **kwargs)[0]


def simulate_study(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    settings: Sequence[AGCSetting],
    p: float,
    n_sims: int = 1000,
    rounds: int = 50,
    n_clients: int = 10,
    k: int = 30,
    lr: float = 0.1,
    decay: float = 0.97,
    n_test: int = 200,
    chunk: int = 250,
    seed: int = 0,
    device: str = "cpu",
    keep_draws: bool = False,
    progress: Callable[[int], None] | None = None,
    threads: int | None = 1,
) -> list[AGCBatchResult]:
    """Run ``n_sims`` independent simulations of ``rounds`` rounds for several settings, vectorised.

    The settings are paired: in simulation ``s`` they all use the same ``M`` examples, the same
    test images, the same straggler draws and the same random streams for the partition and
    the sharing; the per-simulation Gram matrices of the examples are computed once for all.

    Parameters
    ----------
    x_train : ndarray, shape (m, F)
        Training features of the pool (e.g. :func:`prepare_pixels` of MNIST, F = 785).
    y_train : ndarray, shape (m,), int
        Pool labels in ``{0, ..., L - 1}``.
    x_test, y_test : ndarray, shapes (m_test, F) and (m_test,)
        Test set.
    settings : sequence of AGCSetting
        Partition and sharing parameters of each scenario.
    p : float
        Straggling probability in [0, 1).
    n_sims : int
        Number of simulations ``S`` (the paper: 1000).
    rounds : int
        Rounds ``R`` (the paper: 50).
    n_clients : int
        ``N`` (the paper: 10).
    k : int
        Examples per class ``K`` (the paper: 30, so ``M = 300``).
    lr, decay : float
        SGD learning rate ``eta_0`` and its per-round decay ``gamma`` (0.1 and 0.97).
    n_test : int
        Test images per simulation (drawn at random without replacement, independently for
        every simulation: the average over simulations is an unbiased estimate of the mean
        accuracy on the whole test set).
    chunk : int
        Simulations processed together (peak memory about ``4 chunk M (3 M + n_test + F)``
        bytes).
    seed : int
        Root seed; chunk ``b`` uses streams spawned from ``SeedSequence(seed)`` for data,
        partition, sharing, stragglers and test subset.
    device : str
        Torch device of the batched products (``"cpu"`` or ``"cuda"``); the random draws
        are made with NumPy on the host, so the result does not depend on it beyond
        float32 rounding.
    keep_draws : bool
        Keep the draws and the final models in ``result.extra`` (``idx`` (S, M) pool indices,
        ``holders`` (S, N, M), ``responding`` (R, S, N), ``test_idx`` (S, n_test), ``beta``
        (S, F, L) = ``X^T phi``): for tests and audits, memory-hungry.
    progress : callable(n), optional
        Called after every (chunk, setting) with the number ``n`` of simulations just finished
        (so the calls add up to ``n_sims * len(settings)``).
    threads : int or None
        Torch intra-op threads while the function runs (restored afterwards); None leaves
        torch's setting. Default 1: the products are small and memory-bound, and on a shared
        machine torch's thread pool spends more time synchronising than computing (measured:
        a 20x300x20 ``cat`` takes 22 ms with 2 threads under load, 36 us with 1).

    Returns
    -------
    list of AGCBatchResult
        One per setting, in order.

    Raises
    ------
    ValueError
        For out-of-range parameters (named in the message).
    """
    if not (0.0 <= p < 1.0):
        raise ValueError(f"p must lie in [0, 1), got {p!r}")
    for name, value in (("n_sims", n_sims), ("rounds", rounds), ("k", k), ("n_test", n_test),
                        ("chunk", chunk), ("n_clients", n_clients)):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    settings = list(settings)
    if not settings:
        raise ValueError("settings must not be empty")
    for st in settings:
        if st.d > n_clients - 1:
            raise ValueError(f"d must be at most n_clients - 1 = {n_clients - 1}, got {st.d} ({st.name})")
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))
    try:
        return _simulate_study(x_train, y_train, x_test, y_test, settings, p, n_sims, rounds,
                               n_clients, k, lr, decay, n_test, chunk, seed, device, keep_draws,
                               progress)
    finally:
        torch.set_num_threads(old_threads)


def _simulate_study(x_train, y_train, x_test, y_test, settings, p, n_sims, rounds, n_clients, k,
                    lr, decay, n_test, chunk, seed, device, keep_draws, progress):
    t_start = time.perf_counter()
    dev = torch.device(device)
    x_train = np.asarray(x_train, dtype=np.float32)
    x_test = np.asarray(x_test, dtype=np.float32)
    y_train = np.asarray(y_train, dtype=np.int64)
    y_test = np.asarray(y_test, dtype=np.int64)
    n_classes = int(y_train.max()) + 1
    pools = [np.flatnonzero(y_train == c) for c in range(n_classes)]
    if min(len(pl) for pl in pools) < k:
        raise ValueError(f"k = {k} exceeds the smallest class of the training pool")
    m = k * n_classes
    n_test = min(int(n_test), x_test.shape[0])
    streams = np.random.SeedSequence(seed).spawn((n_sims + chunk - 1) // chunk)
    keys = ("accuracy", "second_moment", "sq_norm", "responders", "shared_examples", "held_examples")
    out: list[dict[str, list]] = [{key: [] for key in keys} for _ in settings]
    draws: list[dict[str, list]] = [
        {"idx": [], "holders": [], "responding": [], "test_idx": [], "beta": []} for _ in settings]
    walls = [0.0] * len(settings)
    labels = np.repeat(np.arange(n_classes), k)  # examples are class-sorted in every simulation
    for b, ss in enumerate(streams):
        t_chunk = time.perf_counter()
        s = min(chunk, n_sims - b * chunk)
        seeds = ss.spawn(5)
        r_data, r_strag, r_test = (np.random.default_rng(seeds[i]) for i in (0, 3, 4))
        # K examples of every class, drawn uniformly without replacement, class-sorted order
        idx = np.concatenate(
            [pl[np.argpartition(r_data.random((s, pl.size)), k - 1, axis=1)[:, :k]] for pl in pools],
            axis=1,
        )  # (s, M)
        x = torch.from_numpy(x_train[idx]).to(dev)  # (s, M, F)
        y = torch.zeros((s, m, n_classes), dtype=torch.float32, device=dev)
        y[:, torch.arange(m), torch.from_numpy(labels)] = 1.0
        # Dual form: beta = X^T phi, since beta^(0) = 0 and every step lies in the row span
        # of X; logits X beta = (X X^T) phi, test logits X_t beta = (X_t X^T) phi, and
        # <g_j, g_k> = <x_j, x_k><r_j, r_k>.
        gram_x = torch.bmm(x, x.transpose(1, 2))  # (s, M, M)
        tsel = np.argpartition(r_test.random((s, x_test.shape[0])), n_test - 1, axis=1)[:, :n_test]
        yt = torch.from_numpy(y_test[tsel]).to(dev)  # (s, n_test)
        gram_t = torch.bmm(torch.from_numpy(x_test[tsel]).to(dev), x.transpose(1, 2))  # (s, n_test, M)
        responding_np = r_strag.random((rounds, s, n_clients)) >= p
        responding = torch.from_numpy(responding_np.astype(np.float32)).to(dev)
        shared_wall = time.perf_counter() - t_chunk
        for si, st in enumerate(settings):
            t_set = time.perf_counter()
            part = make_partition(st.setting, n_clients, n_classes, k, st.c, n_sims=s,
                                  alpha=st.alpha, rng=np.random.default_rng(seeds[1]))
            if st.c > 0 and st.d > 0:
                a = share_randomly(part.owner, part.nonprivate, n_clients, st.d,
                                   np.random.default_rng(seeds[2]), st.placement)
            else:
                a = part.holders()
            res = _run_rounds(gram_x, gram_t, y, yt, a, responding, p, rounds, lr, decay, dev)
            o = out[si]
            o["accuracy"].append(res[0])
            o["second_moment"].append(res[1])
            o["sq_norm"].append(res[2])
            o["responders"].append(responding_np.sum(axis=2).T)
            o["shared_examples"].append(a.sum(axis=(1, 2)) - m)
            o["held_examples"].append(a.sum(axis=2))
            if keep_draws:
                dr = draws[si]
                dr["idx"].append(idx)
                dr["holders"].append(a)
                dr["responding"].append(responding_np)
                dr["test_idx"].append(tsel)
                dr["beta"].append(torch.bmm(x.transpose(1, 2), res[3]).cpu().numpy())
            walls[si] += time.perf_counter() - t_set + shared_wall / len(settings)
            if progress is not None:
                progress(s)
    results = []
    for si, st in enumerate(settings):
        o = out[si]
        results.append(AGCBatchResult(
            setting=st,
            p=float(p),
            accuracy=np.concatenate(o["accuracy"]),
            second_moment=np.concatenate(o["second_moment"]),
            sq_norm=np.concatenate(o["sq_norm"]),
            responders=np.concatenate(o["responders"]),
            shared_examples=np.concatenate(o["shared_examples"]),
            held_examples=np.concatenate(o["held_examples"]),
            wall_s=walls[si],
            extra={key: np.concatenate(v, axis=1 if key == "responding" else 0)
                   for key, v in draws[si].items()} if keep_draws else {"total_wall_s":
                                                                         time.perf_counter() - t_start},
        ))
    return results


def _run_rounds(gram_x, gram_t, y, yt, a, responding, p, rounds, lr, decay, dev):
    """The rounds of one chunk and one setting; returns (acc, moment, sq_norm, phi)."""
    s, m, n_classes = y.shape
    w = torch.from_numpy(example_weights(a, p).astype(np.float32)).to(dev)  # (s, M)
    af = torch.from_numpy(a.astype(np.float32)).to(dev)  # (s, N, M)
    a_over_d = af / af.sum(dim=1, keepdim=True)
    # E||g_hat||^2 = sum_jk Q_jk <r_j, r_k> with Q = X X^T for ||sum_j g_j||^2 and
    # Q = (X X^T) o sum_i (a_i/d)(a_i/d)^T for the variance term p/(1-p) sum_i ||h_i||^2.
    q_var = gram_x * torch.bmm(a_over_d.transpose(1, 2), a_over_d)
    phi = torch.zeros((s, m, n_classes), dtype=torch.float32, device=dev)
    z = torch.zeros_like(phi)  # train logits (X X^T) phi, updated incrementally
    zt = torch.zeros((s, gram_t.shape[1], n_classes), dtype=torch.float32, device=dev)
    acc = np.empty((s, rounds + 1))
    mom = np.empty((s, rounds))
    sqn = np.empty((s, rounds))
    for t in range(rounds):
        acc[:, t] = (zt.argmax(dim=2) == yt).double().mean(dim=1).cpu().numpy()
        r = torch.softmax(z, dim=2) - y  # (s, M, L): softmax - Y
        coef = torch.bmm(responding[t].unsqueeze(1), af).squeeze(1) * w  # eqs. (10)-(11)
        v = coef.unsqueeze(2) * r  # g_hat = X^T v
        kv = torch.bmm(gram_x, torch.cat([r, v], dim=2))
        full = (kv[:, :, :n_classes] * r).sum(dim=(1, 2))  # ||sum_j g_j||^2
        var = (torch.bmm(q_var, r) * r).sum(dim=(1, 2))
        mom[:, t] = ((full.double() + p / (1 - p) * var.double()) / m**2).cpu().numpy()
        sqn[:, t] = (kv[:, :, n_classes:] * v).sum(dim=(1, 2)).double().cpu().numpy() / m**2
        step = lr * decay**t / m  # beta <- beta - eta_t g_hat / M
        phi -= step * v
        z -= step * kv[:, :, n_classes:]
        zt -= step * torch.bmm(gram_t, v)
    acc[:, rounds] = (zt.argmax(dim=2) == yt).double().mean(dim=1).cpu().numpy()
    return acc, mom, sqn, phi
