"""The commands that README.md and docs/*.md show still work: a renamed flag, subcommand, module
or setting key fails here.

Every ``gpfl``, ``./gpfl.sh``, ``gpfl-experiment`` and ``python -m ...`` command in a ```bash
block is parsed by the command's own argument parser, with its ``--run-config`` /
``--node-config`` / ``--policy`` values read by gpfl's grammar and checked against the settings'
declarations; one in inline code (often a bare mention) must name a real subcommand and real
options. A few cheap ones really run (``gpfl --help``, ``gpfl certs``, ``python -m settings
--markdown`` against the committed docs/SETTINGS.md), and the examples of output the docs quote
(an error message, the wire table's decline reasons) are compared with what the code produces.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from client import supernode
from client.process_tree import bin_dir
from deploy.cli import build_parser as gpfl_parser
from deploy.cli import parse_node_configs, parse_pairs
from experiments.cli import EXPERIMENTS
from experiments.cli import build_parser as experiments_parser
from server.settings import RunSettings
from settings import SettingError, check_node_config, check_run_config

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PREFIXES = ("gpfl ", "gpfl-experiment ", "./gpfl.sh ", "python -m ")
GPFL_SH = ("setup", "test", "experiment", "experiments", "report", "help")
#: A line a command prints (``gpfl submit: failed: ...``), quoted in the docs: not a command.
OUTPUT_LINE = re.compile(r"gpfl [a-z]+: ")


def _blocks_and_inline(text: str) -> tuple[list[str], list[str]]:
    """Commands of ```bash blocks (continuation lines joined, ``&&`` split) and inline code."""
    block_lines: list[str] = []
    prose: list[str] = []
    fence: str | None = None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = line.strip()[3:] if fence is None else None
            continue
        if fence is None:
            prose.append(line)
        elif fence in ("bash", "sh", "shell"):
            block_lines.append(line)
    joined = re.sub(r"\\\n\s*", " ", "\n".join(block_lines))
    blocks = [part.strip() for line in joined.splitlines()
              for part in re.split(r"\s*&&\s*", line.strip())]
    inline = "\n".join(prose).split("`")[1::2]
    return ([c for c in blocks if c.startswith(PREFIXES)],
            [c for c in inline if c.startswith(PREFIXES) and "\n" not in c
             and not OUTPUT_LINE.match(c)])


COMMANDS = [(doc.name, kind, command) for doc in DOCS
            for kind, found in zip(("block", "inline"), _blocks_and_inline(doc.read_text()),
                                   strict=True)
            for command in found]


def _tokens(command: str) -> list[str]:
    """Split a command; a synopsis's ``NAME`` and ``[--option VALUE]`` become real arguments."""
    words = shlex.split(command, comments=True)
    words = [w for w in words if w not in ("...", "[options]", "[pytest", "args]")]
    words = [w.replace("[", "").replace("]", "") for w in words]
    return [next(iter(EXPERIMENTS)) if w == "NAME" else w for w in words]


def _options(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """Option strings of the (sub)parser that ``argv`` selects."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and argv and argv[0] in action.choices:
            return _options(action.choices[argv[0]], argv[1:])
    return {option for action in parser._actions for option in action.option_strings}


def _first_choices(parser: argparse.ArgumentParser) -> set[str]:
    """The subcommands (``gpfl``) or the experiments (``python -m experiments``)."""
    return {choice for action in parser._actions
            if isinstance(action, argparse._SubParsersAction) or action.dest == "name"
            for choice in action.choices or ()}


def _check_settings(args: argparse.Namespace) -> None:
    for text in getattr(args, "run_config", None) or []:
        check_run_config(parse_pairs(text, "--run-config"))
    node_config = getattr(args, "node_config", None) or []
    if isinstance(node_config, str):  # gpfl supernode: this device's own
        check_node_config(supernode.parse_node_config(node_config))
    else:  # gpfl launch: INDEX:pairs, repeatable
        for node in parse_node_configs(node_config).values():
            check_node_config(node)
    policy = getattr(args, "policy", None) or []
    if isinstance(policy, str):  # gpfl ledger: one device's policy file
        policy = [policy]
    for text in policy:
        if not text.endswith(".toml"):
            check_node_config(parse_pairs(text, "--policy"), source="policy")


def _check(command: str, kind: str) -> None:
    words = _tokens(command)
    if words[0] == "./gpfl.sh":
        assert len(words) > 1, command
        if words[1] in ("test", "setup", "help"):
            return
        if words[1] in ("experiment", "experiments"):
            words = ["gpfl-experiment", *words[2:]]
        elif words[1] == "report":
            words = ["gpfl-experiment", "all", *[w for w in words[2:] if w != "--full"]]
        else:
            words = ["gpfl", *words[1:]]
    if words[:2] == ["python", "-m"]:
        module = words[2]
        if module == "experiments":
            words = ["gpfl-experiment", *words[3:]]
        else:
            spec = importlib.util.find_spec(module)
            assert spec is not None and spec.origin, f"no module {module}: {command}"
            source = Path(spec.origin).read_text()
            if module == "settings":
                source = (ROOT / "settings" / "__main__.py").read_text()
            for word in words[3:]:
                if word.startswith("--"):
                    assert f'"{word}"' in source, f"{module} has no option {word}: {command}"
            return
    parser = gpfl_parser() if words[0] == "gpfl" else experiments_parser()
    argv = words[1:]
    if kind == "inline":
        known = _options(parser, argv)
        for word in argv:
            if word.startswith("-"):
                assert word in known, f"unknown option {word}: {command}"
        if argv and not argv[0].startswith("-"):
            assert argv[0] in _first_choices(parser), f"no {argv[0]!r}: {command}"
        return
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:
        raise AssertionError(f"does not parse: {command}") from stop
    _check_settings(args)


@pytest.mark.parametrize(("doc", "kind", "command"), COMMANDS,
                         ids=[f"{doc}:{command[:50]}" for doc, _, command in COMMANDS])
def test_a_documented_command_parses(doc: str, kind: str, command: str) -> None:
    _check(command, kind)


def test_the_docs_show_commands_at_all() -> None:
    found = {command.split()[1] for _, kind, command in COMMANDS
             if kind == "block" and command.startswith("gpfl ")}
    assert {"certs", "supernode"} <= found
    assert len(COMMANDS) > 40


@pytest.mark.parametrize("command", [
    "gpfl launch --run-config 'num-round=3'",                # a renamed setting
    "gpfl launch --node-config '0:cap-epsilon=-1'",          # a value out of bounds
    "gpfl launch --no-such-flag",
    "gpfl supernode --node-config 'oops'",
    "python -m experiments no-such-experiment",
    "python -m experiments.no_such_module --seeds 1",
    "./gpfl.sh report --no-such-flag",
])
def test_the_check_fails_for_a_wrong_command(command: str) -> None:
    with pytest.raises((AssertionError, ValueError, SystemExit)):
        _check(command, "block")


def test_the_cheap_commands_run(tmp_path: Path) -> None:
    gpfl = str(bin_dir() / "gpfl")
    helped = subprocess.run([gpfl, "--help"], capture_output=True, text=True, timeout=60,
                            check=True)
    for sub in ("launch", "supernode", "certs", "ledger"):
        assert sub in helped.stdout
    subprocess.run([gpfl, "certs", "--out", str(tmp_path / "certs"), "--san", "fl.example.org",
                    "--supernodes", "1"], capture_output=True, text=True, timeout=60, check=True)
    assert {p.name for p in (tmp_path / "certs").iterdir()} >= {"ca.crt", "server.pem",
                                                               "server.key"}
    markdown = subprocess.run([sys.executable, "-m", "settings", "--markdown"],
                              capture_output=True, text=True, timeout=60, check=True, cwd=ROOT)
    assert markdown.stdout == (ROOT / "docs" / "SETTINGS.md").read_text()
    for argv in (["launch", "--help"], ["supernode", "--help"]):
        with pytest.raises(SystemExit) as stop:
            gpfl_parser().parse_args(argv)
        assert stop.value.code == 0


def test_the_error_usage_md_quotes_is_the_one_the_code_prints() -> None:
    quoted = re.search(r"\(for example\s+`([^`]+)`\)", (ROOT / "docs" / "USAGE.md").read_text())
    assert quoted, "docs/USAGE.md quotes no example error"
    with pytest.raises(SettingError) as error:
        RunSettings.from_run_config({"noise-multiplier": -1.0})
    assert str(error.value) == quoted.group(1)


def test_the_wire_table_names_the_declines_the_client_sends() -> None:
    row = next(line for line in (ROOT / "docs" / "ARCHITECTURE.md").read_text().splitlines()
               if line.startswith("| `declined`, `declined-by`"))
    documented = set(re.findall(r"`([\w-]+)` \(", row))
    tree = ast.parse((ROOT / "client" / "numpy_client.py").read_text())
    sent = {call.args[1].value for call in ast.walk(tree)
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr == "_decline" and len(call.args) > 1
            and isinstance(call.args[1], ast.Constant)}
    assert sent and documented == sent
