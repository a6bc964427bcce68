"""The deployment files (deploy/): compose files, image entry point, smoke script. No containers.

The containers themselves run in deploy/smoke.sh (tests/test_deploy_smoke.py).
"""

from __future__ import annotations

import re
import shlex
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
SUPERNODES = ("supernode-0", "supernode-1", "supernode-2")


def load(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((DEPLOY / name).read_text())
    assert isinstance(doc, dict)
    return doc


def node_config(service: dict[str, Any]) -> dict[str, str]:
    cmd = service["command"]
    text = cmd[cmd.index("--node-config") + 1]
    return dict(item.split("=", 1) for item in shlex.split(text, posix=False))


def test_compose_superlink() -> None:
    link = load("compose.yml")["services"]["superlink"]
    cmd = link["command"]
    assert cmd[0] == "superlink"
    assert "--host=0.0.0.0" in cmd and "--fleet-api-address=0.0.0.0:9092" in cmd
    # No SuperExec: the `serverapp` service is the ServerApp, one warm process a run.
    assert "--disable-runtime-dependency-installation" in cmd and "--isolation=process" in cmd
    assert "--insecure" not in cmd  # security comes from the entry point (TLS override)
    for port in link["ports"]:
        assert port.startswith("127.0.0.1:"), f"published beyond localhost: {port}"


def test_compose_serverapp_serves_the_superlink_and_writes_the_results() -> None:
    doc = load("compose.yml")
    serverapp = doc["services"]["serverapp"]
    assert serverapp["command"] == ["serverapp"]
    assert serverapp["depends_on"] == ["superlink"]
    assert any(v.startswith("results:") for v in serverapp["volumes"])
    assert serverapp["working_dir"] == "/data/results"
    # With TLS it trusts the SuperLink's CA, as the other clients of its API do.
    tls = load("compose.tls.yml")["services"]
    assert tls["serverapp"] == tls["submit"]


def test_compose_supernodes_have_their_own_partition_ledger_and_budget() -> None:
    doc = load("compose.yml")
    services = doc["services"]
    configs = {name: node_config(services[name]) for name in SUPERNODES}
    assert sorted(c["partition-id"] for c in configs.values()) == ["0", "1", "2"]
    assert all(c["num-partitions"] == "3" for c in configs.values())
    assert any("cap-d-privacy" in c for c in configs.values())
    volumes = [services[name]["volumes"][0].split(":")[0] for name in SUPERNODES]
    assert len(set(volumes)) == 3 and all(v in doc["volumes"] for v in volumes)
    for name, c in configs.items():
        target = services[name]["volumes"][0].split(":")[1]
        ledger = c.get("ledger-dir", c.get("ledger-path", "")).strip('"')
        assert ledger.startswith(target), f"{name}'s ledger {ledger} is not in its volume"
        assert "--superlink=superlink:9092" in services[name]["command"]
        assert "deploy" not in services[name]  # no GPU reservation outside compose.gpu.yml


def test_node_configs_are_valid_device_settings() -> None:
    from flwr.common.config import parse_config_args

    from settings import check_node_config

    for name in SUPERNODES:
        cmd = load("compose.yml")["services"][name]["command"]
        # Parsed as flower-supernode parses --node-config.
        parsed = parse_config_args([cmd[cmd.index("--node-config") + 1]])
        assert check_node_config(parsed)["partition-id"] == int(name.rsplit("-", 1)[1])


def test_overrides() -> None:
    tls = load("compose.tls.yml")["services"]
    assert tls["superlink"]["environment"]["GPFL_TLS_DIR"] == "/certs"
    for name in (*SUPERNODES, "submit"):
        mounts = tls[name]["volumes"]
        assert all(m.endswith(":ro") for m in mounts)
        assert not any("server.key" in m or "supernodes" in m for m in mounts)
    auth = load("compose.auth.yml")["services"]
    assert auth["superlink"]["environment"]["GPFL_SUPERNODE_AUTH"] == "1"
    for i, name in enumerate(SUPERNODES):
        (mount,) = auth[name]["volumes"]
        assert f"supernode-{i}.key:" in mount and mount.endswith(":ro")
    gpu = load("compose.gpu.yml")["services"]
    for name in SUPERNODES:
        devices = gpu[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]
        assert 'device="cuda"' in gpu[name]["environment"]["GPFL_NODE_CONFIG_EXTRA"]


def test_compose_files_follow_the_compose_specification() -> None:
    # A structural check without a schema download: top-level keys of the spec only.
    allowed = {"name", "services", "volumes", "networks", "configs", "secrets", "include",
               "version"}
    for name in ("compose.yml", "compose.tls.yml", "compose.auth.yml", "compose.gpu.yml"):
        keys = {k for k in load(name) if not k.startswith("x-")}
        assert keys <= allowed, (name, keys - allowed)


def test_dockerfile_runs_unprivileged_and_bakes_in_no_secret() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")
    copies = re.findall(r"^COPY\s+(.+)$", text, re.M)
    assert not any(re.search(r"cert|\.key|\.pem|secret", c) for c in copies), copies
    for arg in ("TORCH_SPEC", "TORCH_INDEX_URL", "PIP_EXTRA"):
        assert re.search(rf"^ARG {arg}\b", text, re.M), arg
    ignore = (DEPLOY.parent / ".dockerignore").read_text()
    assert ".venv/" in ignore and "certs/" in ignore


def test_scripts_are_valid_bash() -> None:
    for name in ("smoke.sh", "entrypoint.sh"):
        path = DEPLOY / name
        assert path.stat().st_mode & stat.S_IXUSR, f"{name} is not executable"
        subprocess.run(["bash", "-n", str(path)], check=True)


@pytest.fixture
def stub_path(tmp_path: Path) -> Path:
    """A PATH whose Flower commands print their arguments, one per line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for cmd in ("flower-superlink", "flower-supernode", "flower-superexec", "flwr", "gpfl"):
        stub = bin_dir / cmd
        stub.write_text(f'#!/bin/sh\necho {cmd}; for a in "$@"; do echo "$a"; done\n')
        stub.chmod(0o755)
    return bin_dir


def entrypoint(stub_path: Path, *args: str, **env: str) -> list[str]:
    base = {"PATH": f"{stub_path}:/usr/bin:/bin", "HOME": str(stub_path.parent),
            "FLWR_HOME": str(stub_path.parent / "flwr")}
    out = subprocess.run([str(DEPLOY / "entrypoint.sh"), *args], env={**base, **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_entrypoint_security_from_environment(stub_path: Path, tmp_path: Path) -> None:
    assert entrypoint(stub_path, "superlink", "--port=8000") == [
        "flower-superlink", "--insecure", "--port=8000"]
    certs = tmp_path / "certs"
    certs.mkdir()
    for f in ("ca.crt", "server.pem", "server.key"):
        (certs / f).write_text("x")
    argv = entrypoint(stub_path, "superlink", GPFL_TLS_DIR=str(certs), GPFL_SUPERNODE_AUTH="1")
    assert argv[:7] == ["flower-superlink", "--ssl-ca-certfile", f"{certs}/ca.crt",
                        "--ssl-certfile", f"{certs}/server.pem", "--ssl-keyfile",
                        f"{certs}/server.key"]
    assert "--enable-supernode-auth" in argv and "--insecure" not in argv
    key = tmp_path / "node.key"
    key.write_text("k")
    argv = entrypoint(stub_path, "supernode", "--superlink=superlink:9092", "--node-config",
                      "partition-id=1 num-partitions=3", GPFL_TLS_DIR=str(certs),
                      GPFL_AUTH_KEY=str(key), GPFL_NODE_CONFIG_EXTRA='device="cuda"')
    # A device runs the gpfl client installed in the image (gpfl supernode), never the FAB.
    assert argv == ["gpfl", "supernode", "--root-certificates", f"{certs}/ca.crt",
                    "--auth-supernode-private-key", str(key), "--superlink=superlink:9092",
                    "--node-config", 'partition-id=1 num-partitions=3 device="cuda"']


def test_entrypoint_submit_writes_the_connection(stub_path: Path, tmp_path: Path) -> None:
    argv = entrypoint(stub_path, "submit", "--run-config", "num-rounds=2",
                      GPFL_SUPERLINK="superlink:8000")
    # gpfl submit: flwr run --stream, followed within deadlines.
    assert argv == ["gpfl", "submit", "/app", "deploy", "--run-config", "num-rounds=2"]
    config = (tmp_path / "flwr" / "config.toml").read_text()
    assert 'address = "superlink:8000"' in config and "insecure = true" in config


def test_entrypoint_serverapp_serves_the_superlinks_runtime_api(stub_path: Path,
                                                                tmp_path: Path) -> None:
    assert entrypoint(stub_path, "serverapp") == [
        "gpfl", "serverapp", "--superlink", "superlink:8000"]
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.crt").write_text("x")
    assert entrypoint(stub_path, "serverapp", GPFL_TLS_DIR=str(certs),
                      GPFL_SUPERLINK="link:9000") == [
        "gpfl", "serverapp", "--superlink", "link:9000", "--root-certificates",
        f"{certs}/ca.crt"]


def test_entrypoint_refuses_unreadable_certificates(stub_path: Path, tmp_path: Path) -> None:
    env = {"PATH": f"{stub_path}:/usr/bin:/bin", "GPFL_TLS_DIR": str(tmp_path / "missing")}
    done = subprocess.run([str(DEPLOY / "entrypoint.sh"), "supernode"], env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "cannot read" in done.stderr

