"""The ServerApp's side of faults without processes: status, checkpoint, resume, bad replies."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.common import Parameters

from server.app import build_components
from server.checkpoint import (
    CHECKPOINT_NAME,
    CheckpointError,
    check_identity,
    read_checkpoint,
    write_checkpoint,
)
from server.results import INLINE_NUMBERS, mark_incomplete
from server.settings import RunSettings, SettingError
from strategies import ClusteredStrategy
from tests.test_server import DEFAULTS
from tests.test_strategies_clustered import FakeManager, reply

NODES = [str(100 + i) for i in range(4)]


def config(out: Path, **over: Any) -> dict[str, Any]:
    return {**DEFAULTS, "out-dir": str(out), "seed": 1, "num-rounds": 4, "clients-per-round": 4,
            "validation-users": 4, **over}


def play(strategy: ClusteredStrategy, manager: FakeManager, flower_rounds: range,
         bad: dict[str, Any] | None = None) -> None:
    """Flower's loop with devices that release their nearest hypothesis moved by a fixed step
    (deterministic in the device and the round); ``bad`` adds metrics to device 0's reply."""
    for server_round in flower_rounds:
        instructions = strategy.configure_fit(server_round, Parameters([], ""), manager)
        t = int(instructions[0][1].config["server-round"])
        current = np.stack([h[0] for h in strategy.hypotheses])
        results = []
        for proxy, _ in instructions:
            i = NODES.index(proxy.cid)
            step = np.random.default_rng([i, t]).normal(0.0, 0.3, current.shape[1])
            release = (current[i % len(current)] + step).astype(np.float32)
            metrics = {"client-name": f"client-{i}", "mechanism": "laplace", "spend-d": 0.4 * t,
                       "releases": t, **((bad or {}) if i == 0 else {})}
            results.append((proxy, reply(release, sigma=None, **metrics)))
        strategy.aggregate_fit(server_round, results, [])
        strategy.evaluate(server_round, Parameters([], ""))


def started(cfg: dict[str, Any]) -> tuple[ClusteredStrategy, Any]:
    components, _ = build_components(cfg)
    strategy = components.server.strategy
    assert isinstance(strategy, ClusteredStrategy)
    strategy.evaluate(0, Parameters([], ""))
    return strategy, components


def summary_of(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())


# ---------------------------------------------------------------------------- status


def test_the_summary_says_running_then_complete_and_a_checkpoint_follows_every_round(
    tmp_path: Path,
) -> None:
    strategy, components = started(config(tmp_path))
    manager = FakeManager(NODES)
    assert components.config.round_timeout == 60.0

    play(strategy, manager, range(1, 4))
    running = summary_of(tmp_path)
    state, _ = read_checkpoint(tmp_path / "checkpoint.npz")
    play(strategy, manager, range(4, 5))
    done = summary_of(tmp_path)

    assert (running["status"], running["incomplete_reason"], running["last_round"]) == (
        "running", None, 3)
    assert state["strategy"]["round"] == 3 and len(state["recorder"]["history"]) == 4
    assert done["status"] == "complete" and done["last_round"] == 4
    entry = done["history"][-1]
    assert (entry["sampled"], entry["missing"], entry["failed"], entry["kept"]) == (4, [], [],
                                                                                   None)
    assert not list(tmp_path.glob(".*tmp"))  # no temporary file left behind


def test_too_few_devices_make_the_run_incomplete_and_say_how_to_resume(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    strategy, _ = started(config(tmp_path, **{"min-replies": 3, "round-timeout": 0.01}))

    with caplog.at_level(logging.ERROR, logger="server"):
        assert strategy.configure_fit(1, Parameters([], ""), FakeManager(NODES[:2])) == []

    summary = summary_of(tmp_path)
    assert summary["status"] == "incomplete"
    assert summary["incomplete_reason"] == ("round 1: too few devices: 2 connected, "
                                            "2 answered their last round, min-replies=3")
    assert any("[gpfl] run incomplete" in r.getMessage()
               and f"resume-from={tmp_path}" in r.getMessage() for r in caplog.records)


def test_an_early_stop_is_its_own_status(tmp_path: Path) -> None:
    strategy, _ = started(config(tmp_path, patience=1))
    strategy.best_loss = -1.0  # nothing can beat it: the next validation stops the run

    play(strategy, FakeManager(NODES), range(1, 2))

    assert summary_of(tmp_path)["status"] == "stopped-early"


def test_a_run_that_died_is_marked_incomplete_and_a_finished_one_is_not(tmp_path: Path) -> None:
    strategy, _ = started(config(tmp_path))
    play(strategy, FakeManager(NODES), range(1, 2))

    marked = mark_incomplete(tmp_path, "the ServerApp exited with code 1")

    assert marked is not None and marked["status"] == "incomplete"
    assert summary_of(tmp_path)["incomplete_reason"] == "the ServerApp exited with code 1"
    assert mark_incomplete(tmp_path / "nothing", "x") is None


def test_a_string_spend_is_dropped_and_the_recorder_goes_on(tmp_path: Path) -> None:
    # Measured before: one reply whose spend-d was a string killed the ServerApp (exit 201).
    strategy, _ = started(config(tmp_path))

    play(strategy, FakeManager(NODES), range(1, 3), bad={"spend-d": "a lot"})

    summary = summary_of(tmp_path)
    assert summary["last_round"] == 2
    # A reply with malformed metrics binds no name: the device is known by its node id.
    assert summary["history"][-1]["dropped"] == [
        ["node 100", "metric 'spend-d' must be a finite number >= 0, got 'a lot'"]]
    entry = summary["privacy"]["per_client"]["node 100"]
    assert entry["dropped"] == 2 and entry["spend"] is None


def test_min_replies_beyond_clients_per_round_fails_early() -> None:
    with pytest.raises(SettingError, match="min-replies=8 can never be reached"):
        RunSettings.from_run_config({**DEFAULTS, "min-replies": 8})


@pytest.mark.parametrize("bad", [{"round-timeout": 0}, {"round-timeout": "soon"},
                                 {"min-replies": 0}])
def test_bad_deadline_settings_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(SettingError, match=next(iter(bad))):
        RunSettings.from_run_config({**DEFAULTS, **bad})


# ---------------------------------------------------------------------------- checkpoint


def test_checkpoint_round_trip_is_exact(tmp_path: Path) -> None:
    arrays = {"hypotheses": np.array([[0.1, np.float32(1e-38)]], np.float32)}
    state = {"a": [1, 2.5, None], "big": 2**100}

    write_checkpoint(tmp_path / "c.npz", state, arrays)
    again, got = read_checkpoint(tmp_path / "c.npz")

    assert again == {"format": 1, **state}
    assert got["hypotheses"].dtype == np.float32
    assert np.array_equal(got["hypotheses"], arrays["hypotheses"])


@pytest.mark.parametrize("content", [b"", b"not a zip", b"PK\x03\x04garbage"])
def test_a_damaged_checkpoint_is_refused_clearly(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "c.npz").write_bytes(content)

    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        read_checkpoint(tmp_path / "c.npz")
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        read_checkpoint(tmp_path / "missing.npz")


def test_identity_differences_are_all_named() -> None:
    with pytest.raises(CheckpointError, match=r"task='digits' there, 'synthetic' here; "
                                              r"num-hypotheses=3 there, 2 here"):
        check_identity({"task": "digits", "num-hypotheses": 3},
                       {"task": "synthetic", "num-hypotheses": 2}, "runs/x")


# ---------------------------------------------------------------------------- resume


def test_resume_from_continues_the_run_and_ends_where_an_uninterrupted_one_does(
    tmp_path: Path,
) -> None:
    manager = FakeManager(NODES)
    # Prepare: an uninterrupted 4-round run, and one stopped after round 2.
    whole, _ = started(config(tmp_path / "whole"))
    play(whole, manager, range(1, 5))
    first, _ = started(config(tmp_path / "run"))
    play(first, manager, range(1, 3))

    # Execute: a new ServerApp continues the run directory (out-dir defaults to it).
    cfg = config(tmp_path / "run", **{"resume-from": str(tmp_path / "run")})
    del cfg["out-dir"]
    components, recorder = build_components(cfg)
    resumed = components.server.strategy
    assert isinstance(resumed, ClusteredStrategy)
    assert components.config.num_rounds == 2 and resumed.last_round == 2
    assert resumed.evaluate(0, Parameters([], "")) is None  # round 2, already recorded
    # Flower's rounds 1 and 2 are the run's 3 and 4 (play's devices use the round they are
    # sent in their noise, so a wrong round would change the hypotheses).
    play(resumed, manager, range(1, 3))

    # Assert: the same hypotheses as the uninterrupted run, the history continued once.
    summary, reference = summary_of(tmp_path / "run"), summary_of(tmp_path / "whole")
    assert recorder.out_dir == tmp_path / "run"
    assert summary["status"] == "complete"
    assert [e["round"] for e in summary["history"]] == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(summary["last_hypotheses"], reference["last_hypotheses"])
    assert summary["best_val_loss"] == reference["best_val_loss"]
    assert [r["after_round"] for r in summary["resumed"]] == [2]
    assert summary["privacy"]["per_client"]["client-1"]["participations"] == 4


def test_a_large_models_hypotheses_are_in_the_checkpoint_and_a_resume_reads_them(
    tmp_path: Path,
) -> None:
    # Prepare: 2 hypotheses of 6,000 parameters (12,000 numbers: more than summary.json holds as
    # JSON), 2 of 4 rounds played.
    large = {"optima-repeat": 3000, "validation-users": 1, "samples-per-user": 2}
    assert 2 * 2 * 3000 > INLINE_NUMBERS
    strategy, _ = started(config(tmp_path, **large))
    initial = np.stack([np.concatenate([a.ravel() for a in h]) for h in strategy.hypotheses])
    manager = FakeManager(NODES)
    play(strategy, manager, range(1, 3))

    # Execute: the summary after round 2, then a resumed ServerApp's rounds 3 and 4.
    after_two = summary_of(tmp_path)
    components, _ = build_components(config(tmp_path, **large, **{"resume-from": str(tmp_path)}))
    resumed = components.server.strategy
    assert isinstance(resumed, ClusteredStrategy)
    play(resumed, manager, range(1, 3))
    summary = summary_of(tmp_path)

    # Assert: the summary names the checkpoint's arrays, which hold the hypotheses (the initial
    # ones kept across the resume); the run completed.
    _, arrays = read_checkpoint(tmp_path / CHECKPOINT_NAME)
    for key, array in (("hypotheses", "best_hypotheses"), ("last_hypotheses", "hypotheses"),
                       ("initial_hypotheses", "initial_hypotheses")):
        assert summary[key] == {"checkpoint": CHECKPOINT_NAME, "array": array,
                                "shape": [2, 6000], "dtype": "float32"}, key
        assert arrays[array].shape == (2, 6000) and arrays[array].dtype == np.float32
    np.testing.assert_array_equal(arrays["hypotheses"], np.stack(
        [np.concatenate([a.ravel() for a in h]) for h in resumed.hypotheses]))
    np.testing.assert_array_equal(arrays["initial_hypotheses"], initial)
    assert after_two["initial_hypotheses"] == summary["initial_hypotheses"]
    assert summary["status"] == "complete" and summary["last_round"] == 4
    assert summary["optima_distances"] is None


def test_resuming_a_finished_run_runs_no_round(tmp_path: Path) -> None:
    strategy, _ = started(config(tmp_path, **{"num-rounds": 1}))
    play(strategy, FakeManager(NODES), range(1, 2))

    components, _ = build_components(config(tmp_path, **{"num-rounds": 1,
                                                         "resume-from": str(tmp_path)}))

    assert components.config.num_rounds == 0
    assert summary_of(tmp_path)["status"] == "complete"


@pytest.mark.parametrize(
    ("change", "named"),
    [({"num-hypotheses": 3}, "num-hypotheses=2 there, 3 here"), ({"seed": 2}, "seed=1 there"),
     ({"mechanism": "gaussian", "aggregation": "mean"}, "mechanism='laplace' there")],
)
def test_resume_refuses_another_runs_checkpoint(
    tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    strategy, _ = started(config(tmp_path / "a"))
    play(strategy, FakeManager(NODES), range(1, 2))

    with pytest.raises(CheckpointError, match=named):
        build_components(config(tmp_path / "b", **{"resume-from": str(tmp_path / "a"),
                                                   **change}))


def test_resume_from_a_folder_without_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        build_components(config(tmp_path, **{"resume-from": str(tmp_path / "nowhere")}))


def test_resuming_after_round_0_does_not_record_round_0_twice(tmp_path: Path) -> None:
    started(config(tmp_path))  # round 0 recorded and checkpointed, then the ServerApp died

    components, _ = build_components(config(tmp_path, **{"resume-from": str(tmp_path)}))
    strategy = components.server.strategy
    assert isinstance(strategy, ClusteredStrategy)
    assert strategy.evaluate(0, Parameters([], "")) is None
    play(strategy, FakeManager(NODES), range(1, 5))

    assert components.config.num_rounds == 4
    assert [e["round"] for e in summary_of(tmp_path)["history"]] == [0, 1, 2, 3, 4]
