"""The published numbers are what the code checked out now computes: one cheap row per experiment.

``python -m experiments verify --rows 1 --max-seconds 20`` as a test: for every experiment with
raw files in ``docs/results/``, the provenance (a commit of this history, a clean checkout,
matching hashes), the relations of every row, and one row drawn at random among those that took
at most 20 seconds when they ran (the cheapest one where none did), run again alone at its
recorded settings and compared column by column with the committed row. The draw's seed is
printed (``--seed`` repeats it). A row that differs from raw files made on another float
environment (another CPU's kernels; ``meta.json`` records it) is inconclusive, printed and not
failed; on the same environment any difference fails. ``tests/test_results_regenerate.py``
checks that RESULTS.md is what these raw files give; together they tie each published number to
the code.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from experiments.core.provenance import float_environment
from experiments.core.registry import EXPERIMENTS
from experiments.core.verify import load_raw, verify

RAW = Path(__file__).resolve().parent.parent / "docs" / "results"
#: The most seconds a drawn row took when it ran (the rows of the digits CNN take about 25).
CHEAP_S = 20.0

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(1800)
def test_one_cheap_row_of_every_experiment_reruns_to_the_committed_values() -> None:
    out = io.StringIO()

    verdicts = verify(RAW, count=1, max_seconds=CHEAP_S, stream=out)

    assert [v.name for v in verdicts] == [n for n in EXPERIMENTS
                                          if (RAW / n / "results.csv").is_file()]
    failed = [v for v in verdicts if not v.ok]
    assert not failed, out.getvalue()
    # Inconclusive only where the raw files were made elsewhere: what they say is shown.
    here = float_environment()
    for verdict in verdicts:
        if verdict.inconclusive:
            print(*verdict.inconclusive, sep="\n")
            assert load_raw(RAW / verdict.name)[1].get("float_environment") != here
    # Every experiment reran a row (scale's cheapest included): none passed by running nothing.
    assert all(len(v.rows) == 1 for v in verdicts), out.getvalue()
