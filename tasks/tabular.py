"""Tabular: classification on the device's own CSV or Parquet file (torch logistic or MLP).

Each device's ``data-path`` (its node config or policy file) names its file; the run config
names the ``label-column``, the numeric ``feature-columns`` and the label values (``classes``,
public: they size the model's output). The model is multinomial logistic regression
(``Linear(d → C)``) or an MLP with one hidden layer of ``hidden-units`` (``Linear(d → h)``,
ReLU, ``Linear(h → C)``), trained with the cross-entropy; accuracy is reported too.

Features are standardized (``standardize``):

``device`` (default)
    with the mean and standard deviation of the rows this side holds: a device's own partition,
    the server's own validation file. The statistics never leave the side that computed them:
    they are one more step of the local computation that the release's device-level guarantee
    covers, and nothing uncharged is sent. Federated statistics would need a release of their
    own, charged to every device.
``public``
    with ``feature-means`` and ``feature-scales`` from the run config: the same transform on
    every device, data-independent (a public codebook, a published data dictionary).
``none``
    the raw values.

The file is the device's own data (``tabular-split = none``), or, on the Simulation Engine
where all virtual devices read the one file of the launch policy, it is split among
``num-partitions`` devices with Flower Datasets' partitioners (``iid``, ``dirichlet`` over the
label with ``dirichlet-alpha``, ``natural-id`` on ``split-column``; see `tasks.tabular_data`).

The ServerApp validates on ``server-data-path`` (its ``data-path``): one held-out user per value
of ``validation-column``, or the whole file as one user; no file, no validation. Files are read
when the data is asked for, never when the task is built: a device that declines a run has
read nothing.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from settings import SETTINGS
from settings.checks import parse_categories
from settings.extras import MissingExtraError, require_extra
from tasks.base import Dataset
from tasks.config import TaskSettingsError
from tasks.tabular_data import (
    Table,
    check_file,
    header_columns,
    is_pattern,
    read_table,
    resolve_columns,
    split_rows,
)
from tasks.torch_support import TorchTask

__all__ = ["TabularTask", "standardize"]


def _items(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",")) if text else ()


def standardize(x: np.ndarray, mean: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Return ``(x - mean) / scale`` as float32 (a zero scale counts as 1)."""
    safe = np.where(scale > 0, scale, 1.0)
    return ((x - mean) / safe).astype(np.float32)


class TabularTask(TorchTask):
    """Classify the rows of a CSV or Parquet file.

    Parameters
    ----------
    data_path : str or os.PathLike
        This side's file (``data-path``; the ServerApp's ``server-data-path``). May be empty
        where no data is asked for (a server without validation data).
    label_column, feature_columns, classes : str
        The settings of the same names (columns and label values, comma-separated).
    tabular_model : str
        ``logistic`` or ``mlp``.
    hidden_units : int
        Hidden units of the MLP.
    standardize : str
        ``device``, ``public`` or ``none`` (see the module notes).
    feature_means, feature_scales : str
        ``standardize = public``: one value per feature column.
    tabular_split : str
        ``none``, ``iid``, ``dirichlet`` or ``natural-id``.
    split_column : str
        The natural-id column.
    dirichlet_alpha : float
        Dirichlet concentration.
    validation_column : str
        Column naming the held-out users of the server's file.
    data_seed : int
        Seed of the split.
    device : str
        Device for scoring.
    """

    name = "tabular"
    is_classifier = True
    objective = "cross-entropy"
    run_config_keys = (
        "data-path", "label-column", "feature-columns", "classes", "tabular-model",
        "hidden-units", "standardize", "feature-means", "feature-scales", "tabular-split",
        "split-column", "dirichlet-alpha", "validation-column", "data-seed", "device",
        "categorical-columns", "impute",
    )

    def __init__(
        self,
        data_path: str | os.PathLike[str] = SETTINGS["data-path"].default,
        *,
        label_column: str = SETTINGS["label-column"].default,
        feature_columns: str = SETTINGS["feature-columns"].default,
        classes: str = SETTINGS["classes"].default,
        tabular_model: str = SETTINGS["tabular-model"].default,
        hidden_units: int = SETTINGS["hidden-units"].default,
        standardize: str = SETTINGS["standardize"].default,
        feature_means: str = SETTINGS["feature-means"].default,
        feature_scales: str = SETTINGS["feature-scales"].default,
        tabular_split: str = SETTINGS["tabular-split"].default,
        split_column: str = SETTINGS["split-column"].default,
        dirichlet_alpha: float = SETTINGS["dirichlet-alpha"].default,
        validation_column: str = SETTINGS["validation-column"].default,
        data_seed: int = SETTINGS["data-seed"].default,
        device: str = SETTINGS["device"].default,
        categorical_columns: str = SETTINGS["categorical-columns"].default,
        impute: str = SETTINGS["impute"].default,
    ) -> None:
        super().__init__(device=device)
        try:  # pandas, PyArrow and Flower Datasets read and split the table
            require_extra("tabular", "task='tabular'")
        except MissingExtraError as err:
            raise TaskSettingsError(str(err)) from None
        self.data_path: str = SETTINGS["data-path"].parse(os.fspath(data_path))
        self.label_column: str = SETTINGS["label-column"].parse(label_column)
        self.feature_columns = _items(SETTINGS["feature-columns"].parse(feature_columns))
        self.classes = _items(SETTINGS["classes"].parse(classes))
        self.tabular_model: str = SETTINGS["tabular-model"].parse(tabular_model)
        self.hidden_units: int = SETTINGS["hidden-units"].parse(hidden_units)
        self.standardize: str = SETTINGS["standardize"].parse(standardize)
        self.tabular_split: str = SETTINGS["tabular-split"].parse(tabular_split)
        self.split_column: str = SETTINGS["split-column"].parse(split_column)
        self.dirichlet_alpha: float = SETTINGS["dirichlet-alpha"].parse(dirichlet_alpha)
        self.validation_column: str = SETTINGS["validation-column"].parse(validation_column)
        self.data_seed: int = SETTINGS["data-seed"].parse(data_seed)
        self.categories = tuple(
            (c, tuple(v)) for c, v in parse_categories(
                SETTINGS["categorical-columns"].parse(categorical_columns)))
        self.impute: str = SETTINGS["impute"].parse(impute)
        if any(is_pattern(item) for item in self.feature_columns):
            # Patterns select among the columns of this side's file: its header alone is read.
            setting = "data-path"
            reserved = [self.label_column, self.split_column, self.validation_column,
                        *(c for c, _ in self.categories)]
            self.feature_columns = tuple(resolve_columns(
                self.feature_columns, header_columns(self.data_path, setting),
                reserved=[c for c in reserved if c], where=f"{setting}={self.data_path!r}"))
        if not self.feature_columns and not self.categories:
            raise TaskSettingsError(
                "feature-columns or categorical-columns must name at least one column for "
                "task tabular, got feature-columns='' and categorical-columns=''")
        if self.label_column in self.feature_columns:
            raise TaskSettingsError(
                f"label-column={self.label_column!r} is also among feature-columns")
        both = sorted(set(self.feature_columns) & {c for c, _ in self.categories}
                      | ({self.label_column} & {c for c, _ in self.categories}))
        if both:
            raise TaskSettingsError(
                f"categorical-columns names {both}, which feature-columns or label-column "
                "also names")
        if len(self.classes) < 2:
            raise TaskSettingsError(
                f"classes must name at least 2 label values for task tabular, got "
                f"classes={','.join(self.classes)!r}")
        if self.tabular_split == "natural-id" and not self.split_column:
            raise TaskSettingsError(
                "tabular-split=natural-id needs split-column, got split-column=''")
        d = len(self.feature_columns)
        means = _items(SETTINGS["feature-means"].parse(feature_means))
        scales = _items(SETTINGS["feature-scales"].parse(feature_scales))
        if self.impute == "public" and len(means) != d:
            raise TaskSettingsError(
                f"impute=public needs one feature-means value per feature column ({d}), got "
                f"feature-means={feature_means!r}")
        self._means = [float(m) for m in means]
        self._public: tuple[np.ndarray, np.ndarray] | None = None
        if self.standardize == "public":
            if len(means) != d or len(scales) != d:
                raise TaskSettingsError(
                    f"standardize=public needs one feature-means and one feature-scales value "
                    f"per feature column ({d}), got feature-means={feature_means!r}, "
                    f"feature-scales={feature_scales!r}")
            self._public = (np.asarray(means, dtype=np.float64),
                            np.asarray(scales, dtype=np.float64))

    @property
    def input_width(self) -> int:
        """The model's inputs: the numeric features, then one per category of each column."""
        return len(self.feature_columns) + sum(len(v) for _, v in self.categories)

    def model(self) -> nn.Module:
        """Build a fresh logistic-regression or MLP module."""
        d, c = self.input_width, len(self.classes)
        if self.tabular_model == "logistic":
            return nn.Sequential(nn.Linear(d, c))
        return nn.Sequential(nn.Linear(d, self.hidden_units), nn.ReLU(),
                             nn.Linear(self.hidden_units, c))

    # -- data -------------------------------------------------------------------------------
    def _read(self, setting: str, extra: tuple[str, ...] = ()) -> Table:
        if not self.data_path:
            raise TaskSettingsError(
                f"{setting} must name a CSV or Parquet file for task tabular, got {setting}=''")
        return read_table(self.data_path, setting=setting, label=self.label_column,
                          features=self.feature_columns, classes=self.classes, extra=extra,
                          categories=self.categories, impute=self.impute,
                          public_means=self._means if self.impute == "public" else ())

    def _dataset(self, table: Table, user: str) -> Dataset:
        # The numeric features are standardized; the one-hot columns after them are not.
        numeric, one_hot = table.x[:, :table.numeric], table.x[:, table.numeric:]
        if self._public is not None:
            scaled = standardize(numeric, *self._public)
        elif self.standardize == "device":
            scaled = standardize(numeric, numeric.mean(axis=0), numeric.std(axis=0))
        else:
            scaled = numeric.astype(np.float32)
        x = np.concatenate([scaled, one_hot.astype(np.float32)], axis=1)
        return Dataset(x=x, y=table.y.copy(), group=np.full(len(table), -1, dtype=np.int64),
                       user=user)

    def file_dataset(self, path: Path) -> Dataset:
        """Read a user's CSV or Parquet file as the devices read theirs (`Task.file_dataset`).

        The same columns, classes and standardization as the run's; a file without the label
        column, or with a label outside ``classes``, is refused with the column named.
        """
        reader = copy.copy(self)
        reader.data_path = os.fspath(path)
        return reader._dataset(reader._read("--data"), user=Path(path).name)

    def model_settings(self) -> dict[str, Any]:
        """Return the settings that rebuild this model: the feature columns as resolved."""
        return {"feature-columns": ",".join(self.feature_columns)}

    def class_names(self) -> list[str] | None:
        """Return the label values, in the order of the model's outputs (``classes``)."""
        return list(self.classes)

    @classmethod
    def declared_shapes(cls, config: Mapping[str, Any]) -> list[tuple[int, ...]] | None:
        """Return the model's shapes, from the run config (`Task.declared_shapes`).

        They follow from its columns, classes and model; building the task reads no file.
        """
        return list(cls.from_run_config(config).parameter_shapes)

    @classmethod
    def preflight(cls, config: Mapping[str, Any], partition_id: int, num_partitions: int) -> None:
        """Check the device's file before the round is charged, reading none of its records.

        The file exists and can be opened as CSV or Parquet, its header (a CSV's first line, a
        Parquet file's schema) has the ``label-column``, the ``feature-columns`` and (for
        ``tabular-split = natural-id``) the ``split-column``, and it has a row, or, for an
        ``iid`` split, more rows than this device's ``partition-id`` (its partition is empty
        otherwise, whatever the values). The partitions of the ``dirichlet`` and
        ``natural-id`` splits depend on the values of a column: they are checked, charged, by
        `client_dataset`, like every value of the file.

        Raises
        ------
        TaskDataError
            Naming the file, the setting and the column (see `tasks.tabular_data.check_file`).
        """
        task = cls.from_run_config(config)  # reads no file
        extra = (task.split_column,) if task.tabular_split == "natural-id" else ()
        rows = partition_id + 1 if task.tabular_split == "iid" else 1
        check_file(task.data_path, setting="data-path", label=task.label_column,
                   features=[*task.feature_columns, *(c for c, _ in task.categories)],
                   extra=extra, rows=rows)

    def client_dataset(self, partition_id: int, num_partitions: int) -> Dataset:
        """Return this device's rows: its whole file, or its partition of a shared one.

        Raises
        ------
        TaskSettingsError
            Naming the file, column or partition: see `tasks.tabular_data.read_table`, and an
            empty partition.
        """
        extra = (self.split_column,) if self.tabular_split == "natural-id" else ()
        table = self._read("data-path", extra)
        where = f"data-path={self.data_path!r}"
        if self.tabular_split != "none":
            if not 0 <= partition_id < num_partitions:
                raise TaskSettingsError(
                    f"partition-id must be in [0, num-partitions={num_partitions}), got "
                    f"partition-id={partition_id}")
            table = split_rows(
                table, method=self.tabular_split, partition_id=partition_id,
                num_partitions=num_partitions, label_column=self.label_column,
                split_column=self.split_column, alpha=self.dirichlet_alpha,
                seed=self.data_seed)
            where += f" (tabular-split={self.tabular_split}, partition-id={partition_id} of " \
                     f"num-partitions={num_partitions})"
        if len(table) == 0:
            raise TaskSettingsError(f"{where}: this device's partition has no rows")
        return self._dataset(table, f"partition-{partition_id}")

    def validation_datasets(self) -> list[Dataset]:
        """Return the server's held-out users (none without ``server-data-path``)."""
        if not self.data_path:
            return []
        extra = (self.validation_column,) if self.validation_column else ()
        table = self._read("server-data-path", extra)
        if not self.validation_column:
            return [self._dataset(table, "validation")]
        values = table.extra[self.validation_column]
        return [self._dataset(table.rows(np.flatnonzero(values == value)), f"validation-{value}")
                for value in sorted(set(values.tolist()))]
