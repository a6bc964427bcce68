"""The round's one pass (strategies.geometry) against the multi-pass computation it replaced.

The oracle is tests/legacy_robust.py: strategies/robust.py's and strategies/persistence.py's
functions as they were. Inputs are seeded and shaped like the committed experiments' rounds
(rogue-devices: 10 releases of 2 parameters, k = 2; digits-server-update: 7 releases of 650,
k = 2) and larger ones (more than one block of columns; more parameters than the sketch).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from strategies.geometry import SKETCH_WIDTH, CountSketch, measure_round
from strategies.norms import measure
from strategies.persistence import Persistence, residual_units
from strategies.robust import cluster_and_aggregate, robust_clusters
from tests import legacy_robust as legacy
from tests.test_strategies_norms import laplace_releases

F32 = np.float32
#: (releases, parameters, hypotheses): rogue-devices, digits-server-update, two larger rounds
#: (the last one spans two blocks of columns: 2²² / (30 + 2) < 150,000).
SHAPES = [(10, 2, 2), (7, 650, 2), (40, 20_000, 3), (30, 150_000, 2)]


def realistic_round(seed: int, m: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (releases, hypotheses): neighbourhood-Laplace releases at ν = 5 around k
    hypotheses 3 apart, the last release pushed 20 times its distance away (a rogue)."""
    rng = np.random.default_rng(seed)
    hypotheses = (rng.standard_normal((k, n)) + 3.0 * np.arange(k)[:, None]).astype(F32)
    released = laplace_releases(rng, hypotheses, m)
    nearest = np.argmin(np.linalg.norm(released[-1] - hypotheses, axis=1))
    released[-1] = hypotheses[nearest] + 20.0 * (released[-1] - hypotheses[nearest])
    return released.astype(F32), hypotheses


# ------------------------------------------------------------------------ the pass itself
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_one_pass_measures_what_each_step_measured(m: int, n: int, k: int) -> None:
    released, hypotheses = realistic_round(1, m, n, k)
    x, h = released.astype(np.float64), hypotheses.astype(np.float64)

    geometry = measure_round(released, hypotheses, gram=True, sketch=CountSketch(seed=5))

    # float64 sums of up to 150,000 squares (einsum's order, as the screening always summed).
    np.testing.assert_allclose(geometry.norms, np.linalg.norm(x, axis=1), rtol=1e-11)
    exact = np.linalg.norm(x[:, None, :] - h[None, :, :], axis=2)
    np.testing.assert_allclose(geometry.distances, exact, rtol=1e-11)
    both = np.vstack([x, h])
    assert geometry.gram is not None
    np.testing.assert_allclose(geometry.gram, both @ both.T, rtol=1e-12, atol=1e-9 * n)
    assert geometry.sketched is not None
    np.testing.assert_allclose(geometry.sketched, CountSketch(seed=5).apply(both), rtol=1e-12,
                               atol=1e-9)
    # The screening's own reading of the pass.
    norms, nearest = measure(released, hypotheses)
    np.testing.assert_array_equal(norms, geometry.norms)
    np.testing.assert_array_equal(nearest, geometry.nearest_distances())


def test_a_subset_is_the_pass_of_the_rows_kept() -> None:
    released, hypotheses = realistic_round(2, 12, 300, 3)
    keep = np.array([True, False, True, True, False, True, True, True, True, False, True, True])

    whole = measure_round(released, hypotheses, gram=True, sketch=CountSketch(seed=1))
    part = whole.subset(keep)
    again = measure_round(released[keep], hypotheses, gram=True, sketch=CountSketch(seed=1))

    for field in ("norms", "distances", "gram", "sketched"):
        np.testing.assert_allclose(getattr(part, field), getattr(again, field), rtol=1e-12,
                                   atol=1e-9)
    assert part.releases == 9 and part.nearest().tolist() == again.nearest().tolist()


def test_the_sketch_is_the_identity_up_to_its_width_and_linear_beyond() -> None:
    rng = np.random.default_rng(3)
    small = rng.standard_normal((4, SKETCH_WIDTH))
    np.testing.assert_array_equal(CountSketch(seed=9).apply(small), small)

    sketch = CountSketch(width=64, seed=9)
    a, b = rng.standard_normal((2, 1000))
    np.testing.assert_allclose(sketch.apply((2 * a - b)[None])[0],
                               2 * sketch.apply(a[None])[0] - sketch.apply(b[None])[0],
                               atol=1e-12)
    # Norms are kept in expectation: over 400 vectors the mean ratio of squared norms is 1
    # (a ratio's standard deviation is about sqrt(2/64) = 0.18: the mean's is 0.009).
    vectors = rng.standard_normal((400, 1000))
    ratios = (np.linalg.norm(sketch.apply(vectors), axis=1) / np.linalg.norm(vectors, axis=1))
    assert abs(np.mean(ratios**2) - 1.0) < 0.04


def test_the_sketch_seed_is_the_servers_own_unless_given() -> None:
    assert CountSketch().seed != CountSketch().seed  # OS entropy (63 bits: never equal here)
    assert CountSketch(seed=4) == CountSketch(seed=4)
    with pytest.raises(ValueError, match="width must be at least 1, got width=0"):
        CountSketch(width=0)


# ------------------------------------------------------------- against the multi-pass oracle
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize("with_trust", [False, True])
def test_clipped_mean_clusters_equal_the_multi_pass_ones(m: int, n: int, k: int,
                                                         with_trust: bool) -> None:
    released, hypotheses = realistic_round(4, m, n, k)
    trust = (np.random.default_rng(5).uniform(0.3, 1.0, m) if with_trust else None)

    old_labels, old = legacy.robust_clusters(released, hypotheses, "clipped-mean", trust)
    labels, new = robust_clusters(released, hypotheses, "clipped-mean", trust)

    assert labels.tolist() == old_labels.tolist()
    # The same float64 numbers summed in another order, then rounded once to float32: at most
    # one float32 step apart, and nearly always equal.
    np.testing.assert_array_max_ulp(new, old, maxulp=1)
    assert np.mean(new != old) < 1e-3


@pytest.mark.parametrize("aggregation", ["mean", "weighted", "inverse-variance", "probability"])
def test_cluster_and_aggregate_equals_the_multi_pass_one(aggregation: str) -> None:
    released, hypotheses = realistic_round(6, 40, 20_000, 3)
    sigmas = np.random.default_rng(7).uniform(0.5, 3.0, 40)
    trust = np.random.default_rng(8).uniform(0.3, 1.0, 40)
    old_rng, new_rng = np.random.default_rng(9), np.random.default_rng(9)

    old_labels, old = legacy.cluster_and_aggregate(
        released, sigmas, hypotheses, aggregation=aggregation,
        cluster_aggregator="clipped-mean", rng=old_rng, trust=trust)
    labels, new = cluster_and_aggregate(
        released, sigmas, hypotheses, aggregation=aggregation,
        cluster_aggregator="clipped-mean", rng=new_rng, trust=trust,
        geometry=measure_round(released, hypotheses, gram=True))

    assert labels.tolist() == old_labels.tolist()
    # The same draws: one ω per non-empty cluster under "probability", none otherwise.
    assert new_rng.uniform() == old_rng.uniform()
    if aggregation == "mean":
        np.testing.assert_array_max_ulp(new, old, maxulp=1)
    else:
        # The multi-pass version rounded the clipped releases and the weights to float32 and
        # summed in float32; the one-pass one sums in float64 and rounds once. The difference
        # is that float32 rounding: a few float32 steps of the releases' magnitude.
        scale = float(np.abs(released).max())
        np.testing.assert_allclose(new, old, rtol=0, atol=8 * 2.0**-24 * scale)


@pytest.mark.parametrize("method", ["median", "trimmed-mean", "krum"])
def test_the_other_robust_methods_are_unchanged(method: str) -> None:
    released, hypotheses = realistic_round(10, 12, 300, 2)

    old_labels, old = legacy.robust_clusters(released, hypotheses, method)
    labels, new = robust_clusters(released, hypotheses, method)

    assert labels.tolist() == old_labels.tolist()
    np.testing.assert_array_equal(new, old)


def test_lloyd_iterations_on_the_gram_matrix_move_releases_as_before() -> None:
    # Hypotheses at 0 and 10 (per coordinate); groups at -1 and 6, and two releases at 4.8,
    # nearest to the hypothesis at 0 at the start. Once that cluster's centroid has moved to
    # its group (near -1) they are nearer the other one (at 6): the iterations must hand them
    # over as the multi-pass iterations did.
    rng = np.random.default_rng(11)
    n = 50
    released = np.vstack([rng.normal(-1.0, 0.3, (8, n)), rng.normal(6.0, 0.3, (8, n)),
                          rng.normal(4.8, 0.1, (2, n))]).astype(F32)
    hypotheses = np.vstack([np.zeros(n), np.full(n, 10.0)]).astype(F32)
    start = measure_round(released, hypotheses).nearest()

    old_labels, old = legacy.robust_clusters(released, hypotheses, "clipped-mean")
    labels, new = robust_clusters(released, hypotheses, "clipped-mean")

    assert start[-2:].tolist() == [0, 0] and labels[-2:].tolist() == [1, 1]
    assert labels.tolist() == old_labels.tolist()
    np.testing.assert_array_max_ulp(new, old, maxulp=1)


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_residual_units_in_full_equal_the_multi_pass_ones(m: int, n: int, k: int) -> None:
    released, hypotheses = realistic_round(12, m, n, k)

    old = legacy.residual_units(released, hypotheses)
    # Without a sketch: the full n coordinates, the same float64 operations in the same order.
    np.testing.assert_array_equal(residual_units(released, hypotheses), old)
    if n <= SKETCH_WIDTH:  # the persistence test's own summary is then the identity
        np.testing.assert_array_equal(Persistence(3.0).units(released, hypotheses), old)


# ------------------------------------------------------------- the persistence test's memory
def test_the_persistence_sums_are_bounded_whatever_the_model() -> None:
    # Prepare: 20 devices, models of 50,000 parameters (a full sum would be 400 kB each).
    rng = np.random.default_rng(13)
    persistence = Persistence(threshold=3.0, sketch=CountSketch(seed=2))
    names = [f"d{i}" for i in range(20)]
    hypotheses = rng.standard_normal((2, 50_000)).astype(F32)

    # Execute: five rounds.
    for t in range(1, 6):
        released = (hypotheses[rng.integers(0, 2, 20)]
                    + rng.standard_normal((20, 50_000))).astype(F32)
        persistence.update(t, names, persistence.units(released, hypotheses))

    # Assert: each device holds SKETCH_WIDTH float64 (32 KiB) and a count; so does the
    # checkpoint, which restores the same sketch.
    assert all(total.shape == (SKETCH_WIDTH,) and total.dtype == np.float64
               for total in persistence.sums.values())
    assert sum(total.nbytes for total in persistence.sums.values()) == 20 * 8 * SKETCH_WIDTH
    state = persistence.to_dict()
    assert all(len(total) == SKETCH_WIDTH for total in state["sums"].values())
    again = Persistence(threshold=3.0)
    again.load_dict(state)
    assert again.sketch == persistence.sketch
    assert again.statistic("d3") == persistence.statistic("d3")


def test_a_full_sum_from_an_older_checkpoint_is_sketched_on_restore() -> None:
    rng = np.random.default_rng(14)
    full = rng.standard_normal(10_000)
    sketch = CountSketch(seed=21)
    state = {"sums": {"a": full.tolist()}, "counts": {"a": 4}, "set_aside": {},
             "sketch": {"width": sketch.width, "seed": sketch.seed}}

    persistence = Persistence(threshold=3.0)
    persistence.load_dict(state)

    np.testing.assert_allclose(persistence.sums["a"], sketch.apply(full[None])[0])


def test_a_push_is_set_aside_in_the_sketch_when_it_is_in_full() -> None:
    # 8 honest devices (fresh noise) and one that pushes by about the noise's median norm
    # every round, in 20,000 dimensions (sketched to 4096): the pusher is set aside at the
    # round the exact sums set it aside, or one round apart; no honest device is.
    rng = np.random.default_rng(15)
    n = 20_000
    hypotheses = np.zeros((1, n), F32)
    push = np.zeros(n)
    push[: n // 2] = 1.0
    push *= math.sqrt(n) / np.linalg.norm(push)
    names = ["rogue", *(f"d{i}" for i in range(8))]
    exact, sketched = Persistence(3.0, sketch=CountSketch(width=n)), Persistence(3.0)
    for t in range(1, 31):
        released = rng.standard_normal((9, n))
        released[0] = push
        released = released.astype(F32)
        for persistence in (exact, sketched):
            persistence.update(t, [nm for nm in names if nm not in persistence.set_aside],
                               persistence.units(released[[i for i, nm in enumerate(names)
                                                           if nm not in persistence.set_aside]],
                                                 hypotheses))
    assert list(exact.set_aside) == ["rogue"] and list(sketched.set_aside) == ["rogue"]
    assert abs(exact.set_aside["rogue"] - sketched.set_aside["rogue"]) <= 1


# ------------------------------------------------------------------ rounds of the strategy
@pytest.mark.parametrize("aggregation", ["mean", "weighted"])
def test_rounds_of_the_robust_strategy_equal_the_multi_pass_ones(
        aggregation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The rogue-devices setting: 10 devices every round around two hypotheses of 2 parameters,
    # Laplace at ν = 5, one device pushing hypothesis 0 away by about the noise's size; the
    # quickstart's robust clusters. Played once with the one-pass functions and once with the
    # multi-pass ones in their place, the runs must set aside the same devices and end on the
    # same hypotheses (with float32 weights in the old "weighted" path: within its rounding).
    import strategies.clustered as clustered
    from tests.test_strategies_clustered import hyp, one_layer, reply, results_of

    def play() -> tuple[np.ndarray, dict[str, int], list[list[int]]]:
        rng = np.random.default_rng(16)
        strategy = clustered.ClusteredStrategy(
            initial_hypotheses=hyp([5.0, 6.0], [4.0, -4.5]), clients_per_round=10,
            rng=np.random.default_rng(0), aggregation=aggregation,
            cluster_aggregator="clipped-mean", persistence_threshold=3.0)
        sizes = []
        for t in range(1, 31):
            current = one_layer(strategy).astype(F32)
            rows = laplace_releases(rng, current, 10)
            rows[0] = current[0] + np.array([1.0, 1.0], F32)  # the push
            sigmas = rng.uniform(0.5, 2.0, 10)
            _, metrics = strategy.aggregate_fit(
                t, results_of([reply(r, sigma=float(s)) for r, s in zip(rows, sigmas,
                                                                         strict=True)]), [])
            sizes.append([int(metrics["cluster-size-0"]), int(metrics["cluster-size-1"])])
        aside = strategy.state()[0]["screen"]["persistence"]["set_aside"]
        return one_layer(strategy), aside, sizes

    new, new_aside, new_sizes = play()
    with monkeypatch.context() as patch:
        patch.setattr(clustered, "cluster_and_aggregate",
                      lambda *args, geometry=None, **kwargs: legacy.cluster_and_aggregate(
                          *args, **kwargs))
        patch.setattr(Persistence, "units",
                      lambda self, released, hypotheses, geometry=None:
                      legacy.residual_units(released, hypotheses))
        old, old_aside, old_sizes = play()

    assert new_aside == old_aside and "c0" in new_aside
    assert new_sizes == old_sizes
    if aggregation == "mean":
        np.testing.assert_array_equal(new, old)
    else:
        np.testing.assert_allclose(new, old, rtol=1e-5)


def test_the_strategys_sketch_follows_its_seed_and_draws_nothing() -> None:
    from strategies import ClusteredStrategy

    def sketch_and_rng(seed: int) -> tuple[dict[str, int], dict[str, object]]:
        strategy = ClusteredStrategy(initial_hypotheses=[[np.zeros(2, F32)]],
                                     clients_per_round=3, rng=np.random.default_rng(seed),
                                     persistence_threshold=3.0)
        state = strategy.state()[0]
        return state["screen"]["persistence"]["sketch"], state["rng"]

    first, rng_state = sketch_and_rng(3)
    assert first == sketch_and_rng(3)[0] != sketch_and_rng(4)[0]
    assert rng_state == np.random.default_rng(3).bit_generator.state
    assert first["width"] == SKETCH_WIDTH
