"""The Simulation Engine on a running two-node Ray cluster (``gpfl launch --ray-address``).

A real cluster on this machine: ``ray start --head`` and a second node joined to it, each with its
own temp dir, ports and resources (2 CPUs and a custom resource each; a ClientApp actor takes 2
CPUs, so Flower puts one actor on each node). Where each client ran is read from each node's own
Ray logs: a device past its cap logs ``client-N declines`` in the log of the Ray worker that ran
it, which lies in that node's temp dir. Everything the cluster started is stopped by PID (the
test process is the child subreaper of the daemons ``ray start`` leaves); ``ray stop`` is never
used, as it would stop every Ray on the machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from client.process_tree import bin_dir, terminate_tree
from deploy.launcher import free_port, launch
from deploy.processes import become_subreaper
from tests.conftest import flower_processes, ledger_spend

pytestmark = pytest.mark.integration

#: A release costs 0.4 (n/ν = 2/5); a device whose cap is 0.5 releases once and then declines.
CAP = 0.5
_DECLINE = re.compile(r"(client-\d+) declines")


def _ray_start(args: list[str], temp_dir: Path, resource: str, env: dict[str, str]) -> None:
    ports = ["--node-manager-port", "--object-manager-port", "--min-worker-port",
             "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
             "--metrics-export-port", "--runtime-env-agent-port"]
    argv = [str(bin_dir() / "ray"), "start", *args, "--node-ip-address", "127.0.0.1",
            "--num-cpus", "2", "--resources", json.dumps({resource: 1}),
            "--temp-dir", str(temp_dir), "--disable-usage-stats", "--max-worker-port", "0"]
    for flag in ports:  # free ports of its own: other Rays may run on this machine
        argv += [flag, str(free_port())]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _node_id(temp_dir: Path) -> str:
    """The Ray node id the raylet started with ``--temp-dir temp_dir`` logged."""
    log = (temp_dir / "session_latest" / "logs" / "raylet.out").read_text()
    match = re.search(r"Setting node ID node_id=([0-9a-f]+)", log)
    assert match, f"no node id in {temp_dir}'s raylet log"
    return match.group(1)


def _declines(temp_dir: Path) -> list[str]:
    """The clients that declined in the Ray workers of the node with ``temp_dir``, in its logs."""
    logs = sorted((temp_dir / "session_latest" / "logs").glob("worker-*.err"))
    return [m.group(1) for log in logs for m in _DECLINE.finditer(log.read_text())]


@pytest.fixture
def two_node_cluster() -> Iterator[tuple[str, dict[str, Path]]]:
    """A Ray head and a worker node on this machine; yields the address and each node's temp dir."""
    become_subreaper()  # the daemons `ray start` leaves are re-parented to this process
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    env = {**os.environ, "PATH": f"{bin_dir()}{os.pathsep}{os.environ['PATH']}"}
    address = f"127.0.0.1:{free_port()}"
    # Short temp dirs of their own: Ray's socket paths must stay under 108 bytes.
    temp = Path(tempfile.mkdtemp(prefix="gpfl-ray-"))
    try:
        _ray_start(["--head", "--port", address.rpartition(":")[2], "--include-dashboard",
                    "false", "--ray-client-server-port", str(free_port())],
                   temp / "head", "gpfl-head", env)
        _ray_start(["--address", address], temp / "worker", "gpfl-worker", env)
        yield address, {name: temp / name for name in ("head", "worker")}
    finally:
        ours = [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in before]
        left = terminate_tree(ours)
        shutil.rmtree(temp, ignore_errors=True)
        assert left == []


@pytest.mark.timeout(400)
def test_the_simulation_engine_runs_clients_on_both_nodes_of_a_ray_cluster(
    tmp_path: Path, no_leftover_processes: None,
    two_node_cluster: tuple[str, dict[str, Path]],
) -> None:
    # Prepare: a head and a worker node, 2 CPUs each, two distinct Ray nodes
    # (no_leftover_processes comes first: it checks after the cluster is stopped).
    address, temp_dirs = two_node_cluster
    assert _node_id(temp_dirs["head"]) != _node_id(temp_dirs["worker"])

    # Execute: 20 virtual users, 10 a round, 3 rounds, on the cluster; every device's policy
    # (the launch's, handed to the workers of both nodes) caps it at one release.
    result = launch(supernodes=20, engine="simulation", ray_address=address,
                    policy={"cap-d-privacy": CAP}, out_dir=tmp_path / "run",
                    echo=lambda _: None, timeout=300,
                    run_config={"num-rounds": 3, "clients-per-round": 10, "patience": 0,
                                "local-epochs": 1, "seed": 3})

    # Assert: the run finished, and each node's own logs name clients that ran there: every
    # decline of the run is in the logs of exactly one of the two nodes, and both have some.
    summary = result.summary
    # Every round ran; a round whose sampled devices had all spent their one release changes
    # nothing, and the run then ends budget-exhausted (it depends on the draw).
    assert result.status in ("complete", "budget-exhausted")
    assert summary["history"][-1]["round"] == 3
    on_node = {name: _declines(temp) for name, temp in temp_dirs.items()}
    assert on_node["head"] and on_node["worker"], on_node
    assert len(on_node["head"]) + len(on_node["worker"]) == sum(
        e["declined"] for e in summary["history"]) > 0
    # Assert: the launch's device policy reached the workers on both nodes: each device
    # released at most once (its cap), into its ledger in the run directory, and the spend
    # reported is what the ledgers hold.
    names = sorted(summary["privacy"]["per_client"])
    spend = ledger_spend(tmp_path / "run" / "ledgers", names)
    for name in names:
        assert spend[name][0] == summary["privacy"]["per_client"][name]["participations"] <= 1
        assert summary["ledgers"]["per_client"][name]["spend"] == pytest.approx(spend[name][1])
    assert flower_processes() == []
