"""The scale benchmark reads each round's seconds from Flower's timestamped log lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.benchmarks.bench_scale import round_seconds


def test_round_seconds_are_the_gaps_between_flowers_round_lines(tmp_path: Path) -> None:
    # Prepare: a run's log as `flwr run --stream` writes it, both line formats, a repeated line.
    log = tmp_path / "run.log"
    log.write_text("\n".join([
        "INFO :      [ROUND 1]",
        "2026-11-28 12:51:04,812 INFO flwr: [ROUND 1]",
        "2026-11-28 12:55:25,272 INFO flwr: [ROUND 2]",
        "2026-11-28 12:55:25,272 INFO flwr: [ROUND 2]",
        "INFO :      [ROUND 3]",
        "2026-11-28 12:55:59,000 INFO flwr: [ROUND 3]",
        "2026-11-28 12:56:10,500 INFO flwr: Run finished 3 round(s) in 305.69s",
    ]) + "\n")

    # Execute / Assert: round 1 holds the engine's start; the others are the work of a round.
    assert round_seconds(log) == pytest.approx([260.46, 33.728, 11.5])


def test_a_log_without_timestamps_has_no_rounds(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("INFO :      [ROUND 1]\nINFO :      Run finished 1 round(s) in 3.0s\n")
    assert round_seconds(log) == []
