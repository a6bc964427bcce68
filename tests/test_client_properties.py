"""Property-based: whatever numbers a server sends, the release invariant holds on the client.

Hypothesis draws run configs from the extremes of every numeric setting a server controls
(0, subnormals, 1e±308, inf, nan, negatives, huge k, huge and tiny hypothesis values, learning
rates from 1e-40 to 1e40) for every mechanism and calibration, and drives the real client
(:class:`client.numpy_client.GpflClient`, real ledger file, real task) with them. For every
draw exactly one of these holds:

* **declined by policy** or **refused as malformed**: nothing charged, nothing released;
* **declined by the budget**: nothing charged, nothing released;
* **released**: charged exactly once, before the release; the release is finite, has the
  model's shapes, and equals neither a hypothesis sent nor the model the device trained.

and never an error after the charge: every number derived from what the server sent must be
checked before private data is touched, so a charged failure (a signal that could depend on the
data) must not occur for any of these inputs. The draws are derandomized (the same examples on
every run); 300 examples take a few seconds.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client.app import device_task
from client.numpy_client import GpflClient, InstructionError, train_rng
from client.policy import DevicePolicy
from mechanisms import PrivacyLedger
from settings import federation_defaults

#: Values every numeric setting may take (positive, from subnormal to its declared maximum)...
IN_RANGE = [5e-324, 2.2e-308, 1e-300, 1e-40, 1e-30, 1e-12, 1e-6, 0.01, 0.1, 0.5, 1.0, 5.0, 1e3,
            1e6]
#: ... and the values beyond (each refused before anything is computed).
OUT_OF_RANGE = [0.0, 1e12, 1e40, 1e162, 1e300, 1e308, 1.7976931348623157e308, math.inf,
                -math.inf, math.nan, -1.0, -1e308]
FLOAT_KEYS = ("noise-multiplier", "d-epsilon", "public-radius", "epsilon", "delta", "clip",
              "learning-rate", "cap-d-privacy", "cap-epsilon")
#: Out-of-range values of the integer settings.
BAD_COUNTS = {"local-epochs": [0, 10**5], "batch-size": [0, 10**8],
              "planned-releases": [-1, 10**8]}
VALUES = [0.0, 5e-324, 1e-300, 1e-6, 1.0, 6.0, 1e5, 1e6, 1.5e6, 1e30, 3e38]


@st.composite
def attacks(draw: st.DrawFn) -> tuple[dict[str, Any], list[np.ndarray], int]:
    """A run config, an instruction of k hypotheses and k as the server claims it.

    Choices are made with a Random that Hypothesis controls (uniform over each list: its own
    integer strategies favour the ends of a list, which here would decline most draws).
    """
    rnd = draw(st.randoms(use_true_random=False))
    run: dict[str, Any] = {
        "mechanism": rnd.choice(["laplace", "laplace", "laplace", "gaussian", "sign"]),
        "calibration": rnd.choice(["neighbourhood", "fixed"]),
        "per-layer": rnd.choice([True, False]),
        "seed": 3,
        "local-epochs": rnd.choice([1, 2, 5]),
        "batch-size": rnd.choice([1, 10, 100]),
        "planned-releases": rnd.choice([0, 1, 10, 10**6]),
    }
    # Every setting within its range (or at its default) ...
    for key in FLOAT_KEYS:
        if rnd.random() < 0.5:
            top = {"delta": 0.5, "learning-rate": 1e3}.get(key, 1e6)
            run[key] = rnd.choice([v for v in IN_RANGE if v <= top])
    # ... but, in a quarter of the draws, one beyond it.
    if rnd.random() < 1 / 4:
        bad = rnd.choice([*FLOAT_KEYS, *BAD_COUNTS])
        run[bad] = rnd.choice(BAD_COUNTS.get(bad, OUT_OF_RANGE))
    k = rnd.choice([1, 1, 1, 2, 2, 3, 9, 1000])
    # Hypothesis values within a device's max-parameter (1e6) mostly, beyond it at times.
    pool = VALUES if rnd.random() < 0.2 else [v for v in VALUES if v <= 1e6]
    values = [rnd.choice(pool) * rnd.choice([1.0, -1.0]) for _ in range(2)]
    base = np.array(values, np.float32)
    hypotheses = [base + np.float32(i) for i in range(min(k, 50))]
    claimed = rnd.choice([k, min(k, 50)])
    return run, hypotheses, claimed


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(attack=attacks())
def test_every_server_value_ends_in_a_decline_a_refusal_or_a_charged_noisy_release(
    attack: tuple[dict[str, Any], list[np.ndarray], int],
) -> None:
    run_extra, hypotheses, claimed = attack
    run = {**federation_defaults(), "num-hypotheses": claimed, **run_extra}
    with tempfile.TemporaryDirectory() as folder:
        ledger_path = Path(folder) / "client-0.json"
        policy = DevicePolicy.load({"partition-id": 0, "num-partitions": 2,
                                    "ledger-path": str(ledger_path)}, environ={})
        client = GpflClient(lambda: device_task(run, policy), run, policy, run_id=1)
        config = {"num-hypotheses": claimed, "server-round": 1}
        try:
            released, _, metrics = client.fit([h.copy() for h in hypotheses], config)
        except InstructionError:
            assert not ledger_path.exists()
            return
        charged = PrivacyLedger(ledger_path, delta=1e-5).spent() if ledger_path.exists() else None
        if metrics["declined"]:
            assert released == []
            assert charged is None or charged.releases == 0
            return
        # Released: charged exactly once, finite, shaped like the model, and noisy.
        assert charged is not None and charged.releases == 1
        assert metrics["releases"] == 1
        assert len(released) == 1 and released[0].shape == (2,)
        assert np.isfinite(released[0]).all()
        candidates = [h.astype(np.float64) for h in hypotheses]
        task = client.task
        for h in hypotheses:
            trained = task.train([h], task.client_dataset(0, 2),
                                 epochs=run["local-epochs"], learning_rate=run.get(
                                     "learning-rate", 0.1), batch_size=run["batch-size"],
                                 rng=train_rng(3, 0, 1))
            candidates.append(np.asarray(trained[0], np.float64))
        if run["mechanism"] == "sign":
            assert set(np.unique(released[0])) <= {-1.0, 1.0}
        else:
            assert all(np.any(released[0].astype(np.float64) != c) for c in candidates)
