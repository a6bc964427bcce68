"""The empirical-privacy and mia experiments run end to end and fill the report's section.

Both run with the tests' ``smoke`` profile (about a minute on 2 cores together): the audit grid
with few releases, and the membership inference on gpfl's client with two shadows, one seed and
short training. The checks are on the shape of what they write and on the facts that hold at any
size: every audited mechanism stays within its charge, every injected error is caught, and the
report quotes both tables.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from experiments.cli import run_experiment
from experiments.core.report import write_report

pytestmark = [pytest.mark.slow]


def _rows(root: Path, name: str) -> list[dict[str, str]]:
    run_experiment(name, out=root / name, cache=root / "_runs", profile="smoke")
    with open(root / name / "results.csv", newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.timeout(1200)
def test_the_audits_and_the_attacks_run_and_are_reported(tmp_path: Path) -> None:
    root = tmp_path / "runs"

    audit = _rows(root, "empirical-privacy")
    attacks = _rows(root, "mia")
    text = write_report(root, tmp_path / "docs" / "RESULTS.md", checked=False).read_text()

    kinds = {r["kind"] for r in audit}
    assert kinds == {"audit", "power", "float-leak", "false-positive"}
    for r in audit:
        if r["kind"] == "audit":
            assert float(r["epsilon_lb"]) <= float(r["charged"]), r["scenario"]
        if r["kind"] == "power":
            assert float(r["epsilon_lb"]) > float(r["charged"]), r["scenario"]
    mechanisms = {r["mechanism"] for r in audit if r["kind"] == "audit"}
    assert mechanisms == {"laplace", "gaussian", "sign", "dpsgd"}
    assert {r["task"] for r in attacks} == {"digits", "breast-cancer"}
    for r in attacks:
        for attack in ("loss", "shadow", "noisy"):
            assert 0.0 <= float(r[f"auc_{attack}"]) <= 1.0
            assert float(r[f"cost_s_{attack}"]) > 0.0
    assert "## empirical-privacy" in text and "## mia" in text
    assert "| gaussian k=2 eps=1 | at delta=1e-05 |" in text
    assert "| gaussian k=2, spread left out of sigma |" in text
    assert "| dpsgd replace-one charged as add-remove |" in text
    assert "| digits | none | shadow |" in text
    assert (tmp_path / "docs" / "results" / "mia" / "mia_roc.png").is_file()
