"""Ports chosen for the federation's processes: free, outside the ephemeral range, never twice."""

from __future__ import annotations

import socket

from deploy import federation
from deploy.federation import free_port


def test_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    # Prepare
    low, _ = federation._ephemeral_range()

    # Execute
    ports = [free_port() for _ in range(200)]

    # Assert: outgoing connections (which take ephemeral ports) cannot take them meanwhile
    assert len(set(ports)) == len(ports)
    if low > 11_000:
        assert all(10_000 <= p < low for p in ports)
    for port in ports[:20]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_handed_out(monkeypatch) -> None:
    # Prepare: a listener on a port, and a draw that offers that port first
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        offers = iter([taken, taken + 1 if taken + 1 < 65536 else taken - 1])
        monkeypatch.setattr(federation, "_ephemeral_range", lambda: (65_536, 65_536))
        monkeypatch.setattr(federation.random.Random, "randrange",
                            lambda self, a, b: next(offers))
        monkeypatch.setattr(federation, "_HANDED_OUT", set())

        # Execute
        port = free_port()

    # Assert
    assert port != taken
