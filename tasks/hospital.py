"""Hospital charges: the CMS inpatient charge data with the preprocessing of paper 001 (appendix).

``data-path`` is the CMS CSV "Inpatient Prospective Payment System (IPPS) Provider Summary for
the Top 100 Diagnosis-Related Groups (DRG)" (columns ``DRG Definition``, ``Provider Id``,
``Provider Zip Code``, ``Average Total Payments``, … — surrounding spaces in the header, as in
the FY2011 file, are ignored; the newer CMS spelling ``DRG_Desc``, ``Rndrng_Prvdr_CCN``,
``Rndrng_Prvdr_Zip5``, ``Avg_Tot_Pymt_Amt`` is accepted too). Preprocessing, following the
paper's appendix:

i.   The 4 conditions the paper names: simple pneumonia; kidney and urinary tract infections;
     heart failure and shock; esophagitis and digestive disorders. The CMS file splits each into
     DRGs by severity (e.g. 193/194/195); the paper keeps the "most widely treated", so for each
     condition the DRG offered by the most providers is kept (ties: the first in sorted order).
ii.  ZIP code → longitude and latitude with the offline ``zipcodes`` package; rows whose ZIP it
     does not know are dropped (logged).
iii. Target: ``Average Total Payments`` (``$`` and ``,`` stripped).
iv.  "Values brought to the range of the units" without looking at the data distribution (the
     paper avoids standardisation on purpose): fixed, public scales. Inputs are the service
     index 1–4 (the order the paper lists the conditions in), longitude / 10 and latitude / 10;
     the target is payments / 1000 (thousands of dollars).

One client per provider (its up to 4 rows). Providers are sorted by id and split 70 / 30 into
training and validation clients by a permutation drawn from ``data-seed``; partition ``p`` is
training provider ``p`` of that permutation. ``validation-users`` caps how many validation
providers are used, the first ones of the permutation (0 = all of them; the paper samples 200 of
its 885 at every validation).

The model is the paper's "two-layer fully connected network with 11 parameters and ReLU":
Linear(3 → 2), ReLU, Linear(2 → 1) = 3·2 + 2 + 2·1 + 1 = 11. The loss is the RMSE.
"""

from __future__ import annotations

import csv
import functools
import logging
import math
import os
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from settings import SETTINGS
from tasks.base import Dataset, resolve_users, user_seed
from tasks.config import TaskSettingsError, require_data_path
from tasks.torch_support import TorchTask

__all__ = [
    "CONDITIONS",
    "HospitalData",
    "HospitalTask",
    "hospital_mlp",
    "load_hospital_csv",
    "zip_coordinates",
]

logger = logging.getLogger(__name__)

#: (name, pattern on the upper-cased DRG definition), in the paper's order = service index 1..4.
CONDITIONS: tuple[tuple[str, str], ...] = (
    ("simple pneumonia", r"SIMPLE PNEUMONIA"),
    ("kidney and urinary tract infections", r"KIDNEY\s*(?:&|AND)\s*URINARY TRACT INFECTION"),
    ("heart failure and shock", r"HEART FAILURE\s*(?:&|AND)\s*SHOCK"),
    ("esophagitis and digestive disorders", r"ESOPHAGITIS"),
)

#: Canonical column -> accepted header names (FY2011-style first, then the newer CMS names).
COLUMNS: Mapping[str, tuple[str, ...]] = {
    "DRG Definition": ("DRG Definition", "DRG_Desc"),
    "Provider Id": ("Provider Id", "Rndrng_Prvdr_CCN"),
    "Provider Zip Code": ("Provider Zip Code", "Rndrng_Prvdr_Zip5"),
    "Average Total Payments": ("Average Total Payments", "Avg_Tot_Pymt_Amt"),
}

COORDINATE_SCALE = 10.0
PAYMENT_SCALE = 1000.0
TRAIN_FRACTION = 0.7
HIDDEN_UNITS = 2


def hospital_mlp() -> nn.Sequential:
    """Linear(3 → 2), ReLU, Linear(2 → 1): 11 parameters."""
    return nn.Sequential(nn.Linear(3, HIDDEN_UNITS), nn.ReLU(), nn.Linear(HIDDEN_UNITS, 1))


@functools.lru_cache(maxsize=1)
def _zip_table() -> dict[str, tuple[float, float]]:
    import zipcodes

    table: dict[str, tuple[float, float]] = {}
    for record in zipcodes.list_all():
        try:
            lon, lat = float(record["long"]), float(record["lat"])
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(lon) and math.isfinite(lat):
            table[str(record["zip_code"])] = (lon, lat)
    return table


def _normalise_zip(raw: str) -> str | None:
    text = raw.strip()
    if not text:
        return None
    if "-" in text:  # ZIP+4
        text = text.split("-", 1)[0]
    try:
        number = int(float(text))
    except ValueError:
        return None
    if not 0 <= number <= 99999:
        return None
    return f"{number:05d}"  # the FY2011 file stores ZIPs as numbers: 2134 is 02134


def zip_coordinates(zip_code: str) -> tuple[float, float] | None:
    """(longitude, latitude) of a US ZIP code from the offline ``zipcodes`` package, or None."""
    key = _normalise_zip(zip_code)
    return None if key is None else _zip_table().get(key)


def _payment(raw: str) -> float:
    value = float(raw.replace("$", "").replace(",", "").strip())
    if not math.isfinite(value):
        raise ValueError(f"not finite: {raw!r}")
    return value


@dataclass(frozen=True)
class HospitalData:
    """Preprocessed rows grouped by provider (providers sorted by id)."""

    providers: tuple[str, ...]
    features: Mapping[str, np.ndarray]  # provider -> float32 (m, 3)
    targets: Mapping[str, np.ndarray]  # provider -> float32 (m,)
    drgs: tuple[str, ...]  # the DRG kept for each condition, service index 1..4


def load_hospital_csv(data_path: str | Path) -> HospitalData:
    """Read and preprocess the CMS CSV (cached per process while the file is unchanged).

    Raises
    ------
    TaskSettingsError
        Naming ``data-path`` when the file is missing, lacks a column, has a bad value or none of
        a condition's DRGs.
    """
    path = Path(data_path).expanduser().resolve()
    if not path.is_file():
        raise TaskSettingsError(f"data-path={str(data_path)!r} is not a file (CMS charges CSV)")
    stat = path.stat()
    return _load_cached(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _load_cached(path: str, mtime_ns: int, size: int) -> HospitalData:
    patterns = [re.compile(pattern) for _, pattern in CONDITIONS]
    rows: list[tuple[int, str, str, str, float]] = []  # condition, drg, provider, zip, payment
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = [name.strip() for name in next(reader, [])]
        where: dict[str, int] = {}
        for canonical, names in COLUMNS.items():
            found = [header.index(n) for n in names if n in header]
            if found:
                where[canonical] = found[0]
        missing = [c for c in COLUMNS if c not in where]
        if missing:
            raise TaskSettingsError(
                f"data-path={path!r} lacks the CMS column(s) {missing}; header is {header}"
            )
        for line, record in enumerate(reader, start=2):
            if not any(field.strip() for field in record):
                continue
            drg = record[where["DRG Definition"]].strip()
            condition = next((i for i, p in enumerate(patterns) if p.search(drg.upper())), None)
            if condition is None:
                continue
            try:
                payment = _payment(record[where["Average Total Payments"]])
            except (IndexError, ValueError):
                raise TaskSettingsError(
                    f"data-path={path!r} line {line}: bad Average Total Payments in {record}"
                ) from None
            rows.append(
                (
                    condition,
                    drg,
                    record[where["Provider Id"]].strip(),
                    record[where["Provider Zip Code"]],
                    payment,
                )
            )
    # i) per condition, the DRG offered by the most providers
    providers_of: dict[tuple[int, str], set[str]] = defaultdict(set)
    for condition, drg, provider, _, _ in rows:
        providers_of[(condition, drg)].add(provider)
    chosen: list[str] = []
    for index, (name, _) in enumerate(CONDITIONS):
        candidates = sorted(drg for (c, drg) in providers_of if c == index)
        if not candidates:
            raise TaskSettingsError(f"data-path={path!r} has no DRG for the condition {name!r}")
        chosen.append(max(candidates, key=lambda d: len(providers_of[(index, d)])))
    features: dict[str, list[list[float]]] = defaultdict(list)
    targets: dict[str, list[float]] = defaultdict(list)
    unknown_zips: set[str] = set()
    for condition, drg, provider, zip_code, payment in rows:
        if drg != chosen[condition]:
            continue
        coordinates = zip_coordinates(zip_code)
        if coordinates is None:
            unknown_zips.add(zip_code.strip())
            continue
        lon, lat = coordinates
        features[provider].append(
            [float(condition + 1), lon / COORDINATE_SCALE, lat / COORDINATE_SCALE]
        )
        targets[provider].append(payment / PAYMENT_SCALE)
    if unknown_zips:
        logger.warning(
            "hospital: dropped rows with %d ZIP code(s) unknown to the zipcodes package: %s",
            len(unknown_zips),
            sorted(unknown_zips)[:10],
        )
    providers = tuple(sorted(features))
    feature_arrays = {p: np.asarray(features[p], dtype=np.float32) for p in providers}
    target_arrays = {p: np.asarray(targets[p], dtype=np.float32) for p in providers}
    for array in (*feature_arrays.values(), *target_arrays.values()):
        array.setflags(write=False)
    return HospitalData(
        providers=providers, features=feature_arrays, targets=target_arrays, drgs=tuple(chosen)
    )


class HospitalTask(TorchTask):
    """Predict a service's average total payment from the service and the provider's location.

    Parameters
    ----------
    data_path : str or os.PathLike
        The setting ``data-path``: the CMS CSV.
    users : int
        Training providers; 0 means one per Flower partition.
    validation_users : int
        Use at most this many of the validation providers (0 = all).
    data_seed : int
        Seed of the 70 / 30 provider split.
    device : str
        Device for scoring.
    """

    name = "hospital"
    is_classifier = False
    objective = "rmse"
    run_config_keys = ("data-path", "users", "validation-users", "data-seed", "device")

    def __init__(
        self,
        data_path: str | os.PathLike[str],
        *,
        users: int = SETTINGS["users"].default,
        validation_users: int = SETTINGS["validation-users"].default,
        data_seed: int = SETTINGS["data-seed"].default,
        device: str = SETTINGS["device"].default,
    ) -> None:
        super().__init__(device=device)
        self.data_path = require_data_path(
            data_path, task=self.name, what="the CMS inpatient charges CSV"
        )
        # validation-users = 0 is allowed here (the schema's minimum): every held-out provider.
        self._set_user_settings(users, validation_users, data_seed, min_validation_users=0)
        self._data = load_hospital_csv(self.data_path)
        count = len(self._data.providers)
        if count < 2:
            raise TaskSettingsError(
                f"data-path={self.data_path!r} yields {count} provider(s); at least 2 are needed "
                "for a training and a validation split"
            )
        order = np.random.default_rng(user_seed(self.data_seed, "partition", 0)).permutation(count)
        num_train = min(max(round(TRAIN_FRACTION * count), 1), count - 1)
        self._train = tuple(self._data.providers[i] for i in order[:num_train])
        held_out = tuple(self._data.providers[i] for i in order[num_train:])
        # A cap, not a count: the 30 % split fixes how many providers are held out.
        self._validation = held_out[: self.validation_users] if self.validation_users else held_out

    @classmethod
    def declared_shapes(cls, config: Mapping[str, Any]) -> list[tuple[int, ...]] | None:
        """Return `hospital_mlp`'s shapes: fixed, whatever the file (`Task.declared_shapes`)."""
        return [tuple(t.shape) for t in hospital_mlp().state_dict().values()]

    def model(self) -> nn.Module:
        """Build a fresh `hospital_mlp`."""
        return hospital_mlp()

    @property
    def drgs(self) -> tuple[str, ...]:
        """The DRG definitions kept, service index 1..4."""
        return self._data.drgs

    @property
    def training_providers(self) -> tuple[str, ...]:
        """Provider ids of the training clients, in partition order."""
        return self._train

    @property
    def validation_providers(self) -> tuple[str, ...]:
        """Provider ids of the validation clients used."""
        return self._validation

    def _dataset(self, provider: str) -> Dataset:
        x = self._data.features[provider]
        return Dataset(
            x=x.copy(),
            y=self._data.targets[provider].copy(),
            group=np.full(x.shape[0], -1, dtype=np.int64),
            user=provider,
        )

    def client_dataset(self, partition_id: int, num_partitions: int) -> Dataset:
        """Return the rows of training provider ``partition_id``."""
        resolve_users(self.users, partition_id, num_partitions, available=len(self._train))
        return self._dataset(self._train[partition_id])

    def validation_datasets(self) -> list[Dataset]:
        """Return the validation providers' rows."""
        return [self._dataset(p) for p in self._validation]
