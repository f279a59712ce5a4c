"""DReS-FL: Lagrange-coded data sharing and a polynomial integer network trained over GF(p).

Source: Shao, Sun, Li, Zhang, "DReS-FL: Dropout-Resilient Secure Federated Learning for Non-IID
Clients via Secret Data Sharing", NeurIPS 2022: Sec. 4.1 (data transformation and secret sharing,
eqs. 2-3), Sec. 4.2 and Alg. 1 (training, eqs. 4-7), Table 4 and App. B (hyperparameters).
The math is in :mod:`fednet.codes.dresfl` and :class:`fednet.learning.field_models.FieldPolyMLP`.

Set-up (round 0, Alg. 1 line 1): client ``i`` transforms its data, ``X_bar_i = Round(2^l X_i)``,
``Y_bar_i = Round(2^l Y_i)``, splits them into ``K`` shards, appends ``T`` uniform noise shards
(secret stream) and computes ``(u_i(alpha_j), v_i(alpha_j))`` for every client ``j`` (the LCC
product, ``N (K + T) (m_i / K)(d_x + d_y)`` MACs on its processor); share ``j`` goes to client ``j``
through the server (``(m_i / K)(d_x + d_y)`` elements of ``ceil(log2 p)`` bits each: 200 bits for
``p = 2^200 - 75``). By default all clients complete the one-time sharing (as in the paper; the dropouts
hit the training rounds; absences in round 0 are recorded only); with ``setup_dropouts = "reshare"`` a client
absent from the sharing sends its shares, and receives those stored for it, in the first later setup attempt
it is present in (:meth:`DReSFL.setup`).

Round ``t`` (Alg. 1 lines 3-12): the server broadcasts the integer model ``w`` (``d_w`` elements);
the common row selection ``C^(t)`` picks ``b`` of the ``m~ = m / K`` coded rows uniformly without
replacement (the keyed stream ``(server, "dresfl-rows", t)``; the expected number of rows from
client ``i``'s block is proportional to ``m_i``, footnote 5); every present client ``j`` evaluates
the gradient polynomial on its coded minibatch (eq. 4-5 at ``alpha_j``) and uploads ``d_w`` field
elements. The server takes the first ``R = deg(g)(K + T - 1) + 1`` uploads, interpolates the ``K``
global gradients (Alg. 1 line 9), maps them by ``psi`` (eq. 6), sums, clips to ``max_norm``
(Table 4) and updates ``w <- w - Q(eta / (b K) g)`` (eq. 7, stochastic rounding from the keyed
stream ``(server, "dresfl-Q", t)``). With fewer than ``R`` clients present the round is skipped
(footnote 6): ``decode_failed`` in the trace.

Modes: ``full`` runs all of this exactly (only small set-ups fit in memory) and checks every decoded
gradient against the plain integer gradient of the same global minibatches, bit for bit. ``timing``
keeps the coded data virtual, charges the MACs the same kernels meter at the same shapes and sends the
same sizes; its update uses the plain integer gradient (equal to the decoded one, as full mode proves):
both modes give the same trajectory, times and traffic at a seed.  Timing mode's host work per round is
that gradient (``FieldPolyMLP.integer_gradient(wide=True)``: the same integers modulo a smaller prime, as
16-bit digit columns, :class:`~fednet.algebra.wideint.WideInts`) and the update on those digits (no Python
ints; ``tests/test_dresfl_timing_pinned.py`` pins the result bit for bit).
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import simpy
from pydantic import Field, field_validator

from fednet.codes.dresfl import (DRESFL_PRIME_200, concat_rows, decode_gradients, default_points, global_shards,
                                 psi, recovery_threshold, share_dataset)
from fednet.algebra.capacity import check_resolution
from fednet.errors import CapacityError, ConfigError
from fednet.learning.field_models import FieldPolyMLP, FieldSGD
from fednet.learning.federated import dresfl_schedule
from fednet.learning.model import Params, flatten, unflatten, unmetered
from fednet.protocol.base import NodeState
from fednet.protocol.modes import Shape
from fednet.protocol.neural import NeuralConfig, NeuralProtocol
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
        The prime (Table 4: ``2^200 - 75`` for MNIST and Fashion-MNIST, ``2^440 - 33`` for the others); a
        string ``"2^a-b"`` is accepted (TOML integers stop at 64 bits).
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
        How the ``N (N - 1)`` shares travel (:meth:`~fednet.protocol.primitives.Primitives.exchange`).
    mode : {"full", "timing"}
    setup_dropouts : {"offline", "reshare", "fail"}
        Reaction to clients absent during the one-time data sharing (:mod:`fednet.protocol.base`).
        ``"offline"`` (default, the paper's assumption: the sharing completes before training; absences are
        recorded only); ``"reshare"``: a client absent in a sharing attempt sends its shares when it is present
        in a later attempt and then receives the shares the server stored for it (:meth:`DReSFL.setup`),
        every transfer charged on the links; ``"fail"``: any absence raises :class:`~fednet.errors.SetupFailure`.
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

    @field_validator("p", mode="before")
    @classmethod
    def _prime_expression(cls, v: Any) -> Any:
        """``"2^a-b"`` (or ``2**a - b``) as an int."""
        m = re.fullmatch(r"\s*2\s*(?:\^|\*\*)\s*(\d+)\s*-\s*(\d+)\s*", v) if isinstance(v, str) else None
        if isinstance(v, str) and not m:
            raise ValueError(f"p must be an integer or '2^a-b', got {v!r}")
        return 2 ** int(m.group(1)) - int(m.group(2)) if m else v


@dataclass
class DReSFLState(NodeState):
    """A client's coded data set ``(X~_j, Y~_j)`` (RnsArrays, ``(m~, d_x)`` and ``(m~, d_y)``; full mode)."""

    x_coded: Any = None
    y_coded: Any = None


class DReSFL(NeuralProtocol):
    """DReS-FL, Alg. 1 (module docstring)."""

    name = "dresfl"
    #: The paper's dropouts are those of training rounds (Sec. 6.1); the data sharing of Sec. 4.1 is a
    #: one-time phase completed before training, so absences then are only recorded by default
    #: (``DReSFLConfig.setup_dropouts`` selects "reshare" or "fail" per instance).
    setup_dropouts = "offline"
    Config = DReSFLConfig
    State = DReSFLState

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg, N = self.config, self.sim.n_devices
        self.setup_dropouts = cfg.setup_dropouts          # the instance's reaction (the class default: offline)
        self.shares_forwarded = 0                          # stored shares forwarded in later setup attempts
        sizes = [self.task.d, *cfg.hidden, self.task.c]
        self.model = FieldPolyMLP(sizes, cfg.p, data_bits=cfg.data_bits, data_shift=cfg.data_shift,
                                  weight_bits=cfg.weight_bits, init_scale=cfg.init_scale,
                                  max_inner=max(4096, cfg.batch_size, *sizes))
        self.params: Params = self.model.init_params(cfg.model_seed)
        self.schedule = dresfl_schedule(cfg.learning_rate, cfg.lr_decay, cfg.lr_every)
        self.R = recovery_threshold(cfg.K, cfg.T, self.model.degree)
        self.alphas, self.betas = default_points(N, cfg.K, cfg.T)
        self.wire_bits = cfg.element_bits or math.ceil(math.log2(cfg.p))
        bad = [i for i, x in enumerate(self.task.X) if x.shape[0] % cfg.K]
        if bad:
            raise ValueError(f"every client's m_i must be divisible by K = {cfg.K} (Sec. 4.1); clients {bad} "
                             f"hold {[self.task.X[i].shape[0] for i in bad]} rows")
        self.shard_rows = [x.shape[0] // cfg.K for x in self.task.X]
        self.m_coded = sum(self.shard_rows)
        self.check_against_data()

    def check_against_data(self) -> None:
        """Refuse, before anything runs, parameters that do not fit the data and the field (issue 33).

        - ``element_bits`` below ``ceil(log2 p)`` (the wire would carry field elements too short);
        - ``batch_size`` above the ``m~`` coded rows it is drawn from (without replacement);
        - ``data_bits`` (``weight_bits``) that round most nonzero features (initial weights) to zero
          (:func:`fednet.algebra.capacity.check_resolution`);
        - a prime whose signed range ``(p-1)/2`` cannot hold the transformed data, the labels times
          ``c_y``, the bias multipliers ``c_i`` or the initial integer weights.

        A gradient that outgrows the field during training is a recorded failure at its round
        (:mod:`fednet.protocol.finite`).

        Raises
        ------
        fednet.errors.ConfigError, fednet.errors.CapacityError
            Naming the parameter, its value and a setting that works.
        """
        cfg, model = self.config, self.model
        field_bits = math.ceil(math.log2(cfg.p))
        if cfg.element_bits is not None and cfg.element_bits < field_bits:
            raise ConfigError(f"element_bits = {cfg.element_bits} is below the {field_bits} bits of an element of "
                              f"GF(p), p = {cfg.p}: every coded message would be counted too short; leave it unset "
                              f"(ceil(log2 p) = {field_bits}) or raise it")
        if cfg.batch_size > self.m_coded:
            raise ConfigError(f"batch_size = {cfg.batch_size} exceeds the m~ = {self.m_coded} coded rows the "
                              f"minibatch is drawn from without replacement (K = {cfg.K}); use batch_size <= "
                              f"{self.m_coded}")
        shift = cfg.data_shift
        check_resolution([x + shift for x in self.task.X] if shift else list(self.task.X), cfg.data_bits,
                         "data_bits", "the training features" + (" plus data_shift" if shift else ""))
        sizes = model.sizes
        if cfg.weight_bits is not None:         # the initial weights' magnitudes (a draw of their law, not the model's)
            rng = np.random.default_rng(0)
            check_resolution([rng.uniform(-1.0, 1.0, min(4096, a * b)) * cfg.init_scale / math.sqrt(a)
                              for a, b in zip(sizes[:-1], sizes[1:])], cfg.weight_bits, "weight_bits",
                             "the initial weights")
        half = (cfg.p - 1) // 2
        x_max = max(max(abs(float(x.max()) + shift), abs(float(x.min()) + shift)) if x.size else 0.0
                    for x in self.task.X)
        y_max = max(float(np.abs(y).max()) if y.size else 0.0 for y in self.task.Y)
        w_max = max((int(np.abs(np.asarray(v, dtype=object)).max()) for v in self.params.values() if v.size),
                    default=0)
        needs = {"the transformed features Round(2^l (x + c))": round(2.0 ** model.l * x_max),
                 "the transformed labels times c_y": round(2.0 ** model.l * y_max) * model.label_mult,
                 "the bias multipliers c_i": max(model.bias_mult, default=1),
                 "the initial integer weights": w_max}
        x0, y0 = self.task.X[0][:cfg.batch_size], self.task.Y[0][:cfg.batch_size]
        with unmetered(), np.errstate(all="ignore"):    # the initial gradient of one real minibatch
            needs["the integer gradient of the initial model on a minibatch of client 0"] = \
                model.gradient_bound(self.params, *model.transform(x0, y0))
        for what, need in needs.items():
            if not need <= half:
                bits = "more than 1024" if not math.isfinite(need) else f"{math.log2(max(need, 1)):.1f}"
                need_bits = "1024" if not math.isfinite(need) else f"{math.ceil(math.log2(2 * need + 1))}"
                raise CapacityError(f"p = {cfg.p} ({cfg.p.bit_length()} bits) is too small for {what} (up to "
                                    f"2^{bits}, above (p-1)/2): use a prime above 2^{need_bits} or fewer "
                                    f"data_bits / weight_bits")

    @classmethod
    def check(cls, config: DReSFLConfig, n_devices: int) -> None:
        """Refuse ``N`` below the recovery threshold of eq. (1) (no dropout tolerated at all)."""
        deg = 2 ** (len(config.hidden) + 1)
        R = recovery_threshold(config.K, config.T, deg)
        if n_devices < R:
            raise ValueError(f"DReS-FL with K = {config.K}, T = {config.T}, deg(g) = {deg} needs N >= "
                             f"deg(g)(K + T - 1) + 1 = {R} clients (Theorem 1, eq. 1), got N = {n_devices}")

    def encode(self, dev: Node):
        """Client ``dev``: transformed data, K shards + T noise shards, LCC shares for all N clients."""
        cfg, i = self.config, dev.index
        xbar, ybar = self.model.transform(self.task.X[i], self.task.Y[i])
        d_x, d_y, N, rows = self.task.d, self.task.c, self.sim.n_devices, self.shard_rows[i]
        macs = N * (cfg.K + cfg.T) * rows * (d_x + d_y)
        like = (Shape((N, rows, d_x), object), Shape((N, rows, d_y), object))
        return self.mode.run(share_dataset, xbar, ybar, cfg.K, cfg.T, self.alphas, self.betas, cfg.p,
                             self.secret_rng(dev, "dresfl-noise"), as_rns=True, ctx=self.model.ctx,
                             macs=macs, like=like)

    def setup(self) -> Generator:
        """Every client encodes its data and sends share ``j`` to client ``j`` (Alg. 1 line 1).

        Under ``setup_dropouts = "reshare"`` (config), one setup attempt: the present clients that have not yet
        shared encode and send their shares; a share addressed to an absent client is uploaded only (the server
        stores it, end-to-end encrypted) and forwarded when that client is present in a later attempt, where it
        also encodes and sends its own shares. The base class repeats attempts while :meth:`setup_waiting` names
        a client: one never present yet, or one the server still holds shares for. With nobody absent this is
        exactly the one exchange of ``"offline"``.
        """
        reshare = self.setup_dropouts == "reshare"
        if not hasattr(self, "_sent"):
            self._sent, self._stored, self._inbox = set(), {}, {dev.index: {} for dev in self.devices}
        here = [dev for dev in self.devices if not reshare or self.net.available(dev)]
        present = {dev.index for dev in here}
        senders = [dev for dev in here if dev.index not in self._sent]
        shares: dict[int, Any] = {}
        stored_now: list[simpy.Process] = []

        def _prepare(dev: Node) -> Generator:
            shares[dev.index] = yield from self.net.compute(dev, self.encode, dev)
            self._inbox[dev.index][dev.index] = _part(dev, dev)
            for dst in self.devices:                  # shares for absent clients: uploaded, stored by the server
                if dst is not dev and dst.index not in present:
                    stored_now.append(self.net.background(self._store(dev, dst, _part(dev, dst))))

        def _part(src: Node, dst: Node) -> _Share:
            x, y = shares[src.index]
            return _Share(x[dst.index], y[dst.index])

        env = self.sim.env
        forwards = [self.net.background(self._forward(src, dst)) for src, dst in sorted(self._stored)
                        if dst in present]
        pairs = [(s, d) for s in senders for d in here if d is not s]
        delivered = yield from self.net.exchange([pairs], _part, kind="coded_data",
                                                 schedule=self.config.sharing_schedule, prepare=_prepare,
                                                 element_bits=self.wire_bits)
        yield env.all_of(stored_now + forwards)
        self._sent.update(present)
        for (s, d), share in delivered.items():
            self._inbox[d][s] = share
        self.shares_forwarded += len(forwards)
        if self.mode.exact:
            for dst in self.devices:
                got = self._inbox[dst.index]
                if len(got) == len(self.devices) and dst.state.x_coded is None:
                    parts = [got[src.index] for src in self.devices]
                    dst.state.x_coded = concat_rows([g.x for g in parts])
                    dst.state.y_coded = concat_rows([g.y for g in parts])
                    got.clear()
        shares.clear()
        self.decoded_rounds, q = 0, self.participation()
        self.p_decodable = None if q is None else decodable_probability(q, self.R)

    def setup_waiting(self, pending: set[int]) -> list[int]:
        """Also the clients the server still holds shares for (absent when their senders came back)."""
        stored = {dst for _, dst in getattr(self, "_stored", {})}
        return sorted(set(pending) | stored)

    def _store(self, src: Node, dst: Node, share: "_Share") -> Generator:
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
        cfg, b = self.config, self.config.batch_size
        w = dev.state.received
        rows = self.rows_t
        x = dev.state.x_coded[rows] if self.mode.exact else Shape((b, self.task.d), object)
        y = dev.state.y_coded[rows] if self.mode.exact else Shape((b, self.task.c), object)
        return self.mode.run(
            self.model.field_gradient, w, x, y,
            macs=lambda: self.model.field_gradient({k: np.zeros_like(v) for k, v in self.params.items()},
                                                   np.zeros((b, self.task.d), np.int64),
                                                   np.zeros((b, self.task.c), np.int64)),
            key=("dresfl-gradient", tuple(self.model.sizes), b, cfg.p),
            like=Shape((self.n_params,), object))

    def plain_gradients(self, wide: bool = False) -> list[Params]:
        """The K integer gradients of the global minibatches ``X_bar^(k)_(I_t)`` (the decoding's target).

        ``wide``: as :class:`~fednet.algebra.wideint.WideInts` (``FieldPolyMLP.integer_gradient``).
        """
        if getattr(self, "_global", None) is None:        # the K global data sets [X_bar^(k)_1; ...; X_bar^(k)_N]
            self._global = [self.model.transform(x, y)   # element-wise: transformed once, rows selected per round
                            for x, y in zip(global_shards(self.task.X, self.shard_rows, self.config.K),
                                            global_shards(self.task.Y, self.shard_rows, self.config.K))]
        return [self.model.integer_gradient(self.params, x[self.rows_t], y[self.rows_t], transformed=True, wide=wide)
                for x, y in self._global]

    def host_gradient(self) -> Params:
        """Timing mode's stand-in for the decoded sum: the plain integer gradients summed over k, computed
        uncharged, as WideInts per parameter (:meth:`update` takes them without Python ints)."""
        with unmetered():
            gs = self.plain_gradients(wide=True)
        return {n: functools.reduce(operator.add, (g[n] for g in gs)) for n in self.params}

    def decode(self, results: list, alphas: list[int]) -> np.ndarray:
        """Server: interpolate the K global gradients (Alg. 1 line 9), psi (eq. 6), sum over k: ``(d_w,)`` ints."""
        cfg = self.config
        g = decode_gradients(results, alphas, self.betas, cfg.K, cfg.T, self.model.degree, cfg.p)
        return np.sum([flatten({n: psi(gk[n], cfg.p).astype(object) for n in self.params}) for gk in g], axis=0)

    def check_decoded(self, results: list, alphas: list[int]) -> None:
        """Full mode's observer: every decoded gradient equals the plain integer gradient, bit for bit."""
        cfg = self.config
        g = decode_gradients(results, alphas, self.betas, cfg.K, cfg.T, self.model.degree, cfg.p)
        for k, (dec, plain) in enumerate(zip(g, self.plain_gradients())):
            bad = [n for n in self.params if not np.array_equal(psi(dec[n], cfg.p).astype(object),
                                                                np.asarray(plain[n]).astype(object))]
            if bad:
                raise AssertionError(f"round {self.epoch}: decoded global gradient {k} differs from the plain "
                                     f"integer gradient in {bad}")

    def update(self, flat: np.ndarray | Params) -> Params:
        """Clip and update with the stochastic rounding Q (eq. 7), exact in ``Z_p``.

        ``flat``: the decoded sum, ``(d_w,)`` ints, or timing mode's :meth:`host_gradient` (Params).
        """
        g = flat if isinstance(flat, dict) else unflatten(np.asarray(flat, dtype=object), self.model.param_shapes())
        opt = FieldSGD(self.model, self.schedule, self.sim.rng(self.server, "dresfl-Q", self.epoch),
                       max_norm=self.config.max_norm)
        return opt.step(self.params, g, self.config.batch_size * self.config.K, self.epoch)

    def round(self, epoch: int) -> Generator:
        """Broadcast w; coded gradients; the first R uploads decoded; psi, clip, Q (Alg. 1)."""
        self.rows_t = self.round_rows(epoch)
        present = [dev for dev in self.devices if self.net.available(dev)]
        replies = yield from self.net.gather(self.devices, self.coded_gradient, kind="coded_gradient",
                                             first=self.R if len(present) >= self.R else None, download=self.params,
                                             download_elements=self.n_params, download_bits=self.wire_bits,
                                             upload_elements=self.n_params, upload_bits=self.wire_bits)
        if len(replies) < self.R:                                   # footnote 6: no update this round
            self.decode_failed = self.skipped = True
            self.used = []
            return
        alphas = [self.alphas[dev.index] for dev in replies.nodes]
        results = replies.values
        cfg = self.config
        zero = [{k: np.zeros(v.shape, object) for k, v in self.params.items()} for _ in range(self.R)]
        G = yield from self.net.server_compute(
                lambda: self.mode.run(self.decode, results, alphas,
                                      macs=lambda: self.decode(zero, self.alphas[:self.R]),
                                      key=("dresfl-decode", self.R, cfg.K, cfg.T, self.n_params),
                                      like=Shape((self.n_params,), object),
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


@dataclass(frozen=True)
class _Share:
    """The coded data ``(X~_{i->j}, Y~_{i->j})`` one client sends another (RnsArrays, or Shapes in timing mode)."""
    x: Any
    y: Any

    @property
    def size(self) -> int:
        """Field elements on the wire: ``(m_i / K)(d_x + d_y)``."""
        return int(np.prod(self.x.shape)) + int(np.prod(self.y.shape))
