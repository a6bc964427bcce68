"""A SuperLink that survives its own death: Flower's persistent state, and when to restart.

``gpfl launch`` runs the SuperLink with ``--database <run dir>/superlink.db`` (Flower's
``SqlLinkState``: runs, nodes, messages in flight and their payloads on disk). The ServerApp and
the SuperNodes are separate processes that retry a lost connection; a SuperLink started again on
the same ports and database carries their run on where it stopped, each instruction and each
reply stored once. Only ``flwr run --stream`` ends with the connection: the launcher follows the
run again with ``flwr log``.
"""

from __future__ import annotations

import re
from pathlib import Path

from deploy.federation import Federation
from deploy.processes import SERVERAPP, descendant_running

__all__ = ["MAX_SUPERLINK_RESTARTS", "RESTART_WINDOW_S", "STARTED", "SUPERLINK_DATABASE",
           "fresh_database", "late_restart_reason", "superlink_restartable"]

#: The SuperLink's database (Flower's ``--database``) in the run directory.
SUPERLINK_DATABASE = "superlink.db"


def fresh_database(out: Path) -> Path:
    """Return the SuperLink's database path in ``out``, moving an earlier launch's aside.

    A resumed launch starts new SuperNodes: the nodes of the earlier launch, still "online" in
    its database until their heartbeats expire, would be sampled and count as lost devices. The
    earlier file is kept (``superlink.db.1``, ...): Flower's record of that launch's run.
    """
    path = out / SUPERLINK_DATABASE
    if path.exists():
        n = 1
        while path.with_name(f"{path.name}.{n}").exists():
            n += 1
        for sidecar in ("", "-wal", "-shm", "-journal"):
            old = path.with_name(path.name + sidecar)
            if old.exists():
                old.rename(path.with_name(f"{path.name}.{n}{sidecar}"))
    return path


#: How often one launch starts its SuperLink again on its database before giving the run up.
MAX_SUPERLINK_RESTARTS = 3
#: Seconds a SuperLink started again has to answer: Flower 1.39 keeps a running ServerApp's
#: task token for its heartbeat window after the last heartbeat (2 x 30 s, checked against the
#: installed Flower by a test), and a SuperLink back later reads from its database that the token
#: expired, refuses it and ends the run. Waiting longer only delays the same end.
RESTART_WINDOW_S = 60.0
#: ``flwr run``'s line naming the run it submitted (``flwr log`` follows it by that id).
STARTED = re.compile(r"Successfully started run (\d+)")


def superlink_restartable(fed: Federation, run_id: int | None, restarts: int) -> bool:
    """Whether the run can go on with its SuperLink started again (it died, the ServerApp lives).

    Only with Flower's persistent state (``fed.database``): a SuperLink started again with its
    state in memory would know neither the run nor its nodes.
    """
    superlink = fed.procs.procs.get("superlink")
    return (fed.database is not None and run_id is not None
            and restarts < MAX_SUPERLINK_RESTARTS
            and superlink is not None and superlink.poll() is not None
            and _serverapp_running(fed))


def _serverapp_running(fed: Federation) -> bool:
    own = fed.procs.procs.get(SERVERAPP)
    return own.poll() is None if own is not None else descendant_running("flwr-serverapp")


def late_restart_reason(code: int, detail: str) -> str:
    """Say in one line why a SuperLink started again on its database could not carry its run on.

    ``code`` is the exit code of the SuperLink that died, ``detail`` what its successor did (did
    not listen in time, or refused the ServerApp).
    """
    return (f"the SuperLink exited (code {code}) and, started again on its database, {detail}: "
            f"a SuperLink that answers more than {RESTART_WINDOW_S:.0f} s (Flower's heartbeat "
            "window) after the ServerApp's last heartbeat refuses its token, so the run cannot "
            "go on (a host too loaded to start the SuperLink in time)")
