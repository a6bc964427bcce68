"""Rogue devices: what an adaptive rogue does to a small federation, and what stops it.

An **adaptive rogue** is a real device (:class:`client.numpy_client.GpflClient`: it trains,
charges its ledger honestly and releases) that then replaces its release by the largest one the
server's rules accept. It knows the rules, the round's other releases and the server's state:
the screening's reference (:func:`strategies.norms.screen_norms`) and, when the run sets
``persistence-threshold``, its own summed residuals (:mod:`strategies.persistence`); it finds
the largest distance by bisection on the rules themselves, so it stays the worst case whatever
the rules become. It pushes one hypothesis (the first) straight away from the other; two rogues
push together (:func:`largest_accepted`).

Each federation drives the real ServerApp components (``server.app.build_components``: the
strategy with its screening, clustering, aggregation, persistence test, server update and
validation) and ten real clients through Flower's loop of ``configure_fit`` → ``fit`` →
``aggregate_fit`` → ``evaluate``, **in process** (no gRPC, no Ray; an omniscient rogue needs
the round's other releases, which no engine would hand it): synthetic task, k = 2, Euclidean
Laplace ν = 5 (neighbourhood calibration), every device every round, E = 5, the quickstart's
server update (``plateau``, ``reseed-after = 3``); each seed its own data draw, initial
hypotheses and noise; devices 0 (and 1) are the rogues. The arms: *mean* (the papers' cluster
mean) and *robust* (``cluster-aggregator = clipped-mean``, ``persistence-threshold = 3``: the
persistence test, and its trust weight on each release), what ``gpfl launch`` runs.
"""

from __future__ import annotations

import math
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_proxy import ClientProxy

from client.app import device_task
from client.numpy_client import GpflClient
from client.policy import DevicePolicy
from deploy.quickstart import QUICKSTART_RUN_CONFIG, ROBUST_CLUSTERS
from experiments.core.claims import flow
from experiments.core.common import PAPERS_AGGREGATION, Context
from experiments.core.in_process import Manager, NodeProxy
from experiments.core.runner import Cell, Experiment
from experiments.core.sanity import at_most
from experiments.core.tables import paired_difference, verdict, wilson
from mechanisms import PrivacyLedger
from server.app import build_components
from settings import federation_defaults
from strategies import ClusteredStrategy
from strategies.clustering import nearest_hypothesis
from strategies.norms import screen_norms
from strategies.persistence import Persistence
from strategies.robust import cluster_and_aggregate

NAME = "rogue-devices"
OPTIMA = np.array([[5.0, 6.0], [4.0, -4.5]])
THRESHOLD = 0.5
DEVICES = 10
#: The quickstart's server update in every arm; *robust* is what `gpfl launch` runs.
UPDATE = {key: QUICKSTART_RUN_CONFIG[key] for key in ("server-update", "reseed-after")}
ARMS: dict[str, dict[str, Any]] = {"mean": PAPERS_AGGREGATION, "robust": ROBUST_CLUSTERS}
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"rounds": 80, "rogues": [0, 1, 2], "seeds": list(range(30))},
    "quick": {"rounds": 80, "rogues": [0, 1, 2], "seeds": list(range(10))},
    "smoke": {"rounds": 4, "rogues": [0, 1], "seeds": [0]},
}
COLUMNS = ("arm", "rogues", "seed", "rounds", "last_0", "last_1", "delivered_0", "delivered_1",
           "honest_dropped", "rogue_dropped", "spend_median", "spend_max")


def largest_accepted(honest: np.ndarray, hypotheses: np.ndarray, strategy: ClusteredStrategy,
                     count: int = 1, names: Sequence[str] = ()) -> np.ndarray:
    """Return ``count`` identical releases as far from hypothesis 0 as the rules let all pass.

    The rules: the screening (each release's distance) and, when the strategy has one, the
    persistence test (no rogue's summed residuals may reach its threshold this round; of the
    levels below it, the rogue takes the one whose trust-weighted aggregate moves hypothesis 0
    furthest).

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
    # away while ‖S‖/√(n+1) stays below a level ρ ≤ c, then pushes as far as the rules allow.
    # Its trust 1 − (ρ/c)² weighs that push: it tries ρ from 0.1 c to c, plays the server's
    # aggregation on each and keeps the level that moves hypothesis 0 furthest away.
    def rows_at(start: np.ndarray, aim: np.ndarray, r: float) -> np.ndarray:
        return np.tile((start + r * aim).astype(np.float32), (count, 1))

    def passes(start: np.ndarray, aim: np.ndarray, r: float, level: float) -> bool:
        matrix = np.vstack([honest, rows_at(start, aim, r)]).astype(np.float32)
        sigmas = np.full(matrix.shape[0], np.nan)
        reasons, _ = screen_norms(matrix, hypotheses, sigmas, reference, strategy.norm_limits)
        if any(reason is not None for reason in reasons[-count:]):
            return False
        if persistence.threshold <= 0:
            return True
        units = persistence.units(matrix, hypotheses)[-count:]
        return all(persistence.statistic(name, unit) < level
                   for name, unit in zip(names, units, strict=True))

    def furthest(start: np.ndarray, aim: np.ndarray, level: float) -> np.ndarray:
        low, high = 0.0, 1e15
        if passes(start, aim, high, level):
            return rows_at(start, aim, high)
        for _ in range(80):  # log-bisection, then linear: ~1e-9 relative
            middle = math.sqrt(max(low, 1e-9) * high) if high / max(low, 1e-9) > 2 else (
                (low + high) / 2)
            low, high = (middle, high) if passes(start, aim, middle, level) else (low, middle)
        return rows_at(start, aim, low)

    if not (persistence.threshold > 0 and names and honest.shape[0]):
        return furthest(target, direction, math.inf)
    labels = nearest_hypothesis(honest, hypotheses)
    mine = honest[labels == 0].astype(np.float64) - target
    drift = np.median(mine, axis=0) if mine.shape[0] else np.zeros_like(target)
    offsets = honest.astype(np.float64) - hypotheses[labels]
    residuals = np.vstack([offsets[labels == j] - np.median(offsets[labels == j], axis=0)
                           for j in np.unique(labels)])
    tau = float(np.median(np.linalg.norm(residuals, axis=1)))
    worst = max(names, key=persistence.statistic)
    # The sums are in the persistence test's summary: the full space for a model of at most
    # strategies.geometry.SKETCH_WIDTH parameters (this task's 2), where the push is aimed.
    assert persistence.sketch.exact(target.size)
    best, score = None, -math.inf
    for share in np.linspace(0.1, 1.0, 10):
        level = share * persistence.threshold
        unit = best_unit(persistence.sums.get(worst), persistence.counts.get(worst, 0),
                         direction, level)
        rows = furthest(target + drift, unit * tau, level)
        moved = _aggregate_as_server(honest, rows, hypotheses, strategy, persistence, names)
        if (moved - target) @ direction > score:
            best, score = rows, float((moved - target) @ direction)
    assert best is not None
    return best


def _aggregate_as_server(honest: np.ndarray, rows: np.ndarray, hypotheses: np.ndarray,
                         strategy: ClusteredStrategy, persistence: Persistence,
                         names: Sequence[str]) -> np.ndarray:
    """Return hypothesis 0 as the server would make it (honest releases weigh 1 here)."""
    matrix = np.vstack([honest, rows]).astype(np.float32)
    units = persistence.units(matrix, hypotheses)[-rows.shape[0]:]
    trust = np.ones(matrix.shape[0])
    for i, (name, unit) in enumerate(zip(names, units, strict=True)):
        trust[honest.shape[0] + i] = persistence.trust(name, unit)
    _, means = cluster_and_aggregate(
        matrix, np.zeros(matrix.shape[0]), hypotheses.astype(np.float32),
        aggregation="mean", cluster_aggregator=strategy.cluster_aggregator,
        rng=np.random.default_rng(0), trust=trust)
    return means[0].astype(np.float64)


def best_unit(total: np.ndarray | None, count: int, direction: np.ndarray,
              threshold: float) -> np.ndarray:
    """Return the residual unit (norm ≤ 1) furthest along ``direction`` with ‖S + u‖ < ρ·√(n+1).

    ``threshold`` is the level ρ.

    ``total`` is the rogue's S so far and ``count`` its n; the search runs over the plane of
    ``direction`` and S (where the best unit lies), 721 angles × 101 lengths.
    """
    if total is None:
        return direction
    radius = threshold * math.sqrt(count + 1) * (1 - 1e-3)
    across = total - (total @ direction) * direction
    size = np.linalg.norm(across)
    across = across / size if size > 0 else np.zeros_like(direction)
    # Every (angle, length) at once: for each angle the longest length inside the ball, then
    # the angle whose push along `direction` is largest (the first on ties, none if none > 0).
    # The grid and the rule are the plain double loop's; in one array it costs milliseconds
    # where the loop's 72,821 norms cost seconds, ten times a round.
    thetas = np.linspace(-math.pi, math.pi, 721)
    lengths = np.linspace(1.0, 0.0, 101)
    ways = np.cos(thetas)[:, None] * direction + np.sin(thetas)[:, None] * across
    points = total + lengths[None, :, None] * ways[:, None, :]
    inside = np.linalg.norm(points, axis=2) < radius
    has = inside.any(axis=1)
    first = np.argmax(inside, axis=1)
    chosen = np.where(has, lengths[first], 0.0)
    scores = np.where(has, chosen * np.cos(thetas), -np.inf)
    j = int(np.argmax(scores))
    if not scores[j] > 0.0:
        return np.zeros_like(direction)
    return chosen[j] * ways[j]


def one_matrix(strategy: ClusteredStrategy) -> np.ndarray:
    """Return the strategy's hypotheses as a (k, n) float32 matrix."""
    return np.stack([np.concatenate([a.ravel() for a in h])
                     for h in strategy.hypotheses]).astype(np.float32)


def _fit_res(arrays: list[np.ndarray], metrics: dict[str, Any]) -> FitRes:
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), 1, metrics)


def run_config(seed: int, rounds: int, arm: Mapping[str, Any], tmp: str) -> dict[str, Any]:
    """Return the run config of one federation (the ServerApp's, as ``flwr run`` would pass)."""
    return {**federation_defaults(), "task": "synthetic", "num-hypotheses": 2,
            "mechanism": "laplace", "noise-multiplier": 5.0, "users": DEVICES,
            "clients-per-round": DEVICES, "min-replies": 1, "num-rounds": rounds,
            "local-epochs": 5, "seed": seed, "data-seed": seed, "patience": 0,
            "out-dir": f"{tmp}/run", **UPDATE, **arm}


def run_federation(seed: int, *, rogues: int = 0, arm: Mapping[str, Any] | None = None,
                   rounds: int = 80, workdir: Path | None = None,
                   trace: Callable[[int, np.ndarray, Any], None] | None = None
                   ) -> dict[str, Any]:
    """One federation of ten real clients, devices ``0 .. rogues-1`` adaptive rogues.

    ``arm`` sets the federation settings that differ from :data:`UPDATE` and the defaults;
    ``trace(round, hypotheses, record)`` sees each round. Returns the optima's distances to
    the last and the delivered hypotheses, the replies dropped and each device's spend.
    """
    # Ledgers and summaries are written with fsync every round: in memory where there is a
    # tmpfs, or the ledger writes take most of the time.
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=workdir or (shm if shm.is_dir() else None)) as tmp:
        run = run_config(seed, rounds, arm or {}, tmp)
        components, _ = build_components(run)
        assert components.server is not None
        strategy = components.server.strategy
        assert isinstance(strategy, ClusteredStrategy)
        clients = {}
        for i in range(DEVICES):
            policy = DevicePolicy.load({
                "partition-id": i, "num-partitions": DEVICES, "ledger-dir": f"{tmp}/ledgers",
                "allow-seeded-noise": True, "noise-seed": 1000 * seed + i,
                "cap-d-privacy": 1e6}, environ={})
            clients[str(i)] = GpflClient(device_task(run, policy), run, policy)
        manager = Manager(list(clients))
        rogue_ids = {str(i) for i in range(rogues)}
        params = strategy.initialize_parameters(manager)  # type: ignore[arg-type]
        assert params is not None
        honest_dropped = rogue_dropped = 0
        for server_round in range(1, rounds + 1):
            instructions = strategy.configure_fit(server_round, params, manager)  # type: ignore[arg-type]
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
                (NodeProxy(cid), _fit_res(arrays, metrics))
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
        spend = [PrivacyLedger(c.policy.ledger_path, delta=run["delta"]).spent().d_privacy
                 for c in clients.values()]
        return {"last": distances(strategy.hypotheses),
                "delivered": distances(strategy.best_hypotheses),
                "honest_dropped": honest_dropped, "rogue_dropped": rogue_dropped,
                "spend": spend}


def distances(hypotheses: Sequence[Sequence[np.ndarray]]) -> list[float]:
    """Each optimum's distance to its nearest hypothesis."""
    h = np.stack([np.concatenate([a.ravel() for a in x]) for x in hypotheses])
    return [float(np.min(np.linalg.norm(h - o, axis=1))) for o in OPTIMA]


# ------------------------------------------------------------------------------ the experiment
def _grid(ctx: Context) -> list[Cell]:
    p = PROFILES[ctx.profile]
    return [Cell(f"{arm}, {rogues} rogue(s), seed {seed}",
                 {"arm": arm, "rogues": rogues, "seed": seed, "rounds": p["rounds"]})
            for arm in ARMS for rogues in p["rogues"] for seed in ctx.pick_seeds(p["seeds"])]


def _perform(ctx: Context, cell: Cell) -> dict[str, Any]:
    """Run one federation, or read it from the cache (keyed by its settings)."""
    k = cell.keys
    config = run_config(k["seed"], k["rounds"], ARMS[k["arm"]], "-")
    return ctx.cached(NAME, f"{k['arm']}-{k['rogues']}-{k['seed']}",
                      {**config, "rogues": k["rogues"]},
                      lambda: run_federation(k["seed"], rogues=k["rogues"], arm=ARMS[k["arm"]],
                                             rounds=k["rounds"]))


def _measure(cell: Cell, result: Mapping[str, Any]) -> dict[str, Any]:
    return {**cell.keys,
            "last_0": result["last"][0], "last_1": result["last"][1],
            "delivered_0": result["delivered"][0], "delivered_1": result["delivered"][1],
            "honest_dropped": result["honest_dropped"], "rogue_dropped": result["rogue_dropped"],
            "spend_median": statistics.median(result["spend"]),
            "spend_max": max(result["spend"])}


def _describe(row: Mapping[str, Any], result: Any) -> str:
    last = max(row["last_0"], row["last_1"])
    return f"largest distance to an optimum {last:.3f} (last), dropped {row['honest_dropped']}"


def _worst(row: Mapping[str, str], which: str) -> float:
    return max(float(row[f"{which}_0"]), float(row[f"{which}_1"]))


def _share(rows: list[dict[str, str]], which: str) -> tuple[int, int, str]:
    hits = sum(_worst(r, which) <= THRESHOLD for r in rows)
    low, high = wilson(hits, len(rows))
    return hits, len(rows), f"{hits}/{len(rows)} [{low:.2f}, {high:.2f}]"


_TEXT = flow("""
**Rogue devices.** An adaptive rogue (`experiments/audits/rogue_devices.py`) is a real device that
trains, charges its ledger honestly and releases, then replaces its release by the largest one
the server's rules accept: it knows the rules, the round's other releases, the screening's
reference and its own persistence sums, and finds the largest distance by bisection on the rules
themselves, pushing the first hypothesis straight away from the other (two rogues push
together). Against the persistence test's trust weight (a release weighs 1 − (‖S‖/(c·√n))² in
its cluster) it also chooses how far its sums may lean this round: of ten levels up to the
threshold, the one whose aggregate, played as the server would, moves the hypothesis furthest
(the best push of each round; a rogue planning over rounds could do more). Each federation
drives the real ServerApp components and ten real clients through Flower's `configure_fit` →
`fit` → `aggregate_fit` → `evaluate` loop in one process (not on the Simulation Engine: the
rogue reads the round's other releases, which no engine hands a client; over real processes
`tests/test_integration_faults.py` runs a rogue ClientApp): synthetic task, k = 2, Laplace ν =
5, all 10 devices every round, E = 5, the quickstart's server update (`plateau`, `reseed-after =
3`); each seed its own data, initial hypotheses and noise; devices 0 (and 1) are the rogues.
*mean*: the papers' cluster mean; *robust*: `cluster-aggregator = clipped-mean` and
`persistence-threshold = 3` (a device set aside once its sums reach the threshold, each release
weighed by its trust until then), what `gpfl launch` runs ("digits-server-update" measures its
cost on rotated digits). Success: both optima within 0.5 of a hypothesis, *last* (the last
round's hypotheses) and *delivered* (the best validation round's), Wilson 95 % intervals.
""")


def section(rows: list[dict[str, str]]) -> list[str]:
    """Return the Markdown of the "Rogue devices" section from ``results.csv``'s rows."""
    groups: dict[tuple[str, int], list[dict[str, str]]] = {}
    for row in rows:
        groups.setdefault((row["arm"], int(row["rogues"])), []).append(row)
    rounds = sorted({int(r["rounds"]) for r in rows})
    out = [_TEXT, "", f"Rounds: {', '.join(map(str, rounds))}.", "",
           "| arm | rogues | success (last) | success (delivered) | median largest distance "
           "(last) | honest replies dropped | rogue replies dropped | spend per device "
           "(median) |", "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    shares: dict[tuple[str, int], tuple[int, int]] = {}
    for (arm, rogues), mine in sorted(groups.items(), key=lambda g: (list(ARMS).index(
            g[0][0]) if g[0][0] in ARMS else 99, g[0][1])):
        hits, n, last = _share(mine, "last")
        shares[arm, rogues] = (hits, n)
        median = statistics.median(_worst(r, "last") for r in mine)
        spend = statistics.median(float(r["spend_median"]) for r in mine)
        out.append(f"| {arm} | {rogues} | {last} | {_share(mine, 'delivered')[2]} | "
                   f"{median:.3g} | {sum(int(r['honest_dropped']) for r in mine)} | "
                   f"{sum(int(r['rogue_dropped']) for r in mine)} | {spend:g} |")
    out += ["", "Cost of robustness without rogues: the largest distance from an optimum to its "
            "nearest last hypothesis, *robust* − *mean*, paired by seed (95 % Student-t "
            "interval; negative: closer than the mean):", ""]
    base = {int(r["seed"]): _worst(r, "last") for r in groups.get(("mean", 0), [])}
    robust = {int(r["seed"]): _worst(r, "last") for r in groups.get(("robust", 0), [])}
    out.append(f"- {verdict(*paired_difference(robust, base))}" if base and robust
               else "- not measured")
    out += ["", "Against the criterion (with 1 and 2 rogues, within 0.5 at the last round as "
            "often as without rogues, read as: the Wilson intervals overlap; with 10 seeds the "
            "intervals are wide, so an overlap is a weak test):", ""]
    for arm in ARMS:
        if (arm, 0) not in shares:
            continue
        clean = wilson(*shares[arm, 0])
        for rogues in (1, 2):
            if (arm, rogues) in shares:
                low, high = wilson(*shares[arm, rogues])
                met = "met" if high >= clean[0] and low <= clean[1] else "**not met**"
                default = " (`gpfl launch`'s)" if ARMS[arm] is ROBUST_CLUSTERS else ""
                out.append(f"- {arm}{default}, {rogues} rogue(s): {shares[arm, rogues][0]}/"
                           f"{shares[arm, rogues][1]} against {shares[arm, 0][0]}/"
                           f"{shares[arm, 0][1]} without: {met}")
    return out


EXPERIMENT = Experiment(name=NAME, columns=COLUMNS, grid=_grid, measure=_measure,
                        perform=_perform, describe=_describe, report=section,
                        paper="robustness against rogue devices", engine="in-process",
                        profiles=PROFILES, checks=(at_most("spend_median", "spend_max"),))
