"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from mechanisms import PrivacyLedger


def descendants() -> set[int]:
    """The PIDs of this test process's descendants now."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def started_since(before: set[int]) -> list[str]:
    """``"pid name"`` of the live descendants that are not in ``before``."""
    return [f"{p.pid} {p.name()}" for p in psutil.Process().children(recursive=True)
            if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]


def close_federation(fed: Any, before: set[int]) -> None:
    """Close a test's federation and fail if it left any process behind (by PID)."""
    left = fed.close()
    assert not left
    stray = started_since(before)
    assert not stray and flower_processes() == [], stray


@pytest.fixture
def no_leftover_processes() -> Iterator[None]:
    """Fail if the test leaves any process it started behind."""
    before = descendants()
    yield
    left = started_since(before)
    assert not left, f"processes left running: {left}"


def flower_processes() -> list[str]:
    """Flower processes on this machine that are descendants of this test process."""
    names = ("flower-superlink", "flower-supernode", "client.fleet_poll", "flower-superexec",
             "flwr-serverapp", "flwr-clientapp", "deploy.serverapp_runner")
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if any(n in cmd for n in names):
            out.append(f"{p.pid} {cmd[:80]}")
    return out


def ledger_spend(folder: Path, names: Iterable[str]) -> dict[str, tuple[int, float]]:
    """Releases and d-privacy spend in each named device's ledger under ``folder``."""
    out = {}
    for name in names:
        path = folder / f"{name}.json"
        s = PrivacyLedger(path, delta=1e-5).spent() if path.exists() else None
        out[name] = (s.releases, s.d_privacy) if s else (0, 0.0)
    return out


def write_task_plugin(folder: Path, name: str, target: str = "tasks.synthetic:SyntheticTask"
                      ) -> Path:
    """Write an installed distribution's metadata registering task ``name`` into ``folder``.

    What pip leaves for a package that declares the task in its ``gpfl.tasks`` entry points;
    ``folder`` on the import path makes it installed. Returns ``folder``.
    """
    info = folder / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[gpfl.tasks]\n{name} = {target}\n")
    return folder


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the longest files first: ``slow`` ones, then ``integration`` ones, then the rest.

    ``./gpfl.sh test`` hands whole files to two workers in collection order; starting the two
    long experiment files at once and filling in with the short ones keeps the workers' loads
    even (longest-processing-time-first). The sort is stable: a file keeps its own order.
    """
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 item.get_closest_marker("integration") is None))


#: Lines kept from the end of each process log a failed real-process test leaves.
LOG_TAIL_LINES = 40


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[None]:
    """Attach the tail of every process log under a failed test's ``tmp_path`` to its report.

    A real-process test that fails on a loaded CI host is rarely reproduced at will; the
    SuperLink's, the ServerApp's and each SuperNode's own words about the run are what tell a
    lost message from a slow reconnect, so they are printed with the failure.
    """
    report = yield
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if report.failed and isinstance(tmp_path, Path) and tmp_path.is_dir():
        for log in sorted(tmp_path.rglob("logs/*.log")):
            lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            report.sections.append((f"log {log.relative_to(tmp_path)}", "\n".join(lines)))
    return report
