"""Reading the tabular task's files: columns checked, labels mapped, partitions split.

A file is a CSV (any other suffix) or a Parquet file (``.parquet``, ``.pq``), read with pandas.
Every problem is a `TaskSettingsError` naming the file, the setting, the column and, for a bad
cell, its row and value: on a device that message stays in the device's log (the client sends
the server one fixed text for any failure while private data is in use), on the server it is
the operator's own file.

One file split among the Simulation Engine's virtual devices uses Flower Datasets'
partitioners (``IidPartitioner``, ``DirichletPartitioner`` over the label,
``NaturalIdPartitioner`` on a column) on a Hugging Face ``datasets.Dataset`` made from the
checked table, shuffled first with the run's ``data-seed`` as Flower Datasets'
``FederatedDataset`` does: the same split in every process.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tasks.config import TaskDataError, TaskSettingsError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PARQUET_SUFFIXES", "Table", "check_file", "header_columns", "is_pattern",
           "read_table", "resolve_columns", "split_rows"]

PARQUET_SUFFIXES = (".parquet", ".pq")

#: The longest CSV header line the preflight reads (a longer one is left to the full read).
MAX_HEADER_BYTES = 1 << 20


@dataclass(frozen=True, eq=False)  # hashed by identity: the split cache keys on the table
class Table:
    """A checked file: numeric features, class indices and the text of ``extra`` columns.

    Attributes
    ----------
    x : np.ndarray
        float64 (rows, features), finite: the numeric feature columns (missing cells imputed
        as asked), then the one-hot columns of each categorical column, in declared order.
    y : np.ndarray
        int64 class index of each row (position of its label in ``classes``).
    extra : dict[str, np.ndarray]
        The text of each further column asked for (a natural-id or validation column).
    path : str
        The file, for messages.
    """

    x: np.ndarray
    y: np.ndarray
    extra: dict[str, np.ndarray]
    path: str
    #: How many of ``x``'s leading columns are numeric (the rest are one-hot).
    numeric: int = -1

    def __post_init__(self) -> None:
        if self.numeric < 0:
            object.__setattr__(self, "numeric", int(self.x.shape[1]))

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def rows(self, index: np.ndarray) -> Table:
        """Return the rows ``index`` of this table."""
        return Table(self.x[index], self.y[index],
                     {k: v[index] for k, v in self.extra.items()}, self.path, self.numeric)


Categories = tuple[tuple[str, tuple[str, ...]], ...]
"""Each categorical column with its public vocabulary, in declared order."""


def read_table(path: str, *, setting: str, label: str, features: Sequence[str],
               classes: Sequence[str], extra: Sequence[str] = (),
               categories: Categories = (), impute: str = "none",
               public_means: Sequence[float] = ()) -> Table:
    """Read and check one file (cached per process while the file is unchanged).

    Parameters
    ----------
    path : str
        The file (``data-path`` on a device, ``server-data-path`` on the server).
    setting : str
        The setting that named it, for messages.
    label : str
        The label column; its values are compared as text with ``classes``.
    features : Sequence[str]
        The numeric feature columns, in model-input order.
    classes : Sequence[str]
        The label values, in class order.
    extra : Sequence[str]
        Further columns to keep as text.
    categories : Categories
        Categorical columns and their vocabularies: one-hot columns after the numeric ones.
    impute : str
        What fills a missing cell (the ``impute`` setting): ``none`` (an error), ``zero``,
        ``mean`` (the column's mean over this file's present cells) or ``public``
        (``public_means``, one per numeric feature); a missing category is no category.
    public_means : Sequence[float]
        The run's public feature means, for ``impute = public``.

    Raises
    ------
    TaskSettingsError
        A missing or unreadable file, a missing column, a non-numeric feature value, a missing
        cell without ``impute``, a category outside its vocabulary, a label not among
        ``classes``, or a file without rows; the message names the file, the column and, for
        a cell, its row (1 = the first data row) and value.
    """
    resolved = Path(path).expanduser()
    if not resolved.is_file():
        raise TaskSettingsError(f"{setting}={path!r}: no such file (the tabular task's CSV or "
                                "Parquet file)")
    stat = resolved.stat()
    return _read_cached(str(resolved.resolve()), stat.st_mtime_ns, stat.st_size, setting, label,
                        tuple(features), tuple(classes), tuple(extra),
                        tuple((c, tuple(v)) for c, v in categories), impute,
                        tuple(float(m) for m in public_means))


def is_pattern(item: str) -> bool:
    """Whether a feature-columns item selects by pattern (a glob, or ``!`` to exclude)."""
    return item.startswith("!") or any(ch in item for ch in "*?[")


def resolve_columns(items: Sequence[str], header: Sequence[str], *, reserved: Sequence[str],
                    where: str) -> list[str]:
    """Resolve feature-columns items against a file's header, in order.

    A name is kept where it stands; a glob (``x_*``, ``*``) adds the header's matching columns
    in file order, none of ``reserved`` (the label, split, validation and categorical columns)
    and none already chosen; ``!pattern`` removes the chosen columns it matches, so
    ``*, !id`` is every column but ``id`` and those reserved.

    Raises
    ------
    TaskSettingsError
        If the items select no column.
    """
    import fnmatch

    chosen: list[str] = []
    for item in items:
        if item.startswith("!"):
            chosen = [c for c in chosen if not fnmatch.fnmatchcase(c, item[1:])]
        elif is_pattern(item):
            chosen += [c for c in header if fnmatch.fnmatchcase(c, item)
                       and c not in reserved and c not in chosen]
        elif item not in chosen:
            chosen.append(item)
    if not chosen:
        raise TaskSettingsError(f"{where}: feature-columns={','.join(items)!r} selects no "
                                f"column of {list(header)}")
    return chosen


def header_columns(path: str, setting: str) -> list[str]:
    """Return a file's column names (a CSV's header line, a Parquet file's schema) alone.

    Raises
    ------
    TaskSettingsError
        If the file is missing or its header cannot be read.
    """
    resolved = Path(path).expanduser()
    if not path or not resolved.is_file():
        raise TaskSettingsError(f"{setting}={path!r}: no such file, and feature-columns "
                                "selects by pattern: the columns are resolved against it")
    try:
        parquet = path.lower().endswith(PARQUET_SUFFIXES)
        columns, _ = _parquet_schema(resolved, 0) if parquet else _csv_schema(resolved, 0)
    except (OSError, ValueError, ImportError) as err:
        raise TaskSettingsError(f"{setting}={path!r}: its header cannot be read: {err}") from None
    if columns is None:
        raise TaskSettingsError(f"{setting}={path!r}: its header line is longer than "
                                f"{MAX_HEADER_BYTES} bytes")
    return columns


def check_file(path: str, *, setting: str, label: str, features: Sequence[str],
               extra: Sequence[str] = (), rows: int = 1) -> None:
    """Check that a file exists, its header has the columns and it has ``rows`` rows (preflight).

    Reads no record's values: the file's metadata, its header line (CSV) or schema and row
    count (Parquet footer) and, for a CSV, whether ``rows`` non-blank lines follow the header.
    What it decides therefore depends on the file's schema and its number of rows alone.
    A line count can exceed the number of records (a quoted value holding a line break), never
    fall short of it, so a file this check passes may still fail the full read
    (`read_table`), never the other way round (but for a whitespace-only line, counted as blank
    here and as a row without values there, which the full read refuses anyway).

    Parameters
    ----------
    path : str
        The file (``data-path``).
    setting : str
        The setting that named it, for messages.
    label, features, extra : str, Sequence[str]
        The columns the run config names.
    rows : int
        How many rows the file needs (1; ``p + 1`` for partition p of an iid split).

    Raises
    ------
    TaskDataError
        An empty ``path``, a missing or unreadable file, a header or schema that cannot be
        read, a missing column (listing the file's columns), fewer than ``rows`` rows.
    """
    if not path:
        raise TaskDataError(
            f"{setting} must name a CSV or Parquet file for task tabular, got {setting}=''")
    resolved = Path(path).expanduser()
    if not resolved.is_file():
        raise TaskDataError(f"{setting}={path!r}: no such file (the tabular task's CSV or "
                            "Parquet file)")
    where = f"{setting}={path!r}"
    parquet = path.lower().endswith(PARQUET_SUFFIXES)
    try:
        columns, found = (_parquet_schema(resolved, rows) if parquet
                          else _csv_schema(resolved, rows))
    except (OSError, ValueError, ImportError) as err:
        kind = "Parquet" if parquet else "CSV"
        raise TaskDataError(f"{where} cannot be read as {kind}: {err}") from None
    if columns is None:  # a header too long to read cheaply: left to the full read
        return
    missing = [c for c in dict.fromkeys([label, *features, *extra]) if c not in columns]
    if missing:
        raise TaskDataError(
            f"{where} has no column(s) {missing} (label-column, feature-columns or "
            f"split-column); its columns are {columns}")
    if found < rows:
        raise TaskDataError(f"{where} has no rows" if found == 0 else
                            f"{where} has {found} row(s), fewer than the {rows} this device's "
                            "partition needs")


def _csv_schema(path: Path, rows: int) -> tuple[list[str] | None, int]:
    """Return the CSV's column names as pandas reads them and min(rows, its non-blank lines)."""
    import io

    import pandas as pd

    with path.open("rb") as fh:
        header = fh.readline(MAX_HEADER_BYTES)
        if len(header) == MAX_HEADER_BYTES and not header.endswith(b"\n"):
            return None, rows
        if not header.strip():
            # No header line: pandas' own message for a file without columns.
            raise ValueError("No columns to parse from file")
        found = 0
        while found < rows:
            line = fh.readline(MAX_HEADER_BYTES)
            if not line:
                break
            found += bool(line.strip())
    # The header line alone, parsed by pandas with the full read's options: the same names
    # (a byte-order mark, duplicates, unnamed columns), and not a byte of any record.
    frame = pd.read_csv(io.BytesIO(header), nrows=0, skipinitialspace=True)
    return [str(c) for c in frame.columns], found


def _parquet_schema(path: Path, rows: int) -> tuple[list[str], int]:
    """Return the Parquet file's column names (as pandas reads them) and row count (footer)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path)
        schema = meta.schema_arrow
        names = [str(n) for n in schema.names]
        # pandas turns the columns its metadata names as the index back into the index.
        index = (schema.pandas_metadata or {}).get("index_columns", [])
        names = [n for n in names if n not in {c for c in index if isinstance(c, str)}]
        return names, int(meta.metadata.num_rows)
    except pa.ArrowException as err:
        raise ValueError(str(err)) from None


@functools.lru_cache(maxsize=4)
def _read_cached(path: str, mtime_ns: int, size: int, setting: str, label: str,
                 features: tuple[str, ...], classes: tuple[str, ...],
                 extra: tuple[str, ...], categories: Categories = (), impute: str = "none",
                 public_means: tuple[float, ...] = ()) -> Table:
    frame = _read_frame(path, setting, label, tuple(c for c, _ in categories))
    where = f"{setting}={path!r}"
    wanted = [label, *features, *(c for c, _ in categories), *extra]
    missing = [c for c in dict.fromkeys(wanted) if c not in frame.columns]
    if missing:
        raise TaskSettingsError(
            f"{where} has no column(s) {missing} (label-column, feature-columns, "
            f"categorical-columns, split-column or validation-column); its columns are "
            f"{[str(c) for c in frame.columns]}")
    if len(frame) == 0:
        raise TaskSettingsError(f"{where} has no rows")
    if impute == "public" and len(public_means) != len(features):
        raise TaskSettingsError(
            f"impute=public needs one feature-means value per feature column "
            f"({len(features)}), got {len(public_means)}")
    width = len(features) + sum(len(v) for _, v in categories)
    x = np.zeros((len(frame), width), dtype=np.float64)
    for j, column in enumerate(features):
        fill = public_means[j] if impute == "public" else None
        x[:, j] = _numeric(frame[column], column, where, impute, fill)
    start = len(features)
    for column, vocabulary in categories:
        x[:, start:start + len(vocabulary)] = _one_hot(frame[column], column, vocabulary,
                                                       where, impute)
        start += len(vocabulary)
    labels = frame[label].astype("string").str.strip()
    index = {c: i for i, c in enumerate(classes)}
    y = labels.map(index)
    unknown = y.isna()
    if unknown.any():
        row = int(np.flatnonzero(unknown.to_numpy())[0])
        raise TaskSettingsError(
            f"{where}: label-column={label!r} holds {labels.iloc[row]!r} in row {row + 1}, "
            f"which is not among classes={','.join(classes)!r}")
    texts = {c: frame[c].astype("string").fillna("").to_numpy(dtype=str) for c in extra}
    return Table(x, y.to_numpy(dtype=np.int64), texts, path, len(features))


def _read_frame(path: str, setting: str, label: str,
                text_columns: tuple[str, ...] = ()) -> pd.DataFrame:
    import pandas as pd

    try:
        if path.lower().endswith(PARQUET_SUFFIXES):
            return pd.read_parquet(path)
        # The label and the categories are read as text, so that "1" and "1.0" are not
        # confused with each other.
        return pd.read_csv(path, dtype={c: str for c in (label, *text_columns)},
                           skipinitialspace=True)
    except (OSError, ValueError, ImportError) as err:
        kind = "Parquet" if path.lower().endswith(PARQUET_SUFFIXES) else "CSV"
        raise TaskSettingsError(f"{setting}={path!r} cannot be read as {kind}: {err}") from None


def _numeric(column: pd.Series, name: str, where: str, impute: str = "none",
             fill: float | None = None) -> np.ndarray:
    """Return a numeric feature column; a missing cell filled as ``impute`` says.

    A cell that holds something other than a finite number is always an error: imputation
    fills what is absent, never what is malformed.
    """
    import pandas as pd

    absent = column.isna().to_numpy()
    values = pd.to_numeric(column, errors="coerce")
    bad = (values.isna().to_numpy() & ~absent) | ~np.isfinite(
        values.to_numpy(dtype=np.float64, na_value=0.0))
    if impute == "none":
        bad |= absent
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        cell = column.iloc[row]
        what = "has no value" if pd.isna(cell) else f"holds {str(cell)!r}"
        raise TaskSettingsError(
            f"{where}: feature column {name!r} is not numeric: row {row + 1} {what} "
            "(feature-columns must be finite numbers; a missing cell needs impute)")
    out = np.array(values.to_numpy(dtype=np.float64, na_value=np.nan), copy=True)
    if absent.any():
        if impute == "mean":
            if absent.all():
                raise TaskSettingsError(f"{where}: feature column {name!r} has no value to "
                                        "average (impute=mean)")
            fill = float(np.mean(out[~absent]))
        out[absent] = 0.0 if impute == "zero" else float(fill if fill is not None else 0.0)
    return out


def _one_hot(column: pd.Series, name: str, vocabulary: tuple[str, ...], where: str,
             impute: str) -> np.ndarray:
    """Return a categorical column one-hot over its declared vocabulary (missing: all zero)."""
    texts = column.astype("string").str.strip()
    index = {v: i for i, v in enumerate(vocabulary)}
    codes = texts.map(index)
    absent = texts.isna().to_numpy() | (texts.fillna("") == "").to_numpy()
    unknown = codes.isna().to_numpy() & ~absent
    if impute == "none":
        unknown |= absent
    if unknown.any():
        row = int(np.flatnonzero(unknown)[0])
        what = "has no value" if absent[row] else f"holds {texts.iloc[row]!r}"
        raise TaskSettingsError(
            f"{where}: categorical column {name!r}: row {row + 1} {what}, which is not among "
            f"its vocabulary {'|'.join(vocabulary)} (categorical-columns; a missing cell "
            "needs impute)")
    out = np.zeros((len(texts), len(vocabulary)), dtype=np.float64)
    present = ~absent
    out[np.flatnonzero(present), codes.to_numpy()[present].astype(np.int64)] = 1.0
    return out


def split_rows(table: Table, *, method: str, partition_id: int, num_partitions: int,
               label_column: str, split_column: str, alpha: float, seed: int) -> Table:
    """Return partition ``partition_id`` of ``num_partitions`` of ``table`` (Flower Datasets).

    Parameters
    ----------
    table : Table
        The whole file.
    method : str
        ``iid``, ``dirichlet`` (over the label) or ``natural-id`` (one partition per value of
        ``split_column``: partition p holds the p-th value in sorted order).
    partition_id, num_partitions : int
        This device's partition.
    label_column, split_column : str
        The columns the partitioner reads.
    alpha : float
        Dirichlet concentration.
    seed : int
        The run's ``data-seed``: the shuffle before partitioning and the Dirichlet draw.

    Raises
    ------
    TaskSettingsError
        When natural ids do not give ``num_partitions`` partitions, or Flower Datasets cannot
        make the split.
    """
    return _split_cached(table, method, partition_id, num_partitions, label_column,
                         split_column, alpha, seed)


@functools.lru_cache(maxsize=8)
def _split_cached(table: Table, method: str, partition_id: int, num_partitions: int,
                  label_column: str, split_column: str, alpha: float, seed: int) -> Table:
    from datasets import Dataset as HFDataset
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        NaturalIdPartitioner,
        Partitioner,
    )

    # The partitioners read these columns; the row number brings the rows back to `table`.
    columns: dict[str, object] = {"row": np.arange(len(table)), label_column: table.y}
    if method == "natural-id":
        columns[split_column] = table.extra[split_column]
    hf = HFDataset.from_dict(columns).shuffle(seed=seed)
    partitioner: Partitioner
    if method == "iid":
        partitioner = IidPartitioner(num_partitions=num_partitions)
    elif method == "dirichlet":
        partitioner = DirichletPartitioner(
            num_partitions=num_partitions, partition_by=label_column, alpha=float(alpha),
            min_partition_size=1, self_balancing=False, seed=seed)
    elif method == "natural-id":
        partitioner = NaturalIdPartitioner(partition_by=split_column)
    else:  # pragma: no cover - the setting's choices
        raise ValueError(f"unknown tabular-split {method!r}")
    partitioner.dataset = hf
    if method == "natural-id":
        found = partitioner.num_partitions
        if found != num_partitions:
            raise TaskSettingsError(
                f"tabular-split=natural-id on split-column={split_column!r} of {table.path!r} "
                f"gives {found} partitions, but num-partitions={num_partitions}")
    try:
        part = partitioner.load_partition(partition_id)
    except IndexError:
        # `datasets` refuses a shard past the end of a file with fewer rows than partitions:
        # this partition is empty, which the caller reports as such.
        return table.rows(np.zeros(0, dtype=np.int64))
    except ValueError as err:
        raise TaskSettingsError(
            f"tabular-split={method} of {table.path!r} into num-partitions={num_partitions} "
            f"failed: {err}") from None
    index = np.sort(np.asarray(part["row"], dtype=np.int64))
    return table.rows(index)
