"""Experiments pair for real, and the direct engine gives the Simulation Engine's numbers.

Four federations of the synthetic task (real ServerApp and ClientApp, 8 virtual SuperNodes, 4
rounds of 3, k = 2, Euclidean Laplace): ν = 1 twice and ν = 5 once on the experiments' direct
engine, and ν = 1 once more on Flower's Simulation Engine (Ray), all at seed 3. Both engines give
the nodes new random ids in every run; the experiments draw each round's devices by the names
the devices announce (``sample-by = "name"``), so:

* the runs at ν = 1 and ν = 5 ask the same devices (``client-<partition>``) in every round;
* the two runs at ν = 1 are identical (seeded noise keyed on the partition), number for number;
* the run on the Simulation Engine is identical to them too: every round's devices, clusters,
  validation loss and hypotheses, and every device's ledger (what lets the experiments run on
  the direct engine and share a cache with runs of the Simulation Engine).
"""

from __future__ import annotations

from typing import Any

import pytest

from experiments.core.common import Context, FederationSpec

pytestmark = pytest.mark.slow


def spec(nu: float) -> FederationSpec:
    config = {"task": "synthetic", "optima": "5,6;4,-4.5", "samples-per-user": 10,
              "validation-users": 20, "clients-per-round": 3, "local-epochs": 1,
              "learning-rate": 0.1, "batch-size": 10, "num-rounds": 4, "patience": 0,
              "seed": 3, "data-seed": 3, "mechanism": "laplace", "noise-multiplier": nu}
    return FederationSpec(f"pairing nu={nu}", config, 8)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("pairing")
    out: dict[str, dict[str, Any]] = {}
    for label, nu, cache, engine in (("nu1", 1.0, "a", "direct"),
                                     ("nu1-again", 1.0, "b", "direct"),
                                     ("nu5", 5.0, "a", "direct"),
                                     ("nu1-simulation", 1.0, "c", "simulation")):
        ctx = Context(name="pairing", out=root / label, cache=root / cache, profile="smoke",
                      timeout=600, engine=engine)
        out[label] = ctx.run(spec(nu))
        assert ctx.engines == {engine: 1}
        assert not out[label]["_cached"]
    return out


def asked(summary: dict[str, Any]) -> list[list[str]]:
    return [entry["asked"] for entry in summary["history"][1:]]


def test_runs_at_one_seed_and_other_nu_ask_the_same_devices(runs: dict) -> None:
    # Assert: 4 rounds of 3 devices, named by partition, the same in both runs.
    first, other = asked(runs["nu1"]), asked(runs["nu5"])
    assert len(first) == 4 and all(len(r) == 3 for r in first)
    assert all(key.startswith("name:client-") for r in first for key in r)
    assert first == other
    assert len({tuple(sorted(r)) for r in first}) > 1  # a new draw each round


@pytest.mark.parametrize("again", ["nu1-again", "nu1-simulation"])
def test_two_runs_with_one_config_give_the_same_numbers(runs: dict, again: str) -> None:
    a, b = runs["nu1"], runs[again]
    assert len(a["hypotheses"]) == 2 and a["rounds_completed"] == 4
    assert [e["cluster_sizes"] for e in a["history"]] == [e["cluster_sizes"] for e in b["history"]]
    def ledgers(summary: dict) -> dict:  # all but where the run kept them
        report = summary["ledgers"]
        return {**report, "per_client": {name: {k: v for k, v in entry.items() if k != "path"}
                                         for name, entry in report["per_client"].items()}}

    assert ledgers(a) == ledgers(b) and a["ledgers"]["max"] > 0
    assert asked(a) == asked(b)
    assert a["hypotheses"] == b["hypotheses"]
    assert [e["val_loss"] for e in a["history"]] == [e["val_loss"] for e in b["history"]]
    def per_client(summary: dict) -> dict:  # all but the node ids the engine drew
        return {name: {k: v for k, v in entry.items() if k != "node_ids"}
                for name, entry in summary["privacy"]["per_client"].items()}

    assert per_client(a) == per_client(b)
