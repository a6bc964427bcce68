"""Property-based: whatever numbers a server sends to a record-level (dpsgd) device.

The record-level twin of ``test_client_properties.py``: Hypothesis draws the dpsgd settings a
server controls (ν, q, T, C_0, γ, the rates, the query ratio, the loss clip, the learning rate)
from their extremes (0, subnormals, 1e±308, inf, nan, negatives), with k and the hypothesis
values, for every clipping strategy, and drives the real client (digits' logistic model, a real
ledger file) with them. For every draw exactly one of these holds:

* **declined** or **refused as malformed**: nothing charged, nothing released;
* **released**: charged exactly once in the record unit, before the release; the release is
  finite and has the model's shapes.

and never an error after the charge. Derandomized: the same 120 examples on every run (when
written: 26 released, 70 declined — 39 of them at the device's record cap — 24 malformed).
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
from client.numpy_client import GpflClient, InstructionError
from client.policy import DevicePolicy
from mechanisms import PrivacyLedger
from settings import SETTINGS, federation_defaults
from tasks.digits import DigitsTask

EXTREMES = [5e-324, 1e-300, 1e-30, 1e-6, 0.01, 0.1, 0.5, 0.9, 1.0, 1.5, 5.0, 10.0, 1e3, 1e6]
OUT_OF_RANGE = [0.0, 1e12, 1e300, 1.7976931348623157e308, math.inf, -math.inf, math.nan,
                -1.0, -1e308]
FLOAT_KEYS = ("record-noise-multiplier", "record-sampling-rate", "record-clip",
              "record-target-quantile", "record-clip-rate", "record-lr-rate",
              "record-query-ratio", "record-loss-clip", "learning-rate",
              "cap-record-epsilon")



def accepted(key: str, value: float) -> bool:
    """Whether the setting's declaration accepts ``value`` (its own range, not a copy)."""
    try:
        SETTINGS[key].parse(value)
    except ValueError:
        return False
    return True


#: Per setting, the extremes within its declared range (from a subnormal up to its maximum).
IN_RANGE = {key: [v for v in EXTREMES if accepted(key, v)] for key in FLOAT_KEYS}
VALUES = [0.0, 5e-324, 1e-300, 1e-6, 1.0, 1e5, 1e6, 1.5e6, 3e38]
BASE: dict[str, Any] = {**federation_defaults(), "task": "digits", "model": "logistic",
                        "mechanism": "dpsgd", "seed": 3, "batch-size": 8}


@st.composite
def attacks(draw: st.DrawFn) -> tuple[dict[str, Any], list[np.ndarray], int]:
    """A dpsgd run config, an instruction of k hypotheses and k as the server claims it."""
    rnd = draw(st.randoms(use_true_random=False))
    run: dict[str, Any] = {"record-clipping": rnd.choice(["fixed", "quantile", "oso"]),
                           "record-steps": rnd.choice([1, 2, 5])}
    for key in FLOAT_KEYS:  # each at an extreme of its range, else at its default
        if rnd.random() < 0.3:
            run[key] = rnd.choice(IN_RANGE[key])
    if rnd.random() < 1 / 4:  # one value beyond its range
        bad = rnd.choice([*FLOAT_KEYS, "record-steps"])
        run[bad] = rnd.choice([0, -1, 10**9] if bad == "record-steps" else OUT_OF_RANGE)
    k = rnd.choice([1, 1, 2, 3, 1000])
    model = DigitsTask(model="logistic").init_parameters(np.random.default_rng(0))
    scale = rnd.choice(VALUES if rnd.random() < 0.2 else [v for v in VALUES if v <= 1e6])
    layers = [np.full_like(a, scale * rnd.choice([1.0, -1.0])) + a for a in model]
    hypotheses = [a + np.float32(i) for i in range(min(k, 4)) for a in layers]
    claimed = rnd.choice([k, min(k, 4)])
    return run, hypotheses, claimed


@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(attack=attacks())
def test_every_record_level_request_ends_in_a_decline_a_refusal_or_a_charged_release(
    attack: tuple[dict[str, Any], list[np.ndarray], int],
) -> None:
    run_extra, hypotheses, claimed = attack
    run = {**BASE, "num-hypotheses": claimed, **run_extra}
    with tempfile.TemporaryDirectory() as folder:
        ledger_path = Path(folder) / "client-0.json"
        policy = DevicePolicy.load({"partition-id": 0, "num-partitions": 4,
                                    "ledger-path": str(ledger_path), "mechanisms": "dpsgd"},
                                   environ={})
        client = GpflClient(lambda: device_task(run, policy), run, policy, run_id=1)
        try:
            released, _, metrics = client.fit([h.copy() for h in hypotheses],
                                              {"num-hypotheses": claimed, "server-round": 1})
        except InstructionError:
            assert not ledger_path.exists()
            return
        charged = PrivacyLedger(ledger_path, delta=1e-5).spent() if ledger_path.exists() else None
        if metrics["declined"]:
            assert released == []
            assert charged is None or charged.releases == 0
            return
        # Released: charged exactly once, in the record unit, finite, shaped like the model.
        assert charged is not None and charged.releases == 1, metrics
        # Within the stricter of the two caps (ε may round to 0: a subnormal q samples no
        # record, and the release is the hypothesis plus data-independent noise).
        cap = min(SETTINGS["cap-record-epsilon"].device_default,
                  run.get("cap-record-epsilon") or math.inf)
        assert 0 <= charged.record_epsilon <= cap, (charged, cap)
        shapes = [a.shape for a in DigitsTask(model="logistic").init_parameters(
            np.random.default_rng(0))]
        assert [a.shape for a in released] == shapes
        assert all(np.isfinite(a).all() for a in released)
