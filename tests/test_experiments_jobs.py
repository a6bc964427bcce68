"""``python -m experiments all --jobs N``: the order, the limits and the clean-up of the processes.

Each "experiment" is a short Python process that writes when it starts and ends (monotonic clock)
to a log; the schedule is read back from that log.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.core import jobs

SCRIPT = """
import sys, time
log, name, seconds, code = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
with open(log, "a") as fh: fh.write(f"start {name} {time.monotonic()}\\n")
time.sleep(seconds)
with open(log, "a") as fh: fh.write(f"end {name} {time.monotonic()}\\n")
sys.exit(code)
"""


def schedule(log: Path) -> dict[str, tuple[float, float]]:
    times: dict[str, dict[str, float]] = {}
    for line in log.read_text().splitlines():
        event, name, t = line.split()
        times.setdefault(name, {})[event] = float(t)
    return {name: (t["start"], t["end"]) for name, t in times.items()}


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_jobs_run_side_by_side_scale_alone_and_leakage_after_its_federations(
        tmp_path: Path) -> None:
    log = tmp_path / "log"
    names = ["synthetic-ablation", "accuracy-vs-nu", "leakage", "fairness", "scale", "dlg"]
    failing = {"dlg"}

    def command(name: str) -> list[str]:
        return [sys.executable, "-c", SCRIPT, str(log), name, "0.6",
                "3" if name in failing else "0"]

    failed = jobs.run_jobs(names, command, 2)
    ran = schedule(log)
    assert failed == ["dlg"]
    assert set(ran) == set(names)
    # scale shares the machine with no one.
    assert not any(overlap(ran["scale"], ran[n]) for n in names if n != "scale")
    # leakage starts once accuracy-vs-nu has ended.
    assert ran["leakage"][0] >= ran["accuracy-vs-nu"][1]
    # Two at a time, never three.
    starts = sorted(t for t, _ in ran.values())
    for t in starts:
        assert sum(s <= t < e for s, e in ran.values()) <= 2
    assert overlap(ran["synthetic-ablation"], ran["accuracy-vs-nu"])


def test_jobs_refuses_a_count_below_one() -> None:
    with pytest.raises(ValueError, match="--jobs must be >= 1, got 0"):
        jobs.run_jobs(["dlg"], lambda name: ["true"], 0)


def test_a_stopped_experiment_leaves_no_process_it_started(tmp_path: Path) -> None:
    # An experiment that started two children which ignore nothing, one of them in a session
    # of its own (as a federation's processes are): all three must end.
    # Each process writes its own pid once it is what it will be: the second child writes after
    # setsid() has run, so the check on its group below cannot race the child's start.
    files = [tmp_path / name for name in ("child", "own-session", "shell")]
    proc = subprocess.Popen(
        ["sh", "-c", f"sleep 60 & echo $! > {files[0]}; "
                     f"setsid sh -c 'echo $$ > {files[1]}; exec sleep 60' & "
                     f"echo $$ > {files[2]}; wait"],
        start_new_session=True)
    deadline = time.monotonic() + 10
    while not all(f.exists() and f.read_text().strip() for f in files) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    started = [int(f.read_text()) for f in files]
    assert os.getpgid(started[1]) != os.getpgid(started[2])  # the second is in another group
    jobs._stop(proc)
    assert proc.returncode is not None
    # A signalled process ends when the scheduler next runs it: wait for that, not a fixed time.
    deadline = time.monotonic() + 10
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in started if alive(p)] == []


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie, ended but not yet reaped by its parent, does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status
