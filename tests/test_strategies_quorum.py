"""No release the server could know it would discard: the quorum, the back-off of silent devices,
a restarted device taking over its name, and a run whose hypotheses were pushed away.

In process (fake ClientManager, hand-built replies); tests/test_integration_robust.py drives the
same over real processes.
"""

from __future__ import annotations

import numpy as np
from flwr.common import Code, GetPropertiesIns, GetPropertiesRes, Parameters, Status

from server.results import RunRecorder, privacy_report
from strategies import ClusteredStrategy
from strategies.proxies import FAILED, DeviceFailure
from tests.test_strategies_clustered import FakeManager, FakeProxy, hyp
from tests.test_strategies_faults import res

NONE = Parameters([], "")


def make(**kwargs: object) -> ClusteredStrategy:
    settings: dict[str, object] = {"clients_per_round": 3, "rng": np.random.default_rng(0),
                                   "round_timeout": 0.2}
    settings.update(kwargs)
    return ClusteredStrategy(initial_hypotheses=hyp([0.0]), **settings)  # type: ignore[arg-type]


def play(strategy: ClusteredStrategy, manager: FakeManager, t: int,
         silent: set[str]) -> list[str]:
    """One round in which every sampled device but ``silent`` replies; return who was sampled."""
    sampled = [proxy.cid for proxy, _ in strategy.configure_fit(t, NONE, manager)]
    if sampled:
        results = [(FakeProxy(cid), res([1.0], name=f"dev-{cid}")) for cid in sampled
                   if cid not in silent]
        strategy.aggregate_fit(t, results, [])
    strategy.evaluate(t, NONE)
    return sorted(sampled)


def test_a_silent_device_rests_longer_after_each_miss_and_is_asked_again() -> None:
    manager = FakeManager(["a", "b", "c"])
    strategy = make()

    asked = [play(strategy, manager, t, silent={"a"}) for t in range(1, 9)]

    # Missed round 1: rests 1 round (2); missed 3: rests 3 (4-6); asked again in 7, missed,
    # rests 7 rounds. Before the back-off, "a" was asked (and waited for) in every round.
    with_a = [t for t, devices in enumerate(asked, start=1) if "a" in devices]
    assert with_a == [1, 3, 7]
    assert strategy.clients["a"].missed_in_a_row == 3 and strategy.clients["a"].missing == 3


def test_a_device_that_answers_again_is_counted_again() -> None:
    manager = FakeManager(["a", "b"])
    strategy = make(clients_per_round=2)
    play(strategy, manager, 1, silent={"a"})
    play(strategy, manager, 2, silent=set())  # a rests
    assert play(strategy, manager, 3, silent=set()) == ["a", "b"]
    assert strategy.clients["a"].missed_in_a_row == 0


def test_no_device_is_asked_when_the_responsive_ones_cannot_make_the_quorum() -> None:
    # Prepare: 3 devices, min-replies 3; "a" dies in round 1 (still registered, as a dead
    # SuperNode stays at the SuperLink for about a minute).
    manager = FakeManager(["a", "b", "c"])
    strategy = make(min_replies=3)
    play(strategy, manager, 1, silent={"a"})
    charged = {cid: strategy.clients[cid].sampled for cid in "abc"}

    # Execute
    asked = play(strategy, manager, 2, silent=set())

    # Assert: nobody asked (before the quorum check, b and c were asked and charged for a
    # round kept unchanged); the run stops, resumable, and says why.
    assert asked == []
    assert {cid: strategy.clients[cid].sampled for cid in "abc"} == charged
    assert strategy.incomplete_reason == ("round 2: too few devices: 3 connected, 2 answered "
                                          "their last round, min-replies=3")


class AliveProxy(FakeProxy):
    """A device that answers a query (its name) and counts how often it was asked."""

    def __init__(self, cid: str) -> None:
        super().__init__(cid)
        self.queries = 0

    def get_properties(self, ins: GetPropertiesIns, timeout: float | None,
                       group_id: int | None) -> GetPropertiesRes:
        self.queries += 1
        return GetPropertiesRes(Status(Code.OK, ""), {"client-name": f"dev-{self.cid}"})


def test_a_device_that_missed_one_round_and_answers_a_query_makes_the_quorum() -> None:
    # Prepare: 3 devices, min-replies 3; "a" (alive) misses round 1 alone: its instruction
    # lost, or its reply a moment late. "b" and "c" answered.
    manager = FakeManager(["a", "b", "c"])
    alive = AliveProxy("a")
    manager.register(alive)
    strategy = make(min_replies=3)
    play(strategy, manager, 1, silent={"a"})

    # Execute: round 2, then round 3 in which "a" misses again, then round 4.
    second = play(strategy, manager, 2, silent={"a"})
    fourth = [play(strategy, manager, t, silent=set()) for t in (3, 4)]

    # Assert: asked whether it is alive, "a" counts and round 2 asks all three (before: 2 of
    # 3 answered their last round, and the run stopped as "too few devices"). Missing twice
    # in a row, it is not asked again: round 3 asks nobody, the run stops, resumable.
    assert second == ["a", "b", "c"] and alive.queries == 1
    assert fourth == [[], []] and alive.queries == 1
    assert strategy.incomplete_reason == ("round 3: too few devices: 3 connected, 2 answered "
                                          "their last round, min-replies=3")


def test_a_round_every_device_missed_is_forgiven_once_and_the_run_goes_on() -> None:
    # Prepare: every device asked in round 1 misses it (their instructions lost with a
    # SuperLink restarted on its database, say), min-replies 1.
    manager = FakeManager(["a", "b", "c"])
    strategy = make()
    assert play(strategy, manager, 1, silent={"a", "b", "c"}) == ["a", "b", "c"]

    # Execute: round 2 and, with every device silent again, round 3.
    second = play(strategy, manager, 2, silent={"a", "b", "c"})
    third = play(strategy, manager, 3, silent=set())

    # Assert: round 2 asks them all at once (before: nobody answered their last round, so the
    # run stopped as "too few devices" with three connected); a second shared miss is not
    # forgiven: round 3 asks nobody and the run stops, resumable, saying why.
    assert second == ["a", "b", "c"]
    assert third == []
    assert strategy.incomplete_reason == ("round 3: too few devices: 3 connected, 0 answered "
                                          "their last round, min-replies=1")
    assert [strategy.clients[c].missed_in_a_row for c in "abc"] == [2, 2, 2]


def test_a_lost_round_is_one_that_every_connected_device_missed_and_only_it() -> None:
    from strategies.records import ClientRecord
    from strategies.sampling import lost_together

    def rec(cid: str, misses: int, last: int) -> ClientRecord:
        return ClientRecord(cid, missed_in_a_row=misses, last_missed=last)

    same = {"a": rec("a", 1, 4), "b": rec("b", 1, 4)}
    assert lost_together(["a", "b"], same) == 4
    # Missed in different rounds, missed twice, or a device never asked: not a lost round.
    assert lost_together(["a", "b"], {**same, "b": rec("b", 1, 3)}) is None
    assert lost_together(["a", "b"], {**same, "b": rec("b", 2, 4)}) is None
    assert lost_together(["a", "b", "c"], same) is None
    assert lost_together([], same) is None


def test_a_restarted_device_makes_the_quorum_and_takes_over_its_name() -> None:
    # Prepare: "a" (dev-a) dies in round 1 and restarts as node "a2", while its old node is
    # still registered.
    manager = FakeManager(["a", "b", "c"])
    strategy = make(min_replies=3)
    play(strategy, manager, 1, silent={"a"})
    manager.register(FakeProxy("a2"))

    # Execute: round 2 asks the three responsive devices; the new node speaks as dev-a.
    sampled = [proxy.cid for proxy, _ in strategy.configure_fit(2, NONE, manager)]
    _, metrics = strategy.aggregate_fit(2, [
        (FakeProxy("a2"), res([2.0], name="dev-a")),
        (FakeProxy("b"), res([2.0], name="dev-b")),
        (FakeProxy("c"), res([2.0], name="dev-c"))], [])

    # Assert: counted (before, "name 'dev-a' belongs to node a" after it charged).
    assert sorted(sampled) == ["a2", "b", "c"]
    assert metrics["dropped"] == 0 and metrics["replies"] == 3
    assert strategy.hypotheses[0][0].tolist() == [2.0]


def test_a_restarted_device_whose_old_node_is_asked_in_the_same_round_is_counted() -> None:
    manager = FakeManager(["1", "2"])
    strategy = make(clients_per_round=8)
    strategy.configure_fit(1, NONE, manager)
    strategy.aggregate_fit(1, [(FakeProxy("1"), res([1.0], name="alice"))], [])
    strategy.evaluate(1, NONE)
    manager.register(FakeProxy("3"))

    # Node 1 (dead, still registered) is asked and silent; node 3 is alice restarted.
    strategy.configure_fit(2, NONE, manager)
    _, metrics = strategy.aggregate_fit(2, [(FakeProxy("3"), res([5.0], name="alice"))], [])
    strategy.evaluate(2, NONE)

    assert metrics["dropped"] == 0
    assert privacy_report("laplace", strategy.clients)["per_client"]["alice"]["node_ids"] == [
        "1", "3"]


def test_a_restarted_device_whose_old_node_was_not_asked_is_counted_and_its_old_node_left_alone(
) -> None:
    # Prepare: dev-a answers round 1 from node a (so a has missed nothing), is killed and
    # restarted as node c while a stays registered. Round 2 draws b and c (2 of 3), not a.
    manager = FakeManager(["a", "b"])
    strategy = make(clients_per_round=2)
    play(strategy, manager, 1, silent=set())
    manager.register(FakeProxy("c"))
    sampled = sorted(proxy.cid for proxy, _ in strategy.configure_fit(2, NONE, manager))
    assert sampled == ["b", "c"]

    # Execute: c answers as dev-a (a decline here; a release is treated the same), b as itself.
    _, metrics = strategy.aggregate_fit(2, [(FakeProxy("c"), res(name="dev-a", declined=1)),
                                            (FakeProxy("b"), res([1.0], name="dev-b"))], [])
    strategy.evaluate(2, NONE)
    asked = sorted(proxy.cid for proxy, _ in strategy.configure_fit(3, NONE, manager))

    # Assert: counted under dev-a (before: dropped as "name 'dev-a' belongs to node a", and
    # node a, dead, drawn again and waited for); node a is no longer asked.
    assert metrics["dropped"] == 0 and metrics["declined"] == 1
    report = privacy_report("laplace", strategy.clients)["per_client"]
    assert report["dev-a"]["declines"] == 1 and report["dev-a"]["node_ids"] == ["a", "c"]
    assert asked == ["b", "c"]


def test_hypotheses_pushed_away_end_the_run_as_diverged_naming_the_rogue(tmp_path) -> None:
    # Prepare: 4 devices; "r" releases 500x farther than the others for two rounds.
    manager = FakeManager(["a", "b", "c", "r"])
    strategy = make(clients_per_round=4)
    recorder = RunRecorder(tmp_path, {}, 10, "laplace")
    recorder.attach(strategy)
    for t in (1, 2):
        strategy.configure_fit(t, NONE, manager)
        strategy.aggregate_fit(t, [
            (FakeProxy("a"), res([0.9 + t], name="dev-a")),
            (FakeProxy("b"), res([1.1 + t], name="dev-b")),
            (FakeProxy("c"), res([1.0 + t], name="dev-c")),
            (FakeProxy("r"), res([500.0 * t], name="rogue"))], [])
        strategy.evaluate(t, NONE)

    # Execute: the honest devices refuse the hypotheses (beyond their max-parameter).
    strategy.configure_fit(3, NONE, manager)
    refusal = ("error: <class 'InstructionError'>:<'hypothesis 0, layer 0: a value of magnitude "
               "7e+05 is beyond this device's max-parameter=1e+06'>")
    strategy.aggregate_fit(3, [(FakeProxy("r"), res([9e5], name="rogue"))],
                           [DeviceFailure(cid, FAILED, refusal) for cid in "abc"])
    strategy.evaluate(3, NONE)

    # Assert: the run stops, diverged (not resumable), naming the rogue and only it.
    assert strategy.diverged and strategy.configure_fit(4, NONE, manager) == []
    reason = strategy.incomplete_reason or ""
    assert reason.startswith("round 3: the hypotheses were pushed away: 3 of 4 devices refused")
    assert "came from rogue (" in reason and "dev-a" not in reason.split("came from")[1]
    assert recorder.status() == ("diverged", reason)


def test_a_lone_refusal_among_many_replies_does_not_stop_the_run() -> None:
    manager = FakeManager(["a", "b", "c"])
    strategy = make()
    strategy.configure_fit(1, NONE, manager)
    strategy.aggregate_fit(1, [(FakeProxy("a"), res([1.0], name="dev-a")),
                               (FakeProxy("b"), res([1.0], name="dev-b"))],
                           [DeviceFailure("c", FAILED, "error: ... max-parameter=10 ...")])
    assert not strategy.diverged and strategy.incomplete_reason is None
