"""fednet.protocol — the ``Protocol`` base class, its primitives, modes, trace, and the registry by name.

Writing a protocol
------------------
One module, one class: a pydantic ``Config`` (unknown keys rejected), a per-node ``State`` dataclass
(subclass of :class:`NodeState`; ``node.state`` is a fresh one per device), ``setup()`` (round 0)
and ``round(epoch)``, both generators that read like the paper's algorithm box. A protocol subclasses
:class:`Protocol` only; what it trains is a component it is configured with, ``Learning``
(:mod:`fednet.protocol.learning`): :class:`RidgeLearning`, the seed papers' ridge model (default;
``self.theta``), ``fednet.protocol.neural.NeuralLearning``, the MLP baselines (``self.params``; ``Config``
deriving from ``NeuralConfig``), or ``fednet.protocol.vertical.VerticalLearning``, FedVS's split model
(``Config`` deriving from ``VerticalConfig``); it is ``self.learning``, as the primitives are ``self.net``::

    @dataclass
    class MyState(NodeState):
        batch: int = 0

    class MyFL(Protocol):
        name = "myfl"                         # registry key
        Config = MyConfig
        State = MyState

        def round(self, epoch):
            replies = yield from self.net.gather(self.devices, self.local_gradient, kind="gradient",
                                                 first=self.sim.n_devices - 2, download=self.theta,
                                                 download_bits=32, upload_bits=32)   # float32 on the wire
            G = yield from self.net.server_compute(sum_gradients, replies.values)      # eq. (3)
            self.used = [dev.index for dev in replies.nodes]
            self.mode.update(self, G, sum(self.task.X[i].shape[0] for i in self.used))

How MACs are charged.  Simulated compute time is ``MACs / MAC rate`` (plus the compute model's
random part) for the MACs that the *metered kernels* of :mod:`fednet.algebra.meter`
(``matmul``, ``axpy``, :mod:`fednet.algebra.modp`, :mod:`fednet.algebra.fixed_point`, the codes) charge
while the step's function runs on the node (``compute``, ``compute_each``, ``gather``,
``tree_aggregate``, ``server_compute``).  Plain numpy is not metered: a step that runs but charges
zero MACs raises :class:`UnchargedCompute` naming it; pass ``free=True`` for a step that is free
on purpose (bookkeeping).  Work done outside those primitives (offline set-up the paper does not
time, the observer's accuracy) is not charged.

One code path, two modes.  Put the math of a step in a pure function (``fednet.codes`` /
``fednet.algebra``) that declares its costs once, where it is defined, and call it through
``self.mode.run(kernel, *args)``, with no cost keywords::

    from fednet.algebra.meter import kernel, matmul
    from fednet.algebra.shape import Shape

    @kernel(macs=lambda X, W: X.shape[0] * X.shape[1] * W.shape[1],          # the closed form (paper, eq. N)
            out=lambda X, W: Shape((X.shape[0], W.shape[1]), np.float64))    # timing mode's stand-in
    def embed(X, W):
        return matmul(X, W)

    H = self.mode.run(embed, X, W)

In ``full`` mode the kernel runs under a MAC meter and the declared count (and output shapes) must
equal what it meters, on every call, else :class:`~fednet.algebra.meter.DeclaredCostError` names the
kernel, the protocol step and both counts; in ``timing`` mode the declared count is charged and the
declared :class:`Shape` stand-ins returned, without running the kernel.  The value a timing-mode run
follows (the host's plain computation) is a separate hook -- ``value=`` on the declaration, or
``stand_in=`` on the call -- that runs under :func:`~fednet.algebra.meter.unmetered`, so it is never
billed.  An undeclared function still works: timing mode measures it on zero operands once per shape
signature (or by a ``macs=`` closed form or measuring closure, which full mode checks every call).
Offline host work goes through ``self.mode.offline``, observer checks through ``self.mode.observe``, the
update through ``self.mode.update``.  A protocol whose decoded update equals the plain full-batch
gradient sets ``exact_trajectory = True`` and timing mode follows the task's cached trajectory.

Failures are results.  ``gather``/``first_k``/``tree_aggregate`` return a :class:`GatherResult`
(``results`` in arrival order, ``dropped``, ``cancelled``, ``missed_deadline``, ``pending``); the
round's unavailable devices reach the trace's ``dropped`` column.  ``self.net.available(node)`` asks
the engine, which draws each device's availability once per round (and once per setup attempt).

Setup-phase dropouts.  A protocol declares its reaction to devices absent in the setup phase in
``setup_dropouts`` (``"none"``, ``"offline"``, ``"reshare"`` -- the default -- or ``"fail"``;
:mod:`fednet.protocol.base`); a setup that cannot complete raises :class:`SetupFailure`.

Paired draws.  A protocol's steps of the same kind as another protocol's (the model download, the
training step, the gradient upload) use the shared keyed draws; a step only it has (mask
encoding, mask messages) names its own ``timing_key``, and minibatches come from
``self.minibatch_rows`` (keyed by device and round), so two protocols at one seed are compared on
the same stragglers and minibatches.  Secrets (pads, masks, Shamir coefficients) come from
``self.sim.secret_rng(...)``, never from the public ``self.sim.rng(...)``.
"""

from .base import (NodeState, Outgoing, Protocol, ProtocolConfig, ServerState, SetupFailure, StragglerShortfall,
                   payload_size)
from .learning import Learning, RidgeLearning
from .modes import Full, Mode, Shape, Timing, make_mode
from .primitives import GatherResult, Mailbox, UnchargedCompute, cyclic_steps
from .registry import get, names, register
from .trace import COLUMNS, TraceRow

__all__ = ["Outgoing", "Protocol", "ProtocolConfig", "Learning", "RidgeLearning", "NodeState", "ServerState",
           "SetupFailure", "StragglerShortfall", "UnchargedCompute", "GatherResult", "Mailbox", "cyclic_steps",
           "payload_size", "Mode", "Full", "Timing", "Shape", "make_mode", "TraceRow", "COLUMNS", "get", "names",
           "register"]
