"""The same ServerApp and ClientApp on Flower's Simulation Engine (Ray), the paper's scale.

001, section 4.1: 100 users of 10 samples, 7 per round, k = 2, E = 1, s = 0.1, B = 10,
ν = 5. Our NumPy re-runs of this setting reach the optima in ~100-150 rounds, but when the two
initial hypotheses are drawn close together the clusters separate late: on the Simulation
Engine seeds 0-3 had their best validation round at 216-283 (and seed 0 was still 1.9 from an
optimum at round 150). So 300 rounds, and the paper's patience of 6, which would stop a noisy
run early, is off.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from server.launcher import launch
from tests.conftest import flower_processes

pytestmark = pytest.mark.integration

OPTIMA = np.array([[5.0, 6.0], [4.0, -4.5]])
PAPER = {"num-rounds": 300, "clients-per-round": 7, "local-epochs": 1, "learning-rate": 0.1,
         "batch-size": 10, "noise-multiplier": 5.0, "patience": 0, "seed": 1}


def best_matching(hypotheses: np.ndarray) -> list[float]:
    """Distances hypothesis→optimum under the one-to-one matching that fits best."""
    perm = min(itertools.permutations(range(len(hypotheses))),
               key=lambda p: max(np.linalg.norm(hypotheses[p[i]] - OPTIMA[i]) for i in (0, 1)))
    return [float(np.linalg.norm(hypotheses[perm[i]] - OPTIMA[i])) for i in (0, 1)]


@pytest.mark.timeout(900)
def test_paper_setting_reaches_both_optima_and_fedavg_does_not(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Execute: ours (k = 2, Laplace ν = 5) and the ablation (k = 1 = FedAvg), same seed.
    ours = launch(supernodes=100, simulation=True, run_config={**PAPER, "num-hypotheses": 2},
                  out_dir=tmp_path / "k2", echo=lambda _: None, timeout=800).summary
    fedavg = launch(supernodes=100, simulation=True,
                    run_config={**PAPER, "num-hypotheses": 1, "num-rounds": 60},
                    out_dir=tmp_path / "k1", echo=lambda _: None, timeout=800).summary

    # Assert: each hypothesis within 0.5 of a distinct optimum.
    distances = best_matching(np.asarray(ours["hypotheses"]))
    assert max(distances) < 0.5, distances
    # Assert: one hypothesis ends between the optima, far from both, with a clearly
    # worse validation RMSE (001, Figure 1b).
    single = np.asarray(fedavg["hypotheses"][0])
    assert min(np.linalg.norm(single - o) for o in OPTIMA) > 2.0, single
    assert fedavg["best_val_loss"] > 2 * ours["best_val_loss"]
    # Assert: the accounting of 100 virtual clients: spend = participations × n/ν.
    per_client = ours["privacy"]["per_client"]
    assert sum(c["participations"] for c in per_client.values()) == 7 * 300
    for client in per_client.values():
        assert client["spend"] == pytest.approx(client["participations"] * 0.4)
    assert flower_processes() == []
