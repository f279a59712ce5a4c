"""DReS-FL: Lagrange-coded data sharing and a polynomial integer network trained over GF(p).

Source: Shao, Sun, Li, Zhang, "DReS-FL: Dropout-Resilient Secure Federated Learning for Non-IID
Clients via Secret Data Sharing", NeurIPS 2022: Sec. 4.1 (data transformation and secret sharing,
eqs. 2-3), Sec. 4.2 and Alg. 1 (training, eqs. 4-7), Table 4 and App. B (hyperparameters).
The math is in :mod:`fednet.codes.dresfl` and :mod:`fednet.learning.field_models` (FieldPolyMLP).

Set-up (round 0, Alg. 1 line 1): client ``i`` transforms its data (``Round(2^l X_i)``, ``Round(2^l Y_i)``),
splits them into ``K`` shards, appends ``T`` uniform noise shards (secret stream), computes ``(u_i(alpha_j),
v_i(alpha_j))`` for every client ``j`` (LCC, on its processor) and sends share ``j`` to client ``j`` through the
server (``(m_i / K)(d_x + d_y)`` elements of ``ceil(log2 p)`` bits).  Absences: ``setup_dropouts``.

Round ``t`` (Alg. 1 lines 3-12): the server broadcasts the integer model ``w``; the common row selection
``C^(t)`` picks ``b`` of the ``m~ = m / K`` coded rows uniformly without replacement (keyed stream
``(server, "dresfl-rows", t)``; client ``i``'s expected share of rows is proportional to ``m_i``, footnote 5);
every present client ``j`` evaluates the gradient polynomial on its coded minibatch (eqs. 4-5 at ``alpha_j``)
and uploads ``d_w`` field elements.  The server takes the first ``R = deg(g)(K + T - 1) + 1``, interpolates the
``K`` global gradients (line 9), maps them by ``psi`` (eq. 6), sums, clips to ``max_norm`` (Table 4) and
updates ``w <- w - Q(eta / (b K) g)`` (eq. 7, rounding from the keyed stream ``(server, "dresfl-Q", t)``).
With fewer than ``R`` clients present the round is skipped (footnote 6): ``decode_failed`` in the trace.

Modes: ``full`` runs this exactly and checks every decoded gradient against the plain integer gradient, bit for bit;
``timing`` keeps the coded data virtual, follows that plain gradient: the same trajectory, times and traffic.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from fednet.codes import dresfl
from fednet.codes.dresfl import DRESFL_PRIME_200, DataShare, decode_gradients, share_dataset
from fednet.learning.field_models import (FieldPolyMLP, FieldSGD, check_dresfl_fits, decoded_sum, global_datasets,
                                         sum_over_k)
from fednet.algebra.meter import unmetered
from fednet.learning.model import Params, unflatten
from fednet.protocol.base import NodeState, Protocol
from fednet.protocol.modes import Shape
from fednet.protocol.neural import NeuralConfig, NeuralLearning
from fednet.sim.dropout import decodable_probability
from fednet.sim.simulation import Node

__all__ = ["DReSFLConfig", "DReSFL", "DReSFLState"]


class DReSFLConfig(NeuralConfig):
    """DReS-FL's parameters (Table 4, App. B; Sec. 6.1: ``K = T = 1``).

    Attributes
    ----------
    K, T : int
        Shards per client and privacy (colluding clients).
    p : int or str
        The prime (Table 4: ``2^200 - 75`` for MNIST and Fashion-MNIST, ``2^440 - 33`` for the others), or
        ``"2^a-b"`` (:func:`fednet.codes.dresfl.parse_prime`).
    element_bits : int or None
        Wire width of a field element (default ``ceil(log2 p)``).
    data_bits : int
        ``l`` of ``Round(2^l (x + c))`` (4); ``data_shift`` is ``c`` (0).
    weight_bits : int or None
        ``f``: fixed-point weights ``W / 2^f`` (FieldPolyMLP; default 8); None: the paper's plain integer
        network, which with fednet's initialisation does not train (measured on MNIST, centralized,
        batch 64, lr 0.1, clip 2e4: test MSE 5e26 after 100 steps, accuracy 8.9 %; f = 8: 80 % after 200).
    init_scale : float
        Initial weights uniform in ``+-init_scale / sqrt(fan_in)`` before ``Round(2^f w)``.
    max_norm : float or None
        Gradient clipping norm (Table 4: 2e4).
    activation, loss : fixed to the PINN's quadratic activation and squared error.
    sharing_schedule : {"relay_asap", "relay_steps"}
        How the ``N (N - 1)`` shares travel (:meth:`~fednet.protocol.primitives.Net.exchange`).
    mode : {"full", "timing"}
    setup_dropouts : {"offline", "reshare", "fail"}
        Reaction to clients absent during the one-time data sharing (:mod:`fednet.protocol.base`): ``"offline"``
        (default, the paper's assumption: the sharing completes before training; absences recorded only);
        ``"reshare"``: an absent client shares, and receives the shares the server stored for it, in a later
        attempt (:meth:`DReSFL.setup`; every transfer charged); ``"fail"``: :class:`~fednet.errors.SetupFailure`.
    """

    K: int = Field(1, ge=1)
    T: int = Field(1, ge=0)
    p: int = DRESFL_PRIME_200
    element_bits: int | None = Field(None, ge=1)
    data_bits: int = 4
    data_shift: float = 0.0
    weight_bits: int | None = 8
    init_scale: float = Field(1.0, gt=0)
    max_norm: float | None = Field(2e4, gt=0)
    activation: Literal["quadratic"] = "quadratic"
    loss: Literal["mse"] = "mse"
    sharing_schedule: Literal["relay_asap", "relay_steps"] = "relay_asap"
    mode: Literal["full", "timing"] = "full"
    setup_dropouts: Literal["offline", "reshare", "fail"] = "offline"

    _prime_expression = field_validator("p", mode="before")(dresfl.parse_prime)   # "2^a-b" (TOML ints: 64 bits)


@dataclass
class DReSFLState(NodeState):
    """A client's coded data set ``(X~_j, Y~_j)`` (RnsArrays, ``(m~, d_x)`` and ``(m~, d_y)``; full mode)."""

    x_coded: Any = None
    y_coded: Any = None


class DReSFL(Protocol):
    """DReS-FL, Alg. 1 (module docstring)."""

    name = "dresfl"
    setup_dropouts = "offline"       # the paper's dropouts hit training rounds (Sec. 6.1); the config's per instance
    Config = DReSFLConfig
    Learning = NeuralLearning        # App. B's schedule and evaluation; __init__ swaps in the field MLP
    State = DReSFLState

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg, N = self.config, self.sim.n_devices
        self.setup_dropouts, self.shares_forwarded = cfg.setup_dropouts, 0    # forwarded: by later setup attempts
        sizes = [self.task.d, *cfg.hidden, self.task.c]
        self.model = FieldPolyMLP(sizes, cfg.p, data_bits=cfg.data_bits, data_shift=cfg.data_shift,
                                  weight_bits=cfg.weight_bits, init_scale=cfg.init_scale,
                                  max_inner=max(4096, cfg.batch_size, *sizes))
        self.params: Params = self.model.init_params(cfg.model_seed)
        self.schedule = self.learning.schedule
        self.R = dresfl.recovery_threshold(cfg.K, cfg.T, self.model.degree)
        self.alphas, self.betas = dresfl.default_points(N, cfg.K, cfg.T)
        self.wire_bits = cfg.element_bits or math.ceil(math.log2(cfg.p))
        self.shard_rows = dresfl.shard_rows(self.task.X, cfg.K)           # refuses m_i not divisible by K
        self.m_coded = sum(self.shard_rows)
        check_dresfl_fits(self.model, self.params, self.task.X, self.task.Y, p=cfg.p, element_bits=cfg.element_bits,
                          batch_size=cfg.batch_size, m_coded=self.m_coded, K=cfg.K, data_bits=cfg.data_bits,
                          data_shift=cfg.data_shift, weight_bits=cfg.weight_bits, init_scale=cfg.init_scale)

    @classmethod
    def check(cls, config: DReSFLConfig, n_devices: int) -> None:
        """Refuse ``N`` below the recovery threshold of eq. (1) (:func:`fednet.codes.dresfl.check_clients`)."""
        dresfl.check_clients(n_devices, config.K, config.T, len(config.hidden))

    def encode(self, dev: Node):
        """Client ``dev``: transformed data, K shards + T noise shards, LCC shares for all N clients."""
        cfg, i = self.config, dev.index
        xbar, ybar = self.model.transform(self.task.X[i], self.task.Y[i])
        return self.mode.run(share_dataset, xbar, ybar, cfg.K, cfg.T, self.alphas, self.betas, cfg.p,
                             self.learning.secret_rng(dev, "dresfl-noise"), as_rns=True, ctx=self.model.ctx)

    def setup(self) -> Generator:
        """Every client encodes its data and sends share ``j`` to client ``j`` (Alg. 1 line 1).

        Under ``setup_dropouts = "reshare"``, one attempt: the present clients that have not shared yet encode and
        send; a share for an absent client is uploaded only (the server stores it, encrypted) and forwarded in a
        later attempt it is present in (:meth:`setup_waiting`).  With nobody absent: the one exchange of "offline".
        """
        reshare = self.setup_dropouts == "reshare"
        if not hasattr(self, "_sent"):
            self._sent, self._stored, self._inbox = set(), {}, {dev.index: {} for dev in self.devices}
        here = [dev for dev in self.devices if not reshare or self.net.available(dev)]
        present = {dev.index for dev in here}
        senders = [dev for dev in here if dev.index not in self._sent]
        shares: dict[int, Any] = {}
        stored_now: list = []                           # the uploads stored for absent clients (processes)

        def _prepare(dev: Node) -> Generator:
            shares[dev.index] = yield from self.net.compute(dev, self.encode, dev)
            self._inbox[dev.index][dev.index] = _part(dev, dev)
            for dst in self.devices:                  # shares for absent clients: uploaded, stored by the server
                if dst is not dev and dst.index not in present:
                    stored_now.append(self.net.background(self._store(dev, dst, _part(dev, dst))))

        def _part(src: Node, dst: Node) -> DataShare:
            x, y = shares[src.index]
            return DataShare(x[dst.index], y[dst.index])

        forwards = [self.net.background(self._forward(src, dst)) for src, dst in sorted(self._stored)
                        if dst in present]
        pairs = [(s, d) for s in senders for d in here if d is not s]
        delivered = yield from self.net.exchange([pairs], _part, kind="coded_data",
                                                 schedule=self.config.sharing_schedule, prepare=_prepare,
                                                 element_bits=self.wire_bits)
        yield self.sim.env.all_of(stored_now + forwards)
        self._sent.update(present)
        for (s, d), share in delivered.items():
            self._inbox[d][s] = share
        self.shares_forwarded += len(forwards)
        if self.mode.exact:
            for dst in self.devices:
                got = self._inbox[dst.index]
                if len(got) == len(self.devices) and dst.state.x_coded is None:
                    parts = [got[src.index] for src in self.devices]
                    dst.state.x_coded, dst.state.y_coded = dresfl.coded_dataset(parts)
                    got.clear()
        shares.clear()
        self.decoded_rounds, q = 0, self.learning.participation()
        self.p_decodable = None if q is None else decodable_probability(q, self.R)

    def setup_waiting(self, pending: set[int]) -> list[int]:
        """Also the clients the server still holds shares for (absent when their senders came back)."""
        return sorted(set(pending) | {dst for _, dst in getattr(self, "_stored", {})})

    def _store(self, src: Node, dst: Node, share: DataShare) -> Generator:
        """Upload ``src``'s share for the absent client ``dst`` to the server, which keeps it (encrypted)."""
        yield from self.net.send(src, self.server, share, kind="coded_data", element_bits=self.wire_bits,
                                 encrypted=True)
        self._stored[(src.index, dst.index)] = share

    def _forward(self, src: int, dst: int) -> Generator:
        """The server forwards the stored share of ``src`` to ``dst``, present again (a reshare attempt)."""
        share = self._stored.pop((src, dst))
        msg = yield from self.net.send(self.server, self.devices[dst], share, kind="coded_data",
                                       element_bits=self.wire_bits)
        self._inbox[dst][src] = msg.payload

    def round_rows(self, epoch: int) -> np.ndarray:
        """``I_t``: ``b`` of the ``m~`` coded rows, uniformly without replacement (common to all clients)."""
        return self.sim.rng(self.server, "dresfl-rows", epoch).choice(self.m_coded, size=self.config.batch_size,
                                                                      replace=False)

    def coded_gradient(self, dev: Node):
        """Client ``dev``: ``g~(X~_j^(I_t), Y~_j^(I_t); w)`` over GF(p) on the downloaded model (eqs. 4-5)."""
        cfg, b, rows = self.config, self.config.batch_size, self.rows_t
        x = dev.state.x_coded[rows] if self.mode.exact else Shape((b, self.task.d), object)
        y = dev.state.y_coded[rows] if self.mode.exact else Shape((b, self.task.c), object)
        return self.mode.run(self.model.field_gradient, dev.state.received, x, y,
                             macs=lambda: self.model.field_gradient_probe(self.params, b),
                             key=("dresfl-gradient", tuple(self.model.sizes), b, cfg.p),
                             like=Shape((self.learning.n_params,), object))

    def plain_gradients(self, wide: bool = False) -> list[Params]:
        """The K integer gradients of the global minibatches ``X_bar^(k)_(I_t)`` (the decoding's target; ``wide``:
        as :class:`~fednet.algebra.wideint.WideInts`, ``FieldPolyMLP.integer_gradient``)."""
        if getattr(self, "_global", None) is None:        # transformed once, rows selected per round
            self._global = global_datasets(self.model, self.task.X, self.task.Y, self.shard_rows, self.config.K)
        return [self.model.integer_gradient(self.params, x[self.rows_t], y[self.rows_t], transformed=True, wide=wide)
                for x, y in self._global]

    def host_gradient(self) -> Params:
        """Timing mode's stand-in for the decoded sum: the plain integer gradients summed over k, computed
        uncharged, as WideInts per parameter (:meth:`update` takes them without Python ints)."""
        with unmetered():
            return sum_over_k(self.plain_gradients(wide=True), list(self.params))

    def decode(self, results: list, alphas: list[int]) -> np.ndarray:
        """Server: interpolate the K global gradients (Alg. 1 line 9), psi (eq. 6), sum over k: ``(d_w,)`` ints."""
        cfg = self.config
        return decoded_sum(decode_gradients(results, alphas, self.betas, cfg.K, cfg.T, self.model.degree, cfg.p),
                           cfg.p, list(self.params))

    def check_decoded(self, results: list, alphas: list[int]) -> None:
        """Full mode's observer: every decoded gradient equals the plain integer gradient, bit for bit."""
        cfg = self.config
        g = decode_gradients(results, alphas, self.betas, cfg.K, cfg.T, self.model.degree, cfg.p)
        dresfl.check_decoded(g, self.plain_gradients(), cfg.p, list(self.params), what=f"round {self.epoch}")

    def update(self, flat: np.ndarray | Params) -> Params:
        """Clip and update with the stochastic rounding Q (eq. 7), exact in ``Z_p``.

        ``flat``: the decoded sum, ``(d_w,)`` ints, or timing mode's :meth:`host_gradient` (Params).
        """
        g = flat if isinstance(flat, dict) else unflatten(np.asarray(flat, dtype=object), self.model.param_shapes())
        return FieldSGD(self.model, self.schedule, self.sim.rng(self.server, "dresfl-Q", self.epoch),
                        max_norm=self.config.max_norm).step(self.params, g, self.config.batch_size * self.config.K,
                                                            self.epoch)

    def round(self, epoch: int) -> Generator:
        """Broadcast w; coded gradients; the first R uploads decoded; psi, clip, Q (Alg. 1)."""
        self.rows_t = self.round_rows(epoch)
        present = [dev for dev in self.devices if self.net.available(dev)]
        replies = yield from self.net.gather(self.devices, self.coded_gradient, kind="coded_gradient",
                                             first=self.R if len(present) >= self.R else None, download=self.params,
                                             download_elements=self.learning.n_params, download_bits=self.wire_bits,
                                             upload_elements=self.learning.n_params, upload_bits=self.wire_bits)
        if len(replies) < self.R:                                   # footnote 6: no update this round
            self.decode_failed = self.learning.skipped = True
            self.used = []
            return
        alphas = [self.alphas[dev.index] for dev in replies.nodes]
        results, cfg = replies.values, self.config
        zero = [{k: np.zeros(v.shape, object) for k, v in self.params.items()} for _ in range(self.R)]
        G = yield from self.net.server_compute(
                lambda: self.mode.run(self.decode, results, alphas,
                                      macs=lambda: self.decode(zero, self.alphas[:self.R]),
                                      key=("dresfl-decode", self.R, cfg.K, cfg.T, self.learning.n_params),
                                      like=Shape((self.learning.n_params,), object),
                                      stand_in=self.host_gradient))
        self.mode.observe(self.check_decoded, results, alphas)
        self.params = yield from self.net.server_compute(self.update, self.mode.value(G))
        self.used = sorted(dev.index for dev in replies.nodes)
        self.decoded_rounds += 1

    def round_metrics(self, round: int) -> dict[str, Any]:
        """Also ``decodable_probability`` (row 0: the exact per-round probability of ``>= R`` present clients)."""
        out = super().round_metrics(round)
        if round == 0:
            out["decodable_probability"] = self.p_decodable
        return out
