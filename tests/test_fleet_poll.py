"""The SuperNode's shorter idle poll (server.fleet_poll); the executor waits for its SuperNode."""

from __future__ import annotations

import argparse
import inspect
import math
import socket
import threading
import time
from pathlib import Path

import pytest

from client.executor import wait_until_listening
from server import fleet_poll, supernode


def test_the_clock_caps_every_sleep_and_is_time_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    clock = fleet_poll.IdleClock(0.5)
    for seconds in (3, 0.5, 0.1, 0):
        clock.sleep(seconds)
    assert slept == [0.5, 0.5, 0.1, 0]
    assert clock.monotonic is time.monotonic and clock.time is time.time


@pytest.mark.parametrize("bad", [0.0, 5e-324, 0.01, -1.0, 3.5, 1e308, math.inf, math.nan])
def test_an_interval_outside_0_to_3_seconds_is_refused_naming_the_option(bad: float) -> None:
    with pytest.raises(ValueError, match=r"--fleet-poll-interval must be in \[0.05, 3\]"):
        fleet_poll.IdleClock(bad)


def test_the_patch_point_exists_in_the_installed_flower(monkeypatch: pytest.MonkeyPatch) -> None:
    # Flower's SuperNode loop sleeps a literal 3 s through its module's `time` name: the one
    # name the patch replaces. Another Flower version that moved it would fail here first.
    from flwr.supernode import start_client_internal as sci

    assert "time.sleep(3)" in inspect.getsource(sci.start_client_internal)
    monkeypatch.setattr(sci, "time", time)  # restored after the test
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    assert fleet_poll.patch(sci, 0.25)
    sci.time.sleep(3)
    assert slept == [0.25]
    assert not fleet_poll.patch(sci, 0.25)  # patched once; a module without `time`: untouched


def test_the_runner_starts_flowers_supernode_through_the_patch(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    supernode.add_arguments(p)
    argv = supernode.supernode_argv(p.parse_args(["--fleet-poll-interval", "1.5", "--insecure"]))
    assert argv[3:6] == ["server.fleet_poll", "--fleet-poll-interval", "1.5"]
    for bad in ("0", "4", "nan"):
        assert supernode.run(p.parse_args(["--insecure", "--fleet-poll-interval", bad])) == 2
        err = capsys.readouterr().err
        assert f"--fleet-poll-interval={float(bad)!r}" in err, err


def test_main_refuses_a_missing_interval_before_flower_starts() -> None:
    with pytest.raises(SystemExit, match="--fleet-poll-interval needs a number"):
        fleet_poll.main(["--fleet-poll-interval"])
    with pytest.raises(SystemExit, match=r"--fleet-poll-interval=9\.0"):
        fleet_poll.main(["--fleet-poll-interval", "9"])


def test_the_executor_waits_for_its_supernode_then_goes_on() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    listener = socket.socket()

    def listen_later() -> None:
        time.sleep(0.5)
        listener.bind(("127.0.0.1", port))
        listener.listen()

    opener = threading.Thread(target=listen_later)
    opener.start()
    try:
        waited = wait_until_listening(f"127.0.0.1:{port}", timeout=30, interval=0.05)
        opener.join()
        # It returned because the port opened, not because it gave up.
        assert 0.4 <= waited < 30
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            pass
    finally:
        opener.join()
        listener.close()
    # Nothing listening: it gives up after its timeout and lets Flower's retry take over.
    assert wait_until_listening(f"127.0.0.1:{port}", timeout=0.3, interval=0.05) >= 0.3
