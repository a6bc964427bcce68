"""Who a device is when the SuperLink authenticates SuperNodes: its key (``node-identity = "key"``).

A device names itself (``client-name``, its node config): without authentication that name is all
the server can go by, and a restarted device, which Flower registers under a new node id while
its old one stays registered until the heartbeat expires, takes its name over
(:class:`strategies.replies.NameBook`). With SuperNode authentication a name is still
self-declared, so any authorized SuperNode could claim another device's name; the SuperNode's
key, though, is verified by the SuperLink.

What Flower 1.39 gives, and why the node id is the key
    The ServerApp does not see a node's public key: ``Grid.get_nodes`` yields ``NodeInfo`` with
    the node id alone (``flwr/serverapp/grid/grid.py``). But under ``--enable-supernode-auth`` the
    SuperLink binds each authorized key to exactly one node id, for good:

    * a node is created only by ``flwr supernode register <key>`` (the Control API); a SuperNode
      may not register itself (``FleetServicer.RegisterNode`` refuses) and a key is registered
      once (``LinkState.create_node``: "Public key already in use");
    * ``ActivateNode`` looks the node id up by the key (``message_handler.activate_node``), so
      the same key always comes back as the same node id;
    * every other Fleet call is signed, and its node id must be the signing key's
      (``NodeAuthServerInterceptor._wrap_method_handler``: "Invalid node ID"): no key can
      pull, or answer, another key's messages.

    So the node id the ServerApp sees is a name for the key, checked by the SuperLink; nothing
    needs to be signed again in gpfl (the device proving its key with a nonce would prove what
    the SuperLink already checks on every message). A restarted device with the same key is not
    a second registration at all: the SuperLink refuses its activation while its old
    registration is still within the heartbeat window (``LinkState.activate_node`` activates only
    a node that is registered or offline), and accepts it, under the same node id, once the
    window has passed (``gpfl supernode`` keeps trying that long; :mod:`client.supernode`).

The rule, under ``node-identity = "key"``
    A name belongs to the first node id that speaks as it, for the whole run (checkpoints
    included): it never moves to another node (:meth:`NameBook.check` refuses). Before a node is
    first drawn, the server asks its name (one properties query, answered with the name alone,
    nothing charged; :class:`strategies.device_keys.DeviceKeys`), and a node whose name belongs
    to another node, or that two connected nodes announce while it belongs to neither, is not
    asked to train (:func:`refused_claims`): nothing is charged on a device whose reply could
    not count. Its reply, should it send one anyway, is dropped, and the log says why.

What this protects, and what not
    It keeps an authorized SuperNode from speaking for, or shutting out, a device whose name is
    taken, and keeps a restarted device's records under its own key. It does not tell the
    server which of two keys the owner meant to have a name (two new keys announcing one name:
    neither is asked, an error says so); a name's first key keeps it even after a key rotation
    (give the new key's device a new name, or a new run). It trusts the SuperLink: whoever runs
    the SuperLink chooses the node ids, as it already chooses everything the server sees.
    Setting ``"key"`` on a SuperLink without authentication is safe but costly: a restarted
    device gets a new node id, and its own name is then refused for the rest of the run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from settings import NODE_IDENTITY
from strategies.replies import NameBook

__all__ = ["NODE_IDENTITY", "refused_claims"]


def refused_claims(announced: Mapping[str, str], book: NameBook) -> dict[str, str]:
    """Return the connected nodes not to ask, each with why, under ``node-identity = "key"``.

    Parameters
    ----------
    announced : Mapping[str, str]
        Node id -> the ``client-name`` it announced ("" when none), for the nodes connected now
        only (a dead node's announcement must not keep a name from anyone).
    book : NameBook
        The run's name bindings (a name is bound at its node's first accepted reply).

    Returns
    -------
    dict of str to str
        Node id -> the reason it is left out of the draw (and out of the quorum). A node that
        announced no name is not in it: its reply is checked by :meth:`NameBook.check`.
    """
    counts = Counter(name for name in announced.values() if name)
    refused: dict[str, str] = {}
    for node, name in announced.items():
        if not name:
            continue
        bound = book.node_name.get(node)
        owner = book.name_node.get(name)
        if bound is not None and bound != name:
            refused[node] = f"announces {name!r}, but it speaks as {bound!r}"
        elif owner is not None and owner != node:
            refused[node] = f"announces {name!r}, the name of node {owner} (another SuperNode key)"
        elif owner is None and counts[name] > 1:
            others = sorted(n for n, said in announced.items() if said == name and n != node)
            refused[node] = (f"announces {name!r}, as node(s) {', '.join(others)} do: none of "
                             "them is asked; give each device its own client-name")
    return refused
