"""SecAgg and SecAgg+: pairwise-mask secure aggregation on conventional minibatch FL.

Sources: Bonawitz, Ivanov, Kreuter, Marcedone, McMahan, Patel, Ramage, Segal, Seth, "Practical Secure
Aggregation for Privacy-Preserving Machine Learning", CCS 2017, Sec. 4, Fig. 4 (the honest-but-curious
protocol; :class:`SecAgg`); Bell, Bonawitz, Gascon, Lepoint, Raykova, "Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead", CCS 2020 (:class:`SecAggPlus`: the same rounds on a random k-regular
communication graph, ``k = O(log N)`` neighbours instead of ``N - 1``).  The math, each round's messages, the
default parameters, the closed-form crypto and MAC counts, the decode failures and what each party sees are in
:mod:`fednet.codes.pairwise_masks`; the real cryptography in :mod:`fednet.algebra.crypto`, its cost in
:mod:`fednet.algebra.crypto_meter` (the per-round counts are trace columns ``device_<kind>``, ``server_<kind>``).

Each epoch is one aggregation with fresh keys, seeds and shares: AdvertiseKeys, ShareKeys, MaskedInputCollection,
Unmasking, then conventional FL's update (eqs. 4-5) with ``m`` = the points of ``U3``.  Users drop before round
0 by the availability model, before rounds 1-3 by :meth:`SecAgg.stage_dropouts`.  ``full`` mode executes the
real cryptography; ``timing`` charges the same closed forms (checked against the kernels in every full-mode step)
and carries the survivors' quantised gradients computed on the host: the same trace.  Keys, seeds and Shamir
coefficients come from the secret stream; the graph and the dropouts are public; the model download, training
and masked upload take conventional FL's keyed draws (a paired comparison), the other steps ``timing_key="secagg"``.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from fednet.algebra.crypto import TAG_BYTES
from fednet.algebra.crypto_meter import CryptoTally, run_crypto
from fednet.codes import pairwise_masks as pm
from fednet.codes.pairwise_masks import P32, masked_gradient as secagg_masked_gradient  # noqa: F401 (re-exported)
from fednet.errors import ConfigError
from fednet.protocol.base import NodeState, Protocol, ProtocolConfig
from fednet.protocol.modes import Shape
from fednet.protocol.primitives import Outgoing
from fednet.sim.simulation import Node

__all__ = ["SecAggConfig", "SecAggPlusConfig", "SecAggState", "SecAgg", "SecAggPlus", "secagg_masked_gradient",
           "P32"]


class SecAggConfig(ProtocolConfig):
    """Parameters of SecAgg (module docstring).

    Attributes
    ----------
    element_bits : int
        Wire width of the float32 model (32); field elements travel at ``ceil(log2 p)`` bits, keys at 256,
        ciphertexts at 8 bits a byte.
    p, quant_bits : int
        The prime field of the masked sum and of the shares (``p > max(256, N)``); the fractional bits ``b`` of
        the quantisation ``round(G 2**b)``.
    t : int, optional
        Shamir threshold, ``1 <= t <=`` the number of a user's neighbours; default ``floor(n / 2) + 1``.
    minibatch_fraction, stage_dropout : float
        Fraction of each device's points per round (0.2, as conventional FL); probability that a user alive at the
        start of round 1, 2 or 3 drops before it (public keyed draws).
    mode : {"full", "timing"}
    """

    element_bits: int = Field(32, ge=1, le=4096)
    p: int = P32
    quant_bits: int = Field(16, ge=0, le=40)
    t: int | None = Field(None, ge=1)
    minibatch_fraction: float = Field(0.2, gt=0.0, le=1.0)
    stage_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    mode: Literal["full", "timing"] = "full"

    @model_validator(mode="after")
    def _prime(self) -> "SecAggConfig":
        pm.check_mask_prime(self.p)
        return self


class SecAggPlusConfig(SecAggConfig):
    """Parameters of SecAgg+: those of :class:`SecAggConfig` and ``k``, the degree of the Harary communication graph
    ``H_{k,N}`` (``1 <= k <= N - 1``; default ``min(N - 1, 2 ceil(log2 N))``)."""

    k: int | None = Field(None, ge=1)


@dataclass
class SecAggState(NodeState):
    """A user's private state for the current epoch.

    Attributes
    ----------
    batch : int
        Its minibatch size ``b_i``.
    keys, b_seed : tuple of bytes, bytes
        ``(c^SK, c^PK, s^SK, s^PK)`` and its self-mask seed ``b_u`` (None in timing mode).
    ckeys, sent, inbox : dict
        Per neighbour: ``c_uv`` (round 1, reused to decrypt in round 3), its ciphertext ``e_uv``, the ``e_vu``
        it received.
    """

    batch: int = 0
    keys: Any = None
    b_seed: Any = None
    ckeys: dict = field(default_factory=dict)
    sent: dict = field(default_factory=dict)
    inbox: dict = field(default_factory=dict)


class SecAgg(Protocol):
    """SecAgg (Bonawitz et al., CCS 2017, Fig. 4) on conventional minibatch FL; module docstring."""

    name = "secagg"
    Config = SecAggConfig
    State = SecAggState
    setup_dropouts = "none"                                   # keys are fresh each epoch: absentees recorded only

    @classmethod
    def degree(cls, config: SecAggConfig, n_devices: int) -> int:
        """Number of a user's neighbours (share holders): ``N - 1``."""
        return n_devices - 1

    @classmethod
    def threshold(cls, config: SecAggConfig, n_devices: int) -> int:
        """The Shamir threshold ``t`` (configured, or ``floor(n / 2) + 1`` of the ``n`` neighbours)."""
        return config.t if config.t is not None else pm.default_threshold(cls.degree(config, n_devices))

    @classmethod
    def check(cls, config: SecAggConfig, n_devices: int) -> None:
        """Refuse ``N < 2``, ``t`` outside ``[1, n]`` and a field that cannot hold the sum
        (:func:`fednet.codes.pairwise_masks.check_parameters`: ``ConfigError``, ``CapacityError``)."""
        if n_devices < 2:                                           # before the degree, which needs N >= 2
            raise ConfigError(f"{cls.__name__} needs at least 2 users, got {n_devices}")
        pm.check_parameters(cls.__name__, n_devices, cls.degree(config, n_devices), cls.threshold(config, n_devices),
                            config.p, config.quant_bits)

    def neighbours(self, epoch: int) -> dict[int, list[int]]:
        """``N(u)`` for each user (ascending): every other user."""
        return pm.complete_neighbours(self.sim.n_devices)

    def stage_dropouts(self, epoch: int, stage: int, users: list[int]) -> set[int]:
        """The users of ``users`` (alive at the start of round ``stage`` = 1, 2, 3) that drop before it: each with
        probability ``stage_dropout``, from the public keyed draw ``(user, "secagg-dropout", epoch, stage)``
        (nothing is drawn when it is 0).  Tests override this to drop chosen users."""
        q = self.config.stage_dropout
        return {u for u in users if self.sim.rng(u, "secagg-dropout", epoch, stage).random() < q} if q else set()

    def setup(self) -> Generator:
        """No set-up phase: each device's minibatch size, the run's threshold ``t``, the per-round crypto record."""
        for dev in self.devices:
            dev.state.batch = max(1, int(round(self.config.minibatch_fraction * self.task.X[dev.index].shape[0])))
        self.t, self._tally = self.threshold(self.config, self.sim.n_devices), CryptoTally()
        return
        yield  # pragma: no cover

    def round_metrics(self, round: int) -> dict[str, Any]:
        """The round's cryptographic operations: ``device_<kind>`` and ``server_<kind>`` for each kind."""
        tally = getattr(self, "_tally", None) if round > 0 else None
        return (tally if tally is not None else CryptoTally()).columns()

    def _drop(self, users: list[int], epoch: int, stage: int) -> list[int] | None:
        """The users left after round ``stage``'s dropouts; None (a decode failure) when fewer than ``t``."""
        gone = self.stage_dropouts(epoch, stage, users)
        self.round_dropped.update(gone)
        left = [u for u in users if u not in gone]
        return left if len(left) >= self.t else None

    def _fail(self) -> None:
        self.decode_failed, self.used = True, []

    # -- the round --------------------------------------------------------------------------------
    def round(self, epoch: int) -> Generator:
        """One aggregation: rounds 0-3 of Bonawitz et al. (Fig. 4), then the update (eqs. 4-5)."""
        self._tally = CryptoTally()
        t, p, dev, nbrs = self.t, self.config.p, self.devices, self.neighbours(epoch)
        m, K, ebits = self.task.d * self.task.c, pm.secret_elements(p), pm.field_bits(p)

        # round 0: AdvertiseKeys
        adv = yield from self.net.gather(dev, self._advertise, kind="secagg_advertise", upload_elements=2,
                                         upload_bits=256, timing_key="secagg")
        self._pks = {d.index: keys for d, keys in adv.results}
        U1 = sorted(self._pks)
        nb1 = pm.restrict(nbrs, U1)
        if len(U1) < t or any(len(nb1[u]) < t for u in U1):
            return self._fail()
        yield from self.net.send_all([[Outgoing(self.server, dev[u], pm.public_keys(self._pks, nb1[u]), "secagg_keys",
                                                n_elements=2 * len(nb1[u]), element_bits=256, timing_key="secagg")
                                       for u in U1]])

        # round 1: ShareKeys (shares encrypted to each neighbour, relayed by the server)
        if (U2 := self._drop(U1, epoch, 1)) is None:
            return self._fail()
        delivered = yield from self.net.exchange(
            [[(dev[u], dev[v]) for u in U2 for v in nb1[u]]], lambda s, d: s.state.sent.get(d.index),
            kind="secagg_shares", schedule="bundled", n_elements=pm.share_plain_bytes(p) + TAG_BYTES, element_bits=8,
            prepare=lambda d: self.net.compute(d, self._share_keys, d, nb1[d.index], timing_key="secagg"),
            timing_key="secagg")
        for (s, d), ct in delivered.items():
            dev[d].state.inbox[s] = ct
        self._nb2 = nb2 = pm.restrict(nbrs, U2)

        # round 2: MaskedInputCollection (the model down, training, the masked gradient up: conventional FL's draws)
        if (alive := self._drop(U2, epoch, 2)) is None:
            return self._fail()
        self._rows = self.minibatch_rows_many(dev, [d.state.batch for d in dev], epoch)  # at once, as conventional FL
        ups = yield from self.net.gather([dev[u] for u in alive], self._masked_gradient, kind="masked_input",
                                         download=self.theta.astype(np.float32), upload_elements=m,
                                         download_bits=self.element_bits,
                                         upload_bits=ebits)
        masked = {d.index: y for d, y in ups.results}
        U3 = sorted(masked)
        if len(U3) < t:
            return self._fail()

        # round 3: Unmasking
        if (U3_alive := self._drop(U3, epoch, 3)) is None:
            return self._fail()
        resp = yield from self.net.gather(
            [dev[u] for u in U3_alive], lambda d: self._unmask_response(d, U3), kind="secagg_unmask",
            download=np.asarray(U3, dtype=np.int64), download_kind="secagg_survivors", download_elements=len(U3),
            download_bits=32, upload_elements=lambda r: len(r[0]) * K, upload_bits=ebits, timing_key="secagg")
        responses = {d.index: r for d, r in resp.results}
        holders = pm.share_holders(responses, U2, nb2)
        if any(len(holders[v]) < t for v in U2):
            return self._fail()
        G = yield from self.net.server_compute(self._unmask, masked, responses, holders, U2, U3)
        self.used = U3
        self.mode.update(self, G, sum(self.task.X[i].shape[0] for i in U3))          # eqs. (4)-(5)

    # -- the steps (through the mode) --------------------------------------------------------------
    def _advertise(self, d: Node) -> Any:
        """Round 0 of ``d``: two key pairs and its self-mask seed from secret bytes; uploads ``(c^PK, s^PK)``."""
        rng = self.mode.offline(self.sim.secret_rng, d, "secagg-keys", self.epoch)
        c, s, d.state.b_seed = self.mode.offline(lambda: (rng.bytes(32), rng.bytes(32), rng.bytes(32))) or (None,) * 3
        keys = d.state.keys = run_crypto(self.mode, pm.advertise, c, s, crypto=pm.advertise_counts(),
                                         tally=self._tally.adder("device"))
        d.state.ckeys, d.state.sent, d.state.inbox = {}, {}, {}
        return None if keys is None else (keys[1], keys[3])

    def _share_keys(self, d: Node, nb: list[int]) -> None:
        """Round 1 of ``d``: Shamir shares of ``b_u || s_u^SK`` among ``nb``, encrypted to each."""
        p, t, (c_sk, _, s_sk, _) = self.config.p, self.t, d.state.keys or (None,) * 4     # None: timing mode
        rng = self.mode.offline(self.sim.secret_rng, d, "secagg-shamir", self.epoch)
        out = run_crypto(self.mode, pm.share_keys, d.index, d.state.b_seed, s_sk, c_sk, nb,
                         pm.public_keys(self._pks, nb, 0), t, p, rng, self.epoch,
                         crypto=pm.share_keys_counts(len(nb), p), macs=pm.share_keys_macs(len(nb), t, p),
                         tally=self._tally.adder("device"))
        if out is not None:
            d.state.sent, d.state.ckeys = out

    def _masked_gradient(self, d: Node) -> Any:
        """Round 2 of ``d``: ``y_u`` (``2 b_i d c + d c (n + 1)`` MACs, ``n`` KA, ``n + 1`` PRG expansions)."""
        cfg, u, m, s_sk = self.config, d.index, self.task.d * self.task.c, (d.state.keys or (None,) * 4)[2]
        rows, peers = self._rows[u], self._nb2[u]
        return run_crypto(self.mode, pm.masked_gradient, self.task.X[u], self.task.Y[u], d.state.received, rows,
                          cfg.quant_bits, cfg.p, self.sim.n_devices, u, d.state.b_seed, s_sk, peers,
                          pm.public_keys(self._pks, peers, 1), crypto=pm.masked_input_counts(len(peers), m),
                          macs=pm.masked_gradient_macs(len(rows), m, len(peers)), like=Shape((m,), np.int64),
                          stand_in=lambda: u, tally=self._tally.adder("device"))

    def _unmask_response(self, d: Node, U3: list[int]) -> Any:
        """Round 3 of ``d``: its shares of ``b_v`` (``v ∈ U3``) or ``s_v^SK`` (others) for its senders ``v``."""
        p, u, senders = self.config.p, d.index, list(self._nb2[d.index])
        return run_crypto(self.mode, pm.unmask_response, u, d.state.inbox, d.state.ckeys, set(U3), p, self.epoch,
                          crypto=pm.unmask_response_counts(len(senders), p),
                          like=(senders, Shape((len(senders), pm.secret_elements(p)), np.int64)),
                          tally=self._tally.adder("device"))

    def _unmask(self, masked: dict, responses: dict, holders: dict, U2: list[int], U3: list[int]) -> Any:
        """The server: rebuild the seeds, remove the masks, dequantise ``(d, c)`` (timing: the host's plain sum)."""
        cfg, t, m, shape = self.config, self.t, self.task.d * self.task.c, (self.task.d, self.task.c)
        P = pm.expected_pairs(U2, U3, self._nb2)
        return run_crypto(self.mode, pm.unmask_gradients, masked, responses, holders, self._nb2,
                          pm.public_keys(self._pks, U3, 1), t, cfg.p, cfg.quant_bits, shape,
                          crypto=pm.unmask_counts(m, len(U3), P), macs=pm.unmask_macs(m, len(U3), len(U2), P, t, cfg.p),
                          like=Shape(shape, np.float64), tally=self._tally.adder("server"),
                          stand_in=lambda: pm.quantised_gradient_sum(self.task.X, self.task.Y, self.theta, self._rows,
                                                                     U3, cfg.quant_bits, cfg.p, self.sim.n_devices))


class SecAggPlus(SecAgg):
    """SecAgg+ (Bell et al., CCS 2020): SecAgg on a random k-regular Harary communication graph; module docstring."""

    name = "secaggplus"
    Config = SecAggPlusConfig

    @classmethod
    def degree(cls, config: SecAggPlusConfig, n_devices: int) -> int:
        """``k``: configured (at most ``N - 1``) or ``min(N - 1, 2 ceil(log2 N))``
        (:func:`fednet.codes.pairwise_masks.harary_degree`)."""
        return pm.harary_degree(config.k, n_devices)

    def neighbours(self, epoch: int) -> dict[int, list[int]]:
        """``N(u)`` in ``H_{k,N}`` relabelled by a public random permutation drawn each epoch (ascending)."""
        N = self.sim.n_devices
        perm = self.sim.rng(self.server, "secaggplus-graph", epoch).permutation(N)
        return pm.harary_neighbours(self.degree(self.config, N), N, perm)
