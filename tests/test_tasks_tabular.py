"""Tests of the tabular task: files, columns, standardization, Flower Datasets splits, models."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from settings import SettingError
from tasks import TaskDataError, TaskSettingsError, load_task, preflight_task
from tasks.tabular import TabularTask

ROOT = Path(__file__).resolve().parents[1]
BASE: dict[str, Any] = {"task": "tabular", "feature-columns": "a,b", "label-column": "y",
                        "classes": "no,yes", "device": "cpu"}


def write_csv(path: Path, rows: list[list[Any]], header: tuple[str, ...] = ("a", "b", "y", "site")
              ) -> Path:
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(header)
        out.writerows(rows)
    return path


def sample_rows(n: int, seed: int = 0) -> list[list[Any]]:
    rng = np.random.default_rng(seed)
    x = rng.normal(loc=(10.0, -3.0), scale=(2.0, 0.5), size=(n, 2))
    return [[f"{a:.4f}", f"{b:.4f}", "yes" if a > 10 else "no", f"s{i % 3}"]
            for i, (a, b) in enumerate(x)]


def task(path: Path | str, **config: Any) -> TabularTask:
    built = load_task({**BASE, "data-path": str(path), **config})
    assert isinstance(built, TabularTask)
    return built


# -- reading a device's file --------------------------------------------------------------------
def test_a_devices_file_is_its_partition_standardized_with_its_own_statistics(
    tmp_path: Path
) -> None:
    path = write_csv(tmp_path / "d.csv", sample_rows(50))
    data = task(path).client_dataset(3, 4)  # tabular-split=none: the whole file, any partition
    assert data.x.shape == (50, 2) and data.x.dtype == np.float32
    np.testing.assert_allclose(data.x.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(data.x.std(axis=0), 1.0, atol=1e-5)
    raw = np.array([[float(r[0]), float(r[1])] for r in sample_rows(50)])
    np.testing.assert_array_equal(data.y, (raw[:, 0] > 10).astype(np.int64))


def test_public_statistics_are_the_same_transform_everywhere(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "d.csv", [["12", "-3", "yes", "s"], ["8", "-2", "no", "s"]])
    data = task(path, standardize="public", **{"feature-means": "10,-3",
                                                "feature-scales": "2,0.5"}).client_dataset(0, 1)
    np.testing.assert_allclose(data.x, [[1.0, 0.0], [-1.0, 2.0]])
    raw = task(path, standardize="none").client_dataset(0, 1)
    np.testing.assert_allclose(raw.x, [[12.0, -3.0], [8.0, -2.0]])


def test_a_parquet_file_reads_like_the_csv(tmp_path: Path) -> None:
    import pandas as pd

    csv_path = write_csv(tmp_path / "d.csv", sample_rows(20))
    pq_path = tmp_path / "d.parquet"
    pd.read_csv(csv_path, dtype={"y": str}).to_parquet(pq_path)
    a, b = task(csv_path).client_dataset(0, 1), task(pq_path).client_dataset(0, 1)
    np.testing.assert_allclose(a.x, b.x)
    np.testing.assert_array_equal(a.y, b.y)


def test_building_the_task_reads_nothing(tmp_path: Path) -> None:
    # A device that declines a run builds the task at most; a missing file must not matter then.
    built = task(tmp_path / "absent.csv")
    assert built.parameter_shapes == [(2, 2), (2,)]


@pytest.mark.parametrize(("rows", "config", "message"), [
    (None, {}, r"data-path='.*absent.csv': no such file"),
    ([["1", "2", "no", "s"]], {"feature-columns": "a,c"},
     r"has no column\(s\) \['c'\].*its columns are \['a', 'b', 'y', 'site'\]"),
    ([["1", "2", "no", "s"], ["1", "oops", "yes", "s"]], {},
     r"feature column 'b' is not numeric: row 2 holds 'oops'"),
    ([["1", "", "no", "s"]], {}, r"feature column 'b' is not numeric: row 1 has no value"),
    ([["1", "inf", "no", "s"]], {}, r"feature column 'b' is not numeric: row 1 holds 'inf'"),
    ([["1", "2", "maybe", "s"]], {}, r"label-column='y' holds 'maybe' in row 1.*classes='no,yes'"),
    ([], {}, r"has no rows"),
])
def test_bad_files_name_the_file_the_column_and_the_value(
    tmp_path: Path, rows: list[list[Any]] | None, config: dict[str, Any], message: str
) -> None:
    path = tmp_path / "absent.csv" if rows is None else write_csv(tmp_path / "d.csv", rows)
    with pytest.raises(TaskSettingsError, match=message):
        task(path, **config).client_dataset(0, 1)


def test_an_empty_data_path_names_the_setting() -> None:
    with pytest.raises(TaskSettingsError, match=r"data-path must name a CSV or Parquet file"):
        task("").client_dataset(0, 1)


@pytest.mark.parametrize(("config", "message"), [
    ({"feature-columns": ""},
     r"feature-columns or categorical-columns must name at least one column"),
    ({"feature-columns": "a,y"}, r"label-column='y' is also among feature-columns"),
    ({"classes": "yes"}, r"classes must name at least 2 label values"),
    ({"tabular-split": "natural-id"}, r"natural-id needs split-column"),
    ({"standardize": "public", "feature-means": "0"}, r"one feature-means and one feature-sc"),
    ({"feature-columns": "a,,b"}, r"feature-columns.*none of them empty"),
    ({"feature-scales": "1,0"}, r"feature-scales.*positive"),
])
def test_bad_settings_name_the_setting(config: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingError, match=message):
        task("x.csv", **config)


# -- the preflight: what the header tells, before the device charges anything -------------------
def preflight(path: Path | str, partition_id: int = 0, num_partitions: int = 1,
              **config: Any) -> None:
    TabularTask.preflight({**BASE, "data-path": str(path), **config}, partition_id,
                          num_partitions)


@pytest.mark.parametrize(("rows", "config", "message"), [
    (None, {}, r"data-path='.*absent.csv': no such file"),
    ([["1", "2", "no", "s"]], {"label-column": "outcome"},
     r"has no column\(s\) \['outcome'\].*its columns are \['a', 'b', 'y', 'site'\]"),
    ([["1", "2", "no", "s"]], {"feature-columns": "a,c"}, r"has no column\(s\) \['c'\]"),
    ([["1", "2", "no", "s"]], {"tabular-split": "natural-id", "split-column": "region"},
     r"has no column\(s\) \['region'\]"),
    ([], {}, r"data-path='.*d.csv' has no rows"),
])
def test_the_preflight_finds_a_missing_file_a_missing_column_and_an_empty_file(
    tmp_path: Path, rows: list[list[Any]] | None, config: dict[str, Any], message: str
) -> None:
    path = tmp_path / "absent.csv" if rows is None else write_csv(tmp_path / "d.csv", rows)
    with pytest.raises(TaskDataError, match=message):
        preflight(path, **config)
    # The full read finds the same problem (the preflight only finds it earlier).
    with pytest.raises(TaskSettingsError):
        task(path, **config).client_dataset(0, 1)


def test_the_preflight_refuses_an_empty_data_path_and_a_file_without_a_header(
    tmp_path: Path
) -> None:
    with pytest.raises(TaskDataError, match=r"data-path must name a CSV or Parquet file"):
        preflight("")
    (tmp_path / "zero.csv").write_bytes(b"")
    with pytest.raises(TaskDataError, match=r"zero.csv' cannot be read as CSV"):
        preflight(tmp_path / "zero.csv")


def test_the_preflight_reads_no_record(tmp_path: Path) -> None:
    # Prepare: a header, then a record that is wrong in every way a value can be: not
    # UTF-8, not a number, a label outside the classes, one field too many.
    path = tmp_path / "d.csv"
    path.write_bytes(b"a,b,y,site\n1,\xff\xfe Jane,maybe,s,extra\n")

    # Execute / Assert: the header has the columns and a line follows it: the preflight
    # passes; the full read (charged, on a device) refuses the record.
    preflight(path)
    with pytest.raises(TaskSettingsError):
        task(path).client_dataset(0, 1)


def test_the_preflight_reads_the_header_as_the_full_read_does(tmp_path: Path) -> None:
    # A byte-order mark, spaces after the commas, Windows line ends, blank lines: no column is
    # found missing that the full read finds.
    path = tmp_path / "d.csv"
    path.write_bytes(b"\xef\xbb\xbfa, b, y, site\r\n\r\n12, -3, yes, s\r\n8, -2, no, s\r\n")
    preflight(path)
    assert len(task(path).client_dataset(0, 1)) == 2
    blank = tmp_path / "blank.csv"
    blank.write_bytes(b"a,b,y,site\n\n  \n")
    with pytest.raises(TaskDataError, match="has no rows"):
        preflight(blank)


def test_the_preflight_reads_a_parquet_files_schema(tmp_path: Path) -> None:
    import pandas as pd

    frame = pd.read_csv(write_csv(tmp_path / "d.csv", sample_rows(5)), dtype={"y": str})
    good, empty = tmp_path / "d.parquet", tmp_path / "empty.pq"
    frame.to_parquet(good)
    frame.iloc[:0].to_parquet(empty)
    preflight(good)
    with pytest.raises(TaskDataError, match=r"has no column\(s\) \['c'\].*'site'\]"):
        preflight(good, **{"feature-columns": "a,c"})
    with pytest.raises(TaskDataError, match=r"empty.pq' has no rows"):
        preflight(empty)
    (tmp_path / "bad.parquet").write_text("a,b,y\n1,2,no\n")
    with pytest.raises(TaskDataError, match=r"bad.parquet' cannot be read as Parquet"):
        preflight(tmp_path / "bad.parquet")


def test_the_preflight_finds_an_empty_iid_partition_from_the_row_count(tmp_path: Path) -> None:
    # Partition p of an iid split is empty exactly when the file has no more than p rows.
    path = write_csv(tmp_path / "all.csv", sample_rows(2))
    iid = {"tabular-split": "iid"}
    preflight(path, 1, 3, **iid)
    with pytest.raises(TaskDataError, match=r"has 2 row\(s\), fewer than the 3"):
        preflight(path, 2, 3, **iid)
    # A Dirichlet partition depends on the labels: left to the (charged) full read.
    preflight(path, 2, 3, **{"tabular-split": "dirichlet"})


def test_tasks_without_a_preflight_check_nothing(tmp_path: Path) -> None:
    absent = str(tmp_path / "absent.csv")
    assert preflight_task({"task": "synthetic", "data-path": absent}, 0, 1) is None
    with pytest.raises(TaskDataError, match="no such file"):
        preflight_task({**BASE, "data-path": absent}, 0, 1)


# -- one file split among virtual devices (Flower Datasets) --------------------------------------
@pytest.mark.parametrize("split", ["iid", "dirichlet"])
def test_a_split_file_gives_disjoint_partitions_that_cover_it(tmp_path: Path, split: str) -> None:
    path = write_csv(tmp_path / "all.csv", sample_rows(90))
    t = task(path, **{"tabular-split": split, "standardize": "none", "data-seed": 3})
    parts = [t.client_dataset(p, 3) for p in range(3)]
    rows = np.concatenate([p.x for p in parts])
    assert len(rows) == 90 and len({tuple(r) for r in rows}) == 90
    if split == "iid":
        assert [len(p) for p in parts] == [30, 30, 30]
    # The same split in another process (a fresh task here): seeded by data-seed.
    again = task(path, **{"tabular-split": split, "standardize": "none", "data-seed": 3})
    np.testing.assert_array_equal(again.client_dataset(1, 3).x, parts[1].x)


def test_natural_ids_give_one_partition_per_value(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "all.csv", sample_rows(30))
    t = task(path, **{"tabular-split": "natural-id", "split-column": "site",
                      "standardize": "none"})
    raw = np.array([[float(r[0]), float(r[1])] for r in sample_rows(30)])
    for p, site in enumerate(("s0", "s1", "s2")):  # sorted values: partition p is value p
        expected = raw[[i for i in range(30) if i % 3 == int(site[1])]]
        np.testing.assert_allclose(t.client_dataset(p, 3).x, expected, atol=1e-6)
    with pytest.raises(TaskSettingsError, match=r"gives 3 partitions, but num-partitions=4"):
        t.client_dataset(0, 4)


def test_an_empty_partition_is_an_error_naming_it(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "all.csv", sample_rows(2))
    with pytest.raises(TaskSettingsError, match=r"partition-id=2 of num-partitions=3\).*no rows"):
        task(path, **{"tabular-split": "iid"}).client_dataset(2, 3)


# -- the server's validation users; models and training -----------------------------------------
def test_validation_users_are_the_values_of_the_validation_column(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "v.csv", sample_rows(30))
    users = task(path, **{"validation-column": "site"}).validation_datasets()
    assert [u.user for u in users] == ["validation-s0", "validation-s1", "validation-s2"]
    assert [len(u) for u in users] == [10, 10, 10]
    assert len(task(path).validation_datasets()) == 1
    assert task("").validation_datasets() == []  # no server-data-path: no validation


@pytest.mark.parametrize(("model", "shapes"), [
    ("logistic", [(2, 2), (2,)]), ("mlp", [(4, 2), (4,), (2, 4), (2,)]),
])
def test_models_learn_a_separable_file(tmp_path: Path, model: str,
                                       shapes: list[tuple[int, ...]]) -> None:
    # Prepare: a label decided by the first feature; training from a seeded init.
    path = write_csv(tmp_path / "d.csv", sample_rows(200))
    t = task(path, **{"tabular-model": model, "hidden-units": 4})
    assert t.parameter_shapes == shapes
    data = t.client_dataset(0, 1)
    params = t.init_parameters(np.random.default_rng(0))

    # Execute
    trained = t.train(params, data, epochs=20, learning_rate=0.5, batch_size=20,
                      rng=np.random.default_rng(1))

    # Assert: well above the majority-class rate of this file.
    majority = max(data.y.mean(), 1 - data.y.mean())
    assert t.user_metrics(trained, data)["accuracy"] > majority + 0.3


def test_the_task_imports_no_datasets_library_unless_it_splits(tmp_path: Path) -> None:
    # Hugging Face datasets costs seconds per process: only a split file pays for it.
    path = write_csv(tmp_path / "d.csv", sample_rows(10))
    code = ("import sys, tasks\n"
            f"t = tasks.load_task({{**{BASE!r}, 'data-path': {str(path)!r}}})\n"
            "t.client_dataset(0, 1)\n"
            "assert 'datasets' not in sys.modules and 'flwr_datasets' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# -- categories and missing cells ----------------------------------------------------------------
HEADER = ("a", "color", "y")


def test_categorical_columns_are_one_hot_over_their_public_vocabulary(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "c.csv", [["1.0", "red", "yes"], ["3.0", "blue", "no"],
                                          ["5.0", "green", "yes"]], HEADER)

    t = task(path, **{"feature-columns": "a", "categorical-columns": "color=red|green|blue",
                      "standardize": "none"})
    data = t.client_dataset(0, 1)

    # The numeric column, then one column per category in declared order; the model's input
    # is as wide.
    assert data.x.tolist() == [[1, 1, 0, 0], [3, 0, 0, 1], [5, 0, 1, 0]]
    assert t.input_width == 4 and t.parameter_shapes[0] == (2, 4)


def test_only_the_numeric_columns_are_standardized(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "c.csv", [["1.0", "red", "yes"], ["3.0", "blue", "no"]], HEADER)

    data = task(path, **{"feature-columns": "a", "categorical-columns": "color=red|blue"}
                ).client_dataset(0, 1)

    assert data.x.tolist() == [[-1, 1, 0], [1, 0, 1]]


@pytest.mark.parametrize(("impute", "filled"), [("zero", 0.0), ("mean", 4.0), ("public", 7.5)])
def test_a_missing_numeric_cell_is_filled_as_declared(tmp_path: Path, impute: str,
                                                      filled: float) -> None:
    path = write_csv(tmp_path / "m.csv", [["2.0", "red", "yes"], ["", "red", "no"],
                                          ["6.0", "", "yes"]], HEADER)

    data = task(path, **{"feature-columns": "a", "categorical-columns": "color=red|blue",
                         "standardize": "none", "impute": impute, "feature-means": "7.5"}
                ).client_dataset(0, 1)

    # The missing number takes the declared fill (the mean of this file's 2 and 6 for
    # "mean"); the missing category is no category.
    assert data.x.tolist() == [[2, 1, 0], [filled, 1, 0], [6, 0, 0]]


@pytest.mark.parametrize(("rows", "config", "message"), [
    ([["", "red", "yes"]], {}, r"feature column 'a' is not numeric: row 1 has no value .*"
                               r"a missing cell needs impute"),
    ([["1.0", "", "yes"]], {}, r"categorical column 'color': row 1 has no value"),
    ([["1.0", "pink", "yes"]], {"impute": "zero"},
     r"categorical column 'color': row 1 holds 'pink', which is not among its vocabulary "
     r"red\|blue"),
    ([["x", "red", "yes"]], {"impute": "zero"}, r"feature column 'a' is not numeric: row 1 "
                                                r"holds 'x'"),
])
def test_a_bad_or_missing_cell_without_a_fill_names_its_row(
        tmp_path: Path, rows: list[list[Any]], config: dict[str, Any], message: str) -> None:
    path = write_csv(tmp_path / "bad.csv", rows, HEADER)
    t = task(path, **{"feature-columns": "a", "categorical-columns": "color=red|blue",
                      **config})

    with pytest.raises(TaskSettingsError, match=message):
        t.client_dataset(0, 1)


@pytest.mark.parametrize(("config", "message"), [
    ({"categorical-columns": "color=red|red"}, r"categorical-columns.*lists a value twice"),
    ({"categorical-columns": "color"}, r"categorical-columns.*column=value"),
    ({"categorical-columns": "a=x|y"}, r"categorical-columns names \['a'\]"),
    ({"impute": "public"}, r"impute=public needs one feature-means value per feature column"),
])
def test_bad_category_or_fill_settings_name_the_setting(tmp_path: Path, config: dict[str, Any],
                                                        message: str) -> None:
    with pytest.raises(SettingError, match=message):
        task(tmp_path / "none.csv", **{"feature-columns": "a", **config})


def test_the_preflight_asks_the_header_for_the_categorical_columns(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "c.csv", [["1.0", "yes"]], ("a", "y"))

    with pytest.raises(TaskDataError, match=r"no column\(s\) \['color'\]"):
        preflight_task({**BASE, "data-path": str(path), "feature-columns": "a",
                        "categorical-columns": "color=red|blue"}, 0, 1)


# -- columns chosen by pattern ------------------------------------------------------------------
@pytest.mark.parametrize(("items", "chosen"), [
    ("*", ["a", "b", "id"]),
    ("*,!id", ["a", "b"]),
    ("b,*,!id", ["b", "a"]),
    ("[ab]", ["a", "b"]),
])
def test_feature_columns_by_pattern_or_all_but(tmp_path: Path, items: str,
                                               chosen: list[str]) -> None:
    # The label, split and categorical columns are never chosen by a pattern.
    path = write_csv(tmp_path / "p.csv", [["1", "2", "7", "red", "s0", "yes"]],
                     ("a", "b", "id", "color", "site", "y"))

    t = task(path, **{"feature-columns": items, "categorical-columns": "color=red|blue",
                      "tabular-split": "natural-id", "split-column": "site"})

    assert list(t.feature_columns) == chosen
    assert t.model_settings() == {"feature-columns": ",".join(chosen)}
    assert t.input_width == len(chosen) + 2


def test_a_pattern_that_selects_nothing_or_has_no_file_is_an_error(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "p.csv", [["1", "2", "yes"]], ("a", "b", "y"))

    with pytest.raises(TaskSettingsError, match=r"feature-columns='x\*' selects no column of "
                                                r"\['a', 'b', 'y'\]"):
        task(path, **{"feature-columns": "x*"})
    with pytest.raises(TaskSettingsError, match=r"no such file, and feature-columns selects by "
                                                r"pattern"):
        task(tmp_path / "absent.csv", **{"feature-columns": "*"})
