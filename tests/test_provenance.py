"""What ties raw files to the code that wrote them, and the relations their rows must satisfy.

`experiments.core.provenance` reads the commit and the state of a checkout with git and hashes
the raw files; `problems` is what the report and ``verify`` refuse. These tests build their own
git repositories in a temporary folder; `experiments.core.sanity`'s relations are checked on
rows written here. The end-to-end reruns of real experiments are in
``tests/test_experiments_quick.py`` (they share its federations).
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from experiments.core.provenance import (
    code_state,
    combine,
    digest,
    federation_configs,
    jsonable,
    problems,
    raw_digests,
)
from experiments.core.sanity import at_most, equals_max, flag, within
from experiments.core.sanity import problems as sanity_problems
from experiments.core.verify import choose_rows


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "t@example.org")
    _git(root, "config", "user.name", "t")
    (root / "code.py").write_text("x = 1\n")
    _git(root, "add", "code.py")
    _git(root, "commit", "-qm", "first")
    return root


def test_a_clean_checkout_names_its_commit(repo: Path) -> None:
    state = code_state(repo)

    assert state == {"commit": _git(repo, "rev-parse", "HEAD"), "dirty": False, "changes": []}


@pytest.mark.parametrize("change", ["edit", "untracked"])
def test_a_changed_or_added_file_makes_the_checkout_dirty(repo: Path, change: str) -> None:
    if change == "edit":
        (repo / "code.py").write_text("x = 2\n")
    else:
        (repo / "new.py").write_text("y = 1\n")

    state = code_state(repo)

    assert state["dirty"] is True
    assert state["changes"] == ["code.py" if change == "edit" else "new.py"]


def test_outside_a_checkout_the_commit_is_unknown(tmp_path: Path) -> None:
    assert code_state(tmp_path) == {"commit": None, "dirty": None, "changes": []}


def test_a_commit_made_while_the_run_ran_makes_it_dirty(repo: Path) -> None:
    start = code_state(repo)
    (repo / "code.py").write_text("x = 3\n")
    _git(repo, "commit", "-qam", "second")

    whole = combine(start, code_state(repo))

    assert whole["dirty"] is True
    assert whole["commit"] == start["commit"]
    assert whole["commit_at_end"] == _git(repo, "rev-parse", "HEAD")


def test_a_clean_run_stays_clean(repo: Path) -> None:
    state = code_state(repo)

    assert combine(state, code_state(repo)) == state


def _published(folder: Path, repo: Path, **overrides: Any) -> dict[str, Any]:
    """A folder of raw files as a clean run at ``repo``'s HEAD writes it; return its meta."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.csv").write_text("a,b\n1,2\n")
    meta = {"code": code_state(repo), "raw_files": raw_digests(folder), "rows": 1,
            "row_settings": [{"label": "one", "settings": {"keys": {"a": 1}}, "seconds": 0.1}]}
    meta.update(overrides)
    return meta


def test_raw_files_of_a_clean_commit_with_matching_hashes_pass(repo: Path,
                                                               tmp_path: Path) -> None:
    folder = tmp_path / "raw"
    meta = _published(folder, repo)

    assert problems(folder, meta, root=repo) == []


def test_an_edited_raw_value_fails_its_hash(repo: Path, tmp_path: Path) -> None:
    folder = tmp_path / "raw"
    meta = _published(folder, repo)
    (folder / "results.csv").write_text("a,b\n1,3\n")

    found = problems(folder, meta, root=repo)

    assert len(found) == 1 and "results.csv does not match the hash" in found[0]


@pytest.mark.parametrize(("override", "says"), [
    ({"code": {"commit": None, "dirty": None}}, "names no commit"),
    ({"code": {"commit": "0" * 40, "dirty": False}}, "history lacks"),
    ({"code": {"commit": None, "dirty": True, "changes": ["a.py"]}}, "uncommitted changes"),
    ({"raw_files": {}}, "no hash of results.csv"),
    ({"row_settings": None}, "no settings per row"),
    ({"rows": 2}, "1 rows' settings for 2 rows"),
])
def test_each_missing_or_false_record_is_refused(repo: Path, tmp_path: Path,
                                                 override: dict[str, Any], says: str) -> None:
    folder = tmp_path / "raw"
    meta = _published(folder, repo, **override)

    found = problems(folder, meta, root=repo)

    assert any(says in p for p in found), found


def test_a_digest_is_the_sha256_of_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc")

    # The SHA-256 of "abc" (FIPS 180-2, appendix B.1).
    assert digest(path) == ("sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f2"
                            "0015ad")


def test_settings_name_functions_and_keep_numbers() -> None:
    import functools

    record = jsonable({"make": functools.partial(json.dumps, 2.0), "nu": 0.5, "k": (1, 2)})

    assert record == {"make": {"function": "json.dumps", "args": [2.0], "keywords": {}},
                      "nu": 0.5, "k": [1, 2]}


def test_federation_configs_come_from_the_rows() -> None:
    meta = {"row_settings": [
        {"label": "a", "settings": {"federation": {"supernodes": 3, "run_config": {"k": 1}}}},
        {"label": "b", "settings": {"keys": {"x": 1}}},
        {"label": "c", "settings": {"federation": {"supernodes": 3, "run_config": {"k": 2}}}},
    ]}

    assert federation_configs(meta) == [{"supernodes": 3, "k": 1}, {"supernodes": 3, "k": 2}]


# ------------------------------------------------------------------------------ relations
def test_a_largest_distance_above_both_it_is_the_largest_of_is_caught() -> None:
    check = equals_max("max_dist", ("dist_opt1", "dist_opt2"))
    rows = [{"max_dist": "0.3", "dist_opt1": "0.3", "dist_opt2": "0.1"},
            {"max_dist": "0.9", "dist_opt1": "0.3", "dist_opt2": "0.1"}]

    found = sanity_problems(rows, [check])

    assert found == ["row 1: max_dist = max(dist_opt1, dist_opt2) fails "
                     "(max_dist=0.9, dist_opt1=0.3, dist_opt2=0.1)"]


@pytest.mark.parametrize(("row", "broken"), [
    ({"accuracy": "1.01", "best_round": "3", "rounds": "5", "done": "1"}, "accuracy"),
    ({"accuracy": "0.5", "best_round": "6", "rounds": "5", "done": "0"}, "best_round"),
    ({"accuracy": "0.5", "best_round": "3", "rounds": "5", "done": "2"}, "done"),
    ({"accuracy": "nan", "best_round": "3", "rounds": "5", "done": "0"}, "accuracy"),
    ({"accuracy": "x", "best_round": "3", "rounds": "5", "done": "0"}, "accuracy"),
])
def test_each_relation_catches_its_own_break(row: dict[str, str], broken: str) -> None:
    checks = [*within("accuracy", 0, 1), at_most("best_round", "rounds"), flag("done")]

    found = sanity_problems([row], checks)

    assert len(found) == 1 and f": {broken}" in found[0], found


def test_an_empty_cell_is_not_measured_and_passes() -> None:
    rows = [{"median_spend": "", "max_spend": ""}]

    assert sanity_problems(rows, [at_most("median_spend", "max_spend")]) == []


def test_rows_are_drawn_among_the_cheap_or_the_cheapest() -> None:
    meta = {"row_settings": [{"seconds": s} for s in (50.0, 3.0, 40.0, 2.0, 60.0)]}

    cheap = choose_rows(meta, 5, random.Random(0), max_seconds=10.0)
    none_cheap = choose_rows(meta, 1, random.Random(0), max_seconds=1.0)
    any_row = choose_rows(meta, 2, random.Random(0))

    assert cheap == [1, 3]
    assert none_cheap == [3]
    assert len(any_row) == 2 and len(set(any_row)) == 2
