"""strategies.identity: under SuperNode authentication (``node-identity = "key"``) a device is its
key, which Flower 1.39 binds to one node id; a name never moves to another node.

In process (fake ClientManager, hand-built replies); tests/test_integration_key_identity.py
drives the same over real, authenticated processes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.common import Parameters
from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL, HEARTBEAT_PATIENCE

from client.supernode import HEARTBEAT_WINDOW_S
from settings import SETTINGS
from strategies import ClusteredStrategy
from strategies.device_keys import DeviceKeys
from strategies.identity import refused_claims
from strategies.intake import ReplyScreen
from strategies.norms import NormLimits
from strategies.replies import NameBook
from tests.test_strategies_clustered import FakeManager, FakeProxy, hyp
from tests.test_strategies_device_keys import NamedProxy
from tests.test_strategies_faults import res

NONE = Parameters([], "")


def book_with(**bound: str) -> NameBook:
    """A by-key book where node ``k`` has spoken as name ``v``."""
    book = NameBook(by_key=True)
    for node, name in bound.items():
        assert book.check(node, name) is None
    return book


def make(identity: str, **kwargs: object) -> ClusteredStrategy:
    settings: dict[str, object] = {"clients_per_round": 8, "rng": np.random.default_rng(0),
                                   "round_timeout": 0.2,
                                   "device_keys": DeviceKeys(3, identity=identity, timeout=1.0)}
    settings.update(kwargs)
    return ClusteredStrategy(initial_hypotheses=hyp([0.0]), **settings)  # type: ignore[arg-type]


def sampled(strategy: ClusteredStrategy, t: int, manager: FakeManager) -> list[str]:
    return sorted(proxy.cid for proxy, _ in strategy.configure_fit(t, NONE, manager))


# ----------------------------------------------------------------- NameBook, by key

def test_by_key_a_name_stays_with_its_node_even_when_that_node_was_silent() -> None:
    # Prepare: node a spoke as alice; a did not answer this round (no `answered`).
    book = book_with(a="alice")

    # Execute: another node (another key) speaks as alice.
    reason = book.check("b", "alice")

    # Assert: refused, naming the owner; alice stays with a, nothing is superseded (by name,
    # the same reply took the name over and superseded a).
    assert reason is not None and "belongs to node a" in reason and "key" in reason
    assert book.name_node == {"alice": "a"} and book.superseded() == set()
    assert book.check("a", "alice") is None  # the device itself, restarted under its key


def test_by_name_the_same_claim_still_takes_the_name_over() -> None:
    book = NameBook()
    assert book.check("a", "alice") is None
    assert book.check("b", "alice") is None and book.superseded() == {"a"}


def test_the_screen_keeps_the_runs_identity_rule_over_a_checkpoint() -> None:
    screen = ReplyScreen([(1,)], release="parameters", need_sigma=False,
                         limits=NormLimits(mechanism="laplace"), by_key=True)
    screen.names.check("a", "alice")

    screen.load_dict(screen.to_dict())

    assert screen.names.by_key and screen.names.check("b", "alice") is not None


# ----------------------------------------------------------------- refused_claims

@pytest.mark.parametrize(("announced", "refused"), [
    ({"a": "alice", "b": "alice"}, {"b"}),        # a's name, claimed by b
    ({"a": "alice", "b": "bob"}, set()),          # each its own
    ({"a": "mallory"}, {"a"}),                    # a bound to alice announces another name
    ({"b": "", "c": ""}, set()),                  # no name announced: checked at the reply
    ({"b": "carol", "c": "carol"}, {"b", "c"}),   # a new name announced twice: neither asked
    ({"b": "carol"}, set()),                      # a new name announced once
])
def test_refused_claims(announced: dict[str, str], refused: set[str]) -> None:
    out = refused_claims(announced, book_with(a="alice"))
    assert set(out) == refused
    assert all(isinstance(why, str) and "announces" in why for why in out.values())


def test_a_gone_nodes_announcement_does_not_keep_a_name_from_a_newcomer() -> None:
    # c1 announced carol, then left before it ever replied; c2 announces carol after it.
    keys = DeviceKeys(1, identity="key", timeout=1.0)
    book = NameBook(by_key=True)
    assert keys.refused({"c1": NamedProxy("c1", "carol")}, book, 1) == {}

    # Only the connected nodes' announcements count (c1's is still remembered).
    assert keys.refused({"c2": NamedProxy("c2", "carol")}, book, 2) == {}
    assert keys.announced == {"c1": "carol", "c2": "carol"}


# ----------------------------------------------------------------- DeviceKeys

def test_by_key_each_new_node_is_asked_its_name_once_and_a_claim_is_refused() -> None:
    nodes = {"a": NamedProxy("a", "alice"), "b": NamedProxy("b", "alice")}
    keys = DeviceKeys(1, identity="key", timeout=1.0)

    first = keys.refused(nodes, book_with(a="alice"), 1)
    second = keys.refused(nodes, book_with(a="alice"), 2)

    assert set(first) == set(second) == {"b"}
    assert nodes["a"].asked == nodes["b"].asked == 1


def test_by_name_no_node_is_asked_anything() -> None:
    # A federation without authentication works as before: no properties query is sent.
    nodes = {"a": NamedProxy("a", "alice"), "b": NamedProxy("b", "alice")}
    keys = DeviceKeys(1, identity="name")
    assert keys.refused(nodes, book_with(a="alice"), 1) == {}
    assert nodes["a"].asked == nodes["b"].asked == 0


def test_device_keys_and_the_setting_name_the_same_choices() -> None:
    with pytest.raises(ValueError, match="node-identity must be one of name, key"):
        DeviceKeys(1, identity="cert")
    assert SETTINGS["node-identity"].default == "name"


# ----------------------------------------------------------------- the strategy

def test_by_key_an_impostor_is_never_asked_and_the_restarted_device_counts() -> None:
    # Prepare: a answers round 1 as alice, then dies (its registration stays online); b, with
    # another key, announces alice too; c is bob.
    manager = FakeManager([])
    for cid, name in (("a", "alice"), ("c", "bob")):
        manager.register(NamedProxy(cid, name))
    strategy = make("key", min_replies=1)
    assert sampled(strategy, 1, manager) == ["a", "c"]
    strategy.aggregate_fit(1, [(FakeProxy("a"), res([1.0], name="alice")),
                               (FakeProxy("c"), res([1.0], name="bob"))], [])
    strategy.evaluate(1, NONE)
    manager.register(NamedProxy("b", "alice"))

    # Execute: round 2 (a silent), round 3 (a rests), round 4: a is back under its node id.
    asked = [sampled(strategy, 2, manager)]
    strategy.aggregate_fit(2, [(FakeProxy("c"), res([1.0], name="bob"))], [])
    strategy.evaluate(2, NONE)
    for t in (3, 4):
        asked.append(sampled(strategy, t, manager))
        strategy.aggregate_fit(t, [(FakeProxy(cid), res([2.0], name=n))
                                   for cid, n in (("a", "alice"), ("c", "bob"))
                                   if cid in asked[-1]], [])
        strategy.evaluate(t, NONE)

    # Assert: b is never asked (by name, b was drawn in round 2, charged, took alice over and
    # a was superseded for good); a counts again in round 4.
    assert asked == [["a", "c"], ["c"], ["a", "c"]]
    assert strategy.clients["a"].participations == 2 and "b" not in strategy.clients


def test_by_key_a_reply_under_anothers_name_is_dropped_with_the_reason() -> None:
    manager = FakeManager(["a", "b"])  # FakeProxy: announces no name, so it is drawn
    strategy = make("key")
    strategy.configure_fit(1, NONE, manager)
    strategy.aggregate_fit(1, [(FakeProxy("a"), res([1.0], name="alice"))], [])
    strategy.evaluate(1, NONE)

    strategy.configure_fit(2, NONE, manager)
    _, metrics = strategy.aggregate_fit(2, [(FakeProxy("b"), res([9.0], name="alice"))], [])

    assert metrics["dropped"] == 1 and metrics["replies"] == 0
    assert strategy.hypotheses[0][0].tolist() == [1.0]


def test_the_runners_heartbeat_window_is_flowers() -> None:
    # gpfl supernode retries a refused activation this long (it does not import Flower).
    assert HEARTBEAT_WINDOW_S == HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL


# ----------------------------------------------------------------- the device runner

class _Clock:
    """``time`` for client.supernode: sleeping moves the clock, nothing waits."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _Proc:
    """A started child: exits with ``code`` (None: runs on)."""

    def __init__(self, code: int | None, pid: int) -> None:
        self.code, self.pid, self.returncode = code, pid, code

    def poll(self) -> int | None:
        return self.code


def run_runner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, keyed: bool,
               codes: list[int]) -> tuple[int, list[float]]:
    """Run ``gpfl supernode`` whose SuperNodes exit with ``codes`` in turn (the last repeats).

    Returns the runner's exit code and when each SuperNode was started (no process is
    started: the runner's ``_start``, ``_stop`` and clock are replaced).
    """
    import argparse

    from client import supernode

    clock, starts = _Clock(), []

    def start(argv: list[str], pass_fd: int | None = None) -> _Proc:
        if "client.executor" in argv:
            return _Proc(None, -1)
        starts.append(clock.now)
        return _Proc(codes[min(len(starts), len(codes)) - 1], -1)

    monkeypatch.setattr(supernode, "start_child", start)
    monkeypatch.setattr(supernode, "stop_child", lambda proc: None)
    monkeypatch.setattr(supernode, "time", clock)
    parser = argparse.ArgumentParser()
    supernode.add_arguments(parser)
    key = ["--auth-supernode-private-key", str(tmp_path / "k")] if keyed else ["--insecure"]
    args = parser.parse_args([*key, "--node-config", f'partition-id=0 ledger-dir="{tmp_path}"'])
    return supernode.run(args, echo=lambda _: None), starts


def test_a_keyed_supernode_refused_at_activation_is_started_again_until_it_is_let_in(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The SuperLink refuses the first two activations (the old registration is still online).
    code, starts = run_runner(monkeypatch, tmp_path, keyed=True, codes=[1, 1, 0])
    assert code == 0 and len(starts) == 3  # before: the runner exited 1 after one start


def test_a_keyed_supernode_refused_for_good_gives_up_after_the_heartbeat_window(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code, starts = run_runner(monkeypatch, tmp_path, keyed=True, codes=[1])
    # One attempt begins after the window (the old registration is offline by then), no more.
    assert code == 1 and starts[-1] >= HEARTBEAT_WINDOW_S
    assert starts[-2] < HEARTBEAT_WINDOW_S + 5.0


def test_a_supernode_without_a_key_is_not_started_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert run_runner(monkeypatch, tmp_path, keyed=False, codes=[1, 0]) == (1, [0.0])
