"""The direct engine's grid: a federation's ServerApp and ClientApp called in one process.

Flower's Simulation Engine runs a federation as a SuperLink, a ServerApp process and a Ray
cluster whose actors call the ClientApp: seconds of start-up per federation and two 0.1 s polls
per round, while the devices' own work in a round of the papers' experiments takes
milliseconds. A sweep of a hundred federations spent most of its time there (docs/BENCHMARKS.md,
"The experiments' engines").

The direct engine (``gpfl launch --engine direct``, :class:`deploy.engines.DirectEngine`) keeps
every part of gpfl and of Flower's server loop and replaces only the transport. It calls
:data:`server.app.app` (Flower's ``ServerApp``: ``server_fn``, then Flower's legacy
``start_grid`` and ``Server.fit``, with gpfl's strategy, recorder and checkpoints) with a
:class:`DirectGrid`, Flower's ``Grid`` interface, whose ``send_and_receive`` calls
:data:`client.app.app` (the ``ClientApp``: the device's policy, ledger, mechanism and training)
for each instruction, with the node's own ``Context`` as the Simulation Engine's node would have
it: ``partition-id`` and ``num-partitions`` in its node config, a state that lasts the run, the
device settings from the launch policy file (``GPFL_POLICY``). A ClientApp that raises becomes
an error reply, as Flower's simulation worker makes it. What it leaves out: the processes, gRPC
and Ray; instruction TTLs (nothing is late in one process); Flower's ``flwr run`` packaging.

The ClientApp answers one instruction at a time, as the Simulation Engine's one Ray actor per
two CPUs does on this machine; torch uses the cores within it. The results are those of the
Simulation Engine, bit for bit: ``tests/test_experiments_pairing.py`` runs one federation under both
engines and compares every round's metrics, clusters, sampled devices, hypotheses and ledgers.
The experiments' cache therefore does not key a run on its engine.
"""

from __future__ import annotations

import copy
import logging
import os
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp.grid import Grid
from flwr.supercore.run import Run

from client.policy import POLICY_ENV
from server.results import ROUND_TAG

__all__ = ["DirectGrid", "policy_env", "run_logging"]

#: The loggers whose records a run writes to its log (Flower's and the apps').
LOGGERS = ("flwr", "server", "strategies", "mechanisms", "tasks", "client")


class DirectGrid(Grid):
    """Flower's ``Grid`` whose instructions are answered by a ClientApp in this process.

    Parameters
    ----------
    client_app : callable
        ``(message, context) -> reply``: a ``flwr.clientapp.ClientApp``.
    run : Run
        The run the nodes' contexts belong to.
    node_configs : sequence of mapping
        One node config per virtual node (``partition-id``, ``num-partitions``).
    run_config : mapping
        The run config every node's context carries.
    """

    #: Replies are there when ``send_and_receive`` returns: the ServerApp polls for none.
    answers_at_once = True

    def __init__(self, client_app: Callable[[Message, Context], Message], run: Run,
                 node_configs: Iterable[Mapping[str, Any]],
                 run_config: Mapping[str, Any]) -> None:
        self._app = client_app
        self._run = run
        self._contexts: dict[int, Context] = {}
        # One instruction at a time over all nodes (see the module's note).
        self._lock = threading.Lock()
        self._replies: dict[str, Message] = {}
        for node in node_configs:
            # Random 63-bit ids, as the SuperLink draws them: nothing may depend on them.
            node_id = secrets.randbits(63) or 1
            self._contexts[node_id] = Context(
                run_id=run.run_id, node_id=node_id, node_config=dict(node),
                state=RecordDict(), run_config=dict(run_config))

    def set_run(self, run: Run) -> None:
        """Set the run (one run per grid)."""
        self._run = run

    @property
    def run(self) -> Run:
        """The run."""
        return Run(**vars(self._run))

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        """Return a message to a node (Flower's deprecated helper)."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """Return the virtual nodes' ids."""
        return list(self._contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Answer each message now; return the ids to pull the replies with."""
        ids: list[str] = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = str(uuid4())
            message.metadata.__dict__["_run_id"] = self._run.run_id
            self._replies[message.metadata.message_id] = self._answer(message)
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Return (and forget) the replies to these messages."""
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        """Answer the messages; return the replies."""
        return self.pull_messages(self.push_messages(messages))

    def _answer(self, message: Message) -> Message:
        """Run the ClientApp on one message with its node's context (errors become replies)."""
        node_id = message.metadata.dst_node_id
        context = self._contexts.get(node_id)
        if context is None:
            return Message(Error(code=ErrorCode.NODE_UNAVAILABLE,
                                 reason=f"no node {node_id}"), reply_to=message)
        # Each node gets its own copy, as over the network: Flower's workflows may share one
        # content among the messages of a stage (SecAgg+'s setup does), and a ClientApp's mod
        # may change what it receives (secaggplus_mod pops its stage key).
        message = copy.deepcopy(message)
        with self._lock:
            try:
                reply = self._app(message, context)
            except Exception as ex:  # Flower's worker makes it a reply
                reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                      reason=f"{type(ex)}:<'{ex}'>"), reply_to=message)
        reply.metadata.__dict__["_message_id"] = str(uuid4())
        return reply


class _Echo(logging.Handler):
    """Pass the per-round lines and errors of a run to ``echo`` (as `deploy.launcher` does)."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self._echo = echo

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        if ROUND_TAG in line:
            self._echo(line[line.index(ROUND_TAG):])
        elif record.levelno >= logging.ERROR:
            self._echo(line)


@contextmanager
def run_logging(path: Path, echo: Callable[[str], None]) -> Iterator[None]:
    """Send the run's log records to ``path`` (and its round lines to ``echo``), not the console.

    The ServerApp gives gpfl's loggers the handlers of Flower's (``server.app``), so both are
    put back as they were afterwards.
    """
    loggers = [logging.getLogger(name) for name in LOGGERS]
    saved = [(lg, list(lg.handlers), lg.propagate, lg.level) for lg in loggers]
    to_file = logging.FileHandler(path, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(levelname)-8s: %(message)s"))
    handlers: list[logging.Handler] = [to_file, _Echo(echo)]
    for lg in loggers:
        lg.handlers = list(handlers)
        lg.propagate = False
        lg.setLevel(logging.INFO)
    try:
        yield
    finally:
        for lg, kept, propagate, level in saved:
            lg.handlers = kept
            lg.propagate = propagate
            lg.setLevel(level)
        to_file.close()


@contextmanager
def policy_env(policy_file: Path) -> Iterator[None]:
    """Name the launch policy in ``GPFL_POLICY`` for the run (as on the Simulation Engine)."""
    previous = os.environ.get(POLICY_ENV)
    os.environ[POLICY_ENV] = str(policy_file)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(POLICY_ENV, None)
        else:
            os.environ[POLICY_ENV] = previous
