"""Tests of the hospital-charges loader and task on a small CMS-format fixture."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import zipcodes

import tasks
from settings import SETTINGS
from tasks.hospital import (
    HospitalTask,
    hospital_mlp,
    load_hospital_csv,
    zip_coordinates,
)
from tasks.torch_support import count_parameters

# The FY2011 file's header, stray spaces included.
HEADER = [
    "DRG Definition",
    "Provider Id",
    "Provider Name",
    "Provider Street Address",
    "Provider City",
    "Provider State",
    "Provider Zip Code",
    "Hospital Referral Region Description",
    " Total Discharges ",
    " Average Covered Charges ",
    " Average Total Payments ",
    "Average Medicare Payments",
]
PNEUMONIA_CC = "194 - SIMPLE PNEUMONIA & PLEURISY W CC"
PNEUMONIA_MCC = "193 - SIMPLE PNEUMONIA & PLEURISY W MCC"
KIDNEY = "690 - KIDNEY & URINARY TRACT INFECTIONS W/O MCC"
HEART = "292 - HEART FAILURE & SHOCK W CC"
ESOPHAGITIS = "392 - ESOPHAGITIS, GASTROENT & MISC DIGEST DISORDERS W/O MCC"
OTHER = "039 - EXTRACRANIAL PROCEDURES W/O CC/MCC"
# provider id -> ZIP as the FY2011 file writes it (numbers: 2134 is 02134)
PROVIDERS = {
    "10001": "36301",
    "10005": "35957",
    "220071": "2134",
    "330214": "10001",
    "140276": "60601",
    "50454": "94103",
    "450068": "77030",
    "500025": "98101",
    "100022": "33136",
    "60024": "80202",
    "999999": "00000",  # unknown ZIP: dropped
}


def _payment(provider: str, index: int) -> float:
    return 4000.0 + 1000.0 * index + float(int(provider) % 997)


def _row(drg: str, provider: str, zip_code: str, payment: float) -> list[str]:
    return [drg, provider, "H", "1 MAIN ST", "CITY", "ST", zip_code, "X", "20", "$35000.00",
            f"${payment:.2f}", "$5000.00"]  # fmt: skip


@pytest.fixture(scope="module")
def cms_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cms")
    return write_cms_csv(folder / "Inpatient_Prospective_Payment_System.csv")


def write_cms_csv(path: Path) -> Path:
    """Write the small CMS-format file the hospital tests read; return its path."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(HEADER)
        for provider, zip_code in PROVIDERS.items():
            for index, drg in enumerate((PNEUMONIA_CC, KIDNEY, HEART, ESOPHAGITIS), start=1):
                if provider == "60024" and drg == HEART:
                    continue  # a provider without one of the services
                writer.writerow(_row(drg, provider, zip_code, _payment(provider, index)))
            writer.writerow(_row(OTHER, provider, zip_code, 99999.0))
        for provider in ("10001", "10005"):  # the less common pneumonia DRG
            writer.writerow(_row(PNEUMONIA_MCC, provider, PROVIDERS[provider], 77777.0))
    return path


def _task(cms_csv: Path, **config: object) -> HospitalTask:
    task = tasks.load_task({"task": "hospital", "data-path": str(cms_csv), **config})
    assert isinstance(task, HospitalTask)
    return task


def test_model_has_eleven_parameters() -> None:
    assert count_parameters(hospital_mlp()) == 11


def test_zip_lookup() -> None:
    lon, lat = zip_coordinates("2134")  # type: ignore[misc]
    record = zipcodes.matching("02134")[0]
    assert (lon, lat) == (float(record["long"]), float(record["lat"]))
    assert -71.5 < lon < -70.8 and 42.0 < lat < 42.6
    assert zip_coordinates("00000") is None and zip_coordinates("") is None


def test_preprocessing(cms_csv: Path) -> None:
    data = load_hospital_csv(cms_csv)
    assert data.drgs == (PNEUMONIA_CC, KIDNEY, HEART, ESOPHAGITIS)
    assert "999999" not in data.providers and len(data.providers) == 10
    x, y = data.features["220071"], data.targets["220071"]
    assert x.shape == (4, 3) and x.dtype == np.float32 and y.dtype == np.float32
    np.testing.assert_array_equal(x[:, 0], [1, 2, 3, 4])  # service index, paper's order
    lon, lat = zip_coordinates("02134")  # type: ignore[misc]
    np.testing.assert_allclose(x[:, 1], lon / 10, rtol=1e-6)
    np.testing.assert_allclose(x[:, 2], lat / 10, rtol=1e-6)
    expected = [_payment("220071", i) / 1000 for i in (1, 2, 3, 4)]
    np.testing.assert_allclose(y, expected, rtol=1e-6)
    assert data.features["60024"].shape == (3, 3)


def test_provider_split_is_seeded_disjoint_and_covering(cms_csv: Path) -> None:
    task = _task(cms_csv, **{"validation-users": 0})
    assert len(task.training_providers) == 7 and len(task.validation_providers) == 3
    assert set(task.training_providers).isdisjoint(task.validation_providers)
    assert set(task.training_providers) | set(task.validation_providers) == set(
        load_hospital_csv(cms_csv).providers
    )
    assert task.training_providers == _task(cms_csv).training_providers
    others = {_task(cms_csv, **{"data-seed": s}).training_providers for s in range(1, 6)}
    assert len(others | {task.training_providers}) > 1
    users = [task.client_dataset(p, 7).user for p in range(7)]
    assert tuple(users) == task.training_providers
    assert [d.user for d in task.validation_datasets()] == list(task.validation_providers)
    assert len(_task(cms_csv, **{"validation-users": 2}).validation_datasets()) == 2
    assert len(_task(cms_csv).validation_datasets()) == 3  # the default 20 is a cap
    # Built directly, the task takes the same default as from a run config.
    direct = HospitalTask(str(cms_csv))
    assert direct.validation_users == SETTINGS["validation-users"].default
    assert direct.validation_providers == _task(cms_csv).validation_providers


def test_training_reduces_the_rmse(cms_csv: Path) -> None:
    task = _task(cms_csv, device="cpu")
    assert task.num_parameters == 11 and not task.is_classifier
    data = task.client_dataset(0, 7)
    params = task.initial_hypotheses(1, np.random.default_rng(0))[0]
    assert [a.shape for a in params] == [(2, 3), (2,), (1, 2), (1,)]
    before = task.loss(params, data)
    for _ in range(30):
        params = task.train(
            params,
            data,
            epochs=1,
            learning_rate=0.1,
            batch_size=2,
            rng=np.random.default_rng(0),
            device="cpu",
        )
    assert all(a.dtype == np.float32 for a in params)
    assert task.loss(params, data) < 0.7 * before
    scores = task.evaluate([params], task.validation_datasets())
    assert scores["hypothesis_0_users"] == len(task.validation_datasets())
    assert {k for k in scores if not k.startswith("hypothesis_")} == {"loss"}


def test_errors_name_the_setting(tmp_path: Path, cms_csv: Path) -> None:
    with pytest.raises(ValueError, match="data-path"):
        tasks.load_task({"task": "hospital"})
    with pytest.raises(ValueError, match=r"data-path=.*not a file"):
        tasks.load_task({"task": "hospital", "data-path": str(tmp_path / "absent.csv")})
    bad = tmp_path / "bad.csv"
    bad.write_text("DRG Definition,Provider Id\n194 - SIMPLE PNEUMONIA,1\n")
    with pytest.raises(ValueError, match=r"lacks the CMS column.*Provider Zip Code"):
        tasks.load_task({"task": "hospital", "data-path": str(bad)})
    with pytest.raises(ValueError,
                       match=r"validation-users must be an integer >= 0 and <= 1e\+07, .*=-1"):
        _task(cms_csv, **{"validation-users": -1})
    with pytest.raises(ValueError, match=r"users=5.*num-partitions=7"):
        _task(cms_csv, users=5).client_dataset(0, 7)
    with pytest.raises(ValueError, match="exceeds the 7 training users"):
        _task(cms_csv).client_dataset(0, 8)
