"""Experiments pair for real: at one seed, runs differing in ν ask the same devices each round.

Three federations of the synthetic task on Flower's Simulation Engine (real ServerApp and
ClientApp, 8 virtual SuperNodes, 4 rounds of 3): ν = 1 twice and ν = 5 once, all at seed 3.
The Simulation Engine gives the SuperNodes new random node ids in every run; the experiments
draw each round's devices by the names the devices announce (``sample-by = "name"``), so:

* the runs at ν = 1 and ν = 5 ask the same devices (``client-<partition>``) in every round;
* the two runs at ν = 1 are identical (seeded noise keyed on the partition), number for number.
"""

from __future__ import annotations

from typing import Any

import pytest

from experiments.common import Context, FederationSpec

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
    for label, nu, cache in (("nu1", 1.0, "a"), ("nu1-again", 1.0, "b"), ("nu5", 5.0, "a")):
        ctx = Context(name="pairing", out=root / label, cache=root / cache, profile="smoke",
                      timeout=600)
        out[label] = ctx.run(spec(nu))
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


def test_two_runs_with_one_config_give_the_same_numbers(runs: dict) -> None:
    a, b = runs["nu1"], runs["nu1-again"]
    assert asked(a) == asked(b)
    assert a["hypotheses"] == b["hypotheses"]
    assert [e["val_loss"] for e in a["history"]] == [e["val_loss"] for e in b["history"]]
    def per_client(summary: dict) -> dict:  # all but the node ids the engine drew
        return {name: {k: v for k, v in entry.items() if k != "node_ids"}
                for name, entry in summary["privacy"]["per_client"].items()}

    assert per_client(a) == per_client(b)
