"""The device runner's pin (which runs a device serves) and its command line, without Flower."""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

import pytest

from client import fleet_poll, supernode
from client.pinning import PUBLISHER, AppPin, check_run, installed_app, parse_fab_hashes
from settings import SettingError, check_node_config

ROOT = Path(__file__).resolve().parent.parent
H1, H2 = "a" * 64, "0123456789abcdef" * 4
PIN = AppPin("gpfl/gpfl", "0.1.0")


def test_the_installed_app_is_this_checkouts_pyproject() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pin = installed_app()
    assert pin.fab_id == f"{data['tool']['flwr']['app']['publisher']}/{data['project']['name']}"
    assert pin.version == data["project"]["version"] and not pin.fab_hashes
    # Without a pyproject.toml (a wheel install) metadata and the constant give the same.
    assert data["tool"]["flwr"]["app"]["publisher"] == PUBLISHER


def test_without_a_pyproject_the_installed_metadata_is_used(tmp_path: Path) -> None:
    pin = installed_app(tmp_path)
    assert pin.fab_id == "gpfl/gpfl" and pin.version == installed_app().version


def test_the_pinned_app_is_served() -> None:
    verdict = check_run("gpfl/gpfl", "0.1.0", H1, PIN)
    assert verdict.serve and "gpfl/gpfl 0.1.0" in verdict.reason


@pytest.mark.parametrize(
    ("fab_id", "version", "why"),
    [("gpfl/other", "0.1.0", "not the app installed"),
     ("evil/gpfl", "0.1.0", "not the app installed"),
     ("", "0.1.0", "<no app id>"),
     ("gpfl/gpfl", "0.2.0", "is not the installed '0.1.0'"),
     ("gpfl/gpfl", "", "<no version>")],
)
def test_another_app_or_version_is_refused_naming_it(fab_id: str, version: str, why: str) -> None:
    verdict = check_run(fab_id, version, H1, PIN)
    assert not verdict.serve
    assert why in verdict.reason and f"{fab_id or '<no app id>'}" in verdict.reason


def test_a_hash_list_narrows_the_pin_to_those_fabs() -> None:
    pin = PIN.with_hashes(frozenset({H2}))
    assert check_run("gpfl/gpfl", "0.1.0", H2, pin).serve
    refused = check_run("gpfl/gpfl", "0.1.0", H1, pin)
    assert not refused.serve and H1 in refused.reason and "trusted-fab-hashes" in refused.reason
    # The hash never widens the pin: a listed hash of another app id is still refused.
    assert not check_run("gpfl/other", "0.1.0", H2, pin).serve


def test_trusted_fab_hashes_is_a_checked_device_setting() -> None:
    assert check_node_config({"trusted-fab-hashes": f"{H1},{H2}"})["trusted-fab-hashes"]
    assert parse_fab_hashes(f"{H1},{H2}") == {H1, H2} and parse_fab_hashes("") == frozenset()
    for bad in ("abc", H1.upper(), f"{H1}, {H2}"):
        with pytest.raises(SettingError, match="trusted-fab-hashes"):
            check_node_config({"trusted-fab-hashes": bad})


def test_node_config_is_parsed_as_flower_parses_it() -> None:
    from flwr.common.config import parse_config_args

    text = 'partition-id=1 num-partitions=3 client-name="client-1" cap-d-privacy=30.0'
    assert supernode.parse_node_config(text) == parse_config_args([text])
    with pytest.raises(supernode.NodeConfigError, match=r"^--node-config expects key=value"):
        supernode.parse_node_config("partition-id=1 oops")


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    supernode.add_arguments(p)
    return p.parse_args(list(argv))


def test_flower_flags_are_passed_through_in_process_isolation() -> None:
    argv = supernode.supernode_argv(_args(
        "--superlink", "link:9092", "--root-certificates", "ca.crt",
        "--auth-supernode-private-key", "k", "--node-config", "partition-id=0", "--port", "9200",
        "--", "--max-retries", "3"))
    # Flower's own flower-supernode entry point, through the module that shortens its idle poll.
    assert argv[:6] == [sys.executable, "-P", "-m", "client.fleet_poll", "--fleet-poll-interval",
                        str(fleet_poll.DEFAULT_INTERVAL)]
    assert argv[6:8] == ["--isolation", "process"]
    for pair in (["--superlink", "link:9092"], ["--port", "9200"],
                 ["--root-certificates", "ca.crt"], ["--auth-supernode-private-key", "k"],
                 ["--node-config", "partition-id=0"], ["--max-retries", "3"]):
        i = argv.index(pair[0])
        assert argv[i:i + 2] == pair
    assert "--insecure" not in argv
    ex = supernode.executor_argv(9200, 0.5, 77)
    assert ex[:4] == [sys.executable, "-P", "-m", "client.executor"]
    assert "127.0.0.1:9200" in ex and ex[-2:] == ["--parent-pid", "77"]
    assert ex[ex.index("--poll-interval") + 1] == "0.5"
    # No interval given: the executor's own default, declared once in client.executor.
    assert "--poll-interval" not in supernode.executor_argv(9200, None, 77)


def test_a_bad_node_config_fails_at_once_naming_key_and_value(capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    bad = tmp_path / "policy.toml"
    bad.write_text('mechanisms = "laplace,bogus"\n')
    absent = tmp_path / "absent.csv"
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_text(f'data-path = "{absent}"\n')
    for text, expected in [("partition-id=-1", "partition-id=-1"),
                           ("num-rounds=3", "num-rounds=3"),
                           (f'policy-file="{bad}"', "mechanisms='laplace,bogus'"),
                           (f'policy-file="{tmp_path / "absent.toml"}"', "does not exist"),
                           (f'data-path="{absent}"', f"data-path={str(absent)!r} (from node "
                                                     "config) does not exist"),
                           (f'policy-file="{elsewhere}"',
                            f"data-path={str(absent)!r} (from policy file")]:
        assert supernode.run(_args("--insecure", "--node-config", text)) == 2
        err = capsys.readouterr().err
        assert "nothing started" in err and expected in err, err


def test_the_runner_restarts_a_crashed_executor_and_exits_with_its_supernode(
    monkeypatch: pytest.MonkeyPatch, no_leftover_processes: None
) -> None:
    # Prepare: stand-ins for the two children. The "SuperNode" lives 3 s and exits with 7;
    # the "executor" crashes at once, every time.
    py = sys.executable
    monkeypatch.setattr(supernode, "supernode_argv",
                        lambda *a: [py, "-c", "import time, sys; time.sleep(3); sys.exit(7)"])
    monkeypatch.setattr(supernode, "executor_argv", lambda *a: [py, "-c", "raise SystemExit(3)"])
    lines: list[str] = []

    # Execute
    code = supernode.run(_args("--insecure", "--node-config", "partition-id=0"),
                         echo=lines.append)

    # Assert: restarted (with a growing pause), then ended with the SuperNode's code.
    restarts = [line for line in lines if "restarting it" in line]
    assert code == 7 and len(restarts) >= 2, lines
    assert "in 1 s" in restarts[0] and "in 2 s" in restarts[1]
    assert "exited with code 7" in lines[-1]


def test_gpfl_supernode_refuses_a_bad_node_config_before_starting_anything(
    no_leftover_processes: None
) -> None:
    import subprocess

    from client.process_tree import bin_dir

    done = subprocess.run([str(bin_dir() / "gpfl"), "supernode", "--insecure", "--node-config",
                           'partition-id=0 mechanisms="laplace,bogus"'],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "mechanisms='laplace,bogus'" in done.stderr and "nothing started" in done.stderr


def test_a_bad_node_config_is_refused_before_flower_is_imported() -> None:
    # Why the refusal is quick: the node config is checked with settings and client.policy
    # alone, before flwr (~0.7 s to import) is loaded. Checked in a fresh interpreter.
    import subprocess

    argv = ["supernode", "--insecure", "--node-config", 'mechanisms="bogus"']
    probe = (f"import sys\nfrom deploy.cli import main\ncode = main({argv!r})\n"
             "print(code, 'flwr' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr


def test_a_data_path_that_exists_passes_the_device_check(tmp_path: Path) -> None:
    data = tmp_path / "d.csv"
    data.write_text("a,y\n1,no\n")
    assert supernode.check_device({"data-path": str(data)}) == "node config"
