"""FedBuff: buffered asynchronous aggregation (Nguyen et al., "Federated learning with buffered asynchronous
aggregation", AISTATS 2022, Algorithm 1), on the ridge task of the seed papers.

Source: Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek, Huba, Sec. 3 and Algorithm 1 (FedBuff): clients train on
the model version they last downloaded and upload when done; the server adds each arriving update, weighted by
its staleness, to a buffer and, once ``K`` updates are in, takes a server step and starts a new model version;
at most ``concurrency`` clients train at once. Staleness weight ``s(tau) = 1 / sqrt(1 + tau)`` (the paper's
choice, Sec. 5) or none.

fednet's reading (the choices the paper leaves open, stated):

* A client's update is its minibatch gradient of eq. (3) of Schlegel et al. (one local step on ``b_i =
  round(minibatch_fraction n_i)`` of its points, the rows keyed by its own iteration count), and the server step is
  eqs. (4)-(5) on ``server_lr * sum_k s(tau_k) G_k`` over the ``m`` points behind the buffer: with ``K = D``, no
  staleness weight and ``server_lr = 1`` the run *is* conventional FL, bit for bit (``tests/test_fedbuff.py``).
* A client trains at most once per model version: having uploaded, it waits for the next version (else a fast
  client would flood the buffer with updates of one version). The ``concurrency`` slots are handed out first come,
  first served (the paper samples idle clients at random; here the first to ask gets the slot, deterministic).
* A client the availability model marks absent when it would start skips that version.

A round is one server step (one new model version): its trace row has ``version`` and the staleness of the ``K``
updates it used (``staleness``: in arrival order; ``max_staleness``); ``used`` names their devices.

What each party sees: the server sees every update in the clear (``fedbuff`` is the clear-text protocol of issue 29).

Host cost: the clients live across rounds, one SimPy process each in the reference semantics; the engine's
``buffered`` backend (:mod:`fednet.sim.engine.backends.buffered`) replays them as arrays with the same trace bit for
bit, and says why where it cannot (a concurrency limit below D, dropouts, views, an energy model, shared cells;
``fednet run --explain-engine``).
"""

from __future__ import annotations

from fednet.protocol.buffered import (BufferedAsync, FedBuffConfig, FedBuffState, buffered_sum,  # noqa: F401
                                      staleness_weight)

__all__ = ["FedBuffConfig", "FedBuffState", "FedBuff", "staleness_weight", "buffered_sum"]


class FedBuff(BufferedAsync):
    """FedBuff, buffered asynchronous aggregation in the clear (module docstring)."""

    name = "fedbuff"
