"""Secure clusters, piece by piece: the integer share, its encoding for SecAgg+, the two
guarantees, the device's rules and the server's decoding (the whole protocol over real
processes: tests/test_integration_secure.py).

Randomized checks state their sample size and false-positive rate. The discrete Gaussian comes
from OpenDP's sampler, fed by the OS's entropy (it takes no seed): its tests are statistical
with a false-positive rate of 1e-6 each.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.common import FitRes, Status, ndarrays_to_parameters
from flwr.common.secure_aggregation.quantization import quantize
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from scipy import stats

from client.app import device_task
from client.numpy_client import GpflClient
from client.policy import DevicePolicy, PolicyDecline
from client.secure import SecureDecline, secure_clusters_mod
from client.settings import ClientSettings
from mechanisms import PrivacyLedger, calibrate_gaussian_noise_multiplier
from mechanisms.accountant import LedgerEntry, compose
from mechanisms.calibration import composed_gaussian_epsilon_rdp, composed_gaussian_epsilons
from mechanisms.distributed import (
    SecureTerms,
    SecureTermsError,
    SlotLayout,
    bounded_rounding,
    central_noise_multiplier,
    decode_sum,
    discrete_gaussian,
    encode,
    local_noise_multiplier,
    slot_signal,
    split_sum,
    verify_share,
)
from mechanisms.events import DistributedGaussianEvent, GaussianReleaseEvent, event_from_dict
from mechanisms.invariant import ReleaseRefused
from settings import SettingError, federation_defaults
from settings.rules import check_run_rules
from strategies.secure import SecureClustersStrategy, settle_counts

TERMS = SecureTerms(quantization_range=2 ** 22, clipping_range=8.0, modulus_range=2 ** 32)
B = TERMS.bound
SEED = 20261207


# ----------------------------------------------------------------------- the integer share


@pytest.mark.parametrize("scale", [1.0, 1.0 - 1e-16, 1e-300, 0.0])
def test_rounding_keeps_the_exact_integer_bound(scale: float) -> None:
    # 200 vectors of norm exactly C·scale (C = 0.7) in 50 dimensions, with subnormal and zero
    # entries among them: the rounded integers' exact norm never passes B.
    rng = np.random.default_rng(SEED)
    for _ in range(200):
        x = rng.normal(size=50)
        x[:5] = 5e-324
        x *= 0.7 * scale / max(np.linalg.norm(x), 1e-300)
        q = bounded_rounding(x, 0.7, B, rng)
        assert q.dtype == np.int64 and sum(int(v) ** 2 for v in q) <= B * B


def test_rounding_is_unbiased() -> None:
    # 4000 roundings of one vector: each coordinate's mean is within 5 standard errors of
    # x·B/C (false-positive rate below 3e-7 a coordinate, 8 coordinates).
    rng = np.random.default_rng(SEED)
    x = np.array([0.3, -0.2, 0.1, 0.05, -0.4, 0.0, 0.2, -0.1])
    x *= 0.5 / np.linalg.norm(x)
    draws = np.array([bounded_rounding(x, 1.0, B, rng) for _ in range(4000)])
    expected = x * B
    assert np.all(np.abs(draws.mean(axis=0) - expected) <= 5 * 0.5 / math.sqrt(4000))


def test_rounding_refuses_what_is_not_finite() -> None:
    with pytest.raises(ValueError, match="not finite"):
        bounded_rounding(np.array([np.nan, 0.0]), 1.0, B, np.random.default_rng(0))


def test_the_signal_holds_one_slot_and_its_count() -> None:
    layout = SlotLayout(3, 2)
    s = slot_signal(np.array([5, -7]), 1, layout, B)
    assert s.tolist() == [0, 0, 5, -7, 0, 0, 0, B, 0]
    with pytest.raises(ValueError, match="slot"):
        slot_signal(np.array([5, -7]), 3, layout, B)


def test_discrete_gaussian_shares_have_the_stated_law() -> None:
    # 20,000 draws at σ = 3000.3: integers, mean 0 and variance σ² (two-sided tests at 1e-6),
    # and a KS test against N(0, σ²) (the discrete law is within 1e-4 of it in CDF) at 1e-6.
    sigma = 3000.3
    x = discrete_gaussian(sigma, 20_000)
    assert x.dtype == np.int64
    assert abs(x.mean()) < 4.9 * sigma / math.sqrt(x.size)
    ratio = float(np.sum(x.astype(float) ** 2)) / sigma ** 2
    assert stats.chi2.ppf(5e-7, x.size) < ratio < stats.chi2.ppf(1 - 5e-7, x.size)
    assert stats.kstest(x / sigma, "norm").pvalue > 1e-6


@pytest.mark.parametrize("sigma", [0.0, -1.0, math.inf, math.nan, 2.0 ** 27])
def test_discrete_gaussian_refuses_an_unusable_sigma(sigma: float) -> None:
    with pytest.raises(ValueError, match="sigma"):
        discrete_gaussian(sigma, 3)


# ------------------------------------------------------------- the encoding for SecAgg+


def test_the_encoding_is_exact_through_flowers_own_quantization() -> None:
    # The extremes of the range, both signs, and values far beyond T (they wrap mod T).
    t = TERMS.quantization_range
    a = np.array([0, 1, -1, t // 2 - 1, -t // 2, t - 1, t, 3 * t + 5, -5 * t - 7], np.int64)
    x = encode(a, TERMS)
    assert x.dtype == np.float64 and np.all(np.abs(x) <= TERMS.clipping_range)
    (q,) = quantize([x], TERMS.clipping_range, t)
    assert q.tolist() == np.mod(a, t).tolist()


def test_the_sum_decodes_from_what_the_workflow_hands_the_strategy() -> None:
    # Flower's SecAggPlusWorkflow: (Σ dequantize) = Σm·2c/T − c, plus −(n−1)c, times T/(n·T).
    rng = np.random.default_rng(SEED)
    n, t, c = 7, TERMS.quantization_range, TERMS.clipping_range
    shares = rng.integers(-3 * B, 3 * B, size=(n, 40))
    m = [quantize([encode(a, TERMS)], c, t)[0].astype(np.int64) for a in shares]
    total = np.mod(np.sum(m, axis=0), TERMS.modulus_range)
    average = (total.astype(float) * (2 * c / t) - c - (n - 1) * c) * (t / (n * t))
    assert decode_sum(average, n, TERMS).tolist() == shares.sum(axis=0).tolist()


@pytest.mark.parametrize(("t", "c", "mod"), [
    (2 ** 22 + 1, 8.0, 2 ** 32), (2 ** 15, 8.0, 2 ** 32), (2 ** 25, 8.0, 2 ** 32),
    (2 ** 22, 6.0, 2 ** 32), (2 ** 22, 2.0 ** 9, 2 ** 32), (2 ** 22, 8.0, 2 ** 22),
    (2 ** 22, 8.0, 3 * 2 ** 30), (True, 8.0, 2 ** 32), (2 ** 22, math.nan, 2 ** 32),
])
def test_terms_a_device_cannot_encode_exactly_are_refused(t: Any, c: Any, mod: Any) -> None:
    with pytest.raises(SecureTermsError):
        SecureTerms(t, c, mod)


# ------------------------------------------------------------------ the two guarantees


def test_the_central_multiplier_is_the_cohorts_and_tau_only_tightens_it() -> None:
    sigma = 1.3 * 2 * B
    z = local_noise_multiplier(sigma, B)
    assert z == pytest.approx(1.3)
    for m in (2, 4, 50):
        # √(2m)·z: m shares of σ against the sensitivity √2·B of one device added or removed.
        assert central_noise_multiplier(sigma, B, m, 10_000) == pytest.approx(
            math.sqrt(2 * m) * z, rel=1e-12)
    # At σ of a few integer units Kairouz et al.'s τ term no longer vanishes: a weaker bound.
    assert central_noise_multiplier(0.6, 1, 10, 10 ** 6) < math.sqrt(20) * 0.3


def test_both_guarantees_round_trip_and_compose_by_rdp() -> None:
    event = DistributedGaussianEvent(1.2, central_noise_multiplier=3.4, cohort=4)
    assert event_from_dict(event.to_dict()) == event
    entries = [LedgerEntry(event, "t", r) for r in range(1, 11)]
    spend = compose(entries, declines=0, delta=1e-5)
    assert spend.epsilon == spend.epsilon_rdp == composed_gaussian_epsilon_rdp({1.2: 10}, 1e-5)
    assert spend.central_epsilon == composed_gaussian_epsilon_rdp({3.4: 10}, 1e-5)
    # A plain Gaussian release beside them is seen whole by the server: it counts at its own z
    # in the central figure too.
    plain = LedgerEntry(GaussianReleaseEvent(1.2), "t", 11)
    both = compose([*entries, plain], declines=0, delta=1e-5)
    assert both.central_epsilon == composed_gaussian_epsilon_rdp({3.4: 10, 1.2: 1}, 1e-5)
    # Without shares the charge is the smaller of RDP and PLD, as before.
    assert compose([plain], declines=0, delta=1e-5).epsilon == min(
        composed_gaussian_epsilons({1.2: 1}, 1e-5))


@pytest.mark.parametrize("fields", [
    {"central_noise_multiplier": 0.0, "cohort": 4},
    {"central_noise_multiplier": math.inf, "cohort": 4},
    {"central_noise_multiplier": 1.0, "cohort": 0},
    {"central_noise_multiplier": 1.0, "cohort": True},
])
def test_an_event_without_a_usable_central_guarantee_is_refused(fields: dict[str, Any]) -> None:
    with pytest.raises((ValueError, TypeError)):
        event_from_dict({"kind": "distributed-gaussian", "noise_multiplier": 1.0, **fields})


# ------------------------------------------------------------------- the last check


def _honest(layout: SlotLayout, z: float) -> tuple[DistributedGaussianEvent, np.ndarray,
                                                   np.ndarray]:
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=layout.size)
    q = bounded_rounding(x / np.linalg.norm(x), 1.0, B, rng)
    signal = slot_signal(q, 1, layout, B)
    event = DistributedGaussianEvent(z, central_noise_multiplier=2 * z, cohort=3)
    return event, signal, signal + discrete_gaussian(z * 2 * B, layout.dimension)


def test_the_last_check_passes_honest_shares_and_refuses_forged_ones() -> None:
    layout = SlotLayout(2, 30)
    event, signal, share = _honest(layout, 0.8)
    verify_share(event, signal, share, layout=layout, bound=B)
    cases = {
        "no noise": (event, signal, signal.copy()),
        "a fifth of the noise": (event, signal, signal + (share - signal) // 5),
        "charged less noise than added": (DistributedGaussianEvent(
            8.0, central_noise_multiplier=1.0, cohort=3), signal, share),
        "a plain Gaussian charge": (GaussianReleaseEvent(0.8), signal, share),
    }
    two_slots = signal.copy()
    two_slots[layout.num_hypotheses * layout.size] = B
    cases["two counts"] = (event, two_slots, share)
    too_long = signal.copy()
    too_long[layout.size] = 2 * B
    cases["an update beyond B"] = (event, too_long, share)
    cases["floats"] = (event, signal, share.astype(np.float64))
    for name, (e, s, a) in cases.items():
        with pytest.raises(ReleaseRefused):
            verify_share(e, s, a, layout=layout, bound=B)
            pytest.fail(name)


# ------------------------------------------------------------------ the settings


def _run(**values: Any) -> dict[str, Any]:
    return {**federation_defaults(), "aggregation-privacy": "secure-clusters",
            "mechanism": "gaussian", **values}


@pytest.mark.parametrize(("name", "value"), [
    ("mechanism", "laplace"), ("cluster-aggregator", "median"), ("persistence-threshold", 3.0),
    ("reseed-after", 3), ("aggregation", "weighted"), ("client-epsilons", "1,5"),
])
def test_a_setting_that_needs_individual_releases_is_refused(name: str, value: Any) -> None:
    with pytest.raises(SettingError, match=name):
        check_run_rules(_run(**{name: value}))


def test_a_cohort_larger_than_a_round_or_than_secagg_can_weigh_is_refused() -> None:
    with pytest.raises(SettingError, match="min-cohort"):
        check_run_rules(_run(**{"clients-per-round": 3, "min-cohort": 4}))
    with pytest.raises(SettingError, match="1023"):
        check_run_rules(_run(**{"clients-per-round": 1024}))
    check_run_rules(_run(**{"clients-per-round": 1023}))


def _policy(tmp_path: Path, **node: Any) -> DevicePolicy:
    return DevicePolicy.load({"partition-id": 0, "num-partitions": 4,
                              "ledger-dir": str(tmp_path), **node}, environ={})


def test_a_device_stricter_than_the_run_declines_and_its_cohort_wins(tmp_path: Path) -> None:
    with pytest.raises(PolicyDecline, match="epsilon"):
        ClientSettings.resolve(_run(epsilon=5.0), _policy(tmp_path, epsilon=2.0))
    s = ClientSettings.resolve(_run(epsilon=5.0, **{"min-cohort": 2}),
                               _policy(tmp_path, **{"min-cohort": 5}))
    assert s.secure and s.min_cohort == 5


# ------------------------------------------------------------------ the device


def _client(tmp_path: Path, secure: SecureTerms | None, **run: Any) -> GpflClient:
    policy = _policy(tmp_path, **{"cap-epsilon": 100.0})
    config = _run(**{"num-rounds": 10, "seed": 3, "validation-users": 4, "epsilon": 5.0,
                     **run})
    return GpflClient(device_task(config, policy), config, policy, secure=secure)


HYPOTHESES = [np.array([5.0, 6.0], np.float32), np.array([4.0, -4.5], np.float32)]


def test_a_device_sends_one_encoded_share_and_charges_both_guarantees(tmp_path: Path) -> None:
    client = _client(tmp_path, TERMS)
    arrays, count, metrics = client.fit(list(HYPOTHESES), {"num-hypotheses": 2,
                                                           "server-round": 1})
    (share,) = arrays
    assert count == 1 and share.dtype == np.float64 and share.shape == (2 * 3,)
    (q,) = quantize([share], TERMS.clipping_range, TERMS.quantization_range)
    assert np.array_equal(q.astype(float), (share + 8.0) * (TERMS.quantization_range / 16.0))
    (entry,) = PrivacyLedger(tmp_path / "client-0.json", delta=1e-5).entries()
    z = calibrate_gaussian_noise_multiplier(5.0, 1e-5, 10)
    event = entry.event
    assert isinstance(event, DistributedGaussianEvent) and event.cohort == 4
    assert event.noise_multiplier == pytest.approx(z, rel=1e-12)
    assert event.central_noise_multiplier == pytest.approx(math.sqrt(2 * 4) * z, rel=1e-12)
    assert metrics["spend-central-epsilon"] < metrics["spend-epsilon"]
    assert "slot" not in " ".join(metrics) and "cluster" not in " ".join(metrics)


def test_a_device_releases_nothing_in_the_clear_outside_secagg(tmp_path: Path) -> None:
    client = _client(tmp_path, None)
    arrays, _, metrics = client.fit(list(HYPOTHESES), {"num-hypotheses": 2, "server-round": 1})
    assert arrays == [] and metrics["declined"] == 1
    assert "SecAgg+" in metrics["decline-reason"]
    assert not (tmp_path / "client-0.json").exists() or not PrivacyLedger(
        tmp_path / "client-0.json", delta=1e-5).entries()


def test_a_decline_through_secagg_is_an_error_not_an_empty_share(tmp_path: Path) -> None:
    # A cap of 0.1 cannot pay one release: the device declines; inside SecAgg+ a reply without
    # a share would corrupt the sum, so the decline is raised (the protocol drops the device).
    policy = _policy(tmp_path, **{"cap-epsilon": 0.1})
    config = _run(**{"num-rounds": 10, "epsilon": 5.0})
    client = GpflClient(device_task(config, policy), config, policy,
                        secure=TERMS)
    with pytest.raises(SecureDecline, match="cap"):
        client.fit(list(HYPOTHESES), {"num-hypotheses": 2, "server-round": 1})


@pytest.fixture(autouse=True)
def _task_identity() -> Any:
    # Flower stamps a message with the run of the process that makes it (an executor's task);
    # these tests make messages outside any task.
    from flwr.supercore.task_identity import TaskIdentity

    before = TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = before


def _stage_message(stage: str, **configs: Any) -> Message:
    record = ConfigRecord({Key.STAGE: stage, **configs})
    return Message(RecordDict({RECORD_KEY_CONFIGS: record}), dst_node_id=1,
                   message_type=MessageType.TRAIN)


def _context(tmp_path: Path, **run: Any) -> Context:
    return Context(run_id=1, node_id=1, state=RecordDict(),
                   node_config={"partition-id": 0, "num-partitions": 4,
                                "ledger-dir": str(tmp_path)},
                   run_config=_run(**run))


SETUP = {Key.SAMPLE_NUMBER: 6, Key.SHARE_NUMBER: 6, Key.THRESHOLD: 4,
         Key.CLIPPING_RANGE: 8.0, Key.TARGET_RANGE: 2 ** 22, Key.MOD_RANGE: 2 ** 32,
         Key.MAX_WEIGHT: 1.0}


@pytest.mark.parametrize(("change", "match"), [
    ({Key.SAMPLE_NUMBER: 3}, "min-cohort"), ({Key.THRESHOLD: 2}, "min-cohort"),
    ({Key.MAX_WEIGHT: 1000.0}, "max_weight"), ({Key.TARGET_RANGE: 2 ** 22 + 1}, "quantization"),
    ({Key.CLIPPING_RANGE: 7.0}, "clipping"), ({Key.THRESHOLD: "4"}, "integer"),
])
def test_the_device_declines_a_setup_it_cannot_keep(tmp_path: Path, change: dict[str, Any],
                                                    match: str) -> None:
    def never(msg: Message, ctxt: Context) -> Message:
        raise AssertionError("the client must not run")

    with pytest.raises(SecureDecline, match=match):
        secure_clusters_mod(_stage_message(Stage.SETUP, **{**SETUP, **change}),
                            _context(tmp_path), never)


def test_the_device_declines_to_mask_with_fewer_than_its_cohort(tmp_path: Path) -> None:
    def never(msg: Message, ctxt: Context) -> Message:
        raise AssertionError("the client must not run")

    ctxt = _context(tmp_path)
    msg = _stage_message(Stage.COLLECT_MASKED_VECTORS, **{Key.SOURCE_LIST: [2, 2, 3],
                                                          Key.CIPHERTEXT_LIST: [b"", b"", b""]})
    # Three sources, one of them twice: 3 distinct devices with this one, below 4.
    with pytest.raises(SecureDecline, match="3 devices"):
        secure_clusters_mod(msg, ctxt, never)


def test_a_plain_training_message_reaches_the_client_untouched(tmp_path: Path) -> None:
    seen: list[Message] = []

    def client(msg: Message, ctxt: Context) -> Message:
        seen.append(msg)
        return msg

    msg = Message(RecordDict(), dst_node_id=1, message_type=MessageType.TRAIN)
    assert secure_clusters_mod(msg, _context(tmp_path), client) is msg and seen == [msg]


# ------------------------------------------------------------------ the server


def _strategy(k: int = 2, n: int = 2) -> SecureClustersStrategy:
    hypotheses = [[np.zeros(n, np.float32)], [np.full(n, 10.0, np.float32)]][:k]
    return SecureClustersStrategy(terms=TERMS, clip=1.0, initial_hypotheses=hypotheses,
                                  clients_per_round=4, min_replies=1, round_timeout=10.0)


class _Proxy:
    def __init__(self, cid: str) -> None:
        self.cid = cid


def _fit_res(average: np.ndarray, name: str) -> FitRes:
    return FitRes(Status(code=0, message=""), ndarrays_to_parameters([average]), 1,
                  {"client-name": name, "declined": 0, "mechanism": "gaussian"})


def test_the_strategy_moves_each_hypothesis_by_its_slots_mean() -> None:
    # Four devices without noise: three in slot 0 with updates (0.5, 0), (0.3, 0), (0.1, 0.3),
    # one in slot 1 with (−0.2, −0.4); counts 3 and 1.
    strategy = _strategy()
    layout = strategy.layout
    picks = [(0, [0.5, 0.0]), (0, [0.3, 0.0]), (0, [0.1, 0.3]), (1, [-0.2, -0.4])]
    shares = [slot_signal(np.rint(np.array(u) * B).astype(np.int64), j, layout, B)
              for j, u in picks]
    n, c, t = len(shares), TERMS.clipping_range, TERMS.quantization_range
    total = np.sum([np.mod(a, t) for a in shares], axis=0)
    average = (total * (2 * c / t) - n * c) / n
    results = [(_Proxy(str(i)), _fit_res(average, f"client-{i}")) for i in range(n)]
    parameters, metrics = strategy.aggregate_fit(1, results, [])  # type: ignore[arg-type]
    assert parameters is not None and metrics["replies"] == 4
    new = strategy.hypotheses
    # Each update is rounded to a multiple of C/B = 1/4096: the means are within 1/4096.
    np.testing.assert_allclose(new[0][0], [0.3, 0.1], atol=1 / B)
    np.testing.assert_allclose(new[1][0], [9.8, 9.6], atol=1 / B)
    _, counts = split_sum(decode_sum(average, n, TERMS), layout, 1.0, B)
    assert counts.tolist() == [3.0, 1.0] and metrics["cluster-size-0"] == 3


def test_noisy_counts_settle_on_the_cohort() -> None:
    # Moved by (4 − 2.8)/3 = 0.4 each to sum to the cohort, then clipped to [0, 4].
    settled = settle_counts(np.array([2.6, -0.9, 1.1]), 4)
    assert settled.tolist() == pytest.approx([3.0, 0.0, 1.5])
    assert settle_counts(np.array([9.0, 1.0]), 4).tolist() == pytest.approx([4.0, 0.0])


def test_the_launch_budget_counts_a_share_by_rdp_alone(tmp_path: Path) -> None:
    # The launch's budget lines run the ledger's own cap check on the event a device will
    # charge: for a share, RDP alone (no PLD), so a cap pays no release more than the device.
    from deploy.budget import plan_budgets

    run = _run(epsilon=5.0, **{"num-rounds": 10})
    node = {"partition-id": 0, "num-partitions": 1, "ledger-dir": str(tmp_path),
            "cap-epsilon": 100.0}
    (plan,) = plan_budgets(run, {0: node}, [(2,)], hypotheses=2)
    z = calibrate_gaussian_noise_multiplier(5.0, 1e-5, 10)
    assert plan.cost == pytest.approx(composed_gaussian_epsilon_rdp({z: 1}, 1e-5), rel=1e-9)
    assert plan.cost > min(composed_gaussian_epsilons({z: 1}, 1e-5))


def test_the_servers_check_counts_plain_replies_masked_vectors_and_errors() -> None:
    # The grid wrapper between SecAgg+'s workflow and the grid: a reply with arrays is a plain
    # release (counted, logged), a masked vector must be integers, an error names its node.
    from flwr.app import Array, ArrayRecord, Error
    from flwr.common import ndarray_to_bytes

    from server.secure_round import MaskedOnlyGrid
    from strategies.secure import StageReplies

    sent = [Message(RecordDict({"configs": ConfigRecord({"stage": "x"})}), dst_node_id=n,
                    message_type=MessageType.TRAIN) for n in (1, 2, 3, 4)]

    def reply(msg: Message, content: RecordDict) -> Message:
        out = Message(content, reply_to=msg)
        out.metadata.__dict__["_src_node_id"] = msg.metadata.dst_node_id
        return out

    masked = ConfigRecord({Key.MASKED_PARAMETERS: [ndarray_to_bytes(np.arange(3))]})
    floats = ConfigRecord({Key.MASKED_PARAMETERS: [ndarray_to_bytes(np.ones(3))]})
    replies = [
        reply(sent[0], RecordDict({RECORD_KEY_CONFIGS: masked})),
        reply(sent[1], RecordDict({RECORD_KEY_CONFIGS: floats})),
        reply(sent[2], RecordDict({"arrays": ArrayRecord({"w": Array(np.ones(2))})})),
        Message(Error(code=0, reason="declined: too few"), reply_to=sent[3]),
    ]
    replies[3].metadata.__dict__["_src_node_id"] = 4

    class Grid:
        def send_and_receive(self, messages: Any, *, timeout: Any = None) -> list[Message]:
            return replies

    stage = StageReplies()
    grid = MaskedOnlyGrid(Grid(), stage)
    grid.send_and_receive(sent)
    assert (grid.received, grid.masked_vectors, grid.plain) == (4, 1, 2)
    assert stage.errors == {"4": "declined: too few"}
    assert set(grid.sent_bytes) == {1, 2, 3, 4} and grid.received_bytes[1] > 0


#: What an adversarial server can announce as a SecAgg+ range: the edges of arithmetic and of
#: representation, as numbers of either type.
_ANNOUNCED = st.one_of(
    st.sampled_from([0, 1, -1, 2 ** 16, 2 ** 22, 2 ** 24, 2 ** 25, 2 ** 32, 2 ** 63, True]),
    st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from([0.0, 5e-324, 1e-300, 2.0 ** -8, 8.0, 2.0 ** 8, 1e308, math.inf, math.nan]),
)


@hypothesis_settings(max_examples=300, deadline=None)
@given(t=_ANNOUNCED, c=_ANNOUNCED, mod=_ANNOUNCED)
def test_announced_ranges_are_refused_or_encode_exactly(t: Any, c: Any, mod: Any) -> None:
    # Whatever a server announces, the device either refuses the terms or encodes its integers
    # so that Flower's own quantization gives each one back, the extremes of the range included.
    try:
        terms = SecureTerms(t, c, mod)
    except SecureTermsError:
        return
    span = terms.quantization_range
    a = np.array([0, 1, -1, span // 2, -span // 2, span - 1, 7 * span + 3], np.int64)
    (q,) = quantize([encode(a, terms)], terms.clipping_range, span)
    assert q.tolist() == np.mod(a, span).tolist()
