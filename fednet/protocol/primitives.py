"""The primitives a protocol's round is written with: ``yield from self.net.<primitive>(...)``.

:class:`Net` is the protocol's one handle on the engine (``Protocol.net``, composition: no protocol method can shadow an
engine method).  Each primitive checks its arguments, describes its step (:class:`~fednet.sim.engine.step.Step`) and
asks the engine to execute it: the reference semantics (:mod:`fednet.sim.engine.reference`, plain SimPy processes) or a
backend that gives the same results bit for bit (:mod:`fednet.sim.engine.backends`), chosen by the simulation's
:class:`~fednet.sim.engine.config.EngineConfig` and recorded in ``sim.engine_paths``.

Messages: :meth:`~Net.send`, :meth:`~Net.broadcast`, :meth:`~Net.send_all`; computation: :meth:`~Net.compute`,
:meth:`~Net.compute_each`, :meth:`~Net.server_compute`; steps over many nodes: :meth:`~Net.first_k`,
:meth:`~Net.gather`, :meth:`~Net.gather_groups`, :meth:`~Net.exchange` (with its sharing schedules),
:meth:`~Net.tree_aggregate`, :meth:`~Net.masked_sum`; and :meth:`~Net.mailbox`, :meth:`~Net.delay`,
:meth:`~Net.queue`, :meth:`~Net.background`, :meth:`~Net.cancel`.  A step function may declare its batched form
(:func:`batched`), which the engine's backends pick.

``first_k``, ``gather`` and ``tree_aggregate`` return a :class:`GatherResult`: the results in order of arrival
*and* the failures (who was unavailable, who was cancelled, who missed the deadline). Failures are never silent: the
run loop writes the round's unavailable devices to the trace's ``dropped`` column.

Paired draws: every primitive takes a ``timing_key``.  The default (``""``) draws a message's losses from the
shared keyed streams ``(device, "uplink" / "downlink", round)`` and a computation's random delay from ``(node,
"compute", round)``; a step that only some protocols have (LightSecAgg's mask encoding and mask messages, say) names
its own key, so that the steps every protocol shares (the model download, the training step, the gradient upload)
take the same draws in each of them (:class:`fednet.sim.network.Message`, :meth:`fednet.sim.Simulation.compute`).

Charged compute is never silently free: a computation run by ``compute_each``, ``server_compute``, ``gather`` or
``tree_aggregate`` that executes but meters zero MACs raises :class:`UnchargedCompute` naming the step, unless the
call says ``free=True``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, Literal

import networkx as nx
import simpy

from fednet.algebra.meter import DeclaredCostError, MacMeter
from fednet.sim.compute import compute_seconds
from fednet.sim.engine import reference, wire
from fednet.sim.engine.backends import BY_KIND
from fednet.sim.engine.forest import forest_parts, taking_part
from fednet.sim.engine.mailbox import AllToAll, CyclicSteps, Mailbox, cyclic_steps, prepend, received_by
from fednet.sim.engine.results import (SCHEDULES, Batch, GatherResult, Outgoing, StragglerShortfall, UnchargedCompute,
                                       alike_batches, batch_of, batched, compute_key, payload_size,
                                       uploaded_elements)
from fednet.sim.engine.step import Step, execute
from fednet.sim.network import Message
from fednet.sim.simulation import Node, Simulation

__all__ = ["Net", "GatherResult", "Outgoing", "Mailbox", "StragglerShortfall", "UnchargedCompute",
           "payload_size", "SCHEDULES", "cyclic_steps", "CyclicSteps", "AllToAll", "received_by", "prepend",
           "compute_key", "compute_seconds", "Batch", "batched"]


class Net:
    """A protocol's primitives (module docstring): ``protocol.net``.

    Parameters
    ----------
    protocol : Protocol
        The protocol it serves (its ``sim``, ``label``, ``epoch``, ``element_bits`` and ``round_dropped``).
    """

    def __init__(self, protocol: Any) -> None:
        self.protocol = protocol
        self._tree_parts_of: dict = {}

    @property
    def sim(self) -> Simulation:
        """The protocol's simulation."""
        return self.protocol.sim

    @property
    def label(self) -> str:
        """The run's label (errors name it)."""
        return self.protocol.label

    @property
    def epoch(self) -> int:
        """The protocol's current round."""
        return self.protocol.epoch

    def overridden(self) -> list[str]:
        """The methods every backend replays that a subclass of :class:`Net` overrides (then the reference runs)."""
        return [f"Net.{name}" for name in ("send", "_message") if getattr(type(self), name) is not getattr(Net, name)]

    def _execute(self, step: Step) -> Generator:
        """Run ``step`` on a backend or the reference (:func:`fednet.sim.engine.step.execute`)."""
        return execute(self, step, BY_KIND.get(step.kind, []), getattr(reference, step.kind))

    def mailbox(self) -> Mailbox:
        """A new :class:`Mailbox` on this simulation (lazily materialised where the ``mailbox`` backend is allowed)."""
        lazy = self.sim.engine.allows("mailbox")
        if self.sim.engine.record_paths:
            self.sim.engine_paths.record("mailbox", "mailbox", "mailbox" if lazy else "reference",
                                         () if lazy else ["mailbox: not allowed by the engine configuration"])
        return Mailbox(self.sim.env, lazy=lazy)

    def available(self, node: Node) -> bool:
        """Whether ``node`` takes part in the current round (availability model).

        A shorthand for :meth:`fednet.sim.Simulation.available`, which draws each device's
        availability once per round and answers every later question from that draw, so every
        primitive, protocol and the setup-phase reaction see the same set of present devices.
        """
        return self.sim.available(node)

    def _note_failures(self, result: GatherResult) -> None:
        """Add the unavailable nodes of a step to this round's ``dropped`` set."""
        dropped = getattr(self.protocol, "round_dropped", None)
        if dropped is not None:
            dropped.update(n.index for n in result.dropped)

    def _charged(self, fn: Callable[..., Any], step: str, free: bool) -> Callable[..., Any]:
        """``fn`` wrapped so that executing it without metering a MAC raises (unless ``free``)."""
        if free:
            return fn

        def run(*args: Any, **kwargs: Any) -> Any:
            """Run ``fn`` under a MAC meter; raise :class:`UnchargedCompute` if it charged none."""
            with MacMeter() as meter:
                try:
                    out = fn(*args, **kwargs)
                except DeclaredCostError as err:          # name the protocol step that ran the kernel
                    raise err.in_step(f"{self.label}: step {step!r}").with_traceback(err.__traceback__) from None
            if meter.macs == 0:
                name = getattr(fn, "__qualname__", repr(fn))
                raise UnchargedCompute(f"{self.label}: step {step!r} ran {name} but it charged 0 MACs; "
                                       f"compute with metered kernels (fednet.algebra.meter) or pass free=True")
            return out
        return run

    # -- messages --------------------------------------------------------------------------
    def _message(self, src: Node, dst: Node, payload: Any, kind: str, n_elements: int | None,
                 element_bits: int | None, encrypted: bool = False, timing_key: str = "") -> Message:
        return Message(src.index, dst.index, kind, payload,
                       payload_size(payload) if n_elements is None else int(n_elements),
                       wire.message_bits(payload, element_bits, kind, where=f"{self.label}: "), round=self.sim.round,
                       encrypted=encrypted, timing_key=timing_key)

    def send(self, src: Node, dst: Node, payload: Any, *, kind: str, n_elements: int | None = None,
             element_bits: int | None = None, encrypted: bool = False,
             timing_key: str = "") -> Generator[Any, Any, Message]:
        """Send one message and wait until it is delivered; returns the :class:`Message`.

        Parameters
        ----------
        src, dst : Node
        payload : Any
        kind : str
            The message's kind (traces and views).
        n_elements : int, optional
            Numbers on the wire (default :func:`payload_size`).
        element_bits : int or fednet.sim.engine.wire.Width, optional
            Bits per number: an int, or :func:`~fednet.sim.engine.wire.field` / :func:`~fednet.sim.engine.wire.fixed`;
            default from the payload (float32 32, bytes 8...), else :class:`~fednet.sim.engine.wire.WireWidthError`.
        encrypted : bool
            Marks a message to the server that the server only stores and forwards (end-to-end
            encrypted for other devices): it goes to the server's ``relayed`` list, not its view.
            Device-to-device messages are always encrypted.
        timing_key : str
            ``""`` (default): the message's losses come from the shared keyed draws of
            ``(device, "uplink" / "downlink", round)``; a message only this protocol sends (mask
            shares, say) names its own key and draws from ``"uplink:<key>"`` / ``"downlink:<key>"``,
            leaving the shared draws to the messages every protocol sends (module docstring).
        """
        msg = self._message(src, dst, payload, kind, n_elements, element_bits, encrypted, timing_key)
        return (yield from self.sim.transfer(msg))

    def broadcast(self, payload: Any, *, kind: str, to: Iterable[Node] | None = None,
                  n_elements: int | None = None, element_bits: int | None = None) -> Generator:
        """Send ``payload`` from the server to every device in ``to`` (default: all) in parallel.

        Each device's downlink is its own resource, so this lasts as long as the slowest
        download. Returns the delivered messages, in the order of ``to``.
        """
        env = self.sim.env
        targets = list(self.sim.devices if to is None else to)
        procs = [env.process(self.send(self.sim.server, dev, payload, kind=kind, n_elements=n_elements,
                                       element_bits=element_bits)) for dev in targets]
        yield env.all_of(procs)
        return [p.value for p in procs]

    def _launch(self, o: Outgoing) -> simpy.Process:
        return self.sim.env.process(self.send(o.src, o.dst, o.payload, kind=o.kind, n_elements=o.n_elements,
                                              element_bits=o.element_bits, encrypted=o.encrypted,
                                              timing_key=o.timing_key))

    def send_all(self, steps: Sequence[Sequence[Outgoing]], *, barrier: bool = True) -> Generator:
        """Send messages in steps.

        Parameters
        ----------
        steps : sequence of sequences of Outgoing
            With ``barrier=True`` every message of a step is sent in parallel and the next step
            starts when the whole step is delivered (a synchronous schedule). With
            ``barrier=False`` all messages are launched at once, in order, and each link serves
            its queue first come, first served (each transfer starts as soon as its link is free).

        Returns
        -------
        list of list of Message
            The delivered messages, step by step.
        """
        env = self.sim.env
        out: list[list[Message]] = []
        if barrier:
            for step in steps:
                procs = [self._launch(o) for o in step]
                yield env.all_of(procs)
                out.append([p.value for p in procs])
        else:
            launched = [[self._launch(o) for o in step] for step in steps]
            yield env.all_of([p for step in launched for p in step])
            out = [[p.value for p in step] for step in launched]
        return out

    def delay(self, seconds: float) -> Generator:
        """Wait ``seconds`` of simulated time (a modelled delay: FedVS's Sec. 6.2 pattern, a deadline's rest).

        Raises
        ------
        ValueError
            For a negative or non-finite ``seconds``.
        """
        if not 0 <= seconds < float("inf"):
            raise ValueError(f"{self.label}: delay seconds must be finite and >= 0, got {seconds!r}")
        yield self.sim.env.timeout(seconds)

    def queue(self) -> simpy.Store:
        """A FIFO queue on this simulation (``yield q.put(item)``, ``item = yield q.get()``): an asynchronous
        server's arrivals (VAFL)."""
        return simpy.Store(self.sim.env)

    def background(self, gen: Generator) -> simpy.Process:
        """Start ``gen`` as a process beside the caller (cancel it with :meth:`cancel`)."""
        return self.sim.env.process(gen)

    def cancel(self, *items: Any) -> None:
        """Interrupt what is still running: processes, or the ``pending`` work of a :class:`GatherResult`
        (None is skipped)."""
        for item in items:
            if item is None:
                continue
            procs = [p for _, p in item.pending] if isinstance(item, GatherResult) else [item]
            for p in procs:
                if p.is_alive:
                    p.interrupt("cancelled: the round is over")

    def exchange(self, steps: Sequence[Sequence[tuple[Node, Node]]] | AllToAll | CyclicSteps,
                 payload: Callable[[Node, Node], Any] | None, *,
                 kind: str, schedule: Literal["relay_steps", "relay_asap", "upload_once", "bundled"] = "relay_steps",
                 n_elements: int | None = None, element_bits: int | None = None,
                 prepare: Callable[[Node], Generator] | None = None, mailbox: Mailbox | None = None,
                 rows: Callable[[Node], Any] | None = None, timing_key: str = "",
                 exclusive: bool = False, alike: bool = False) -> Generator:
        """Device-to-device exchange of shares, relayed through the server, on a sharing schedule.

        Parameters
        ----------
        steps : sequence of sequences of (src, dst), AllToAll or CyclicSteps
            Who sends to whom, step by step (e.g. :func:`cyclic_steps` for all-to-all in groups,
            or the rows of a gradient code's support matrix); an :class:`AllToAll` is its one step, a
            :class:`CyclicSteps` the steps of :func:`cyclic_steps` as an index array.
        payload : callable(src, dst) -> Any, or None
            The share ``src`` sends to ``dst`` (evaluated once ``src`` is prepared); None: ``rows(src)[dst.index]``.
        kind : str
        schedule : {"relay_steps", "relay_asap", "upload_once", "bundled"}
            ``relay_steps``: the steps in turn, each an upload and a download per message, the next
            step starting when the slowest message of the step is delivered. ``relay_asap``: every
            message launched as soon as its sender is prepared; each link serves its queue first
            come, first served. ``upload_once``: every sender uploads once (encrypted: the server
            only stores it), then, when all uploads are in, the server forwards it to each of its
            destinations, all forwards launched at once (one upload and ``len(dsts)`` downloads per
            sender; meant for a payload that does not depend on ``dst``: the upload carries
            ``payload(src, first dst)``). ``bundled``: every sender uploads one message holding its
            shares for all its destinations (``n_elements`` each); when all uploads are in, the
            server sends each destination *available this round* one message holding the shares
            addressed to it (senders in index order).
        n_elements, element_bits : int, optional
            Size of each share (default :func:`payload_size`) and bits per number (as :meth:`send`).
        prepare : callable(src) -> generator, optional
            Run for each sender (in parallel, in order of first appearance) before its shares are
            formed, e.g. its encoding on its processor.
        mailbox : Mailbox, optional
            Every delivered share is also posted here as it arrives.
        rows : callable(src) -> ndarray or Shape, optional
            All of ``src``'s shares as one table (evaluated once ``src`` is prepared), row ``dst.index``
            being ``payload(src, dst)``: an ndarray, or a timing-mode :class:`~fednet.protocol.modes.Shape`.
            With an :class:`AllToAll` on the ``bundled`` schedule, the shares then travel as arrays
            (the ``bundled`` backend): a sender's upload carries its rows for its destinations (in the order
            of ``receivers``), a forward the rows addressed to its destination (senders in index order),
            each posted to ``mailbox`` with one :meth:`Mailbox.put_many`.
        timing_key : str
            Key of the messages' loss draws (:meth:`send`); ``prepare`` names its own compute key.
        exclusive : bool
            The caller expects that, until the exchange ends, no other process uses the links of its devices or
            cancels it (other processes may run beside it, e.g. other groups' exchanges): the ``relay_*``
            schedules may then be replayed (the ``relays`` backend; without views recorded) even with other
            processes scheduled.  Checked, not trusted: if another process used one of its links meanwhile,
            :class:`~fednet.sim.engine.results.EngineError` names the step (a replayed time is never silently
            wrong).  Without it the replay runs only where nothing else is scheduled.
        alike : bool
            In timing mode every share is one stand-in value (equal :class:`~fednet.protocol.modes.Shape` s, as
            CodedSecAgg's): with a :class:`CyclicSteps` on a ``relay_*`` schedule, the ``cyclic`` backend then moves
            the pairs as index arrays (:mod:`fednet.sim.engine.backends.cyclic`) and returns an
            :class:`~fednet.sim.engine.mailbox.AlikeDelivered` (read it with :func:`received_by`).  Ignored in
            full mode.

        Returns
        -------
        dict of (int, int) -> Any
            ``{(src.index, dst.index): delivered payload}``; for ``relay_*``/``upload_once`` in the
            order of ``steps``, for ``bundled`` in order of delivery (a read-only mapping in the bulk
            and alike cases). If the exchange is cancelled (interrupted: run it with :meth:`background`), what was
            delivered by then.

        Raises
        ------
        ValueError
            For an unknown ``schedule``.
        """
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        if payload is None and rows is None:
            raise ValueError("exchange needs payload or rows")
        return (yield from self._execute(Step(
            "exchange", f"exchange {kind!r}", steps=steps, payload=payload, rows=rows, kind_of=kind, schedule=schedule,
            n_elements=n_elements, element_bits=element_bits, prepare=prepare, mailbox=mailbox,
            timing_key=timing_key, exclusive=exclusive, alike=alike and not self.protocol.mode.exact)))

    def compute_each(self, nodes: Iterable[Node], fn: Callable[[Node], Any] | None, *,
                     macs: Callable[[Node], int] | None = None, free: bool = False,
                     step: str | None = None, timing_key: str = "") -> Generator:
        """Run ``fn(node)`` on every node in parallel (each on its own processor); wait for all.

        Parameters
        ----------
        nodes : iterable of Node
        fn : callable(Node) -> Any, or None
            The computation (metered); None computes nothing (only ``macs`` are charged).
        macs : callable(Node) -> int, optional
            A known MAC count added to the metered one.
        free : bool
            The step deliberately charges nothing (otherwise zero metered MACs raise).
        step : str, optional
            Name of the step in errors (default ``fn``'s name).
        timing_key : str
            ``""``: the random delay is the shared ``(node, "compute", round)`` draw; a step only
            this protocol has names its own key (drawn as ``"compute-<key>"``).

        Returns
        -------
        dict of int -> Any
            ``{node.index: result}``.

        Raises
        ------
        UnchargedCompute
            If ``fn`` ran and metered no MAC, with neither ``macs`` nor ``free``.
        """
        name = step or getattr(fn, "__name__", "compute_each")
        run = None if fn is None else self._charged(fn, name, free or macs is not None)
        return (yield from self._execute(Step("compute", f"compute_each {name!r}", nodes=list(nodes), run=run,
                                              macs=macs, timing_key=compute_key(timing_key))))

    def compute(self, node: Node, fn: Callable[..., Any], *args: Any, free: bool = False, step: str | None = None,
                timing_key: str = "", **kwargs: Any) -> Generator:
        """Run ``fn(*args, **kwargs)`` on ``node``'s processor (metered); returns its result.

        ``timing_key`` names the step's own compute draw (see :meth:`compute_each`).

        Raises
        ------
        UnchargedCompute
            If ``fn`` metered no MAC and ``free`` is False.
        """
        run = self._charged(fn, step or getattr(fn, "__name__", "compute"), free)
        return (yield from self.sim.compute(node, run, *args, timing_key=compute_key(timing_key), **kwargs))

    def server_compute(self, fn: Callable[..., Any] | None, *args: Any, macs: int | None = None,
                       free: bool = False, step: str | None = None, **kwargs: Any) -> Generator:
        """Run ``fn(*args, **kwargs)`` on the server (metered, plus ``macs``); returns its result.

        Raises
        ------
        UnchargedCompute
            If ``fn`` ran and metered no MAC, with neither ``macs`` nor ``free``.
        """
        run = None if fn is None else self._charged(fn, step or getattr(fn, "__name__", "server_compute"),
                                                     free or macs is not None)
        return (yield from self.sim.compute(self.sim.server, run, *args, macs=macs, **kwargs))

    def first_k(self, work: Sequence[tuple[Node, Generator]], k: int | None = None, *,
                deadline: float | None = None, dropped: Sequence[Node] = (), cancel: bool = True) -> Generator:
        """Run each ``(node, generator)`` in parallel; keep the first ``k`` to finish, cancel the rest.

        Parameters
        ----------
        work : sequence of (Node, generator)
            A generator's return value is the node's result; it finishes when its result has
            reached the server. Cancelled work is interrupted (``simpy.Interrupt`` is thrown into
            it: its transfers and computations end).
        k : int, optional
            Results to wait for (default: all).
        deadline : float, optional
            Simulated seconds after which the server stops waiting: the results in by then are
            returned (possibly fewer than ``k``), the rest are cancelled as ``missed_deadline``.
        dropped : sequence of Node
            Nodes that took no part (copied to the result).
        cancel : bool
            False leaves the work still running when ``k`` results are in going on (in the
            result's ``pending``; end it with :meth:`cancel`): it keeps its links and processors busy.

        Returns
        -------
        GatherResult

        Raises
        ------
        StragglerShortfall
            Without a deadline, if fewer than ``k`` pieces of work are given or finish.
        ValueError
            For a negative deadline.
        """
        return (yield from reference.first_k(self, [(node, gen, True) for node, gen in work], k, deadline=deadline,
                                             dropped=dropped, cancel=cancel))

    def take_buffered(self, owner: Any, nodes: Sequence[Node], k: int, *, base: type, fn: Callable[..., Any],
                      download: Callable[[], Any], download_kind: str, download_bits: Any, upload_kind: str,
                      upload_bits: Any, concurrency: int | None) -> Generator:
        """The next ``k`` updates of asynchronous clients, in arrival order: FedBuff's buffer (an engine step of kind
        ``buffered``).

        ``owner`` is a :class:`fednet.protocol.buffered.BufferedAsync` (``base``): its ``client_loop`` per client in
        ``nodes`` is the reference (:func:`fednet.sim.engine.reference.buffered`), started at the first take;
        ``fn(dev, model, iteration)`` the client's update; ``download()`` the current model; the kinds and widths those
        of its messages; ``concurrency`` its limit.  The ``buffered`` backend replays the loop with arrays where it
        can (:mod:`fednet.sim.engine.backends.buffered`), for the whole run.

        Returns
        -------
        list of (Node, int, Any)
            ``(client, version it trained on, update)``, in arrival order.
        """
        return (yield from self._execute(Step(
            "buffered", f"buffered {upload_kind!r}", owner=owner, nodes=list(nodes), K=int(k), base=base, fn=fn,
            download=download, download_kind=download_kind, download_bits=download_bits, upload_kind=upload_kind,
            upload_bits=upload_bits, concurrency=concurrency)))

    def gather(self, nodes: Iterable[Node], fn: Callable[[Node], Any] | None, *, kind: str,
               first: int | None = None, download: Any = None, download_kind: str = "model",
               download_elements: int | None = None, download_bits: int | None = None,
               upload_elements: int | Callable[[Any], int] | None = None, upload_bits: int | None = None,
               macs: Callable[[Node], int] | None = None, deadline: float | None = None,
               free: bool = False, cancel: bool = True,
               wait: Callable[[Node], simpy.Event] | None = None, timing_key: str = "") -> Generator:
        """Each node: receive ``download`` (if given), compute ``fn(node)``, upload the result.

        Nodes work in parallel, each starting its computation as soon as its own download
        arrives; the downloaded payload is in ``node.state.received`` when ``fn`` runs.
        Devices that the availability model marks absent this round (:meth:`available`) take no part
        (``dropped``).
        When ``first`` results have reached the server the remaining nodes are cancelled (their
        partial transfers and computations end; the round does not wait for them).

        Parameters
        ----------
        nodes : iterable of Node
        fn : callable(Node) -> Any, or None
            The node's computation (metered; its result is uploaded). None computes nothing.
        kind : str
            Kind of the uploaded messages.
        first : int, optional
            How many results to wait for (default: every available node).
        download : Any, optional
            Payload the server sends to each node first.
        download_kind, download_elements, download_bits
            Kind, size and element width of the download (the width as :meth:`send`'s ``element_bits``).
        upload_elements : int or callable(result) -> int, optional
            Size of an upload (default: :func:`payload_size` of the result).
        upload_bits : int or fednet.sim.engine.wire.Width, optional
            Width of an upload's numbers (as :meth:`send`'s ``element_bits``: default from the result).
        macs : callable(Node) -> int, optional
            MACs to charge in addition to those metered in ``fn``.
        deadline : float, optional
            Simulated seconds after which the server stops waiting (see :meth:`first_k`).
        free : bool
            ``fn`` deliberately charges nothing.
        cancel : bool
            False lets the nodes still working when ``first`` results are in go on (see :meth:`first_k`).
        wait : callable(Node) -> simpy.Event, optional
            An event a node waits for after its download and before computing (e.g. the shares
            it needs, :meth:`Mailbox.wait`).
        timing_key : str
            ``""`` (default): the download, computation and upload take the shared keyed draws; a
            gather only this protocol has (LightSecAgg's aggregated masks) names its own key, used
            for its messages (:meth:`send`) and its computation (:meth:`compute_each`).

        The ``batched`` backend computes every node's ``fn`` at once where ``fn`` declares its batched form
        (:func:`~fednet.sim.engine.results.batched`); each node is still charged its own MACs and keyed time.

        Returns
        -------
        GatherResult
            ``results``: ``(node, result)`` in order of arrival at the server; and the failures.

        Raises
        ------
        StragglerShortfall
            If fewer than ``first`` nodes are available or finish (without a deadline).
        UnchargedCompute
            If ``fn`` ran and metered no MAC, with neither ``macs`` nor ``free``.
        """
        nodes = list(nodes)
        flags = self.sim.available_many(nodes)
        if flags.all():
            up, absent = nodes, []
        else:
            up = [n for n, ok in zip(nodes, flags) if ok]
            absent = [n for n, ok in zip(nodes, flags) if not ok]
        charged = not (free or macs is not None)
        run = None if fn is None else self._charged(fn, f"gather {kind!r}", not charged)
        return (yield from self._execute(Step(
            "gather", f"gather {kind!r}", nodes=up, absent=absent, first=first, download=download,
            download_kind=download_kind, download_elements=download_elements, download_bits=download_bits, run=run,
            macs=macs, kind_of=kind, size_of=uploaded_elements(upload_elements), upload_bits=upload_bits,
            timing_key=timing_key, deadline=deadline, cancel=cancel, wait=wait,
            batch=batch_of(fn), charged=charged)))

    def gather_groups(self, groups: Sequence[Sequence[Node]], fn: Callable[[Node], Any] | None, *, kind: str,
                      first: Sequence[int | None], then: Callable[[int, GatherResult], Generator],
                      download: Any = None, download_kind: str = "model", download_elements: int | None = None,
                      download_bits: int | None = None, upload_elements: int | None = None,
                      upload_bits: int | None = None, timing_key: str = "") -> Generator:
        """:meth:`gather` over each of several disjoint groups in parallel, each followed by ``then(g, result)``.

        The same as running, for every group ``g`` at once, a process that does ``result = yield from
        self.gather(groups[g], fn, first=first[g], ...)`` and then ``yield from then(g, result)`` (CodedPaddedFL's
        groups, each decoded by the server as soon as its own gather ends, Sec. V-E); returns when all have ended.

        Where no other process can act meanwhile, the ``groups`` backend replays the gathers without a process per
        device (:mod:`fednet.sim.engine.backends.groups`; the same results bit for bit).

        Parameters
        ----------
        groups : sequence of sequences of Node
            Disjoint groups of devices.
        fn, kind, download, download_kind, download_elements, download_bits, upload_elements, upload_bits,
        timing_key
            As :meth:`gather` (the same for every group).
        first : sequence of int or None
            Results to wait for in each group (None: every available node of it).
        then : callable(int, GatherResult) -> generator
            What follows group ``g``'s gather (e.g. the server decoding it).

        Raises
        ------
        ValueError
            If ``first`` does not give one count per group, or a node is in two groups.
        StragglerShortfall
            As :meth:`gather`, for a group with fewer than ``first[g]`` available nodes.
        """
        groups = [list(g) for g in groups]
        first = list(first)
        if len(first) != len(groups):
            raise ValueError(f"first gives {len(first)} counts for {len(groups)} groups")
        everyone = [node for group in groups for node in group]
        if len({id(node) for node in everyone}) != len(everyone):
            raise ValueError("gather_groups needs disjoint groups: a node is in two of them")
        common = dict(download=download, download_kind=download_kind, download_elements=download_elements,
                      download_bits=download_bits, upload_elements=upload_elements, upload_bits=upload_bits,
                      timing_key=timing_key)
        yield from self._execute(Step("groups", f"gather_groups {kind!r}", groups=groups, fn=fn, first=first,
                                      then=then, kind_of=kind, common=common))

    def tree_aggregate(self, tree: nx.DiGraph, fn: Callable[[Node], Any], combine: Callable[[Any, Any], Any], *,
                       kind: str, root_kind: str, first: int | None = None, download: Any = None,
                       download_kind: str = "model", download_bits: int | None = None,
                       n_elements: int | None = None, element_bits: int | None = None,
                       free: bool = False, alike: bool = False) -> Generator:
        """Partial aggregates climb a tree, children to parents, to its roots, which upload to the server.

        Every node of ``tree`` (device indices; an edge ``u -> v`` makes ``v`` the parent of ``u``)
        receives ``download`` (if given), computes ``fn(node)`` (metered), then for each child in
        the order of the edges' ``step`` attribute waits for the child's message and computes
        ``combine(acc, part)`` (metered); a node with a parent then sends its aggregate to it, a
        root uploads it to the server. A transfer starts as soon as its sender holds its own value
        and its children's (no barrier between the levels). When ``first`` roots' uploads have
        arrived the rest is cancelled.

        A root takes part only if every node of its subtree is available this round (otherwise its
        aggregate could never be complete): the nodes of other subtrees are ``dropped``.

        Parameters
        ----------
        tree : networkx.DiGraph
            A forest over device indices, edges child -> parent with an integer ``step``
            attribute (default 0) ordering a parent's children. Nodes are launched in the graph's
            node order.
        fn : callable(Node) -> Any
            A node's own contribution (computed on the node after its download).
        combine : callable(acc, part) -> Any
            Adds a child's aggregate (computed on the parent).
        kind, root_kind : str
            Kinds of the messages to a parent and of the roots' uploads.
        first : int, optional
            Roots to wait for (default: every complete root).
        download, download_kind, download_bits
            The payload the server sends to every node first.
        n_elements, element_bits : int, optional
            Size and width of every tree message and upload (the width as :meth:`send`'s).
        free : bool
            ``fn`` and ``combine`` deliberately charge nothing.
        alike : bool
            In timing mode every call of ``fn`` (and of ``combine``) charges the same MACs and gives the same
            stand-in (CodedSecAgg), so the backends run each once per batch
            (:func:`~fednet.sim.engine.results.alike_batches`; ``check_engine`` compares).  Otherwise ``fn``'s
            declared batch (:func:`~fednet.sim.engine.results.batched`), if any, serves the ``batched`` backend
            (a tree without edges) and the ``tree`` backend (:mod:`fednet.sim.engine.backends.tree`).

        Returns
        -------
        GatherResult
            ``results``: ``(root node, aggregate)`` in order of arrival at the server.

        Raises
        ------
        StragglerShortfall
            If fewer than ``first`` roots have a complete available subtree, or finish.
        ValueError
            If ``tree`` has a cycle or a node with two parents.
        """
        edgeless = tree.number_of_edges() == 0
        parts = forest_parts(self._tree_parts_of, tree, edgeless)
        complete, nodes, absent = taking_part(self.sim, self.available, parts, edgeless)
        batch, combine_batch = (alike_batches(fn, combine) if alike and not self.protocol.mode.exact
                                else (batch_of(fn), None))
        own = self._charged(fn, f"tree_aggregate {kind!r}", free)
        add = self._charged(combine, f"tree_aggregate {kind!r} combine", free)
        return (yield from self._execute(Step(
            "tree", f"tree_aggregate {kind!r}", edgeless=edgeless, taking_part=nodes, complete=complete,
            absent=absent, kids=parts[3], parent=parts[4], first=first, download=download, download_kind=download_kind,
            download_bits=download_bits, own=own, add=add, kind_of=kind, root_kind=root_kind, n_elements=n_elements,
            element_bits=element_bits, batch=batch, combine_batch=combine_batch, free=free)))

    def masked_sum(self, nodes: Sequence[Node], *, prepare: Callable[[Node], None],
                   encode: Callable[[Node], Any], local: Callable[[Node], Any],
                   aggregate: Callable[[Node, Any, Mailbox], Any], first: int, piece_length: int, download: Any,
                   upload_elements: int, element_bits: int | wire.Width, download_bits: int | wire.Width,
                   relay: Literal["bundled", "per_message"] = "bundled",
                   parallel: bool = True, timing_key: str = "mask", precomputed: bool = False,
                   kinds: tuple[str, str, str, str] | None = None) -> Generator:
        """A masked secure sum in one round (LightSecAgg, So et al., MLSys 2022, Sec. 4; the reference semantics:
        :func:`fednet.sim.engine.reference.masked`, the ``masked`` backend where it can run).

        Parameters
        ----------
        nodes : sequence of Node
            The users taking part this round (available).
        prepare : callable(Node) -> None
            A user's free offline preparation (its secret mask for this round).
        encode : callable(Node) -> (N, L) array or Shape
            Its encoded mask shares, row ``j`` for user ``j`` (charged on its processor, ``timing_key``).
        local : callable(Node) -> Any
            Its masked input, computed after the model download (charged: the training step's shared draws).
        aggregate : callable(Node, U1, Mailbox) -> Any
            A survivor's sum of the encoded masks of ``U1`` (indices, ascending) addressed to it, read from the
            mailbox (charged; free when ``U1`` has one user).
        first : int
            U: the masked inputs the server waits for (the survivors).
        piece_length : int
            L: elements of each encoded share and of each aggregated mask.
        download : Any
            The model every user downloads first.
        upload_elements : int
            Elements of a masked input.
        element_bits, download_bits : int or fednet.sim.engine.wire.Width
            Width of the field's numbers (encoded masks, masked inputs, survivor list, aggregated masks) and of the
            model's.
        relay : {"bundled", "per_message"}
            How the encoded shares travel (:meth:`exchange`'s ``bundled`` or ``relay_asap``).
        parallel : bool
            The mask phase runs beside the online phase (else before it).
        timing_key : str
            Key of the mask steps' draws (the model download, training and masked upload take the shared draws).
        precomputed : bool
            The callables may run before their inputs arrive (timing mode's stand-ins): the ``masked`` backend
            may then replay the round.
        kinds : tuple of 4 str, optional
            Message kinds: encoded masks, masked inputs, survivor list, aggregated masks.

        Returns
        -------
        (U1, online, replies)
            The survivors' indices (ascending), their masked inputs ``(node, value)`` in order of arrival, and their
            aggregated masks ``(node, value)`` in index order.

        Raises
        ------
        StragglerShortfall
            If fewer than ``first`` users take part.
        """
        nodes = list(nodes)
        if len(nodes) < first:
            raise StragglerShortfall(f"{self.label}: round {self.epoch} needs U = {first} users, "
                                     f"{len(nodes)} available")
        if kinds is None:
            kinds = ("encoded_mask" if relay == "per_message" else "encoded_mask_relay", "masked_model",
                     "survivors", "aggregated_mask")
        return (yield from self._execute(Step(
            "masked", f"masked_sum {kinds[1]!r}", nodes=nodes, prepare=prepare, encode=encode, local=local,
            aggregate=aggregate, first=int(first), piece_length=int(piece_length), download=download,
            upload_elements=int(upload_elements), element_bits=element_bits, download_bits=download_bits, relay=relay, parallel=parallel, timing_key=timing_key,
            precomputed=precomputed, kinds=kinds)))
