"""A curious server at the edges: arithmetic, radii it controls, error texts, uncharged signals.

Each test plays one attack of a server that writes the run config and the hypotheses, against
the real ClientApp (``client.app.app``) driven with Flower messages, on a device whose own
settings bound what it does. Every one of them succeeded against the client as it was before
the device bounded every number it derives, kept a least protected radius, charged before
reading its data and built its task inside the failure guard.
"""

from __future__ import annotations

import csv
import logging
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from client.numpy_client import TASK_DATA_DECLINED
from mechanisms import NeighbourhoodEvent, PrivacyLedger
from mechanisms import rng as rng_module
from mechanisms.invariant import lower_tail_factor
from tests.test_adversarial_server import (
    HONEST,
    CuriousServer,
    ServerSeesError,
    device,
    ledger,
)

N_OVER_NU = 2 / 5  # one synthetic release at nu = 5: n/nu with n = 2


@pytest.fixture
def fixed_entropy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Feed the device's noise from a fixed seed instead of the OS CSPRNG, for one test.

    The release still goes through ``device_rng`` and the mechanism exactly as a device runs
    them; only the 128 bits that seed each release's generator come from
    ``random.Random(2026)``. A statistical test at alpha = 1e-3 fails a correct mechanism once
    in a thousand seeds: with the seed fixed, it fails only if the mechanism changes.
    """
    monkeypatch.setattr(rng_module.secrets, "randbits", random.Random(2026).getrandbits)


def hypotheses_near(count: int, spacing: float) -> list[np.ndarray]:
    """A grid of ``count`` hypotheses ``spacing`` apart around the first optimum."""
    return [np.array([5.0 + spacing * i, 6.0], np.float32) for i in range(count)]


# -- 1. arithmetic at the edges -------------------------------------------------------------------
@pytest.mark.parametrize("nu", [1e308, 1e162, 1.7976931348623157e308])
def test_an_enormous_noise_multiplier_is_declined_and_nothing_leaves(
    tmp_path: Path, nu: float
) -> None:
    # Prepare: a device that asks for nu >= 5 and a cap of 1; the server asks for a nu so large
    # that nu * ||delta|| overflows, with a step that makes the update large.
    server = CuriousServer(device(tmp_path, **{"noise-multiplier": 5.0, "cap-d-privacy": 1.0}))

    # Execute
    released, metrics = server.fit({"noise-multiplier": nu, "learning-rate": 10.0}, HONEST)

    # Assert: declined before anything was computed, naming the setting; nothing charged.
    assert released == [] and metrics["declined"] == 1 and metrics["declined-by"] == "policy"
    assert "noise-multiplier" in metrics["decline-reason"]
    assert not ledger(tmp_path).path.exists()


@pytest.mark.parametrize("nu", [1e308, 1e162, 1.7976931348623157e308])
def test_the_overflow_attack_per_layer_is_declined_and_nothing_leaves(
    tmp_path: Path, nu: float
) -> None:
    # Prepare: the same attack in per-layer mode (each layer's nu * ||delta_l|| overflows); the
    # client before the bounds released the trained model bit for bit here too, charged 2e-308.
    server = CuriousServer(device(tmp_path, **{"noise-multiplier": 5.0, "cap-d-privacy": 1.0}))

    # Execute
    released, metrics = server.fit(
        {"noise-multiplier": nu, "learning-rate": 10.0, "per-layer": True}, HONEST)

    # Assert: declined before anything was computed, naming the setting; nothing charged.
    assert released == [] and metrics["declined"] == 1 and metrics["declined-by"] == "policy"
    assert "noise-multiplier" in metrics["decline-reason"]
    assert not ledger(tmp_path).path.exists()


def test_hypotheses_at_the_devices_max_parameter_never_fail_after_the_charge(
    tmp_path: Path,
) -> None:
    # Prepare: a float32 hypothesis at the device's max-parameter (1e6, where float32's spacing
    # is 0.0625) and a vanishing step, so the noise is nu * least-radius = 0.05: the cast to
    # float32 rounds it away in about 4 releases of 10. The release invariant measured the
    # noise after the cast and refused those releases, charged: 40 % of the rounds failed
    # after the charge.
    server = CuriousServer(device(tmp_path, **{"cap-d-privacy": 1e6}))
    far = [np.array([1e6, -1e6], np.float32)]

    # Execute: 40 rounds (with a 40 % failure rate, all 40 succeed with probability 1e-9).
    for r in range(40):
        released, metrics = server.fit({"learning-rate": 1e-30, "num-hypotheses": 1}, far,
                                       server_round=r + 1)
        assert len(released) == 1 and np.isfinite(released[0]).all()

    # Assert: every round released and was charged once.
    assert metrics["releases"] == 40 and ledger(tmp_path).spent().releases == 40


def test_a_vanishing_clip_is_declined_before_the_charge(tmp_path: Path) -> None:
    # Prepare: a clip of 1e-40 makes sigma = z * 2C about 1e-39, which vanishes when added to
    # the hypothesis in float64: the release was refused after the charge, every round.
    server = CuriousServer(device(tmp_path))

    # Execute
    released, metrics = server.fit({"mechanism": "gaussian", "clip": 1e-40,
                                     "num-hypotheses": 1}, [HONEST[0]])

    # Assert
    assert released == [] and metrics["declined-by"] == "policy"
    assert "clip=1e-40" in metrics["decline-reason"]
    assert not ledger(tmp_path).path.exists()


def test_task_settings_that_do_not_fit_the_partition_are_refused_before_the_charge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: users = 3 on a device that is partition 0 of 2: the task's data call refuses it,
    # which it did after the charge (a round charged for nothing, and failed).
    from tasks.synthetic import SyntheticTask

    reads: list[int] = []
    original = SyntheticTask.client_dataset
    monkeypatch.setattr(SyntheticTask, "client_dataset",
                        lambda self, *a: reads.append(1) or original(self, *a))
    server = CuriousServer(device(tmp_path))

    # Execute
    with pytest.raises(ServerSeesError) as caught:
        server.fit({"users": 3}, HONEST)

    # Assert: the public reason, no data read, nothing charged.
    assert "users=3 does not match num-partitions=2" in str(caught.value)
    assert reads == [] and not ledger(tmp_path).path.exists()


def test_whether_a_round_is_charged_does_not_depend_on_the_data(tmp_path: Path) -> None:
    # Prepare: two devices with different data; the server probes noise multipliers and steps
    # across the whole range it may send (the old client raised before charging for some of
    # them, depending on ||delta||, and the next reply's counter told the server which).
    probes = [(nu, lr) for nu in (5.0, 1e3, 1e6, 1e162) for lr in (1e-30, 0.1, 1e3)]
    outcomes = []
    for partition in (0, 1):
        node = device(tmp_path / f"p{partition}", **{"partition-id": partition})
        server = CuriousServer(node)
        seen = []
        for i, (nu, lr) in enumerate(probes):
            released, metrics = server.fit({"noise-multiplier": nu, "learning-rate": lr},
                                           HONEST, server_round=i + 1)
            seen.append((metrics["declined"], metrics.get("releases"), bool(released)))
        outcomes.append(seen)

    # Assert: the same outcome and the same counters, probe by probe, whatever the data.
    assert outcomes[0] == outcomes[1]
    assert [s[0] for s in outcomes[0]] == [0] * 9 + [1] * 3  # 1e162 is beyond any bound


# -- 2. a radius the server controls ---------------------------------------------------------------
@pytest.mark.usefixtures("fixed_entropy")
def test_a_vanishing_learning_rate_still_gets_noise_at_the_least_radius(tmp_path: Path) -> None:
    # Prepare: with a step of 1e-30 the update is 0 and the heuristic's noise nu * ||delta||
    # vanishes: the release was the chosen hypothesis, unnoised. The device's least radius
    # (0.05 here) keeps the noise at nu * 0.05.
    nu, least, draws = 5.0, 0.05, 300
    server = CuriousServer(device(tmp_path, **{"least-radius": least, "cap-d-privacy": 1e6}))

    # Execute
    distances = []
    for i in range(draws):
        released, metrics = server.fit({"learning-rate": 1e-30, "noise-multiplier": nu}, HONEST,
                                       server_round=i + 1)
        distances.append(min(float(np.linalg.norm(released[0] - h)) for h in HONEST))

    # Assert: the distance to the hypothesis is the Euclidean Laplace radius Gamma(n = 2,
    # scale nu * least / 2) (KS at alpha = 1e-3 over 300 draws from the fixed entropy; the
    # nearest hypothesis is the chosen one: they are 10.5 apart, the noise ~0.25), and every
    # release was charged n/nu.
    assert stats.kstest(distances, stats.gamma(2, scale=nu * least / 2).cdf).pvalue > 1e-3
    assert metrics["releases"] == draws
    assert metrics["spend-d"] == pytest.approx(draws * N_OVER_NU)


@pytest.mark.parametrize(("k", "bound"), [(9, None), (3, 2), (1000, None)])
def test_more_hypotheses_than_the_device_allows_are_declined(
    tmp_path: Path, k: int, bound: int | None
) -> None:
    # Prepare: a fine grid of k hypotheses, from which the argmin of the private loss would be
    # read (and zoomed into, round after round).
    node = device(tmp_path, **({"max-hypotheses": bound} if bound else {}))
    server = CuriousServer(node)

    # Execute
    released, metrics = server.fit({"num-hypotheses": k}, hypotheses_near(k, 1e-3))

    # Assert
    assert released == [] and metrics["declined-by"] == "policy"
    assert f"num-hypotheses={k}" in metrics["decline-reason"]
    assert "max-hypotheses" in metrics["decline-reason"]
    assert not ledger(tmp_path).path.exists()


@pytest.mark.usefixtures("fixed_entropy")
def test_the_zoom_attack_at_the_most_hypotheses_a_device_serves_is_bounded(
    tmp_path: Path,
) -> None:
    # Prepare: the zoom attack within the device's bound: k = max-hypotheses = 8 hypotheses on
    # a 1e-3 grid around the device's local optimum, and a vanishing step (delta = 0): the
    # release is the hypothesis the device picked (the argmin of its loss over the grid) plus
    # noise. The device's least radius keeps that noise at the Euclidean Laplace of
    # epsilon = n / (nu * least-radius) = 2 / (5 * 0.01) = 40, E||noise|| = n / epsilon = 0.05,
    # 50 times the grid's spacing; each release is charged n / nu = 0.4 as any other.
    from client.policy import DevicePolicy
    from tests.test_adversarial_server import RUN, device_task

    nu, least, draws, k = 5.0, 0.01, 150, 8
    node = device(tmp_path, **{"cap-d-privacy": 1e6})
    server = CuriousServer(node)
    grid = [np.array([4.522 + 1e-3 * (i - 3.5), 6.345], np.float32) for i in range(k)]
    task = device_task(RUN, DevicePolicy.load(node, environ={}))
    data = task.client_dataset(0, 2)
    picked = grid[int(np.argmin([task.loss([g], data) for g in grid]))]

    # Execute
    noise = []
    for i in range(draws):
        released, metrics = server.fit({"learning-rate": 1e-30, "noise-multiplier": nu}, grid,
                                       server_round=i + 1)
        noise.append(float(np.linalg.norm(released[0].astype(np.float64) - picked)))
    more, declined = server.fit({"learning-rate": 1e-30}, [*grid, grid[0] + 1e-3],
                                server_round=draws + 1)

    # Assert: every release's noise is above the invariant's bound at the least radius (an
    # honest release falls below it with probability <= 1e-9), and the noise norms follow
    # Gamma(n = 2, scale nu * least / 2), mean 0.05 (KS over 150 draws from the fixed entropy
    # at alpha = 1e-3); each release was charged n / nu.
    assert min(noise) >= lower_tail_factor(2) * nu * least
    assert stats.kstest(noise, stats.gamma(2, scale=nu * least / 2).cdf).pvalue > 1e-3
    assert metrics["releases"] == draws
    assert metrics["spend-d"] == pytest.approx(draws * N_OVER_NU)
    # ... and one hypothesis more than the device serves is declined, nothing charged.
    assert more == [] and declined["declined-by"] == "policy"
    assert "max-hypotheses=8" in declined["decline-reason"]
    assert ledger(tmp_path).spent().releases == draws


# -- 3. data in error text -------------------------------------------------------------------------
def test_a_malformed_row_of_the_devices_file_never_reaches_the_server(tmp_path: Path) -> None:
    # Prepare: the device's CMS file has one row whose payment field holds a patient's name;
    # the run asks for the task whose loader parses that file.
    from tests.test_tasks_hospital import HEADER, PNEUMONIA_CC

    path = tmp_path / "charges.csv"
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(HEADER)
        writer.writerow([PNEUMONIA_CC, "10001", "H", "1 MAIN ST", "CITY", "ST", "36301", "X",
                         "20", "$35000.00", "Jane Q. Doe 1961-04-02", "$5000.00"])
    server = CuriousServer(device(tmp_path, **{"data-path": str(path)}))
    hypotheses = [np.zeros(shape, np.float32) for shape in _hospital_shapes()]

    # Execute
    with pytest.raises(ServerSeesError) as caught:
        server.fit({"task": "hospital", "num-hypotheses": 1, "validation-users": 0},
                   hypotheses, config={"num-hypotheses": 1})

    # Assert: the fixed text only; the round was charged before the file was read.
    assert "Jane" not in str(caught.value) and "1961" not in str(caught.value)
    assert "could not complete this round" in str(caught.value)
    assert ledger(tmp_path).spent().releases == 1


#: A tabular run on the device's file (columns of its header below), one logistic model.
TABULAR: dict[str, Any] = {"task": "tabular", "label-column": "outcome",
                           "feature-columns": "age,dose", "classes": "no,yes",
                           "num-hypotheses": 1}
TABULAR_MODEL = [np.zeros((2, 2), np.float32), np.zeros(2, np.float32)]


def write_records(path: Path, rows: list[list[str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["age", "dose", "outcome", "site"])
        writer.writerows(rows)
    return path


GOOD_ROWS = [[str(20 + i), str(0.5 * i), "yes" if i % 2 else "no", "s1"] for i in range(8)]


def tabular_round(server: CuriousServer, server_round: int, **run: Any
                  ) -> tuple[list[np.ndarray], dict[str, Any]]:
    return server.fit({**TABULAR, **run}, list(TABULAR_MODEL), server_round=server_round,
                      config={"num-hypotheses": 1})


@pytest.mark.parametrize(("problem", "detail"), [
    ("missing-file", "no such file"),
    ("missing-label", "['hiv_status']"),
    ("missing-feature", "['hiv_status']"),
    ("empty-file", "has no rows"),
    ("empty-iid-partition", "fewer than the 2 this device's partition needs"),
])
def test_a_file_that_does_not_fit_the_run_is_declined_before_anything_is_charged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, problem: str, detail: str
) -> None:
    # Prepare: device 1 of 2 with a valid file of one row, which releases once (round 1).
    path = write_records(tmp_path / "records-site-a.csv", GOOD_ROWS[:1])
    node = device(tmp_path, **{"data-path": str(path), "device": "cpu", "partition-id": 1,
                               "client-name": "client-0"})
    server = CuriousServer(node)
    released, metrics = tabular_round(server, 1)
    assert metrics["declined"] == 0 and len(released) == 2
    before = ledger(tmp_path).spent()
    run: dict[str, Any] = {}
    if problem == "missing-file":
        path.unlink()
    elif problem == "missing-label":
        run = {"label-column": "hiv_status"}
    elif problem == "missing-feature":
        run = {"feature-columns": "age,hiv_status"}
    elif problem == "empty-file":
        write_records(path, [])
    else:  # a shared file split iid: partition 1 of a one-row file is empty
        run = {"tabular-split": "iid"}

    # Execute
    caplog.set_level(logging.WARNING, logger="client.numpy_client")
    released, metrics = tabular_round(server, 2, **run)

    # Assert: a decline with the one fixed reason; the ledger exactly as it was (no charge, no
    # decline counted); the details in the device's log, not in the reply.
    assert released == [] and metrics["declined"] == 1
    assert metrics["declined-by"] == "task-data"
    assert metrics["decline-reason"] == TASK_DATA_DECLINED
    assert ledger(tmp_path).spent() == before
    logged = caplog.text
    assert re.search(r"gpfl device: run \S+ round 2 federation \S+: client-0 declines "
                     r"\(task-data\): .*; nothing charged", logged)
    assert detail in logged and "records-site-a.csv" in logged
    said = repr(sorted(metrics.items()))
    assert "hiv_status" not in said and "records-site-a" not in said and "rows" not in said


def test_a_value_that_is_not_a_number_stays_a_charged_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare: the header is right, so the preflight passes; one cell holds a patient's name.
    rows = [*GOOD_ROWS[:3], ["41", "Jane Q. Doe 1961-04-02", "no", "s1"]]
    path = write_records(tmp_path / "records.csv", rows)
    server = CuriousServer(device(tmp_path, **{"data-path": str(path), "device": "cpu"}))
    caplog.set_level(logging.WARNING, logger="client.numpy_client")

    # Execute
    with pytest.raises(ServerSeesError) as caught:
        tabular_round(server, 1)

    # Assert: charged (the value needed the records), the fixed text only; the device's log
    # names the cell.
    assert "could not complete this round" in str(caught.value)
    assert "Jane" not in str(caught.value) and "1961" not in str(caught.value)
    assert "dose" not in str(caught.value)
    assert ledger(tmp_path).spent().releases == 1
    assert "Jane Q. Doe" in caplog.text
    assert re.search(r"gpfl device: run \S+ round 1 federation \S+: \S+ failed \(charged\)",
                     caplog.text)


def test_a_file_that_fits_passes_the_preflight_and_releases(tmp_path: Path) -> None:
    path = write_records(tmp_path / "records.csv", GOOD_ROWS)
    server = CuriousServer(device(tmp_path, **{"data-path": str(path), "device": "cpu"}))
    released, metrics = tabular_round(server, 1)
    assert metrics["declined"] == 0 and "declined-by" not in metrics
    assert [r.shape for r in released] == [(2, 2), (2,)]
    assert ledger(tmp_path).spent().releases == 1 == metrics["releases"]


def _hospital_shapes() -> list[tuple[int, ...]]:
    from tasks.hospital import hospital_mlp

    return [tuple(p.shape) for p in hospital_mlp().parameters()]


# -- 4. uncharged signals -------------------------------------------------------------------------
def test_a_device_at_its_cap_declines_without_reading_its_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: a cap of 0.5 holds one release (0.4); count every read of the local data.
    from tasks.synthetic import SyntheticTask

    reads: list[int] = []
    original = SyntheticTask.client_dataset

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SyntheticTask, "client_dataset", counted)
    server = CuriousServer(device(tmp_path, **{"cap-d-privacy": 0.5}))
    server.fit({}, HONEST, server_round=1)
    assert len(reads) == 1

    # Execute: every further round would pass the cap.
    for r in range(2, 6):
        released, metrics = server.fit({}, HONEST, server_round=r)
        assert released == [] and metrics["declined-by"] == "budget"

    # Assert: the data was never read again (the decline's time cannot depend on it).
    assert len(reads) == 1
    assert ledger(tmp_path).spent().declines == 4


def test_a_reply_carries_this_federations_spend_not_the_devices_lifetime(
    tmp_path: Path,
) -> None:
    # Prepare: the device already released three times in another federation.
    path = tmp_path / "ledger" / "client-0.json"
    other = PrivacyLedger(path, delta=1e-5)
    for r in range(3):
        other.charge(NeighbourhoodEvent((2,), 5.0), cap=50.0, round=r, federation="elsewhere")
    server = CuriousServer(device(tmp_path))

    # Execute
    _, first = server.fit({}, HONEST, server_round=1, config={"federation-id": "f00d"})
    _, second = server.fit({}, HONEST, server_round=2, config={"federation-id": "f00d"})
    _, unnamed = server.fit({}, HONEST, server_round=3)

    # Assert: this federation's releases only; the ledger still caps the lifetime spend.
    assert (first["releases"], second["releases"]) == (1, 2)
    assert second["spend-d"] == pytest.approx(2 * N_OVER_NU)
    assert unnamed["releases"] == 1  # no id: the Flower run's own releases
    assert "declines" not in second
    lifetime = PrivacyLedger(path, delta=1e-5).spent()
    assert lifetime.releases == 6 and lifetime.d_privacy == pytest.approx(6 * N_OVER_NU)
