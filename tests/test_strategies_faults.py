"""ClusteredStrategy under faults: garbage replies, impostors, lost devices, too few replies,
arrival order, and resuming from its state (no processes; Flower's own loop where it matters)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.common import Code, FitIns, FitRes, Parameters, Status, ndarrays_to_parameters
from flwr.server.client_proxy import ClientProxy

from server.checkpoint import read_checkpoint, write_checkpoint
from server.results import privacy_report, round_line
from strategies import ClusteredStrategy
from strategies.proxies import FAILED, MISSING, DeviceFailure, TracedProxy, classify_failure
from tests.test_strategies_clustered import (
    PLAIN_MEAN,
    FakeManager,
    FakeProxy,
    hyp,
    one_layer,
    reply,
)

F32 = np.float32
UNAVAILABLE = ("Message contains an Error (reason: Error: Message Unavailable - The requested "
               "message could not be found in the database. It may have expired due to its "
               "TTL, been deleted because the destination SuperNode was removed from the "
               "federation, or never existed.). It originated during client-side execution of "
               "a message.")


def res(*layers: Sequence[float] | np.ndarray, name: str, sigma: float | None = None,
        **metrics: Any) -> FitRes:
    """A reply of device ``name`` (laplace; σ only if given) releasing ``layers``."""
    return reply(*layers, sigma=sigma, **{"client-name": name, "mechanism": "laplace", **metrics})


def make(hypotheses: list[list[np.ndarray]], **kwargs: Any) -> ClusteredStrategy:
    settings: dict[str, Any] = {"clients_per_round": 8, "rng": np.random.default_rng(0),
                                **PLAIN_MEAN}
    settings.update(kwargs)
    return ClusteredStrategy(initial_hypotheses=hypotheses, **settings)


# ---------------------------------------------------------------------------- garbage in


def test_every_kind_of_garbage_is_dropped_named_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Prepare: 3 good replies (mean (2, 4)) and one of each kind of garbage reply below.
    strategy = make(hyp([0, 0]))
    huge = Parameters([b"\x93NUMPY" + b"\x00" * 10_000_000], "numpy.ndarray")
    bad = {
        "spend-string": res([9, 9], name="d1", **{"spend-d": "lots"}),
        "negative-count": FitRes(Status(Code.OK, ""), ndarrays_to_parameters(
            [np.array([9, 9], F32)]), -3, {"client-name": "d2"}),
        "no-name": reply([9, 9], sigma=None),
        "oversized": FitRes(Status(Code.OK, ""), huge, 1, {"client-name": "d4"}),
        "norm-1e12": res([1e12, 0], name="d5"),
        "float32-max": res([3e38, -3e38], name="d6"),
        "nan": res([np.nan, 1], name="d7"),
        "wrong-mechanism": res([9, 9], name="d8", mechanism="none"),
    }
    results: list[tuple[ClientProxy, FitRes]] = [
        (FakeProxy(f"g{i}"), res(v, name=f"good-{i}")) for i, v in enumerate(([1, 3], [2, 4],
                                                                             [3, 5]))
    ] + [(FakeProxy(cid), r) for cid, r in bad.items()]

    # Execute
    with caplog.at_level(logging.WARNING, logger="strategies"):
        parameters, metrics = strategy.aggregate_fit(1, results, [])
        strategy.evaluate(1, Parameters([], ""))

    # Assert: only the good replies were averaged, and the hypotheses are finite.
    np.testing.assert_allclose(one_layer(strategy), [[2, 4]])
    assert parameters is not None and metrics["dropped"] == len(bad)
    dropped = dict(strategy.history[-1].dropped)
    expected = {
        "spend-string": "metric 'spend-d' must be a finite number >= 0, got 'lots'",
        "negative-count": "num_examples must be an integer in [0, 1000000000], got -3",
        "no-name": "metric 'client-name' must be a name",
        "oversized": "message too large",
        "norm-1e12": "distance 1e+12 to the nearest hypothesis is beyond 1000 x",
        "float32-max": "norm 4.24e+38 is beyond the absolute cap",
        "nan": "array 0 has non-finite values",
        "wrong-mechanism": "released with mechanism 'none', the run asks for 'laplace'",
    }
    names = {"spend-string": "node spend-string", "negative-count": "node negative-count",
             "no-name": "node no-name", "oversized": "d4", "norm-1e12": "d5",
             "float32-max": "d6", "nan": "d7", "wrong-mechanism": "node wrong-mechanism"}
    for cid, reason in expected.items():
        assert dropped[names[cid]].startswith(reason), (cid, dropped[names[cid]])
        assert strategy.clients[cid].dropped == 1 and strategy.clients[cid].participations == 0
        assert any(f"node {cid}" in r.getMessage() and reason in r.getMessage()
                   for r in caplog.records), cid
    # The malformed spend never reached the device's record.
    assert "spend-d" not in strategy.clients["spend-string"].metrics


def test_a_hypothesis_is_never_moved_by_an_absurd_reply_over_rounds() -> None:
    strategy = make(hyp([0.0, 0.0]), min_replies=1)
    for t in range(1, 6):
        replies = [(FakeProxy(f"g{i}"), res([1.0 + i, 2.0], name=f"g{i}")) for i in range(3)]
        replies.append((FakeProxy("x"), res([1e12 * t, -1e12], name="x")))
        strategy.aggregate_fit(t, replies, [])
        strategy.evaluate(t, Parameters([], ""))
        assert np.isfinite(one_layer(strategy)).all()
        assert np.abs(one_layer(strategy)).max() < 10
    assert strategy.clients["x"].dropped == 5


# ---------------------------------------------------------------------------- names


def test_a_device_cannot_speak_for_another_that_answers_the_same_round() -> None:
    # Prepare: alice (node 1) reports spend 2.0; node 2 then claims alice's name with 0.4.
    manager = FakeManager(["1", "2"])
    strategy = make(hyp([0.0]))
    strategy.configure_fit(1, Parameters([], ""), manager)
    strategy.aggregate_fit(1, [(FakeProxy("1"), res([1.0], name="alice", **{"spend-d": 2.0}))],
                           [])
    strategy.evaluate(1, Parameters([], ""))

    # Execute: both answer round 2 (one device, one reply a round: the name stays with node 1).
    strategy.configure_fit(2, Parameters([], ""), manager)
    _, metrics = strategy.aggregate_fit(
        2, [(FakeProxy("1"), res([1.0], name="alice", **{"spend-d": 2.0})),
            (FakeProxy("2"), res([50.0], name="alice", **{"spend-d": 0.4}))], [])
    strategy.evaluate(2, Parameters([], ""))

    # Assert
    assert metrics["dropped"] == 1
    assert strategy.history[-1].dropped == [
        ("node 2", "name 'alice' belongs to node 1, which answered this round")]
    assert strategy.hypotheses[0][0].tolist() == [1.0]
    report = privacy_report("laplace", strategy.clients)["per_client"]
    assert report["alice"]["spend"] == 2.0 and report["alice"]["node_ids"] == ["1"]


def test_a_restarted_device_is_accepted_and_its_records_merge() -> None:
    # Prepare: alice replies as node 1 (spend 0.8, 2 releases), then node 1 is gone and alice
    # comes back as node 3 (a SuperNode restart gives a new node id).
    manager = FakeManager(["1", "2"])
    strategy = make(hyp([0.0]))
    strategy.configure_fit(1, Parameters([], ""), manager)
    strategy.aggregate_fit(1, [
        (FakeProxy("1"), res([1.0], name="alice", **{"spend-d": 0.8, "releases": 2})),
        (FakeProxy("2"), res([3.0], name="bob", **{"spend-d": 0.4, "releases": 1})),
    ], [])
    strategy.evaluate(1, Parameters([], ""))
    manager.unregister(manager.clients["1"])
    manager.register(FakeProxy("3"))

    # Execute: alice's new node reports; a stale lower report of bob does not lower his spend.
    strategy.configure_fit(2, Parameters([], ""), manager)
    strategy.aggregate_fit(2, [
        (FakeProxy("3"), res([2.0], name="alice", **{"spend-d": 1.2, "releases": 3})),
        (FakeProxy("2"), res([4.0], name="bob", **{"spend-d": 0.0, "releases": 0})),
    ], [])
    strategy.evaluate(2, Parameters([], ""))

    # Assert
    report = privacy_report("laplace", strategy.clients)["per_client"]
    assert report["alice"]["node_ids"] == ["1", "3"]
    assert report["alice"]["participations"] == 2 and report["alice"]["spend"] == 1.2
    assert report["alice"]["releases"] == 3
    assert report["bob"]["spend"] == 0.4 and report["bob"]["releases"] == 1


# ---------------------------------------------------------------------------- lost devices


@pytest.mark.parametrize(
    ("error", "kind", "reason"),
    [
        (ValueError(UNAVAILABLE), MISSING, "no reply before the round's deadline"),
        (ValueError("Message contains an Error (reason: Error: Node Unavailable — ...)"),
         MISSING, "the SuperLink lost the device"),
        (TimeoutError("timed out"), MISSING, "no reply before the round's deadline"),
        (ValueError("Message contains an Error (reason: Reply message objects are unavailable: "
                    "timeout or retry limit reached)"),
         MISSING, "its reply's upload did not finish before the round's deadline"),
        (ValueError("Message contains an Error (reason: <class 'InstructionError'>:<'bad'>). "
                    "It originated during client-side execution of a message."),
         FAILED, "error: <class 'InstructionError'>:<'bad'>"),
        (RuntimeError("x" * 1000), FAILED, "error: xxx"),
    ],
)
def test_failures_are_classified(error: BaseException, kind: str, reason: str) -> None:
    got_kind, got_reason = classify_failure(error)

    assert got_kind == kind and got_reason.startswith(reason) and len(got_reason) < 320


class Device(FakeProxy):
    """Answers fit by calling ``answer`` (which may raise, as Flower's proxies do)."""

    def __init__(self, cid: str, answer: Callable[[FitIns], FitRes]) -> None:
        super().__init__(cid)
        self.answer = answer

    def fit(self, ins, timeout, group_id):
        return self.answer(ins)


def raising(error: BaseException) -> Callable[[FitIns], FitRes]:
    def answer(ins: FitIns) -> FitRes:
        raise error
    return answer


def test_a_round_ends_with_what_arrived_and_names_the_missing_and_failed_devices(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Prepare: Flower's own server loop, 4 devices sampled: two answer (1 and 3), one misses
    # the deadline (the SuperLink's "Message Unavailable"), one's ClientApp raises. Round 1
    # binds every name (all answer); round 2 has the failures.
    from flwr.server import Server, SimpleClientManager

    def honest(value: float, name: str) -> Callable[[FitIns], FitRes]:
        return lambda ins: res([value], name=name)

    def flaky(value: float, name: str, error: BaseException) -> Callable[[FitIns], FitRes]:
        def answer(ins: FitIns) -> FitRes:
            if ins.config["server-round"] == 2:
                raise error
            return res([value], name=name)
        return answer

    manager = SimpleClientManager()
    for device in (
        Device("1", honest(1.0, "a")),
        Device("2", flaky(2.0, "b", ValueError(UNAVAILABLE))),
        Device("3", honest(3.0, "c")),
        Device("4", flaky(4.0, "d", ValueError("Message contains an Error (reason: gpfl: the "
                                               "device could not complete this round). It "
                                               "originated during client-side execution."))),
    ):
        manager.register(device)
    lines: list[str] = []
    strategy = make(hyp([0.0]), clients_per_round=4,
                    on_round=lambda r: lines.append(round_line(r, 2, {})))
    server = Server(client_manager=manager, strategy=strategy)

    # Execute
    with caplog.at_level(logging.WARNING, logger="strategies"):
        server.fit(num_rounds=2, timeout=None)

    # Assert: round 2 averaged the two replies that arrived, and names the others.
    record = strategy.history[-1]
    assert record.round == 2 and record.replies == 2 and record.sampled == 4
    assert one_layer(strategy).tolist() == [[2.0]]
    assert record.missing == ["b"]
    assert record.failed == [("d", "error: gpfl: the device could not complete this round")]
    assert record.failures == 1
    assert strategy.clients["2"].missing == 1 and strategy.clients["4"].failures == 1
    assert "replies 2 missing 1 declined 0 dropped 0 failed 1" in lines[-1]
    logged = [r.getMessage() for r in caplog.records]
    assert any("round 2: no reply from b (node 2): no reply before the round's deadline" in m
               for m in logged)
    report = privacy_report("laplace", strategy.clients)["per_client"]
    assert (report["b"]["missing"], report["d"]["failures"]) == (1, 1)


def test_the_traced_proxy_names_the_device() -> None:
    proxy = TracedProxy(Device("7", raising(ValueError(UNAVAILABLE))))

    with pytest.raises(DeviceFailure) as caught:
        proxy.fit(FitIns(Parameters([], ""), {}), timeout=3.0, group_id=1)

    assert (caught.value.cid, caught.value.kind) == ("7", MISSING)


def test_too_few_usable_replies_keep_the_hypotheses_and_say_why() -> None:
    # Prepare: min-replies 3; one good reply, one decline, one dropped.
    strategy = make(hyp([5.0]), min_replies=3, clients_per_round=3)
    declined = FitRes(Status(Code.OK, ""), Parameters([], "numpy.ndarray"), 1,
                      {"client-name": "b", "declined": 1, "declines": 1})

    # Execute
    parameters, metrics = strategy.aggregate_fit(1, [
        (FakeProxy("1"), res([1.0], name="a")),
        (FakeProxy("2"), declined),
        (FakeProxy("3"), res([np.inf], name="c")),
    ], [])
    strategy.evaluate(1, Parameters([], ""))

    # Assert
    assert parameters is None and metrics["replies"] == 1
    assert strategy.hypotheses[0][0].tolist() == [5.0] and strategy.rounds_completed == 0
    record = strategy.history[-1]
    assert record.kept == ("1 usable replies, fewer than min-replies=3 (1 declined, 1 dropped, "
                           "0 failed, 0 missing)")
    assert record.cluster_sizes == [0]
    assert round_line(record, 5, {}).endswith(f"(hypotheses kept: {record.kept})")


# ---------------------------------------------------------------------------- order, resume


def test_arrival_order_does_not_change_the_hypotheses() -> None:
    rng = np.random.default_rng(6)
    replies = [(FakeProxy(str(i)), res(rng.normal([5, 6] if i % 2 else [4, -4.5], 2.0)
                                       .astype(F32), name=f"c{i}")) for i in range(9)]
    outcomes = []
    for order in (range(9), reversed(range(9)), [4, 0, 8, 2, 6, 1, 5, 3, 7]):
        strategy = make(hyp([1, 1], [0, -1]))
        strategy.aggregate_fit(1, [replies[i] for i in order], [])
        outcomes.append(one_layer(strategy))

    assert all(np.array_equal(outcomes[0], o) for o in outcomes[1:])


TARGETS = {str(i): np.array([5.0, 6.0] if i % 2 else [4.0, -4.5]) for i in range(6)}


def device_reply(cid: str, t: int, current: np.ndarray) -> FitRes:
    """A deterministic stand-in for a device: 30% of the way from its nearest hypothesis to its
    group's optimum, plus noise drawn from (device, round)."""
    start = current[np.argmin(np.linalg.norm(current - TARGETS[cid], axis=1))]
    noise = np.random.default_rng([int(cid), t]).normal(0.0, 0.5, 2)
    released = (start + 0.3 * (TARGETS[cid] - start) + noise).astype(F32)
    return res(released, name=f"client-{cid}", sigma=1.0 + int(cid), releases=t)


def run_rounds(strategy: ClusteredStrategy, manager: FakeManager, flower_rounds: range) -> None:
    """Flower's loop: configure_fit → device replies → aggregate_fit → evaluate."""
    for server_round in flower_rounds:
        instructions = strategy.configure_fit(server_round, Parameters([], ""), manager)
        t = int(instructions[0][1].config["server-round"])
        current = one_layer(strategy)
        results = [(proxy, device_reply(proxy.cid, t, current)) for proxy, _ in instructions]
        strategy.aggregate_fit(server_round, results, [])
        strategy.evaluate(server_round, Parameters([], ""))


def resumable(seed: int) -> ClusteredStrategy:
    # Sampling 4 of 6 and the probability aggregation both draw from the rng.
    return make(hyp([1.0, 1.0], [0.0, -1.0]), clients_per_round=4, aggregation="probability",
                rng=np.random.default_rng(seed), patience=3,
                evaluate_fn=lambda h: {"loss": float(np.linalg.norm(h[0][0] - [5, 6]))})


def test_a_resumed_run_reaches_the_same_hypotheses_as_an_uninterrupted_one(
    tmp_path: Path,
) -> None:
    # Prepare: an uninterrupted run of 6 rounds.
    manager = FakeManager([str(i) for i in range(6)])
    whole = resumable(seed=9)
    whole.evaluate(0, Parameters([], ""))
    run_rounds(whole, manager, range(1, 7))

    # Execute: 3 rounds, a checkpoint on disk, then a new strategy (seeded differently: the
    # checkpoint's rng state must win) continuing with Flower's rounds 1..3.
    first = resumable(seed=9)
    first.evaluate(0, Parameters([], ""))
    run_rounds(first, manager, range(1, 4))
    state, arrays = first.state()
    write_checkpoint(tmp_path / "checkpoint.npz", {"strategy": state}, arrays)
    saved, saved_arrays = read_checkpoint(tmp_path / "checkpoint.npz")
    resumed = resumable(seed=12345)
    resumed.restore(saved["strategy"], saved_arrays)
    assert resumed.evaluate(0, Parameters([], "")) is None  # round 3, already recorded
    run_rounds(resumed, manager, range(1, 4))

    # Assert: bit-identical hypotheses, and the same records, clients and rng state.
    assert np.array_equal(one_layer(resumed), one_layer(whole))
    assert np.array_equal(resumed.best_hypotheses[0][0], whole.best_hypotheses[0][0])
    assert [r.to_dict() for r in resumed.history] == [r.to_dict() for r in whole.history]
    assert resumed.clients == whole.clients
    assert (resumed.best_loss, resumed.best_round, resumed.rounds_completed) == (
        whole.best_loss, whole.best_round, whole.rounds_completed)
    assert resumed.last_round == 6
    # The rng continues where the uninterrupted run's is: the next round samples the same
    # devices (4 of 6, drawn from it), and aggregates to the same hypotheses.
    assert not whole.stopped_early
    next_whole = whole.configure_fit(7, Parameters([], ""), manager)
    next_resumed = resumed.configure_fit(4, Parameters([], ""), manager)
    assert len(next_whole) == 4
    assert [p.cid for p, _ in next_resumed] == [p.cid for p, _ in next_whole]
    for strategy, instructions, flower_round in ((whole, next_whole, 7),
                                                 (resumed, next_resumed, 4)):
        current = one_layer(strategy)
        strategy.aggregate_fit(flower_round, [(p, device_reply(p.cid, 7, current))
                                              for p, _ in instructions], [])
    assert np.array_equal(one_layer(resumed), one_layer(whole))


def test_restore_refuses_a_state_of_other_shapes() -> None:
    state, arrays = make(hyp([1.0, 1.0], [0.0, 0.0])).state()

    with pytest.raises(ValueError, match="holds 2 hypotheses of layer shapes"):
        make(hyp([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])).restore(state, arrays)
    with pytest.raises(ValueError, match="this run has 1"):
        make(hyp([1.0, 1.0])).restore(state, arrays)


class TimedManager(FakeManager):
    """Records each wait with its timeout."""

    def __init__(self, cids: Sequence[str]) -> None:
        super().__init__(cids)
        self.waits: list[tuple[int, int]] = []

    def wait_for(self, num_clients: int, timeout: int) -> bool:
        self.waits.append((num_clients, timeout))
        return super().wait_for(num_clients, timeout)


def test_a_small_federation_waits_once_briefly_and_then_samples_what_is_connected() -> None:
    # Prepare: 3 devices, the default 7 per round (`--supernodes 3` used to hang for a day).
    manager = TimedManager(["a", "b", "c"])
    strategy = make(hyp([0.0]), clients_per_round=7, round_timeout=60.0)

    # Execute
    first = strategy.configure_fit(1, Parameters([], ""), manager)
    second = strategy.configure_fit(2, Parameters([], ""), manager)

    # Assert: one wait of at most 15 s for 7, in the first round only; then all 3 are sampled.
    assert manager.waits == [(7, 15)]
    assert len(first) == len(second) == 3


def test_the_wait_for_min_replies_is_the_round_timeout() -> None:
    manager = TimedManager(["a"])
    strategy = make(hyp([0.0]), clients_per_round=2, min_replies=2, round_timeout=7.5)

    assert strategy.configure_fit(1, Parameters([], ""), manager) == []
    assert manager.waits == [(2, 8), (2, 8)]  # forming (min(15, 7.5)), then min-replies
    assert strategy.incomplete_reason == ("round 1: too few devices: 1 connected, 1 answered "
                                          "their last round, min-replies=2")
