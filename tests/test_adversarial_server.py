"""A curious server against real clients: each attack on local privacy, through the ClientApp.

The server side is adversarial here: it writes the run config, the instructions and the
hypotheses, and it reads everything a reply carries, error texts included. The client is the real
one (``client.app.app``), driven with Flower messages as Flower's runtime drives it, on a device
whose own settings (node config) bound what it does.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app.message_type import MessageType
from flwr.common import (
    Context,
    EvaluateIns,
    FitIns,
    Message,
    Metadata,
    RecordDict,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.common.recorddict_compat import (
    evaluateins_to_recorddict,
    fitins_to_recorddict,
    recorddict_to_evaluateres,
    recorddict_to_fitres,
)
from scipy import stats

from client.app import app, device_task
from client.numpy_client import RELEASE_FAILED, GpflClient
from client.policy import DevicePolicy
from mechanisms import PrivacyLedger, calibrate_gaussian_noise_multiplier, gaussian_epsilon
from mechanisms.calibration import composed_gaussian_epsilon_rdp
from settings import federation_defaults

HONEST = [np.array([5.0, 6.0], np.float32), np.array([4.0, -4.5], np.float32)]
#: 110 apart, each 50 from the optimum of the group that picks it: the choice is obvious.
FAR_APART = [np.array([5.0, 56.0], np.float32), np.array([4.0, -54.5], np.float32)]
RUN: dict[str, Any] = {**federation_defaults(), "seed": 11, "validation-users": 2}


class CuriousServer:
    """Sends instructions to one device's ClientApp and reads its replies, as a server would."""

    def __init__(self, node_config: dict[str, Any]) -> None:
        self.node_config = node_config
        self.sent = 0

    def _send(self, content: RecordDict, message_type: str, run_config: dict[str, Any]) -> Message:
        self.sent += 1
        metadata = Metadata(
            run_id=1, message_id=f"m{self.sent}", src_node_id=0, dst_node_id=1,
            reply_to_message_id="", group_id="", created_at=time.time(), ttl=3600.0,
            message_type=message_type,
        )
        context = Context(run_id=1, node_id=1, node_config=dict(self.node_config),
                          state=RecordDict(), run_config={**RUN, **run_config})
        return app(Message(content=content, metadata=metadata), context)

    def fit(self, run_config: dict[str, Any], hypotheses: list[np.ndarray],
            server_round: int = 1, config: dict[str, Any] | None = None,
            ) -> tuple[list[np.ndarray], dict[str, Any]]:
        """Return the release and the metrics; raise ``ServerSeesError`` with Flower's text.

        Each array is one hypothesis (one-layer models) unless ``config`` says otherwise.
        """
        ins = FitIns(ndarrays_to_parameters(hypotheses),
                     {"num-hypotheses": len(hypotheses), "server-round": server_round,
                      **(config or {})})
        try:
            reply = self._send(fitins_to_recorddict(ins, keep_input=True), MessageType.TRAIN,
                               run_config)
        except Exception as ex:
            # What flwr-clientapp puts in the error reply the server receives.
            raise ServerSeesError(str(type(ex)) + ":<'" + str(ex) + "'>") from None
        res = recorddict_to_fitres(reply.content, keep_input=False)
        return parameters_to_ndarrays(res.parameters), dict(res.metrics)

    def evaluate(self, hypotheses: list[np.ndarray]) -> tuple[float, int, dict[str, Any]]:
        ins = EvaluateIns(ndarrays_to_parameters(hypotheses),
                          {"num-hypotheses": len(hypotheses)})
        reply = self._send(evaluateins_to_recorddict(ins, keep_input=True), MessageType.EVALUATE,
                           {})
        res = recorddict_to_evaluateres(reply.content)
        return res.loss, res.num_examples, dict(res.metrics)


class ServerSeesError(Exception):
    """The error text a server receives in place of a reply."""


def device(tmp_path: Path, **policy: Any) -> dict[str, Any]:
    return {"partition-id": 0, "num-partitions": 2, "ledger-dir": str(tmp_path / "ledger"),
            **policy}


def ledger(tmp_path: Path) -> PrivacyLedger:
    return PrivacyLedger(tmp_path / "ledger" / "client-0.json", delta=1e-5)


def trained(node: dict[str, Any], hypothesis: np.ndarray, server_round: int) -> np.ndarray:
    """The model the device trains from ``hypothesis`` (training is seeded by the run's seed)."""
    policy = DevicePolicy.load(node, environ={})
    task = device_task(RUN, policy)
    rng = np.random.default_rng(np.random.SeedSequence([RUN["seed"], 0, server_round]))
    return task.train([hypothesis], task.client_dataset(0, 2), epochs=1, learning_rate=0.1,
                      batch_size=10, rng=rng)[0]


# -- 2. the seed attack ---------------------------------------------------------------------------
def test_the_runs_seed_does_not_reproduce_the_noise(tmp_path: Path) -> None:
    # Prepare: the server fixes `seed` and knows the derivation the noise used to take from it
    # (SeedSequence([seed, partition, round, 1])), so it could regenerate and subtract it.
    server = CuriousServer(device(tmp_path))
    run = {"mechanism": "gaussian", "num-hypotheses": 1, "clip": 1.0}
    model = trained(server.node_config, HONEST[0], 1)

    # Execute: the same instruction twice, same seed, same round.
    first, metrics = server.fit(run, [HONEST[0]])
    second, _ = server.fit(run, [HONEST[0]])
    guess = np.random.default_rng(np.random.SeedSequence([RUN["seed"], 0, 1, 1]))
    regenerated = guess.standard_normal(2) * metrics["sigma"]
    recovered = first[0].astype(np.float64) - regenerated

    # Assert: two releases with identical inputs differ by noise of their declared scale, and
    # subtracting the regenerated noise does not give the trained model back.
    sigma = metrics["sigma"]
    assert np.linalg.norm(first[0] - second[0]) > 0.01 * sigma
    assert np.linalg.norm(recovered - model) > 0.01 * sigma


# -- 3. the run-config attacks --------------------------------------------------------------------
def test_mechanism_none_is_declined_and_no_raw_model_leaves(tmp_path: Path) -> None:
    server = CuriousServer(device(tmp_path))

    released, metrics = server.fit({"mechanism": "none", "num-hypotheses": 1}, [HONEST[0]])

    assert released == []
    assert metrics["declined"] == 1 and metrics["declined-by"] == "policy"
    assert ledger(tmp_path).spent().releases == 0


def test_a_fresh_ledger_dir_per_run_does_not_reset_the_spend(tmp_path: Path) -> None:
    # The device's cap allows two releases of n/nu = 0.4; the server sends 8 runs, each naming
    # a new ledger folder.
    server = CuriousServer(device(tmp_path, **{"cap-d-privacy": 0.8}))
    releases = []
    for r in range(8):
        released, metrics = server.fit({"ledger-dir": str(tmp_path / f"fresh-{r}")}, HONEST, r + 1)
        releases.append(len(released))

    assert sum(releases) == 2 and metrics["spend-d"] == pytest.approx(0.8)
    assert ledger(tmp_path).spent().releases == 2
    assert not any((tmp_path / f"fresh-{r}").exists() for r in range(8))


def test_a_tiny_public_radius_is_charged_at_the_devices_radius(tmp_path: Path) -> None:
    server = CuriousServer(device(tmp_path))  # device default: public-radius >= 1

    _, metrics = server.fit(
        {"calibration": "fixed", "d-epsilon": 2.0, "public-radius": 1e-9}, HONEST
    )

    assert metrics["spend-d"] == 2.0  # epsilon * r at r = 1, not 2e-9


def test_a_large_delta_request_is_not_applied(tmp_path: Path) -> None:
    server = CuriousServer(device(tmp_path))
    run = {"mechanism": "gaussian", "num-hypotheses": 1, "delta": 0.5, "epsilon": 1.0,
           "planned-releases": 1}

    _, metrics = server.fit(run, [HONEST[0]])

    z = calibrate_gaussian_noise_multiplier(1.0, 1e-5, 1)
    assert metrics["budget-delta"] == 1e-5
    assert metrics["sigma"] == pytest.approx(z * 2.0)  # sensitivity 2C, C = 1, k = 1


def test_switching_mechanism_does_not_dodge_either_cap(tmp_path: Path) -> None:
    server = CuriousServer(device(tmp_path, **{"cap-d-privacy": 0.8, "cap-epsilon": 2.0}))
    gaussian = {"mechanism": "gaussian", "num-hypotheses": 1, "epsilon": 1.0,
                "planned-releases": 1}
    for r in range(12):
        if r % 2:
            server.fit(gaussian, [HONEST[0]], r + 1)
        else:
            server.fit({}, HONEST, r + 1)

    # Assert: each family stopped at its own cap: two Laplace releases of 0.4, and as many
    # Gaussian releases of epsilon 1 (RDP) as compose to at most 2 (as charged: the smaller of
    # RDP and PLD, delta 1e-5).
    z = calibrate_gaussian_noise_multiplier(1.0, 1e-5, 1)
    gaussian_fit = max(r for r in range(1, 7) if gaussian_epsilon(z, r, 1e-5) <= 2.0)
    spend = ledger(tmp_path).spent()
    assert spend.d_privacy == pytest.approx(0.8) and spend.epsilon <= 2.0
    assert spend.releases == 2 + gaussian_fit
    assert spend.declines == 12 - spend.releases


# -- 4. side doors ------------------------------------------------------------------------------
def test_evaluate_sends_nothing_that_depends_on_the_data(tmp_path: Path) -> None:
    server = CuriousServer(device(tmp_path))
    near = server.evaluate(HONEST)
    far = server.evaluate([h * 100 for h in HONEST])
    assert near == far and near[:2] == (0.0, 0)


def test_an_error_after_private_data_is_used_sends_only_the_fixed_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = CuriousServer(device(tmp_path))

    def failing_read(*args: Any, **kwargs: Any) -> None:
        raise ValueError("row 7: 'Jane Doe',3.2814 is not a number")  # data-dependent text

    from tasks.synthetic import SyntheticTask

    monkeypatch.setattr(SyntheticTask, "client_dataset", failing_read)
    with pytest.raises(ServerSeesError) as caught:
        server.fit({}, HONEST)

    assert RELEASE_FAILED in str(caught.value)
    assert "3.2814" not in str(caught.value) and "Jane" not in str(caught.value)
    # Charged before the data was read: whether the read fails cannot show in the counters.
    assert ledger(tmp_path).spent().releases == 1


# -- 1. the choice of hypothesis under the Gaussian mechanism -------------------------------------
class _MemoryLedger:
    """An in-memory ledger with the real cap check's shape (the file ledger's fsync per release
    would make 2 x 10^4 releases take minutes); the charged cost is checked separately."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.events: list[Any] = []

    def charge(self, event: Any, *, cap: float | None, round: int | None = None,
               federation: str | None = None) -> Any:
        self.events.append(event)
        return self.spent()

    def spent(self, *, federation: str | None = None) -> Any:
        from mechanisms import Spend

        return Spend(0.0, 0.0, 0.0, len(self.events), 0)

    def record_decline(self) -> Any:  # pragma: no cover - no cap is reached here
        raise AssertionError("no decline expected")


def releases(partition: int, hypotheses: list[np.ndarray], samples: int,
             monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> np.ndarray:
    """``samples`` releases of one device's whole local data set, as the real client makes them."""
    monkeypatch.setattr("client.numpy_client.PrivacyLedger", _MemoryLedger)
    policy = DevicePolicy.load({"partition-id": partition, "num-partitions": 2,
                                "ledger-dir": str(tmp_path)}, environ={})
    run = {**RUN, "mechanism": "gaussian", "epsilon": 1.0, "delta": 1e-5,
           "planned-releases": 1, "num-hypotheses": 2}
    client = GpflClient(device_task(run, policy), run, policy)
    out = np.empty((samples, 2))
    config = {"num-hypotheses": 2, "server-round": 1}
    for i in range(samples):
        released, _, metrics = client.fit(list(hypotheses), config)
        out[i] = released[0]
    assert metrics["declined"] == 0
    return out


def empirical_epsilon(a: np.ndarray, b: np.ndarray, axis: np.ndarray, delta: float,
                      alpha: float) -> float:
    """A lower bound on epsilon from threshold tests on the projection onto ``axis``.

    For each of 19 thresholds and both directions, the Clopper-Pearson bounds at level alpha/m
    (Bonferroni over the m = 38 tests) give ln((p_hi_lower - delta) / p_lo_upper); the largest is
    a lower bound on the true epsilon that holds with probability >= 1 - alpha.
    """
    ta, tb = a @ axis, b @ axis
    thresholds = np.quantile(np.concatenate([ta, tb]), np.linspace(0.05, 0.95, 19))
    level = alpha / (2 * len(thresholds))
    best = 0.0
    for tau in thresholds:
        for hi, lo in ((tb, ta), (ta, tb)):
            k_hi, k_lo, n = int((hi > tau).sum()), int((lo > tau).sum()), len(hi)
            p_hi = stats.beta.ppf(level, k_hi, n - k_hi + 1) if k_hi > 0 else 0.0
            p_lo = stats.beta.ppf(1 - level, k_lo + 1, n - k_lo) if k_lo < n else 1.0
            if p_hi - delta > 0:
                best = max(best, math.log((p_hi - delta) / p_lo))
    return best


@pytest.mark.parametrize("spread", ["honest", "far-apart"])
def test_a_gaussian_release_with_two_hypotheses_stays_within_its_charged_epsilon(
    spread: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Prepare: two neighbouring local data sets (the whole data set is the unit: partition 0
    # of group 0 and partition 1 of group 1), each device choosing its hypothesis with its
    # private loss. Far apart, the server places the hypotheses to make the choice obvious.
    hypotheses = HONEST if spread == "honest" else FAR_APART
    samples, alpha = 10_000, 1e-3  # per data set; false-positive rate of the whole test

    # Execute
    a = releases(0, hypotheses, samples, monkeypatch, tmp_path)
    b = releases(1, hypotheses, samples, monkeypatch, tmp_path)
    axis = (hypotheses[1] - hypotheses[0]).astype(np.float64)
    axis /= np.linalg.norm(axis)
    measured = empirical_epsilon(a, b, axis, delta=1e-5, alpha=alpha)

    # Assert: each release was charged one Gaussian of the calibrated multiplier, i.e. epsilon 1
    # at delta 1e-5 by RDP and about 0.915 by PLD (the charge), and no test can show more than
    # that (with probability 1 - alpha).
    z = calibrate_gaussian_noise_multiplier(1.0, 1e-5, 1)
    charged = gaussian_epsilon(z, 1, 1e-5)
    assert composed_gaussian_epsilon_rdp({z: 1}, 1e-5) == pytest.approx(1.0, rel=1e-3)
    assert charged == pytest.approx(0.915, abs=1e-3)
    assert measured <= charged, f"empirical epsilon {measured:.2f} > charged {charged:.2f}"


@pytest.mark.parametrize(("hypotheses", "at_least"), [(HONEST, 1.5), (FAR_APART, 5.0)])
def test_the_distinguishing_test_catches_a_release_centred_on_an_unpaid_choice(
    hypotheses: list[np.ndarray], at_least: float, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # The same test against the client as it was: noise calibrated to the clip alone (spread 0)
    # while the release is centred on the privately chosen hypothesis. It must fail.
    monkeypatch.setattr("client.release.hypotheses_diameter", lambda hypotheses: 0.0)
    a = releases(0, hypotheses, 10_000, monkeypatch, tmp_path)
    b = releases(1, hypotheses, 10_000, monkeypatch, tmp_path)
    axis = (hypotheses[1] - hypotheses[0]).astype(np.float64)
    axis /= np.linalg.norm(axis)
    assert empirical_epsilon(a, b, axis, delta=1e-5, alpha=1e-3) > at_least
