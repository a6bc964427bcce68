"""Property-based: whatever numbers a server sends, the release invariant holds on the client.

Hypothesis draws run configs from the extremes of every numeric setting a server controls
(0, subnormals, 1e±308, inf, nan, negatives, huge k, huge and tiny hypothesis values, learning
rates from 1e-40 to 1e40, and the task's own settings, ``num-rounds``, ``client-epsilons``,
``seed``) for every mechanism and calibration (Laplace neighbourhood and fixed, whole model and
per layer; Gaussian and sign, clipped in L2 or element-wise), on models of one layer (the
synthetic task), two layers, and three layers of which one is empty. It drives the real client
(:class:`client.numpy_client.GpflClient`, real ledger file) with them. For every draw exactly
one of these holds:

* **declined** (by policy, or by the budget) or **refused** (a malformed instruction, or task
  settings that do not fit the device's partition: an error with a public message, raised
  before the charge): nothing charged, nothing released;
* **released**: charged exactly once, before the release, with the event the test computes
  from the applied settings alone (its cost finite and positive: a z > 0 for Gaussian and sign,
  whose ε at the device's δ may round to 0 when z is huge); the arrays sent have the model's
  shapes, are float32 whatever dtype the server sent, and are exactly the cast of one finite
  float64 release, which equals neither a hypothesis sent nor the model the device trained,
  lies on the public grid of its charged noise scale (every value a multiple of it) and
  (Laplace, Gaussian) carries noise no smaller than its charged scale allows, less the half
  grid step that rounding may take away. The cast to float32 may round noise below float32's
  resolution away (at values near a device's max-parameter): post-processing.

and never an error after the charge: every number derived from what the server sent must be
checked before private data is touched, so a charged failure (a signal that could depend on the
data) must not occur for any of these inputs. Each kind of release is its own property (50
draws each, derandomized: the same examples on every run); ``--hypothesis-show-statistics``
prints how they ended (when written, of the 400 draws: 125 released, from 13 to 20 of each
kind; 189 declined by policy, 26 by the budget; 44 refused as malformed, 16 for their task
settings; 3,200 non-derandomized draws, 400 of each kind, found nothing either).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from client.app import device_task
from client.numpy_client import GpflClient, InstructionError, train_rng
from client.policy import DevicePolicy
from mechanisms import (
    GaussianReleaseEvent,
    Mechanism,
    MetricPrivacyEvent,
    NeighbourhoodEvent,
    PrivacyLedger,
    SignReleaseEvent,
    calibrate_gaussian_noise_multiplier,
    gaussian_epsilon,
    l2_sensitivity,
)
from mechanisms.grid import grid_spacing, on_grid_exactly
from mechanisms.invariant import lower_tail_factor
from mechanisms.laplace import laplace_grid
from settings import SETTINGS, SettingError, federation_defaults
from tasks.base import Dataset, Params, Schedule
from tasks.synthetic import SyntheticTask, rmse, rmse_gradient

#: Values every positive numeric setting may take, from a subnormal to its declared maximum...
IN_RANGE = [5e-324, 2.2e-308, 1e-300, 1e-40, 1e-30, 1e-12, 1e-6, 0.01, 0.1, 0.5, 1.0, 5.0, 1e3,
            1e6]
#: ... and the values beyond (each refused before anything is computed).
OUT_OF_RANGE = [0.0, 1e12, 1e40, 1e162, 1e300, 1e308, 1.7976931348623157e308, math.inf,
                -math.inf, math.nan, -1.0, -1e308, -5e-324]
FLOAT_KEYS = ("noise-multiplier", "d-epsilon", "public-radius", "epsilon", "delta", "clip",
              "learning-rate", "cap-d-privacy", "cap-epsilon")
#: The integer settings: values within their declared range, and beyond it.
COUNTS = {
    "local-epochs": ([1, 2, 5], [0, -1, 10**5]),
    "batch-size": ([1, 10, 100, 10**7], [0, -1, 10**8]),
    "planned-releases": ([0, 1, 10, 10**6, 10**7], [-1, 10**8]),
    "num-rounds": ([1, 20, 10**7], [0, -1, 10**8]),
    "seed": ([0, 3, 2**62], [-2]),
    # The task's own settings (synthetic): the device has 2 partitions.
    "users": ([0, 1, 2, 3, 10**7], [-1, 10**8]),
    "samples-per-user": ([1, 2, 10, 1000], [0, -1, 10**8]),
    "validation-users": ([0, 1, 10**7], [-1, 10**8]),
    "data-seed": ([0, 1, 2**62], [-1]),
}
#: ``optima`` (one vector per group; its length is the model's size) and ``client-epsilons``.
OPTIMA = (["5,6;4,-4.5", "0,0", "1e6,-1e6;5e-324,0", "1e-300,1e-300", "1,2,3;4,5,6"],
          ["1e7,0", "inf,0", "nan,1", "1e308,1", "1,2;3", ""])
CLIENT_EPSILONS = (["", "5e-324", "1e-300,1e6", "0.5,2", "1e6"],
                   ["0", "nan", "inf", "-1", "1e308", "1,,2", "one"])
#: Hypothesis values (a device's max-parameter is 1e6; beyond it at times).
VALUES = [0.0, 5e-324, 1e-300, 1e-6, 1.0, 6.0, 1e5, 1e6, 1.5e6, 1e30, 3e38]
#: The models: layer sizes of an n = 2 (or 3) parameter vector, in wire order.
MODELS = {"one layer": lambda n: (n,), "two layers": lambda n: (1, n - 1),
          "three layers, one empty": lambda n: (1, 0, n - 1)}
PARTITION, PARTITIONS = 0, 2
CALIBRATIONS, CLIP_MODES = ["neighbourhood", "fixed"], ["l2", "elementwise"]
#: The eight kinds of release: Laplace neighbourhood or fixed, whole model or per layer;
#: Gaussian or sign, clipped in L2 or element-wise (per-layer drawn, and ignored, for them).
KINDS = [*((f"laplace {c}", p) for c in CALIBRATIONS for p in (False, True)),
         *((f"{m} {c}", False) for m in ("gaussian", "sign") for c in CLIP_MODES)]
DEVICE = {name: SETTINGS[name].device_default for name in
          ("noise-multiplier", "d-epsilon", "public-radius", "epsilon", "delta",
           "cap-d-privacy", "cap-epsilon")}
LEAST_RADIUS = float(SETTINGS["least-radius"].default)
MAX_PARAMETER = float(SETTINGS["max-parameter"].default)


class LayeredSynthetic(SyntheticTask):
    """The synthetic task's linear model cut into layers of the given sizes (some may be 0)."""

    def __init__(self, sizes: Sequence[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if sum(sizes) != self.dimension:
            raise ValueError(f"layers {sizes} do not add up to {self.dimension}")
        self.sizes = tuple(sizes)

    @property
    def parameter_shapes(self) -> list[tuple[int, ...]]:
        return [(size,) for size in self.sizes]

    def split(self, weights: np.ndarray) -> Params:
        cuts = np.cumsum(self.sizes)[:-1]
        return [part.astype(np.float32) for part in np.split(weights, cuts)]

    def init_parameters(self, rng: np.random.Generator) -> Params:
        return self.split(rng.standard_normal(self.dimension))

    def loss(self, params: Params, data: Dataset) -> float:
        self._check(params)
        weights = np.concatenate([np.asarray(p, dtype=np.float64) for p in params])
        return rmse(data.x @ weights - data.y)

    def _fit(self, params: Params, data: Dataset, schedule: Schedule, device: str) -> Params:
        weights = np.concatenate([np.asarray(p, dtype=np.float64) for p in params])
        x, y = np.asarray(data.x, np.float64), np.asarray(data.y, np.float64)
        for batch in schedule.batches(len(data)):
            weights -= schedule.learning_rate * rmse_gradient(weights, x[batch], y[batch])
        return self.split(weights)


def pick(rnd: Any, spec: tuple[list[Any], list[Any]], bad: bool) -> Any:
    return rnd.choice(spec[1] if bad else spec[0])


@st.composite
def attacks(draw: st.DrawFn, kind: str, per_layer: bool,
            ) -> tuple[str, dict[str, Any], list[np.ndarray], int]:
    """A model, a run config, an instruction of k hypotheses (flat) and k as the server claims.

    ``kind`` ("laplace neighbourhood", "gaussian elementwise", ...) and ``per_layer`` fix the
    kind of release; everything else is drawn, with a Random that Hypothesis controls (its
    own integer strategies favour the ends of a list, which here would decline most draws).
    """
    rnd = draw(st.randoms(use_true_random=True))
    model = rnd.choice(list(MODELS))
    mechanism, mode = kind.split(" ")
    run: dict[str, Any] = {
        "mechanism": mechanism,
        "calibration": mode if mechanism == "laplace" else rnd.choice(CALIBRATIONS),
        "per-layer": per_layer if mechanism == "laplace" else rnd.choice([True, False]),
        "clip-mode": mode if mechanism != "laplace" else rnd.choice(CLIP_MODES),
        "seed": 3,
        "local-epochs": rnd.choice([1, 2]),
        "batch-size": rnd.choice([1, 10, 100]),
    }
    # Every setting at an extreme of its range (or at its default) ...
    for key in FLOAT_KEYS:
        if rnd.random() < 0.25:
            top = {"delta": 0.5, "learning-rate": 1e3}.get(key, 1e6)
            run[key] = rnd.choice([v for v in IN_RANGE if v <= top])
    if rnd.random() < 0.2:
        run["learning-rate"] = rnd.choice([1e-40, 1e-20, 1e3])
    for key, spec in COUNTS.items():
        if rnd.random() < 0.15:
            run[key] = pick(rnd, spec, bad=False)
    if rnd.random() < 0.2:
        run["optima"] = pick(rnd, OPTIMA, bad=False)
    if rnd.random() < 0.2:
        run["client-epsilons"] = pick(rnd, CLIENT_EPSILONS, bad=False)
    # ... but, in a quarter of the draws, one beyond it.
    if rnd.random() < 1 / 4:
        bad = rnd.choice([*FLOAT_KEYS, *COUNTS, "optima", "client-epsilons"])
        run[bad] = {"optima": lambda: pick(rnd, OPTIMA, bad=True),
                    "client-epsilons": lambda: pick(rnd, CLIENT_EPSILONS, bad=True)}.get(
            bad, lambda: rnd.choice(COUNTS[bad][1] if bad in COUNTS else OUT_OF_RANGE))()
    k = rnd.choice([1, 1, 1, 2, 2, 3, 8, 9, 1000])
    n = 3 if run.get("optima") == "1,2,3;4,5,6" else 2
    # Hypothesis values within a device's max-parameter (1e6) mostly, beyond it at times.
    pool = VALUES if rnd.random() < 0.2 else [v for v in VALUES if v <= 1e6]
    dtype = rnd.choice([np.float32, np.float32, np.float64])
    base = np.array([rnd.choice(pool) * rnd.choice([1.0, -1.0]) for _ in range(n)], dtype)
    sizes = MODELS[model](n)
    cuts = np.cumsum(sizes)[:-1]
    flat = []
    for i in range(min(k, 50)):
        flat.extend(np.split(base + dtype(i), cuts))
    claimed = rnd.choice([k, min(k, 50)])
    return model, run, flat, claimed


def make_task(model: str, run: dict[str, Any], policy: DevicePolicy) -> Any:
    task = device_task(run, policy)
    if model == "one layer":
        return task
    kwargs = {key.replace("-", "_"): getattr(task, key.replace("-", "_"))
              for key in ("users", "samples-per-user", "validation-users", "data-seed")}
    return LayeredSynthetic(MODELS[model](task.dimension), optima=task.optima, **kwargs)


def planned_event(run: dict[str, Any], layers: list[int]) -> Any:
    """The event a release must be charged with, from the applied settings alone."""
    blocks = [size for size in layers if size > 0] if run["per-layer"] else [sum(layers)]
    if run["mechanism"] == "laplace" and run["calibration"] == "neighbourhood":
        nu = max(run["noise-multiplier"], DEVICE["noise-multiplier"])
        return NeighbourhoodEvent(tuple(blocks), nu)
    if run["mechanism"] == "laplace":
        epsilon = min(run["d-epsilon"], DEVICE["d-epsilon"])
        radius = max(run["public-radius"], DEVICE["public-radius"])
        return MetricPrivacyEvent(tuple((epsilon, radius) for _ in blocks))
    asked = run["epsilon"]
    if run["client-epsilons"]:
        values = [float(v) for v in run["client-epsilons"].split(",")]
        asked = values[PARTITION % len(values)]
    z = calibrate_gaussian_noise_multiplier(
        min(asked, DEVICE["epsilon"]), min(run["delta"], DEVICE["delta"]),
        run["planned-releases"] or run["num-rounds"])
    return (GaussianReleaseEvent if run["mechanism"] == "gaussian" else SignReleaseEvent)(z)


def flat64(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])


@pytest.mark.parametrize(("kind", "per_layer"), KINDS)
@settings(max_examples=50, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_server_value_ends_in_a_decline_a_refusal_or_a_charged_noisy_release(
    kind: str, per_layer: bool, data: st.DataObject,
) -> None:
    # One property per kind of release, so that every kind is drawn as often as the others.
    attack = data.draw(attacks(kind, per_layer), label="attack")
    model, run_extra, parameters, claimed = attack
    run = {**federation_defaults(), "num-hypotheses": claimed, **run_extra}
    kind = run["mechanism"] + (
        f" {run['calibration']}{' per-layer' if run['per-layer'] else ''}"
        if run["mechanism"] == "laplace" else f" {run['clip-mode']}")
    with tempfile.TemporaryDirectory() as folder:
        ledger_path = Path(folder) / "client-0.json"
        policy = DevicePolicy.load({"partition-id": PARTITION, "num-partitions": PARTITIONS,
                                    "ledger-path": str(ledger_path)}, environ={})
        client = GpflClient(lambda: make_task(model, run, policy), run, policy, run_id=1)
        config = {"num-hypotheses": claimed, "server-round": 1}
        made: list[list[np.ndarray]] = []  # the float64 release, before its cast
        sanitize_exact = Mechanism.sanitize_exact

        def recorded(self: Any, *args: Any, **kwargs: Any) -> list[np.ndarray]:
            made.append(sanitize_exact(self, *args, **kwargs))
            return made[-1]

        try:
            with mock.patch.object(Mechanism, "sanitize_exact", recorded):
                released, _, metrics = client.fit([p.copy() for p in parameters], config)
        except InstructionError:
            event("outcome: refused (malformed instruction)")
            assert not ledger_path.exists()
            return
        except SettingError:
            # The task cannot be built from the run config (a public task, built before the
            # charge): refused with the setting's public message, nothing charged.
            event("outcome: refused (task settings)")
            assert not ledger_path.exists()
            return
        charged = PrivacyLedger(ledger_path, delta=1e-5) if ledger_path.exists() else None
        if metrics["declined"]:
            event(f"outcome: declined by {metrics['declined-by']}")
            assert released == []
            assert charged is None or charged.spent().releases == 0
            return
        event("outcome: released")
        event(f"released: {kind}, {model}")

        # Charged exactly once, with the event the applied settings plan, at a finite,
        # positive cost that the reply reports exactly.
        assert charged is not None and [e.round for e in charged.entries()] == [1]
        task = client.task
        layers = [math.prod(shape) for shape in task.parameter_shapes]
        expected = planned_event(run, layers)
        assert charged.entries()[0].event == expected
        spend = charged.spent()
        if expected.family == "d-privacy":
            assert 0.0 < spend.d_privacy < math.inf
            assert spend.d_privacy == metrics["spend-d"]
            blocks = [size for size in layers if size > 0] if run["per-layer"] else [sum(layers)]
            if isinstance(expected, NeighbourhoodEvent):
                cost = math.fsum(size / expected.noise_multiplier for size in blocks)
            else:
                epsilon, radius = expected.layers[0]
                cost = len(blocks) * epsilon * radius
            assert math.isclose(spend.d_privacy, cost, rel_tol=1e-12)
        else:
            # The charge is the event's noise multiplier z > 0; its ε at the device's δ may be
            # exactly 0 (z so large that the release is (0, δ)-DP), never negative or inf.
            assert 0.0 < expected.noise_multiplier < math.inf
            assert 0.0 <= spend.epsilon < math.inf
            assert spend.epsilon == metrics["spend-epsilon"]
            assert math.isclose(spend.epsilon, gaussian_epsilon(
                expected.noise_multiplier, 1, 1e-5), rel_tol=1e-9)
            assert spend.epsilon <= min(run["cap-epsilon"] or math.inf, DEVICE["cap-epsilon"])
        assert metrics["releases"] == 1

        # The release: the model's shapes, float32 whatever the server sent, finite.
        count = len(layers)
        hypotheses = [parameters[j * count:(j + 1) * count] for j in range(claimed)]
        assert [a.shape for a in released] == [a.shape for a in hypotheses[0]]
        assert [a.dtype for a in released] == [np.float32] * count
        assert all(np.isfinite(a).all() for a in released)
        # ... exactly the cast of one float64 release (the cast is post-processing), made once.
        assert len(made) == 1
        assert all(np.array_equal(e.astype(r.dtype), r) for e, r in zip(made[0], released,
                                                                        strict=True))
        out = flat64(made[0])
        assert np.isfinite(out).all()
        if run["mechanism"] == "sign":
            assert set(np.unique(out)) <= {-1.0, 1.0}
            return

        # Not a hypothesis, not the trained model: the device's own computation, replayed.
        data = task.client_dataset(PARTITION, PARTITIONS)
        losses = [task.loss(h, data) for h in hypotheses]
        best = int(np.argmin([v if math.isfinite(v) else math.inf for v in losses]))
        reference = flat64(hypotheses[best])
        trained = flat64(task.train(
            hypotheses[best], data, epochs=run["local-epochs"], learning_rate=run[
                "learning-rate"], batch_size=run["batch-size"],
            rng=train_rng(run["seed"], PARTITION, 1)))
        trained = trained.astype(hypotheses[0][0].dtype).astype(np.float64)
        if not (np.isfinite(trained).all() and np.abs(trained).max() <= MAX_PARAMETER):
            trained = reference  # a diverged model is released as its hypothesis
        assert all(np.any(out != flat64(h)) for h in hypotheses)
        assert np.any(out != trained)
        if np.array_equal(flat64(released), trained):
            # Noise below the dtype's resolution at the model's values (a model near the
            # device's max-parameter in float32): the cast rounded it away.
            event("released: rounded to the trained model by the cast")

        # ... and its noise is at least what the charge paid for (below the invariant's own
        # 1e-9 refusal tail an honest release never falls).
        starts = np.cumsum([0, *layers])
        blocks = ([range(starts[i], starts[i + 1]) for i in range(count) if layers[i] > 0]
                  if run["per-layer"] and run["mechanism"] == "laplace"
                  else [range(0, sum(layers))])
        for block in blocks:
            index = np.asarray(block)
            size, noise = len(index), float(np.linalg.norm(out[index] - trained[index]))
            if isinstance(expected, NeighbourhoodEvent):
                radius = float(np.linalg.norm(trained[index] - reference[index]))
                mean = expected.noise_multiplier * max(radius, LEAST_RADIUS)
                spacing = grid_spacing(mean / math.sqrt(size), size)
                assert noise + spacing * math.sqrt(size) / 2 >= lower_tail_factor(size) * mean
                # On the grid of the block's scale (or a finer one: the scale is recomputed
                # here in another order of operations, so allow one binade).
                assert on_grid_exactly(out[index], spacing / 2)
            elif isinstance(expected, MetricPrivacyEvent):
                epsilon = expected.layers[0][0]
                spacing = laplace_grid(size, epsilon)
                assert noise + spacing * math.sqrt(size) / 2 >= (
                    lower_tail_factor(size) * size / epsilon)
                assert on_grid_exactly(out[index], spacing)
            else:
                # Gaussian: around hypothesis + clip(δ); ‖noise‖²/(2σ²) is Gamma(n/2, 1).
                spread = max(float(np.linalg.norm(flat64(a) - flat64(b)))
                             for a in hypotheses for b in hypotheses)
                sigma = expected.noise_multiplier * (
                    l2_sensitivity(run["clip-mode"], run["clip"], size) + spread)
                assert math.isclose(metrics["sigma"], sigma, rel_tol=1e-12)
                delta = trained - reference
                if run["clip-mode"] == "l2":
                    norm = float(np.linalg.norm(delta))
                    clipped = delta * min(1.0, run["clip"] / norm) if norm > 0 else delta
                else:
                    clipped = np.clip(delta, -run["clip"], run["clip"])
                noise = float(np.linalg.norm(out - reference - clipped))
                spacing = grid_spacing(sigma, size)
                assert noise + spacing * math.sqrt(size) / 2 >= math.sqrt(
                    lower_tail_factor(size / 2) * size) * sigma
                assert on_grid_exactly(out, spacing)
