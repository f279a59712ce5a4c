"""Pure updates of the DReS-FL baselines: FedAvg, FedAvg-IS, SCAFFOLD, centralized SGD.

Source: Shao, Sun, Li, Zhang, "DReS-FL", Sec. 6.1 and App. B (one local SGD step per round, batch
64, learning rate 0.1 decayed by 0.65 every 1500 rounds); McMahan et al. 2017 (FedAvg); Ren et al.
2020 / Kairouz et al. 2021 (importance weights ``1 / (1 - dropout probability)``); Karimireddy et
al., "SCAFFOLD", ICML 2020, Algorithm 1 with option II control variates.

Parameters are :data:`fednet.learning.model.Params` (name -> array); every function charges the
MACs of the arithmetic it performs (a metered ``axpy`` per array: one MAC per element), the
gradients are charged by the model's own metered kernels. No SimPy here: the protocols
(``protocols/fedavg.py``, ``scaffold.py``, ``centralized.py``, ``fedavg_lightsecagg.py``) move the
results around.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from fednet.algebra.meter import axpy, charge
from fednet.learning.model import Model, Params, StepSchedule

__all__ = ["dresfl_schedule", "add_scaled", "local_sgd_delta", "local_sgd_steps", "weighted_sum", "fedavg_weights",
           "scaffold_local", "scaffold_server", "fedopt_server"]


def dresfl_schedule(learning_rate: float = 0.1, decay: float = 0.65, every: int = 1500) -> StepSchedule:
    """The learning-rate schedule of DReS-FL App. B: ``0.1``, times ``0.65`` after every 1500 rounds."""
    return StepSchedule(learning_rate, decay=decay, every=every)


def add_scaled(a: Mapping[str, np.ndarray], alpha: float, b: Mapping[str, np.ndarray]) -> Params:
    """``a + alpha b`` per array (metered: one MAC per element).

    With ``alpha = +-1`` and float arrays the sum is taken as ``a + b`` or ``a - b`` (charged the
    same): ``+-1 * b`` is exact and IEEE addition commutes, so the bits are those of
    ``alpha * b + a`` (the metered :func:`~fednet.algebra.meter.axpy`), one pass fewer.
    """
    out = {}
    for k, v in a.items():
        x, y = np.asarray(b[k]), np.asarray(v)
        if (alpha == 1.0 or alpha == -1.0) and x.dtype.kind == "f" and y.dtype.kind == "f":
            charge(x.size)
            out[k] = np.add(y, x) if alpha == 1.0 else np.subtract(y, x)
        else:
            out[k] = axpy(alpha, x, y)
    return out


def local_sgd_delta(model: Model, params: Params, x: np.ndarray, y: np.ndarray, lr: float,
                    correction: Mapping[str, np.ndarray] | None = None) -> tuple[Params, Params]:
    """One local SGD step of a client on a minibatch; returns ``(delta, g)``.

    ``g = (1/b) sum_j grad l(f(x_j), y_j)`` at ``params`` (the model's metered gradient, divided by
    the ``b`` rows), ``delta = -lr (g + correction)`` (SCAFFOLD's ``c - c_i`` as ``correction``).

    Parameters
    ----------
    model : Model
    params : Params
        The model the client downloaded.
    x : ndarray, (b, d)
    y : ndarray, (b,) labels or (b, c) targets
    lr : float
        Local learning rate ``eta_l``.
    correction : Params, optional

    Returns
    -------
    delta : Params
        ``y_i - x`` of the local step (float64).
    g : Params
        The mean minibatch gradient (float64).
    """
    b = x.shape[0]
    grad = model.gradient(params, x, y)
    g = {k: np.divide(v, b, dtype=np.float64) for k, v in grad.items()}   # = float64(v) / b, one pass
    step = g if correction is None else add_scaled(g, 1.0, correction)
    return {k: axpy(-lr, v, 0.0) for k, v in step.items()}, g               # -lr v + 0, as onto a zero array


def local_sgd_steps(model: Model, params: Params, batches: Iterable[tuple[np.ndarray, np.ndarray]], lr: float,
                    mu: float = 0.0) -> Params:
    """``K`` local SGD steps of a client (FedAvg's ``E`` local epochs, FedProx's inexact local solve); returns ``delta``.

    The client keeps ``delta_s = w_s - w_t`` (``w_t`` = ``params``, the downloaded model) and takes, on its
    ``s``-th minibatch ``(x_s, y_s)``,

        ``delta_{s+1} = delta_s - lr (g_s(w_t + delta_s) + mu delta_s)``,

    ``g_s`` the mean minibatch gradient; ``mu delta_s = mu (w - w_t)`` is the gradient of FedProx's proximal term
    ``mu/2 ||w - w_t||^2`` (Li et al., "Federated optimization in heterogeneous networks", MLSys 2020, eq. (2)).
    The first step is :func:`local_sgd_delta` at ``w_t`` itself (there ``delta = 0``: no proximal term is
    computed), so one batch gives FedAvg's one-step update bit for bit; ``mu = 0`` computes no proximal term at
    all (FedProx with ``mu = 0`` is FedAvg).

    MACs (metered): each batch's gradient (the model's kernels); one per element for ``-lr v``; from the second
    step on, one per element for ``w_t + delta_s`` and one for ``delta_s + step``, and with ``mu > 0`` one for
    ``mu delta_s`` and one for adding it to the gradient.

    Parameters
    ----------
    model : Model
    params : Params
        ``w_t``, the model the client downloaded.
    batches : iterable of (x (b, d), y (b,) or (b, c))
        The ``K >= 1`` minibatches, in order.
    lr : float
        Local learning rate ``eta_l``.
    mu : float
        FedProx's ``mu >= 0`` (0: FedAvg).

    Returns
    -------
    Params
        ``delta_K = w_K - w_t`` (float64).

    Raises
    ------
    ValueError
        If ``batches`` is empty.
    """
    delta: Params | None = None
    for x, y in batches:
        if delta is None:
            delta, _ = local_sgd_delta(model, params, x, y, lr)
            continue
        w = add_scaled(params, 1.0, delta)
        prox = None if mu == 0 else {k: axpy(mu, v, 0.0) for k, v in delta.items()}
        step, _ = local_sgd_delta(model, w, x, y, lr, prox)
        delta = add_scaled(delta, 1.0, step)
    if delta is None:
        raise ValueError("local_sgd_steps needs at least one minibatch")
    return delta


def fedopt_server(params: Params, m: Params, v: Params, delta: Params, rule: str, server_lr: float,
                  beta1: float, beta2: float, tau: float) -> tuple[Params, Params, Params]:
    """One server step of FedAdam / FedYogi / FedAdagrad on the averaged client delta (Reddi et al., Alg. 2).

    Source: Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan, "Adaptive federated optimization",
    ICLR 2021, Algorithm 2 (lines 10-14), element-wise:

    * ``m_t = beta1 m_{t-1} + (1 - beta1) Delta_t``
    * FedAdagrad: ``v_t = v_{t-1} + Delta_t^2``;
      FedYogi: ``v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)``;
      FedAdam: ``v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2``
    * ``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)`` (no bias correction, as in Alg. 2).

    MACs (metered, one per element-wise multiply, add, square root or division): ``m_t`` 2, ``Delta^2`` 1,
    ``v_t`` 1 (Adagrad), 2 (Adam), 3 (Yogi: the difference, the signed product, the scaled addition), the step 4
    (square root, ``+ tau``, division, scaled addition); per parameter.

    Parameters
    ----------
    params : Params
        ``x_t``.
    m, v : Params
        ``m_{t-1}``, ``v_{t-1}`` (Alg. 2 starts from ``m_{-1} = 0``, ``v_{-1} >= tau^2``).
    delta : Params
        ``Delta_t``, the aggregated client delta.
    rule : {"adam", "yogi", "adagrad"}
    server_lr : float
        ``eta``.
    beta1, beta2 : float
    tau : float
        Degree of adaptivity (``> 0``).

    Returns
    -------
    (Params, Params, Params)
        ``x_{t+1}``, ``m_t``, ``v_t`` (float64).

    Raises
    ------
    ValueError
        For an unknown rule.
    """
    if rule not in ("adam", "yogi", "adagrad"):
        raise ValueError(f"rule must be 'adam', 'yogi' or 'adagrad', got {rule!r}")
    x_new, m_new, v_new = {}, {}, {}
    for k, x in params.items():
        d = np.asarray(delta[k], dtype=np.float64)
        mk = beta1 * np.asarray(m[k], dtype=np.float64) + (1.0 - beta1) * d
        d2 = d * d
        vk = np.asarray(v[k], dtype=np.float64)
        if rule == "adagrad":
            vk = vk + d2
            ops = 1
        elif rule == "adam":
            vk = beta2 * vk + (1.0 - beta2) * d2
            ops = 2
        else:
            vk = vk - (1.0 - beta2) * (d2 * np.sign(vk - d2))
            ops = 3
        x_new[k] = np.asarray(x, dtype=np.float64) + server_lr * (mk / (np.sqrt(vk) + tau))
        m_new[k], v_new[k] = mk, vk
        charge((2 + 1 + ops + 4) * d.size)
    return x_new, m_new, v_new


def weighted_sum(vectors: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]) -> Params:
    """``sum_i w_i v_i`` per array (metered: one MAC per element and term), in the given order.

    Raises
    ------
    ValueError
        If the lengths differ or nothing is given.
    """
    if len(vectors) != len(weights) or not vectors:
        raise ValueError(f"need as many weights as vectors (> 0), got {len(weights)} and {len(vectors)}")
    total = {k: np.zeros_like(np.asarray(v, dtype=np.float64)) for k, v in vectors[0].items()}
    for v, w in zip(vectors, weights):
        total = add_scaled(total, float(w), v)
    return total


def fedavg_weights(m: Sequence[int], used: Sequence[int], participation: Sequence[float] | None = None,
                   rule: str = "unbiased") -> np.ndarray:
    """Aggregation weights of the clients ``used`` in a round.

    Parameters
    ----------
    m : sequence of int
        Every client's number of samples ``m_i``.
    used : sequence of int
        The clients whose updates arrived.
    participation : sequence of float, optional
        Each client's probability ``1 - p_i`` of taking part (FedAvg-IS); None: plain FedAvg.
    rule : {"unbiased", "normalized"}
        FedAvg-IS only. ``unbiased`` (Horvitz-Thompson): ``w_i = (m_i / m) / (1 - p_i)``, so that
        ``E[sum_i w_i Delta_i] = sum_i (m_i / m) Delta_i`` over the dropouts; ``normalized``: the
        same weights divided by their sum over ``used``.

    Returns
    -------
    ndarray, (len(used),)
        Plain FedAvg: ``m_i / sum_{j in used} m_j`` (McMahan et al.).

    Raises
    ------
    ValueError
        For an unknown rule, no client used, or a participation probability that is not positive.
    """
    if not len(used):
        raise ValueError("used must name at least one client")
    mi = np.asarray([m[i] for i in used], dtype=np.float64)
    if participation is None:
        return mi / mi.sum()
    q = np.asarray([participation[i] for i in used], dtype=np.float64)
    if not np.all(q > 0):
        raise ValueError(f"participation probabilities must be positive, got {q.tolist()}")
    w = mi / float(np.sum(m)) / q
    if rule == "unbiased":
        return w
    if rule == "normalized":
        return w / w.sum()
    raise ValueError(f"rule must be 'unbiased' or 'normalized', got {rule!r}")


def scaffold_local(model: Model, params: Params, x: np.ndarray, y: np.ndarray, lr: float,
                   c: Mapping[str, np.ndarray], c_i: Mapping[str, np.ndarray],
                   control_lr: float | None = None) -> tuple[Params, Params, Params]:
    """SCAFFOLD client (Karimireddy et al. 2020, Alg. 1, lines 8-13) with ``K = 1`` local step, option II.

    ``y_i = x - eta_l (g_i(x) - c_i + c)``; option II: ``c_i^+ = c_i - c + (x - y_i) / (K eta_l)``,
    which for ``K = 1`` is ``g_i(x)``. ``control_lr`` replaces ``eta_l`` in option II only (default: ``lr``);
    a constant there while ``lr`` decays is a variant, not Alg. 1 (:mod:`protocols.scaffold`).

    Returns
    -------
    delta_y : Params
        ``y_i - x``.
    delta_c : Params
        ``c_i^+ - c_i``.
    c_i_new : Params
        ``c_i^+`` (the client keeps it).
    """
    correction = add_scaled(c, -1.0, c_i)                      # c - c_i
    delta_y, _ = local_sgd_delta(model, params, x, y, lr, correction)
    # option II: c_i+ = c_i - c + (x - y_i) / (K lr) with K = 1
    c_new = add_scaled(add_scaled(c_i, -1.0, c), -1.0 / (lr if control_lr is None else control_lr), delta_y)
    delta_c = add_scaled(c_new, -1.0, c_i)
    return delta_y, delta_c, c_new


def scaffold_server(params: Params, c: Params, delta_ys: Sequence[Params], delta_cs: Sequence[Params],
                    n_clients: int, global_lr: float = 1.0) -> tuple[Params, Params]:
    """SCAFFOLD server (Alg. 1, lines 16-17): ``x += eta_g / |S| sum dy_i``, ``c += 1/N sum dc_i``.

    Parameters
    ----------
    params, c : Params
        Global model ``x`` and control variate ``c``.
    delta_ys, delta_cs : sequence of Params
        The updates of the clients ``S`` that arrived (``|S| >= 1``).
    n_clients : int
        ``N``, all clients.
    global_lr : float
        ``eta_g`` (1 in the DReS-FL comparison: the server applies the mean local step).

    Returns
    -------
    (Params, Params)
        The new ``x`` and ``c``.
    """
    S = len(delta_ys)
    x = add_scaled(params, global_lr, weighted_sum(delta_ys, [1.0 / S] * S))
    c_new = add_scaled(c, 1.0, weighted_sum(delta_cs, [1.0 / n_clients] * S))
    return x, c_new
