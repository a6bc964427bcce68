"""The adaptive rogue device, and federations of real clients against it, in one process.

A rogue device charges its ledger honestly (it is a real :class:`client.numpy_client.GpflClient`
that trains and releases) and then replaces its release by the largest one the server's
screening accepts: it knows the rule (:func:`strategies.norms.screen_norms`), the round's
other releases and the screening's reference, and finds the largest distance by bisection on
the rule itself, so it stays the worst case whatever the rule becomes. It pushes one
hypothesis (the first) straight away from the other; two rogues push together.

:func:`run_federation` drives the real ServerApp components (``server.app.build_components``:
the strategy with its screening, clustering, aggregation and validation) and ten real clients
through Flower's loop of ``configure_fit`` → ``fit`` → ``aggregate_fit`` → ``evaluate``, in
process (no gRPC, no Ray: the Simulation Engine runs the same objects). ``python -m
tests.rogues`` prints the table of docs/RESULTS.md ("Rogue devices").
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_proxy import ClientProxy

from client.app import device_task
from client.numpy_client import GpflClient
from client.policy import DevicePolicy
from server.app import build_components
from settings import federation_defaults
from strategies import ClusteredStrategy
from strategies.clustering import nearest_hypothesis
from strategies.norms import screen_norms
from strategies.persistence import Persistence, residual_units
from tests.test_strategies_clustered import FakeManager, FakeProxy

OPTIMA = np.array([[5.0, 6.0], [4.0, -4.5]])


def largest_accepted(honest: np.ndarray, hypotheses: np.ndarray, strategy: ClusteredStrategy,
                     count: int = 1, names: Sequence[str] = ()) -> np.ndarray:
    """``count`` identical releases as far from hypothesis 0 as the server's rules let all pass.

    The rules: the screening (each release's distance) and, when the strategy has one, the
    persistence test (no rogue's summed residuals may reach its threshold this round).

    Parameters
    ----------
    honest : np.ndarray
        (m, n) float32: the round's other releases.
    hypotheses : np.ndarray
        (k, n): the hypotheses the round sent.
    strategy : ClusteredStrategy
        The server's strategy (its screening's limits and reference).
    count : int
        Rogue releases in the round (all at the same place).
    names : sequence of str
        The rogues' names (the persistence test keeps a sum per name).

    Returns
    -------
    np.ndarray
        (count, n) float32.
    """
    # The screening's reference and the persistence sums, as the strategy's checkpoint holds them.
    saved = strategy.state()[0]["screen"]
    reference = np.asarray(saved["reference"], dtype=np.float64)
    persistence = Persistence(strategy.persistence_threshold)
    persistence.load_dict(saved["persistence"])
    target = hypotheses[0].astype(np.float64)
    away = target - hypotheses[1] if hypotheses.shape[0] > 1 else np.ones_like(target)
    norm = np.linalg.norm(away)
    direction = away / norm if norm > 0 else np.eye(target.size)[0]

    # Under the persistence test the rogue aims its *residual* (its offset from the cluster's
    # median offset, in units of the round's median residual) at the unit that pushes furthest
    # away while its summed residuals stay below the threshold; the push along that unit is then
    # as large as the rules allow.
    start, aim = target, direction
    if persistence.threshold > 0 and names and honest.shape[0]:
        labels = nearest_hypothesis(honest, hypotheses)
        mine = honest[labels == 0].astype(np.float64) - target
        drift = np.median(mine, axis=0) if mine.shape[0] else np.zeros_like(target)
        offsets = honest.astype(np.float64) - hypotheses[labels]
        residuals = np.vstack([offsets[labels == j] - np.median(offsets[labels == j], axis=0)
                               for j in np.unique(labels)])
        tau = float(np.median(np.linalg.norm(residuals, axis=1)))
        worst = max(names, key=persistence.statistic)
        unit = best_unit(persistence.sums.get(worst), persistence.counts.get(worst, 0),
                         direction, persistence.threshold)
        start, aim = target + drift, unit * tau

    def rows(r: float) -> np.ndarray:
        return np.tile((start + r * aim).astype(np.float32), (count, 1))

    def passes(r: float) -> bool:
        matrix = np.vstack([honest, rows(r)]).astype(np.float32)
        sigmas = np.full(matrix.shape[0], np.nan)
        reasons, _ = screen_norms(matrix, hypotheses, sigmas, reference, strategy.norm_limits)
        if any(reason is not None for reason in reasons[-count:]):
            return False
        if persistence.threshold <= 0:
            return True
        units = residual_units(matrix, hypotheses)[-count:]
        return all(persistence.statistic(name, unit) < persistence.threshold
                   for name, unit in zip(names, units, strict=True))

    low, high = 0.0, 1e15
    if passes(high):
        return rows(high)
    for _ in range(80):  # log-bisection, then linear: ~1e-9 relative
        middle = math.sqrt(max(low, 1e-9) * high) if high / max(low, 1e-9) > 2 else (
            (low + high) / 2)
        low, high = (middle, high) if passes(middle) else (low, middle)
    return rows(low)


def best_unit(total: np.ndarray | None, count: int, direction: np.ndarray,
              threshold: float) -> np.ndarray:
    """The residual unit (norm ≤ 1) furthest along ``direction`` that keeps ‖S + u‖ < c·√(n+1).

    ``total`` is the rogue's S so far and ``count`` its n; the search runs over the plane of
    ``direction`` and S (where the best unit lies), 721 angles × 101 lengths.
    """
    if total is None:
        return direction
    radius = threshold * math.sqrt(count + 1) * (1 - 1e-3)
    across = total - (total @ direction) * direction
    size = np.linalg.norm(across)
    across = across / size if size > 0 else np.zeros_like(direction)
    best, score = np.zeros_like(direction), 0.0
    for theta in np.linspace(-math.pi, math.pi, 721):
        way = math.cos(theta) * direction + math.sin(theta) * across
        for length in np.linspace(1.0, 0.0, 101):
            if np.linalg.norm(total + length * way) < radius:
                if length * math.cos(theta) > score:
                    best, score = length * way, length * math.cos(theta)
                break
    return best


@dataclass
class Outcome:
    """How one federation ended: the optima's distances to the last and the delivered hypotheses."""

    last: list[float]
    best: list[float]
    honest_dropped: int
    rogue_dropped: int


def one_matrix(strategy: ClusteredStrategy) -> np.ndarray:
    """The strategy's hypotheses as a (k, n) float32 matrix."""
    return np.stack([np.concatenate([a.ravel() for a in h])
                     for h in strategy.hypotheses]).astype(np.float32)


def _fit_res(arrays: list[np.ndarray], metrics: dict[str, Any]) -> FitRes:
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), 1, metrics)


def run_federation(seed: int, *, rogues: int = 0, aggregator: str = "mean", rounds: int = 80,
                   devices: int = 10, nu: float = 5.0, workdir: Path | None = None,
                   overrides: dict[str, Any] | None = None,
                   trace: Callable[[int, np.ndarray, Any], None] | None = None) -> Outcome:
    """One synthetic federation of ``devices`` real clients, ``rogues`` of them adaptive rogues.

    Every device is sampled every round (k = 2, Laplace ν, E = 5); devices ``0 .. rogues-1``
    are the rogues. ``overrides`` sets any other federation setting;
    ``trace(round, hypotheses, record)`` sees each round.
    """
    # Ledgers and summaries are written with fsync every round: in memory where there is a
    # tmpfs, or the ledger writes take most of the time.
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=workdir or (shm if shm.is_dir() else None)) as tmp:
        run: dict[str, Any] = {
            **federation_defaults(), "task": "synthetic", "num-hypotheses": 2,
            "mechanism": "laplace", "noise-multiplier": nu, "users": devices,
            "clients-per-round": devices, "min-replies": 1, "num-rounds": rounds,
            "local-epochs": 5, "seed": seed, "patience": 0, "out-dir": f"{tmp}/run",
            "cluster-aggregator": aggregator, **(overrides or {}),
        }
        components, _ = build_components(run)
        assert components.server is not None
        strategy = components.server.strategy
        assert isinstance(strategy, ClusteredStrategy)
        clients = {}
        for i in range(devices):
            policy = DevicePolicy.load({
                "partition-id": i, "num-partitions": devices, "ledger-dir": f"{tmp}/ledgers",
                "allow-seeded-noise": True, "noise-seed": 1000 * seed + i,
                "cap-d-privacy": 1e6}, environ={})
            clients[str(i)] = GpflClient(device_task(run, policy), run, policy)
        manager = FakeManager(list(clients))
        rogue_ids = {str(i) for i in range(rogues)}
        params = strategy.initialize_parameters(manager)
        assert params is not None
        honest_dropped = rogue_dropped = 0
        for server_round in range(1, rounds + 1):
            instructions = strategy.configure_fit(server_round, params, manager)
            current = one_matrix(strategy)
            replies: dict[str, tuple[list[np.ndarray], dict[str, Any]]] = {}
            for proxy, ins in instructions:
                arrays, _, metrics = clients[proxy.cid].fit(
                    parameters_to_ndarrays(ins.parameters), dict(ins.config))
                replies[proxy.cid] = (arrays, metrics)
            honest = [np.concatenate([a.ravel() for a in arrays])
                      for cid, (arrays, m) in replies.items()
                      if cid not in rogue_ids and not m.get("declined")]
            rogue_here = [cid for cid in replies if cid in rogue_ids]
            if rogue_here:
                forged = largest_accepted(np.array(honest, np.float32).reshape(-1, 2), current,
                                          strategy, count=len(rogue_here),
                                          names=[f"client-{cid}" for cid in rogue_here])
                for row, cid in zip(forged, rogue_here, strict=True):
                    arrays, metrics = replies[cid]
                    if not metrics.get("declined"):
                        replies[cid] = ([row.reshape(arrays[0].shape)], metrics)
            results: list[tuple[ClientProxy, FitRes]] = [
                (FakeProxy(cid), _fit_res(arrays, metrics))
                for cid, (arrays, metrics) in replies.items()]
            new, _ = strategy.aggregate_fit(server_round, results, [])
            if new is not None:
                params = new
            strategy.evaluate(server_round, params)
            record = strategy.history[-1]
            if trace is not None:
                trace(server_round, one_matrix(strategy), record)
            for device, _ in record.dropped:
                if device.removeprefix("client-") in rogue_ids:
                    rogue_dropped += 1
                else:
                    honest_dropped += 1

        def distances(hypotheses: Sequence[Sequence[np.ndarray]]) -> list[float]:
            h = np.stack([np.concatenate([a.ravel() for a in x]) for x in hypotheses])
            return [float(np.min(np.linalg.norm(h - o, axis=1))) for o in OPTIMA]

        return Outcome(distances(strategy.hypotheses), distances(strategy.best_hypotheses),
                       honest_dropped, rogue_dropped)


def table(results: dict[str, dict[str, dict[str, Any]]], rounds: int) -> list[str]:
    """The markdown lines of docs/RESULTS.md from ``results[aggregator][rogues][seed]``."""
    from experiments.tables import paired_difference, verdict, wilson

    lines = [
        "| cluster-aggregator | rogues | success (last) | Wilson 95 % | success (delivered) | "
        "median largest distance (last) | honest replies dropped | rogue replies dropped |",
        "|---|---|---|---|---|---|---|---|"]
    worst: dict[tuple[str, str], dict[str, float]] = {}
    for aggregator, by_count in results.items():
        for count, by_seed in sorted(by_count.items()):
            worst[(aggregator, count)] = {s: max(o["last"]) for s, o in by_seed.items()}
            n = len(by_seed)
            ok = sum(max(o["last"]) <= 0.5 for o in by_seed.values())
            ok_best = sum(max(o["best"]) <= 0.5 for o in by_seed.values())
            low, high = wilson(ok, n)
            median = float(np.median(list(worst[(aggregator, count)].values())))
            lines.append(
                f"| {aggregator} | {count} | {ok}/{n} | [{low:.2f}, {high:.2f}] | {ok_best}/{n} "
                f"| {median:.3g} | {sum(o['honest_dropped'] for o in by_seed.values())} "
                f"| {sum(o['rogue_dropped'] for o in by_seed.values())} |")
    if ("mean", "0") in worst:
        lines += ["", f"Cost of robustness without rogues ({rounds} rounds): the largest distance "
                  "from an optimum to its nearest last hypothesis, aggregator minus mean, paired "
                  "by seed (95 % t interval; negative: closer than the mean):", ""]
        for aggregator in results:
            if aggregator != "mean" and (aggregator, "0") in worst:
                diff = paired_difference(worst[(aggregator, "0")], worst[("mean", "0")])
                lines.append(f"- {aggregator}: {verdict(*diff)}")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    """Run the grid (or combine saved ones) and print the table of docs/RESULTS.md."""
    import json

    parser = argparse.ArgumentParser(prog="python -m tests.rogues")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--aggregators", default="mean,median,trimmed-mean,krum,clipped-mean")
    parser.add_argument("--rogues", default="0,1,2")
    parser.add_argument("--server-update", default="mean", help="the server-update setting")
    parser.add_argument("--persistence", type=float, default=0.0,
                        help="the persistence-threshold setting (0: off)")
    parser.add_argument("--reseed-after", type=int, default=0, help="the reseed-after setting")
    parser.add_argument("--out", type=Path, help="write the per-seed results here (JSON)")
    parser.add_argument("--combine", type=Path, nargs="*", default=[],
                        help="print the table of these saved results instead of running")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    if args.combine:
        for path in args.combine:
            for aggregator, by_count in json.loads(path.read_text()).items():
                results.setdefault(aggregator, {}).update(by_count)
    else:
        overrides = {"server-update": args.server_update,
                     "persistence-threshold": args.persistence,
                     "reseed-after": args.reseed_after}
        extra = "".join([f", {args.server_update}" if args.server_update != "mean" else "",
                         f", c = {args.persistence:g}" if args.persistence else "",
                         f", re-seed {args.reseed_after}" if args.reseed_after else ""])
        for aggregator in args.aggregators.split(","):
            label = aggregator + extra
            for count in args.rogues.split(","):
                for seed in range(args.seeds):
                    outcome = run_federation(seed, rogues=int(count), aggregator=aggregator,
                                             rounds=args.rounds, overrides=overrides)
                    results.setdefault(label, {}).setdefault(count, {})[str(seed)] = (
                        outcome.__dict__)
                    print(f"{label} rogues={count} seed={seed}: {outcome}", flush=True)
                if args.out:
                    args.out.write_text(json.dumps(results, indent=1))
    print("\n".join(table(results, args.rounds)))


if __name__ == "__main__":
    main()
