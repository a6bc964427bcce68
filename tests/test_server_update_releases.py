"""The server update driven by real releases: it uses the releases and nothing else.

Four real :class:`client.numpy_client.GpflClient` devices (own policy, own ledger on disk,
seeded Laplace noise at ν = 5) and the ServerApp's strategy, played as Flower's ``Server.fit``
plays them (the in-process loop of ``experiments.reproductions.small_federations``). The test checks
that

* each round sends each device exactly one instruction, with the papers' config (the server
  hypotheses, ``num-hypotheses`` and ``server-round``; nothing new), and the strategy talks to
  no device otherwise (the proxies raise if it tries);
* each device's ledger holds exactly one charge per round, n/ν = 2/5 each, and no other ledger
  appears: the update costs no privacy;
* each round's new hypotheses are recomputed from the previous hypotheses, the round's
  releases (as the devices returned them) and the strategy's own records alone.
"""

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from experiments.core.in_process import Manager
from experiments.reproductions.small_federations import (
    build_clients,
    build_strategy,
    play_round,
    run_config,
)
from mechanisms import PrivacyLedger
from server.settings import RunSettings
from strategies.aggregation import cluster_means
from strategies.clustering import assign_clusters

ROUNDS = 6
ARMS: list[dict[str, Any]] = [
    {"server-update": "step", "server-step": 0.5, "reseed-after": 1},
    {"server-update": "anneal", "anneal-after": 1, "anneal-rounds": 2.0, "reseed-after": 1},
    {"server-update": "plateau", "anneal-after": 1, "plateau-factor": 0.5, "reseed-after": 1},
    {"server-update": "mean"},
]


def _flat(hypotheses: list[list[np.ndarray]]) -> np.ndarray:
    return np.stack([np.concatenate([a.ravel() for a in h]) for h in hypotheses])


@pytest.mark.parametrize("arm", ARMS, ids=[a["server-update"] for a in ARMS])
def test_the_update_consumes_the_releases_only(tmp_path: Path, arm: dict[str, Any]) -> None:
    config = run_config(4, seed=3, rounds=ROUNDS, arm=arm)
    settings = RunSettings.from_run_config(config)
    strategy = build_strategy(settings)
    clients = build_clients(config, 4, tmp_path)
    calls: list[tuple[str, Any, dict[str, Any]]] = []
    for cid, client in clients.items():
        def spy(parameters: Any, cfg: dict[str, Any], cid: str = cid,
                fit: Any = client.fit) -> Any:
            out = fit(parameters, cfg)
            calls.append((cid, out[0], dict(cfg)))
            return out
        client.fit = spy  # type: ignore[method-assign,assignment]
    manager = Manager(list(clients))
    parameters = strategy.initialize_parameters(manager)  # type: ignore[arg-type]
    assert parameters is not None
    strategy.evaluate(0, parameters)
    reseeded: dict[int, int] = {}
    restored: list[int] = []

    for t in range(1, ROUNDS + 1):
        before, history = _flat(strategy.hypotheses), list(strategy.history)
        calls.clear()
        parameters = play_round(strategy, clients, t, parameters, manager)

        # One instruction per device, the papers' config only.
        assert sorted(cid for cid, _, _ in calls) == sorted(clients)
        assert all(cfg == {"num-hypotheses": 2, "server-round": t} for _, _, cfg in calls)
        # The new hypotheses from the releases alone (in the order the strategy got them).
        released = np.stack([arrays[0] for _, arrays, _ in calls]).astype(np.float32)
        labels = assign_clusters(released, before)
        means = cluster_means(released, np.ones(len(released)), labels, before, "mean",
                              np.random.default_rng())
        expected, _ = settings.server_update.apply(before, means, released, labels, history, t,
                                                   reseeded)
        # plateau: a stall in the server's own validation restores its best hypotheses.
        if settings.server_update.restores(strategy.history, reseeded, strategy.best_round):
            expected = _flat(strategy.best_hypotheses)
            restored.append(t)
        np.testing.assert_allclose(_flat(strategy.hypotheses), expected, rtol=1e-6, atol=1e-6)

    # The plateau arm restored at least once in these rounds (the case above was exercised).
    assert bool(restored) == (arm["server-update"] == "plateau")
    # No extra spend: one charge of n/ν = 0.4 per round in each device's own ledger, no other.
    ledgers = sorted(p.name for p in tmp_path.glob("*.json"))
    assert ledgers == sorted(f"{c.policy.client_name}.json" for c in clients.values())
    for client in clients.values():
        ledger = PrivacyLedger(client.policy.ledger_path, delta=1e-5)
        assert len(ledger.entries()) == ROUNDS
        assert ledger.spent().d_privacy == pytest.approx(ROUNDS * 2 / 5)
