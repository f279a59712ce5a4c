"""The engine: steps, their reference semantics, the backends that stand for them, and which one ran.

A protocol writes its round with the primitives of ``self.net`` (:class:`fednet.protocol.primitives.Net`); each
primitive describes a **step** (:class:`~fednet.sim.engine.step.Step`: kind, nodes, sizes, timing key, first-k,
deadline, kernels) and the engine executes it:

* **Step kinds**: ``gather`` (download, compute, upload on each node; first ``k``), ``groups`` (gathers of disjoint
  groups, each followed by its server step), ``tree`` (partial sums up a tree), ``exchange`` (device-to-device shares
  through the server on a schedule), ``masked`` (a masked secure sum: LightSecAgg's round), ``buffered``
  (asynchronous clients living across rounds and the server's buffer: FedBuff).  ``send``,
  ``broadcast``, ``compute`` and ``first_k`` are plain SimPy and have no backend.
* **Reference semantics** (:mod:`.reference`): plain SimPy processes, a process per node or message.  They define
  what a step does; ``FEDNET_ENGINE=reference`` runs everything on them.
* **Backends** (:mod:`.backends`, one module per kind): replays that give the reference's simulated times, keyed
  draws, counters, messages, views and results bit for bit, with array arithmetic instead of processes.  Each has
  ``can_run(net, step) -> True | reason`` -- derived from the engine's own state (nothing else scheduled, links
  and processors idle, nothing overridden), never promised by the caller; what cannot be known up front (another
  process using an ``exclusive`` exchange's links) is checked after the fact and raises
  :class:`~fednet.sim.engine.results.EngineError` -- and ``run(net, step)``.  The first allowed backend that can run a
  step runs it (:func:`~fednet.sim.engine.step.execute`, networkx's dispatch model), else the reference does.
* **Configuration** (:class:`EngineConfig`, ``Simulation(engine=...)``, default from ``$FEDNET_ENGINE``): which
  backends are allowed; no module globals.
* **Paths** (:class:`EnginePaths`, ``sim.engine_paths``): per step, which backend ran it or why the reference did;
  in every study's ``timing.json`` and printed by ``fednet run --explain-engine``.
* **Checks**: ``tests/test_engine_property.py`` draws random networks, dropouts and step sequences and asserts the
  reference and the backends agree; :func:`fednet.testing.check_engine` does the same for a user's protocol.

Only :mod:`.config` and :mod:`.paths` are imported here (the simulation needs them); import the rest by module.
"""

from .config import BACKENDS, ENV_VAR, EngineConfig
from .paths import REFERENCE, EnginePaths

__all__ = ["BACKENDS", "ENV_VAR", "EngineConfig", "EnginePaths", "REFERENCE"]
