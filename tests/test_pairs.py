"""One grammar for ``key=value`` settings: ``gpfl launch`` and ``gpfl supernode`` read the same
text to the same values, Flower reads every Flower-valid line to those values too, and what
``gpfl supernode`` hands ``flower-supernode`` reads back to the values it checked."""

from __future__ import annotations

import argparse
from pathlib import Path

import click
import pytest
from flwr.common.config import parse_config_args

from client import supernode
from deploy.cli import parse_node_configs, parse_pairs
from settings.pairs import PairsError, format_pairs, read_settings

FLOWER_VALID = [
    'partition-id=1 num-partitions=3 client-name="client-1" cap-d-privacy=30.0',
    "num-rounds=3 noise-multiplier=2.5 task='digits' per-layer=true out-dir=\"my runs\" a.b=-1",
    'x="5" y=-1e-300 z=false',
]
FORGIVEN = {
    # Bare words, a value Flower would read as a file, a TOML array: the text as written.
    "mechanisms=gaussian": {"mechanisms": "gaussian"},
    "optima=5,6;4,-4.5": {"optima": "5,6;4,-4.5"},
    "policy-file=/etc/gpfl/policy.toml": {"policy-file": "/etc/gpfl/policy.toml"},
    "x=[1,2]": {"x": "[1,2]"},
    'out-dir="a b=1"': {"out-dir": "a b=1"},
}


def _supernode(text: str) -> list[str]:
    p = argparse.ArgumentParser()
    supernode.add_arguments(p)
    argv = supernode.supernode_argv(p.parse_args(["--node-config", text]))
    return argv


def _both(text: str) -> dict:
    launch = parse_node_configs([f"0:{text}"])[0]
    device = supernode.parse_node_config(text)
    assert launch == device == parse_pairs(text, "--run-config")
    return device


@pytest.mark.parametrize("text", FLOWER_VALID)
def test_a_flower_line_reads_as_flower_reads_it_in_both_commands(text: str) -> None:
    assert _both(text) == parse_config_args([text])


@pytest.mark.parametrize(("text", "want"), FORGIVEN.items())
def test_bare_words_are_strings_in_both_commands(text: str, want: dict) -> None:
    assert _both(text) == want


@pytest.mark.parametrize("text", [*FLOWER_VALID, *FORGIVEN])
def test_flower_supernode_is_handed_the_values_gpfl_checked(text: str) -> None:
    argv = _supernode(text)
    handed = argv[argv.index("--node-config") + 1]
    assert parse_config_args([handed]) == supernode.parse_node_config(text)
    assert handed == format_pairs(supernode.parse_node_config(text))


def test_flower_itself_rejects_what_gpfl_forgives() -> None:
    with pytest.raises(click.ClickException):
        parse_config_args(["optima=5,6;4,-4.5"])
    # ... and skips an item without "=", which gpfl refuses naming the option.
    assert parse_config_args(["a=1 oops"]) == {"a": 1}


@pytest.mark.parametrize("bad", ["a=1 oops", "=3", 'a="unclosed'])
def test_a_malformed_line_is_an_error_naming_the_option(bad: str) -> None:
    with pytest.raises(PairsError, match=r"^--policy"):
        read_settings(bad, "--policy")
    with pytest.raises(SystemExit, match=r"^gpfl: --policy"):
        parse_pairs(bad, "--policy")
    with pytest.raises(supernode.NodeConfigError, match=r"^--node-config"):
        supernode.parse_node_config(bad)
    with pytest.raises(SystemExit, match=r"^gpfl: --node-config"):
        parse_node_configs([f"0:{bad}"])


def test_a_toml_file_is_read_by_both_and_left_to_flower(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('partition-id = 2\nmechanisms = "gaussian"\n')
    want = {"partition-id": 2, "mechanisms": "gaussian"}
    assert _both(str(path)) == want
    argv = _supernode(str(path))
    assert argv[argv.index("--node-config") + 1] == str(path)
    with pytest.raises(SystemExit, match=r"node\.toml"):
        parse_pairs(str(tmp_path / "missing" / "node.toml"), "--policy")
