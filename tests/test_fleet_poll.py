"""The SuperNode's shorter waits and its wake-up of the executor (client.fleet_poll); the executor
waits for its SuperNode (client.executor)."""

from __future__ import annotations

import argparse
import inspect
import math
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from client import fleet_poll, supernode
from client.executor import idle_wait, wait_until_listening


def test_the_clock_caps_every_sleep_and_is_time_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    clock = fleet_poll.IdleClock(0.5)
    # Flower's idle poll (3 s) and its waits in memory (0.5 s), then shorter ones.
    for seconds in (3, 1.0, 0.5, 0.1, 0.01, 0):
        clock.sleep(seconds)
    assert slept == [0.5, 0.5, fleet_poll.LOCAL_WAIT, fleet_poll.LOCAL_WAIT, 0.01, 0]
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
    sci.time.sleep(0.5)
    assert slept == [0.25, fleet_poll.LOCAL_WAIT]
    assert not fleet_poll.patch(sci, 0.25)  # patched once; a module without `time`: untouched
    # Its waits in memory are the literal 0.5 s sleeps of the reply path.
    assert "time.sleep(0.5)" in inspect.getsource(sci._push_messages)


def test_a_stored_message_writes_one_byte_and_a_full_pipe_never_blocks() -> None:
    stored = iter([None, 7, None, 8])
    read_end, write_end = os.pipe()
    try:
        os.set_blocking(write_end, False)
        os.set_blocking(read_end, False)
        pull = fleet_poll.notify_after(lambda **_: next(stored), write_end)
        # Execute: no message, a message (run 7), no message, a message (run 8).
        results = [pull(state=None) for _ in range(4)]
        # Assert: the run ids pass through; one byte per stored message, none otherwise.
        assert results == [None, 7, None, 8]
        assert os.read(read_end, 100) == b"\x01\x01"
        # A pipe nobody drained: the SuperNode goes on (the executor has bytes waiting).
        while True:
            try:
                os.write(write_end, b"\x00" * 65536)
            except BlockingIOError:
                break
        assert fleet_poll.notify_after(lambda: 3, write_end)() == 3
    finally:
        os.close(read_end)
        os.close(write_end)
    # The reader gone: no BrokenPipeError reaches Flower's loop either.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        assert fleet_poll.notify_after(lambda: 4, write_end)() == 4
    finally:
        os.close(write_end)


def test_the_wake_up_patch_point_exists_in_the_installed_flower(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Flower's SuperNode loop calls `_pull_and_store_message` through its module's global name
    # and it returns the run id of a stored message: the one name the wake-up replaces.
    from flwr.supernode import start_client_internal as sci

    assert "run_id = _pull_and_store_message(" in inspect.getsource(sci.start_client_internal)
    original = sci._pull_and_store_message
    monkeypatch.setattr(sci, "_pull_and_store_message", original)  # restored after the test
    read_end, write_end = os.pipe()
    try:
        assert fleet_poll.patch_notify(sci, write_end)
        assert sci._pull_and_store_message is not original
        assert sci._pull_and_store_message.__wrapped__ is original
    finally:
        os.close(read_end)
        os.close(write_end)
    assert not fleet_poll.patch_notify(argparse, 1)  # a module without it: untouched


def test_the_executor_wakes_on_a_byte_and_reads_them_all() -> None:
    stop = threading.Event()
    read_end, write_end = os.pipe()
    try:
        os.set_blocking(read_end, False)
        os.write(write_end, b"\x01\x01\x01")
        # Woken: it returns True at once (a 60 s wait would time the test out) and drains.
        assert idle_wait(stop, 60.0, read_end)
        with pytest.raises(BlockingIOError):
            os.read(read_end, 1)
        # Nothing written: it waits its poll interval and says so.
        assert not idle_wait(stop, 0.05, read_end)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert not idle_wait(stop, 0.01, None)  # no pipe: a plain wait


def test_the_runner_starts_flowers_supernode_through_the_patch(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    supernode.add_arguments(p)
    argv = supernode.supernode_argv(p.parse_args(["--fleet-poll-interval", "1.5", "--insecure"]))
    assert argv[3:6] == ["client.fleet_poll", "--fleet-poll-interval", "1.5"]
    assert fleet_poll.NOTIFY_FLAG not in argv
    # With the executor's pipe: its write end for the SuperNode, its read end for the executor.
    argv = supernode.supernode_argv(p.parse_args(["--insecure"]), notify_fd=7)
    assert argv[6:9] == [fleet_poll.NOTIFY_FLAG, "7", "--isolation"]
    ex = supernode.executor_argv(9200, None, 77, wake_fd=8)
    assert ex[ex.index("--wake-fd") + 1] == "8"
    for bad in ("0", "4", "nan"):
        assert supernode.run(p.parse_args(["--insecure", "--fleet-poll-interval", bad])) == 2
        err = capsys.readouterr().err
        assert f"--fleet-poll-interval={float(bad)!r}" in err, err


def test_main_refuses_a_missing_interval_before_flower_starts() -> None:
    with pytest.raises(SystemExit, match="--fleet-poll-interval needs a number"):
        fleet_poll.main(["--fleet-poll-interval"])
    with pytest.raises(SystemExit, match=r"--task-notify-fd needs a file descriptor, got \['x'\]"):
        fleet_poll.main(["--fleet-poll-interval", "0.5", "--task-notify-fd", "x"])
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
