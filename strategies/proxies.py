"""Which device a failure came from, and whether it missed the deadline or failed.

Flower's legacy round (``flwr.server.server.fit_clients``) reports a client whose ``fit`` raised
as a bare exception, without the client: under the Deployment Engine that is every device that
missed the round's deadline (the SuperLink answers an instruction whose TTL ran out with a
*Message Unavailable* error, which ``GridClientProxy`` raises as a ``ValueError``), every device
the SuperLink found dead (*Node Unavailable*), and every device whose ClientApp raised. The
strategy hands Flower each sampled client wrapped in a :class:`TracedProxy`, which re-raises
such an exception as a :class:`DeviceFailure` carrying the node id and what happened.
"""

from __future__ import annotations

from flwr.common import (
    DisconnectRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    ReconnectIns,
)
from flwr.server.client_proxy import ClientProxy

__all__ = ["FAILED", "MISSING", "DeviceFailure", "TracedProxy", "classify_failure"]

#: A device that sent no reply in time (deadline passed, or the SuperLink lost it).
MISSING = "missing"
#: A device that answered with an error (its ClientApp raised, or an error status).
FAILED = "failed"

# Error reasons the SuperLink writes itself (flwr/server/superlink/linkstate/utils.py), and
# the one Flower's grid writes for a reply whose upload never finished (flwr's http_grid,
# and server.polling in the same words).
_SUPERLINK_REASONS = (
    ("Reply message objects are unavailable",
     "its reply's upload did not finish before the round's deadline"),
    ("Error: Message Unavailable", "no reply before the round's deadline (round-timeout)"),
    ("Error: Reply Message Unavailable", "its reply came after the round's deadline"),
    ("Error: Node Unavailable", "the SuperLink lost the device (no heartbeat)"),
)
_LONGEST_REASON = 300


class DeviceFailure(Exception):
    """A sampled device's ``fit`` did not give a reply.

    Attributes
    ----------
    cid : str
        The node id.
    kind : str
        :data:`MISSING` or :data:`FAILED`.
    reason : str
        One line for the log and the round's record.
    """

    def __init__(self, cid: str, kind: str, reason: str) -> None:
        super().__init__(f"node {cid}: {reason}")
        self.cid = cid
        self.kind = kind
        self.reason = reason


def classify_failure(error: BaseException) -> tuple[str, str]:
    """Return ``(kind, reason)`` for an exception raised by a client proxy's ``fit``."""
    text = str(error)
    for marker, reason in _SUPERLINK_REASONS:
        if marker in text:
            return MISSING, reason
    if isinstance(error, TimeoutError):
        return MISSING, "no reply before the round's deadline (round-timeout)"
    # GridClientProxy wraps the device's own error text: keep that part only.
    prefix = "Message contains an Error (reason: "
    if text.startswith(prefix):
        text = text[len(prefix):].split("). It originated", 1)[0]
    text = " ".join(text.split()) or type(error).__name__
    if len(text) > _LONGEST_REASON:
        text = text[: _LONGEST_REASON - 3] + "..."
    return FAILED, f"error: {text}"


class TracedProxy(ClientProxy):
    """A client proxy whose failures name the device (see the module notes).

    Parameters
    ----------
    inner : ClientProxy
        The proxy Flower's client manager holds; every call is delegated to it.
    """

    def __init__(self, inner: ClientProxy) -> None:
        super().__init__(inner.cid)
        self.inner = inner

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        """Delegate; an exception becomes a :class:`DeviceFailure` naming this node."""
        try:
            return self.inner.fit(ins, timeout=timeout, group_id=group_id)
        except Exception as error:  # every failure is the device's: recorded
            kind, reason = classify_failure(error)
            raise DeviceFailure(self.cid, kind, reason) from error

    def get_properties(
        self, ins: GetPropertiesIns, timeout: float | None, group_id: int | None
    ) -> GetPropertiesRes:
        """Delegate."""
        return self.inner.get_properties(ins, timeout=timeout, group_id=group_id)

    def get_parameters(
        self, ins: GetParametersIns, timeout: float | None, group_id: int | None
    ) -> GetParametersRes:
        """Delegate."""
        return self.inner.get_parameters(ins, timeout=timeout, group_id=group_id)

    def evaluate(
        self, ins: EvaluateIns, timeout: float | None, group_id: int | None
    ) -> EvaluateRes:
        """Delegate."""
        return self.inner.evaluate(ins, timeout=timeout, group_id=group_id)

    def reconnect(
        self, ins: ReconnectIns, timeout: float | None, group_id: int | None
    ) -> DisconnectRes:
        """Delegate."""
        return self.inner.reconnect(ins, timeout=timeout, group_id=group_id)
