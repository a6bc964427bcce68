"""TLS and SuperNode authentication with real Flower processes.

A SuperLink and three SuperNodes on this machine run Flower's own FedAvg app
(``experiments/benchmarks/fedavg_baseline``, Flower + NumPy only) for two rounds:

* every connection encrypted: the run finishes;
* one SuperNode trusts the wrong CA: its TLS handshake fails, it is never part
  of the federation, and the run finishes with the other two;
* authentication on, one SuperNode's key unregistered: it is refused when it
  activates, and the run finishes with the two registered ones.

``gpfl launch --auth`` (keys made and registered, the gpfl app over TLS) runs in
tests/test_integration_key_identity.py, whose federation checks it too.

Each test ends with no process of its own left running.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from deploy.certs import make_local_tls, make_supernode_keys
from deploy.launcher import Federation, stream_lines

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

APP = Path(__file__).resolve().parent.parent / "experiments" / "benchmarks" / "fedavg_baseline"
ROUNDS = 2


def _descendants() -> set[int]:
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[Federation]:
    """A Federation that must leave no descendant process behind after ``close()``."""
    before = _descendants()
    tls = make_local_tls(tmp_path / "certs")
    # Flower's FedAvg app is the yardstick here: these SuperNodes run it the way Flower does
    # (a device runner refuses another app). `launch(auth=True)` below covers the runner with
    # TLS and authentication.
    fed = Federation(workdir=tmp_path, tls=tls, device_runner=False)
    try:
        yield fed
    finally:
        started = list(fed.procs.procs.values())
        left_by_close = fed.close()
        for proc in started:
            # close() reaped them through psutil; let each Popen see it, and
            # close the pipe of `flwr run` (else ResourceWarnings, errors here).
            proc.poll()
            if proc.stdout is not None:
                proc.stdout.close()
        left = _descendants() - before
        detail = []
        for pid in left:
            try:
                detail.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:100]}")
            except psutil.NoSuchProcess:
                continue
        assert not left_by_close, f"close() could not stop {left_by_close}"
        assert not detail, f"processes left running: {detail}"


def run_to_end(fed: Federation, clients: int) -> list[str]:
    """Submit the FedAvg app for ``ROUNDS`` rounds over ``clients`` clients; return its log."""
    proc = fed.submit(APP, {"num-rounds": ROUNDS, "clients-per-round": clients})
    lines = list(stream_lines(proc, fed.logs / "flwr-run.log", timeout=100))
    text = "\n".join(lines)
    assert proc.returncode == 0, text[-3000:]
    assert f"Run finished {ROUNDS} round(s)" in text, text[-3000:]
    assert f"received {clients} results and 0 failures" in text, text[-3000:]
    return lines


def wait_for_exit(fed: Federation, name: str, timeout: float = 30) -> tuple[int, str]:
    """Wait until process ``name`` exits on its own; return its exit status and its log.

    A SuperNode that the SuperLink refuses (failed TLS handshake, activation refused) gives up
    at once and exits: its exit is the event to wait for, and once it has exited its log is
    complete. If it is still running after ``timeout`` seconds the test fails, showing the log.
    """
    proc = fed.procs.procs[name]
    path = fed.logs / f"{name}.log"
    try:
        status = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        text = path.read_text(errors="replace") if path.exists() else ""
        raise AssertionError(
            f"{name} still runs after {timeout} s; {path}:\n{text[-3000:]}"
        ) from None
    return status, path.read_text(errors="replace")


def served(fed: Federation, index: int) -> bool:
    """Whether SuperNode ``index`` took part in the run (it sent a reply)."""
    path = fed.logs / f"supernode-{index}.log"
    return path.exists() and "Sent successfully" in path.read_text(errors="replace")


def test_tls_federation_finishes_and_a_wrong_ca_is_refused(
    federation: Federation, tmp_path: Path
) -> None:
    # Prepare: a TLS SuperLink, three SuperNodes that trust its CA and a fourth that trusts
    # another CA (same names, other key).
    fed = federation
    wrong = make_local_tls(tmp_path / "wrong-ca")
    fed.start_superlink()
    for i in range(3):
        fed.start_supernode(i, {"partition-id": i, "num-partitions": 4})
    fed.start_supernode(3, {"partition-id": 3, "num-partitions": 4},
                        root_certificates=wrong.ca_cert)

    # Execute + Assert: the fourth gives up on the handshake; the run of the other three
    # goes to its end, encrypted.
    status, log = wait_for_exit(fed, "supernode-3")
    assert status != 0 and "CERTIFICATE_VERIFY_FAILED" in log, log[-3000:]
    assert "SuperNode ID" not in log
    run_to_end(fed, clients=3)
    assert all(served(fed, i) for i in range(3))
    assert not served(fed, 3)
    superlink_argv = list(fed.procs.procs["superlink"].args)  # type: ignore[arg-type]
    assert "--insecure" not in superlink_argv and "--ssl-certfile" in superlink_argv
    assert "root-certificates" in (fed.flwr_home / "config.toml").read_text()


def test_unregistered_key_is_refused_and_run_goes_on(federation: Federation,
                                                     tmp_path: Path) -> None:
    fed = federation
    keys = make_supernode_keys(tmp_path / "keys", 3)
    fed.start_superlink(extra_args=["--enable-supernode-auth"])
    for key in keys[:2]:  # the third key is never registered
        assert "registered successfully" in fed.register_supernode(key.public_key)
    for i, key in enumerate(keys):
        fed.start_supernode(i, {"partition-id": i, "num-partitions": 3},
                            extra_args=["--auth-supernode-private-key", str(key.private_key)])
    status, log = wait_for_exit(fed, "supernode-2")
    assert status != 0 and "Failed to activate SuperNode" in log, log[-3000:]
    assert "SuperNode ID" not in log
    run_to_end(fed, clients=2)
    assert served(fed, 0) and served(fed, 1)
    assert not served(fed, 2)
