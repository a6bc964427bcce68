"""docs/RESULTS.md is what its committed raw files give, number for number.

`experiments.core.report.render` writes the report from ``docs/results/<experiment>/results.csv``
and ``meta.json`` alone; a section whose raw files are not committed is kept from the previous
report and marked as not regenerated (listed by `test_sections_not_regenerated_are_marked`).
"""

from __future__ import annotations

import csv
import difflib
import json
import shutil
from pathlib import Path

import pytest

from experiments.core.provenance import problems
from experiments.core.registry import load
from experiments.core.report import ORDER, RAW_DIR, RefusedRawFiles, not_regenerated, render
from experiments.core.sanity import problems as sanity_problems

DOCS = Path(__file__).resolve().parent.parent / "docs"
DOC = DOCS / "RESULTS.md"
RAW = DOCS / RAW_DIR


def _diff(expected: str, actual: str) -> str:
    lines = difflib.unified_diff(expected.splitlines(), actual.splitlines(), "committed",
                                 "regenerated", lineterm="", n=1)
    return "\n".join(list(lines)[:60])


def test_results_md_regenerates_from_the_committed_raw_files() -> None:
    committed = DOC.read_text(encoding="utf-8")

    regenerated = render(RAW, committed)

    assert regenerated == committed, (
        "docs/RESULTS.md differs from what docs/results/ gives (python -m experiments report "
        "--out docs/results writes it):\n" + _diff(committed, regenerated))


def test_changing_a_committed_raw_value_changes_the_report(tmp_path: Path) -> None:
    # Prepare: a copy of the raw files with one measured value of each regenerated experiment
    # (the first row that has one) changed to 7 times itself plus 1.
    committed = DOC.read_text(encoding="utf-8")
    raw = tmp_path / RAW_DIR
    shutil.copytree(RAW, raw)
    regenerated = [name for name in ORDER if (raw / name / "results.csv").is_file()]
    assert regenerated, "no experiment has committed raw files"
    for name in regenerated:
        path = raw / name / "results.csv"
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        changed = rows[:1] + [list(r) for r in rows[1:]]
        column = _shown_numeric_column(name, rows)
        row = next(i for i in range(1, len(rows)) if _is_number(rows[i][column]))
        changed[row][column] = f"{float(rows[row][column]) * 7 + 1:.6g}"
        with open(path, "w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows(changed)

        # Execute
        text = render(raw, committed, checked=False)
        with pytest.raises(RefusedRawFiles) as refused:
            render(raw, committed)

        # Assert: the report is no longer the committed one (the regeneration test would fail),
        # and, checked as the report command checks, refuses the edited file by its hash.
        assert text != committed, f"changing {name}'s {rows[0][column]} changed nothing"
        assert f"{name}: results.csv does not match the hash in meta.json" in str(refused.value)
        shutil.copy2(RAW / name / "results.csv", path)


@pytest.mark.skipif(not (RAW / "personalized-budgets" / "results.csv").is_file(),
                    reason="personalized-budgets' raw files are withdrawn until it is rerun "
                           "(NOT_YET_REGENERATED)")
@pytest.mark.parametrize("column", ["accuracy", "max_epsilon", "min_epsilon", "max_sigma",
                                    "min_sigma"])
def test_the_budgets_section_follows_each_column_it_reads(tmp_path: Path, column: str) -> None:
    # Prepare: the personalized-budgets section compares the two readings of ε_i by the
    # clients' spends and noise as well as by accuracy; a copy of the raw files with one
    # `per-round` run's value of that column changed to 7 times itself plus 1.
    committed = DOC.read_text(encoding="utf-8")
    raw = tmp_path / RAW_DIR
    shutil.copytree(RAW, raw)
    path = raw / "personalized-budgets" / "results.csv"
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    row = next(r for r in rows if r["accounting"] == "per-round" and _is_number(r[column]))
    row[column] = f"{float(row[column]) * 7 + 1:.6g}"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)

    # Execute
    text = render(raw, committed, checked=False)

    # Assert: only that section changed, and it did.
    section = "## personalized-budgets\n"
    assert text != committed, f"changing a per-round run's {column} changed nothing"
    assert text.split(section)[0] == committed.split(section)[0]
    assert text.split("\n## dlg\n")[1] == committed.split("\n## dlg\n")[1]


def _shown_numeric_column(name: str, rows: list[list[str]]) -> int:
    """The column whose change the report must show: a measured value, not a key."""
    measured = {"dlg": "psnr", "scale": "rounds_per_minute", "synthetic-ablation": "max_dist",
                "empirical-privacy": "epsilon_lb", "leakage": "max_spend",
                "accuracy-vs-nu": "accuracy", "mia": "auc_noisy",
                "personalized-budgets": "accuracy"}
    header = rows[0]
    return header.index(measured[name]) if measured.get(name) in header else next(
        i for i, v in enumerate(rows[1]) if _is_number(v))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


#: The sections of docs/RESULTS.md whose raw files are not committed yet: kept from the last
#: report made from uncommitted runs, each marked at its top as not regenerated.
NOT_YET_REGENERATED: list[str] = []


def test_sections_not_regenerated_are_marked_and_listed_here() -> None:
    text = DOC.read_text(encoding="utf-8")
    kept = not_regenerated(DOC)
    assert kept == NOT_YET_REGENERATED
    for name in ORDER:
        has_raw = (RAW / name / "results.csv").is_file()
        body = text.split(f"## {name}\n", 1)[1][:300]
        # Written from raw files, or marked as kept, or saying that it never ran.
        assert has_raw != (name in kept or body.lstrip().startswith("Not run yet"))


def test_the_committed_commands_name_no_folder_of_the_machine_that_ran_them() -> None:
    # meta.json's command is how to rerun an experiment; the folders it wrote to were that
    # machine's and are left out (experiments.core.common), so anyone can run it as it stands.
    for meta in sorted(RAW.glob("*/meta.json")):
        command = json.loads(meta.read_text())["command"]
        assert command.startswith("python -m experiments "), (meta, command)
        assert "/" not in command.removeprefix("python -m experiments "), (meta, command)


#: The experiments whose raw files are committed.
COMMITTED = [name for name in ORDER if (RAW / name / "results.csv").is_file()]


def test_every_experiment_has_raw_files_but_those_listed_as_not_regenerated() -> None:
    assert sorted(set(ORDER) - set(COMMITTED)) == sorted(NOT_YET_REGENERATED)


@pytest.mark.parametrize("name", COMMITTED)
def test_each_committed_experiment_names_its_commit_and_matches_its_hashes(name: str) -> None:
    # Every published raw file was written by a commit of this history from a clean checkout,
    # is byte for byte what that run wrote, and records the settings of each of its rows.
    meta = json.loads((RAW / name / "meta.json").read_text(encoding="utf-8"))

    found = problems(RAW / name, meta)

    assert found == [], found
    assert len(meta["row_settings"]) == meta["rows"]


@pytest.mark.parametrize("name", COMMITTED)
def test_each_committed_experiment_satisfies_its_relations(name: str) -> None:
    with open(RAW / name / "results.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))

    assert sanity_problems(rows, load(name).checks) == []
