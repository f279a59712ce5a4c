"""FedVS: straggler-resilient, private split vertical FL (Li, Yao, Liu, ICML 2023, Algorithm 1).

Set-up (Sec. 4.2, Alg. 1 lines 1-10; the math in :mod:`fednet.codes.fedvs`): every client raises its features
to the powers of its PN, quantises them (``phi(Round(2^{l_x} X_hat))``), splits the rows into K segments, adds T
uniform masks and sends the LCC share ``F_n(alpha_n')`` (eq. 2) to every other client, relayed through the server
(bundled), charged at its metered ``N (K+T) (M/K) d_n D_n`` MACs and ``bits(p)`` per element.  To keep memory at
O(batch), a batch's shares are materialised when it is used, from masks keyed by the block: the values the set-up
would have sent (:func:`fednet.codes.fedvs.batch_data_shares`; a detail of the simulator, not of the protocol).

Each round (Sec. 4.3, Alg. 1 lines 12-35):

1. every client quantises its PN with stochastic rounding (eq. 3), LCC-shares it (eq. 4), waits the
   model-sharing delay of Sec. 6.2 (mean ``(log2 N)^2 / |B|`` times its upload mean, ``|B|`` the coded batch),
   and the shares are exchanged all-to-all (bundled through the server: every client needs every model, so
   this phase waits for the slowest sharer);
2. every client evaluates its coded embedding (eq. 5) on the batch's ``|B| = batch_size / K`` coded rows,
   waits its upload delay and uploads; the server keeps the first ``2(K+T-1)+1`` (Thm. 5.1);
3. the server interpolates ``psi`` (eq. 6), reads ``psi(beta_1..beta_K)``, dequantises (eq. 7), and in
   full mode checks the result bit-exactly against the plain quantised sum ``sum_n X_bar_n W_bar_n``;
   it steps its top model and broadcasts ``dL/dH``; every client updates its PN (``dL/dH_n = dL/dH / N``).

With a ``deadline``, a round whose uploads fall short of the threshold is a decode failure: recorded in
the trace (``decode_failed``), no update.

Model-sharing delay (``sharing_wait``).  Sec. 6.2 adds "an exponential delay at each client" to the model
sharing phase, of mean ``(log2 N)^2 / |B|`` times "the corresponding delay's mean for embedding uploading"
(read as: that client's own upload mean, 0.1 s or ``2 + 4i/N``; :meth:`fednet.sim.delays.FedVSDelays.
sharing_mean`).  How it composes is not stated, so it is a parameter:

* ``"all"`` (default, Alg. 1 as written): the delay is part of the all-to-all share exchange; since eq. (5)
  needs the model share of *every* client (lines 18-19 and 23), every client waits for the slowest sharer
  before its coded embedding, stragglers included (a round costs about the largest of the N sharing delays);
* ``"own"``: the delay only adds to the client's own latency before its coded embedding (the shares are
  exchanged at network speed), as a simulation adding one more delay per client would compose it; the
  server's wait for the first ``2(K+T-1)+1`` then also skips the stragglers' sharing delays.

Modes (``mode``, :mod:`fednet.protocol.modes`).  ``"timing"`` charges the same metered MACs and message sizes but
skips the field math of the data shares (eq. 2), the model encoding (eq. 4), the coded embeddings (eq. 5) and the
interpolation (eq. 6), carrying the plain quantised sum ``sum_n X_bar_n W_bar_n``, which full mode proves equal to
the decoded one every round (:meth:`FedVS.check_exact`).  The rounding (eq. 3), the mask draws, which uploads
arrive first, eq. (7) and the SGD steps run in both modes: the same trace bit for bit except ``checked_rounds``
(the full-mode observer's count; ``tests/test_fedvs_protocol.py``).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from fednet.codes import fedvs as fv
from fednet.codes.fedvs import WeightsOutgrowField  # re-exported
from fednet.algebra.meter import unmetered
from fednet.protocol.base import NodeState, Protocol
from fednet.protocol.modes import Shape
from fednet.protocol.vertical import VerticalConfig, VerticalLearning

__all__ = ["FedVSConfig", "FedVS", "FedVSState"]

#: Default prime: the Mersenne prime 2^31 - 1.  With the defaults ``l_x = l_w = 8``, ``w_max = 16`` and pixels
#: in [0, 1] it carries FashionMNIST's sums over 28 clients x 28 features (bound 784 * 2^8 * 2^12 < 2^30);
#: a 31-bit prime keeps the exact limb kernels on their fast int64 path (a 61-bit prime is ~5x slower).
P31 = 2**31 - 1


class FedVSConfig(VerticalConfig):
    """FedVS parameters (Alg. 1 input and Sec. 4).

    Attributes
    ----------
    K : int
        Partition parameter (segments of the data).
    T : int
        Privacy parameter (colluding clients; 1 in Sec. 6.2).
    l_x, l_w : int
        Scaling bits of the data (Sec. 4.2) and of the model (eq. 3).
    w_max : float
        Bound on every PN weight the field is sized for; a model leaving it stops the run.
    p : int
        The prime (below 2**62); refused when too small for the embedding sums.
    deadline : float or None
        Seconds the server waits for coded embeddings before giving up on a round.
    sharing_scale : float
        Multiplies the model-sharing delay of Sec. 6.2 (1 = the paper with ``log2``; ``(ln 2)^2 = 0.480``
        reads the paper's ``log`` as natural; 0 removes it, a diagnostic).
    sharing_wait : {"all", "own"}
        Who waits for a client's model-sharing delay (module docstring): every client (``"all"``, Alg. 1:
        eq. 5 needs every client's share) or only the client itself (``"own"``).
    mode : {"full", "timing"}
        Run the field math (full) or charge its metered MACs only (timing; module docstring).
    aggregation : {"average"}
        Inherited from :class:`~fednet.protocol.vertical.VerticalConfig`; FedVS recovers only the sum of the
        embeddings (Sec. 3, "Embedding averaging"), so any other value is refused.
    """

    K: int = Field(1, ge=1)
    T: int = Field(1, ge=0)
    l_x: int = Field(8, ge=0)
    l_w: int = Field(8, ge=0)
    w_max: float = Field(16.0, gt=0)
    p: int = P31
    deadline: float | None = Field(None, ge=0)
    sharing_scale: float = Field(1.0, ge=0)
    sharing_wait: Literal["all", "own"] = "all"
    mode: Literal["full", "timing"] = "full"

    @field_validator("aggregation")
    @classmethod
    def _average_only(cls, v: str) -> str:
        """FedVS reconstructs the *sum* of the embeddings (Sec. 3, "Embedding averaging"; eq. 5): average only."""
        if v != "average":
            raise ValueError(f"FedVS decodes only the sum of the clients' embeddings (Sec. 3: 'the server only "
                             f"recovers the summation of the embeddings'), so aggregation must be 'average', got {v!r}")
        return v


@dataclass
class FedVSState(NodeState):
    """A client's secrets (from ``sim.secret_rng``, never the public seed).

    Attributes
    ----------
    data_key : int
        Key of its data masks (per batch block).
    model_rng : numpy.random.Generator
        Its stochastic rounding (eq. 3) and model masks (eq. 4).
    """

    data_key: int = 0
    model_rng: np.random.Generator | None = None


class FedVS(Protocol):
    """FedVS (Alg. 1) on the engine's primitives (module docstring)."""

    name = "fedvs"
    secrets_reach_model = True          # the stochastic rounding of the shares draws from the secret streams
    Config = FedVSConfig
    Learning = VerticalLearning
    State = FedVSState

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        c = self.config                       # refuse a field or resolution that does not fit the data (issue 33)
        fv.check_fits(c.p, c.l_x, c.l_w, self.learning.data.x_max, c.w_max, self.learning.data.sizes, self.model.D,
                      self.learning.data.x_train, self.model.W)

    @classmethod
    def check(cls, config: FedVSConfig, n_devices: int) -> None:
        """Refuse ``2(K+T-1)+1 > N`` (nothing to decode from) and a batch smaller than K."""
        need = fv.recovery_threshold(config.K, config.T)
        if need > n_devices:
            raise ValueError(f"K = {config.K}, T = {config.T} need 2(K+T-1)+1 = {need} clients, the network has "
                             f"{n_devices}")
        if config.batch_size < config.K:
            raise ValueError(f"batch_size = {config.batch_size} must be at least K = {config.K}")

    def setup(self) -> Generator:
        """Data preparation (Alg. 1, lines 1-10): LCC data shares, charged and sent all-to-all."""
        c, N, data = self.config, self.sim.n_devices, self.learning.data
        self.p = fv.check_modulus(c.p, c.l_x, c.l_w, data.x_max, c.w_max, data.sizes, self.model.D)
        self.bits = self.p.bit_length()
        self.alphas, self.betas = fv.default_points(c.K, c.T, N)
        self.need = fv.recovery_threshold(c.K, c.T)
        self.seg_rows = len(data.y_train) // c.K          # M / K (rows beyond K (M/K) are not used)
        self.coded_batch = max(1, c.batch_size // c.K)         # |B|
        self.checked_rounds = 0
        for dev in self.devices:
            dev.state.data_key = int(self.sim.secret_rng(dev, "fedvs_data_masks").integers(2**62))
            dev.state.model_rng = self.sim.secret_rng(dev, "fedvs_model_secrets")
        width = [d * D for d, D in zip(self.learning.data.sizes, self.model.D)]
        yield from self.net.compute_each(self.devices, None,       # eq. (2) at alpha_1..alpha_N, count of share_data
                                         macs=lambda dev: fv.share_macs(N, c.K, c.T, self.seg_rows * width[dev.index]))
        pairs = [[(s, d) for s in self.devices for d in self.devices if s is not d]]
        yield from self.net.exchange(pairs, lambda s, d: _Share(self.seg_rows * width[s.index]), kind="data_share",
                                     schedule="bundled", element_bits=self.bits)

    # -- the steps of one client / the server (the math: fednet.codes.fedvs) ------------------------------
    def data_shares(self, n: int, rows: np.ndarray) -> np.ndarray:
        """Client ``n``'s shares ``F_n(alpha_1..alpha_N)`` of the coded rows ``rows`` (eq. 2), (N, |B|, d_n D_n)."""
        with unmetered():                                                  # charged once in the set-up
            return fv.batch_data_shares(self._quantised_segments(n, rows), self.devices[n].state.data_key, rows,
                                        self.config.T, self.alphas, self.betas, self.p)

    def _quantised_segments(self, n: int, rows: np.ndarray) -> np.ndarray:
        """Client ``n``'s ``X_bar`` of the batch's rows in each segment, (K, |B|, d_n D_n) (uncharged)."""
        with unmetered():
            return fv.batch_segments(self.learning.data.x_train[n], rows, self.seg_rows, self.config.K, self.model.D[n],
                                     self.config.l_x, self.p)

    def share_model(self, dev) -> tuple[np.ndarray, Any]:
        """Quantise (eq. 3) and LCC-share (eq. 4) the client's PN: ``(W_bar_n, shares (N, d_n D_n, h))``.

        The rounding and the masks ``V`` are drawn in both modes (in this order, from the client's secret
        stream, as :func:`fednet.codes.fedvs.share_model` draws them); the encoding runs through the mode
        (timing mode: its ``N (K + T) d_n D_n h`` MACs and a stand-in of the shares' shape).
        """
        c, W = self.config, self.model.W[dev.index]
        if np.abs(W).max() > c.w_max:
            raise WeightsOutgrowField(f"client {dev.index}'s PN weights reach {np.abs(W).max():.3g} > w_max = {c.w_max}: "
                             "the field was sized for w_max; raise w_max (and p)")
        w_bar = fv.quantize_model(W, c.l_w, self.p, dev.state.model_rng)
        masks = fv.draw_masks(dev.state.model_rng, self.p, c.T, w_bar.shape)
        shares = self.mode.run(fv.model_shares, w_bar, masks, c.K, self.alphas, self.betas, self.p)
        return w_bar, shares

    def coded_embedding(self, dev) -> Any:
        """Client ``n'``'s ``H~_n' = sum_n X~_{n,n'} W~_{n,n'}`` (eq. 5) on the round's coded rows, (|B|, h).

        Charges ``|B| h sum_n d_n D_n`` MACs (timing mode: the count, a stand-in of the shape).
        """
        j, N = dev.index, self.sim.n_devices
        return self.mode.run(fv.coded_embedding, [self.round_data[n][j] for n in range(N)],
                             [self.model_shares[(n, j)] for n in range(N)], self.p)

    def decode(self, uploads: list) -> np.ndarray:
        """Interpolate psi (eq. 6) at beta_1..beta_K and dequantise (eq. 7): the mean embedding (K |B|, h).

        Timing mode charges the interpolation's ``K R b h`` MACs (``R = 2(K+T-1)+1``) and carries the plain
        quantised sum (:meth:`plain_sum`) as the decoded value.
        """
        c = self.config
        results = [v for _, v in uploads]
        alphas = [self.alphas[n.index] for n, _ in uploads]
        H_bar = self.mode.run(fv.decode_embedding_sum, results, alphas, self.betas, c.K, c.T, self.p,
                              stand_in=lambda: fv.to_field(self.plain_sum(self.rows), self.p))
        self.H_bar = self.mode.value(H_bar)
        return fv.dequantize(self.H_bar, c.l_x, c.l_w, self.sim.n_devices, self.p)

    def plain_sum(self, rows: np.ndarray) -> np.ndarray:
        """``sum_n X_bar_n W_bar_n`` of the round's K |B| rows as signed int64, (K |B|, h) (uncharged host work,
        :func:`fednet.codes.fedvs.plain_sum_int64`: exact, as the set-up's field check and ``w_max`` bound it)."""
        with unmetered():
            return fv.plain_sum_int64((self._quantised_segments(n, rows) for n in range(self.sim.n_devices)),
                                      self.w_bars, self.p)

    def check_exact(self, rows: np.ndarray) -> None:
        """Full mode's observer: the decoded sum equals ``sum_n X_bar_n W_bar_n`` bit-exactly.

        Raises
        ------
        AssertionError
            If they differ.
        """
        if not np.array_equal(fv.from_field(self.H_bar, self.p), self.plain_sum(rows)):
            raise AssertionError(f"round {self.epoch}: the decoded embedding sum differs from the plain quantised sum")
        self.checked_rounds += 1

    # -- Algorithm 1, lines 12-35 ---------------------------------------------------------------------
    def round(self, epoch: int) -> Generator:
        """Model sharing, coded embeddings, decoding of the first 2(K+T-1)+1, server and client updates."""
        c, N = self.config, self.sim.n_devices
        rows = self.rows = self.learning.batch_rows(epoch, self.coded_batch, self.seg_rows)   # B in [M/K]
        widths = [d * D for d, D in zip(self.learning.data.sizes, self.model.D)]
        self.round_data = [self.mode.offline(self.data_shares, n, rows,               # materialised set-up shares
                                             like=Shape((N, len(rows), widths[n]), np.dtype(np.int64)))
                           for n in range(N)]

        def _sharing_delay(dev) -> float:
            return c.sharing_scale * self.learning.delays.sharing_delay(dev.index, epoch, self.coded_batch)

        def _prepare(dev) -> Generator:                                               # eqs. (3)-(4)
            self.shared[dev.index] = yield from self.net.compute(dev, self.share_model, dev)
            if c.sharing_wait == "all":                                               # part of the exchange
                yield from self.net.delay(_sharing_delay(dev))

        self.shared = {}
        pairs = [[(s, d) for s in self.devices for d in self.devices if s is not d]]
        yield from self.net.exchange(pairs, lambda s, d: self.shared[s.index][1][d.index], kind="model_share",
                                     schedule="bundled", element_bits=self.bits, prepare=_prepare)
        self.w_bars = [self.shared[n][0] for n in range(N)]
        self.model_shares = {(n, j): self.shared[n][1][j] for n in range(N) for j in range(N)}
        def _upload(dev) -> Generator:                                                # eq. (5)
            if c.sharing_wait == "own":                                               # the client's own latency
                yield from self.net.delay(_sharing_delay(dev))
            return (yield from self.learning.delayed_upload(dev, self.coded_embedding, kind="coded_embedding",
                                                   key_round=epoch, element_bits=self.bits))

        work = [(dev, _upload(dev)) for dev in self.devices]
        got = yield from self.net.first_k(work, self.need, deadline=c.deadline)
        self.used = [n.index for n in got.nodes]
        if len(got) < self.need:                                                    # Thm. 5.1 not met
            self.decode_failed = True
            self.decode_error = str(fv.FedVSDecodeFailure(len(got), self.need, c.K, c.T))
            return
        H = yield from self.net.server_compute(self.decode, got.results)                # eqs. (6)-(7)
        self.mode.observe(self.check_exact, rows)
        samples = np.concatenate([k * self.seg_rows + rows for k in range(c.K)])
        g_H = yield from self.net.server_compute(self.model.server_step, H, samples)
        yield from self.net.broadcast(g_H.astype(np.float32), kind="embedding_gradient", element_bits=self.element_bits)
        yield from self.net.compute_each(self.devices, lambda dev: self.model.client_step(dev.index, samples, g_H))

    def round_metrics(self, round: int) -> dict[str, Any]:
        """``checked_rounds``: rounds whose decoded sum was verified bit-exact so far."""
        return {"checked_rounds": getattr(self, "checked_rounds", 0)}


@dataclass(frozen=True)
class _Share:
    """Stand-in for a data share on the wire (its element count); the values are materialised per batch."""

    size: int
