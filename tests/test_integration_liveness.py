"""A ServerApp held up longer than Flower's heartbeat window, over real processes.

Flower 1.39's SuperLink gives a claimed ServerApp task 30 s to send its first heartbeat and 60 s
between two, then refuses its token. ``gpfl launch`` starts the run's ServerApp itself, warm
before it claims the run (:mod:`deploy.serverapp_runner`). These tests hold the ServerApp
process with SIGSTOP (alive to the OS, silent to the SuperLink, as on a host too loaded to
schedule it) and check what the launch does: held as it appears, it completes, later; held after
its claim past the window, the launch ends within a bound with one line naming the refusal;
held for good, it ends at its start-up deadline. Every time: one ServerApp process for the run,
and nothing left running (by PID).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from deploy.launcher import LaunchError, describe, launch
from deploy.processes import CLAIMED_MARK
from tests.conftest import flower_processes

pytestmark = pytest.mark.integration

#: Flower's window for a claimed task's first heartbeat, and between two (30 s, 2 x 30 s).
FIRST_WINDOW_S, WINDOW_S = 30.0, 60.0
RUN_CONFIG = {"num-rounds": 2, "clients-per-round": 2, "patience": 0, "seed": 1}


def _is_serverapp(proc: psutil.Process) -> bool:
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return False
    return "deploy.serverapp_runner" in cmd or any(
        Path(part).name == "flwr-serverapp" for part in cmd[:2])


class Holder:
    """Hold every ServerApp process of this test with SIGSTOP, each for ``hold_s`` seconds.

    ``ready(pid)`` says when a process is to be held (default: as soon as it appears). Every
    held process is let go at the end, whatever happened (``close``).
    """

    def __init__(self, hold_s: float, ready: Callable[[int], bool] = lambda pid: True) -> None:
        self.hold_s, self.ready = hold_s, ready
        self.seen: dict[int, float] = {}
        self.held: dict[int, float] = {}
        self.released: dict[int, float] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Holder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        for pid in self.held:
            if pid not in self.released:
                _signal(pid, signal.SIGCONT)

    def _run(self) -> None:
        while not self._done.wait(0.02):
            now = time.monotonic()
            for proc in psutil.Process().children(recursive=True):
                if proc.pid not in self.seen and _is_serverapp(proc) \
                        and not _inside_a_serverapp(proc):
                    self.seen[proc.pid] = now
            for pid in self.seen:
                if pid not in self.held and self.ready(pid):
                    _signal(pid, signal.SIGSTOP)
                    self.held[pid] = time.monotonic()
                elif pid in self.held and pid not in self.released \
                        and now - self.held[pid] >= self.hold_s:
                    _signal(pid, signal.SIGCONT)
                    self.released[pid] = time.monotonic()


def _inside_a_serverapp(proc: psutil.Process) -> bool:
    """Whether ``proc`` descends from a ServerApp process (a fork of it keeps its command line).

    Such a child is part of that ServerApp, not a second one; stopping the ServerApp's process
    group is the launcher's business, and the leftover check covers it.
    """
    try:
        return any(_is_serverapp(parent) for parent in proc.parents())
    except psutil.Error:
        return False


def _signal(pid: int, signum: int) -> None:
    try:
        psutil.Process(pid).send_signal(signum)
    except psutil.NoSuchProcess:
        pass


@pytest.mark.timeout(300)
def test_a_serverapp_held_as_it_appears_still_runs_the_launch(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: every ServerApp process is stopped the moment it appears, for longer than
    # Flower's window for a first heartbeat (under Flower's own SuperExec, which starts the
    # process after claiming the run, each such process was refused and another started).
    hold = FIRST_WINDOW_S + 10

    # Execute
    started = time.monotonic()
    with Holder(hold) as holder:
        result = launch(supernodes=2, out_dir=tmp_path / "run", echo=lambda _: None,
                        timeout=240, run_config=RUN_CONFIG)
    took = time.monotonic() - started

    # Assert: the run completed, later, with one ServerApp process, held once.
    assert result.status == "complete" and result.summary["last_round"] == 2
    assert len(holder.seen) == 1 and len(holder.held) == 1, holder.seen
    assert took >= hold
    print(f"held {hold:.0f} s as it appeared; the launch completed in {took:.1f} s")
    assert flower_processes() == []


@pytest.mark.timeout(300)
def test_a_serverapp_held_past_the_window_after_its_claim_ends_the_launch_with_its_reason(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: the ServerApp is stopped as soon as its log says it claimed the run (its first
    # heartbeats are sent around then), for longer than any window Flower gives.
    out = tmp_path / "run"
    log = out / "logs" / "serverapp.log"
    hold = WINDOW_S + 10

    def claimed(pid: int) -> bool:
        try:
            return CLAIMED_MARK in log.read_text(errors="replace")
        except OSError:
            return False

    # Execute
    with Holder(hold, ready=claimed) as holder, pytest.raises(LaunchError) as failed:
        launch(supernodes=2, out_dir=out, echo=lambda _: None, timeout=240,
               run_config=RUN_CONFIG)
    ended = time.monotonic()

    # Assert: one line saying the SuperLink gave the ServerApp up, and what to try, within
    # Flower's window and the launcher's grace after the hold began (Flower ends the run while
    # the process is still held: the launch does not wait for it); one ServerApp process for
    # the run, and nothing left running.
    message = str(failed.value)
    assert "\n" not in message
    assert "ServerApp" in message and "heartbeat" in message and "try again" in message
    assert len(holder.seen) == 1 and len(holder.held) == 1, holder.seen
    after_hold = ended - next(iter(holder.held.values()))
    print(f"held {hold:.0f} s after its claim; the launch ended {after_hold:.1f} s after the "
          f"hold began: {message}")
    assert after_hold < WINDOW_S + 30
    assert flower_processes() == []


@pytest.mark.timeout(300)
def test_a_serverapp_held_mid_run_leaves_the_run_incomplete_and_resumable(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: once round 1 is recorded, the ServerApp is stopped for good (past Flower's
    # heartbeat window: the SuperLink ends the run while the process is still there).
    seen_round: list[float] = []

    def after_round_1(line: str, fed: object) -> None:
        if "[gpfl] round 1/" in line and not seen_round:
            seen_round.append(time.monotonic())

    # Execute
    with Holder(3600, ready=lambda pid: bool(seen_round)) as holder:
        result = launch(supernodes=2, out_dir=tmp_path / "run", echo=lambda _: None,
                        timeout=240, run_config={**RUN_CONFIG, "num-rounds": 30},
                        on_line=after_round_1)
    ended = time.monotonic()

    # Assert: incomplete after round 1, the reason in one line, resumable; within Flower's
    # window and the launcher's grace of the hold.
    after_hold = ended - next(iter(holder.held.values()))
    reason = result.summary["incomplete_reason"]
    print(f"held mid-run; the launch ended {after_hold:.1f} s after the hold began: {reason}")
    assert result.status == "incomplete" and result.summary["last_round"] >= 1
    assert "heartbeat" in reason and "try again" in reason and "\n" not in reason
    assert "gpfl launch --resume" in describe(result)
    assert len(holder.seen) == 1
    # Flower's window, its lazy expiry and the stream's end, the launcher's 8 s grace and the
    # 5 s a stopped process takes to be killed (79 s measured).
    assert after_hold < WINDOW_S + 40
    assert flower_processes() == []


@pytest.mark.timeout(200)
def test_a_serverapp_that_never_starts_ends_the_launch_at_its_startup_deadline(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: the ServerApp is stopped as it appears and never let go during the launch.
    deadline = 20.0

    # Execute
    started = time.monotonic()
    with Holder(3600) as holder, pytest.raises(LaunchError) as failed:
        launch(supernodes=2, out_dir=tmp_path / "run", echo=lambda _: None, timeout=240,
               run_config=RUN_CONFIG, startup_timeout=deadline)
    took = time.monotonic() - started

    # Assert: ended at the deadline (plus start and stop), saying what to try; the stopped
    # process was ended too (by PID).
    message = str(failed.value)
    assert f"did not start within {deadline:.0f} s" in message
    assert "--startup-timeout" in message and "\n" not in message
    assert len(holder.seen) == 1
    print(f"start-up deadline {deadline:.0f} s: the launch ended after {took:.1f} s")
    assert deadline <= took < deadline + 45
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                   for pid in holder.seen)
    assert flower_processes() == []


#: CPU hogs started beside the launch: on 2 cores, four busy processes at the federation's own
#: priority leave it about a third of the machine.
HOGS = 4


@pytest.mark.timeout(300)
def test_a_small_launch_completes_with_cpu_hogs_beside_it(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: busy loops, each its own process, for the whole launch.
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(HOGS)]

    # Execute
    started = time.monotonic()
    try:
        result = launch(supernodes=2, out_dir=tmp_path / "run", echo=lambda _: None,
                        timeout=240, run_config=RUN_CONFIG)
    finally:
        load = os.getloadavg()[0]
        for hog in hogs:
            hog.kill()
            hog.wait()
    took = time.monotonic() - started

    # Assert: the launch completed, slower, with one ServerApp for the run.
    assert result.status == "complete" and result.summary["last_round"] == 2
    log = (tmp_path / "run" / "logs" / "serverapp.log").read_text(errors="replace")
    assert log.count(CLAIMED_MARK) == 1
    print(f"{HOGS} CPU hogs (load average {load:.1f}): the launch completed in {took:.1f} s")
    assert flower_processes() == []
