"""The experiments' plumbing without Flower: cache, CSV, progress, CLI and report."""

from __future__ import annotations

import csv
import io
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import deploy.launcher
from experiments import cli
from experiments.benchmarks import scale
from experiments.benchmarks.scale import MemoryMonitor
from experiments.core.common import Context, FederationSpec, compact_summary
from experiments.core.report import write_report
from experiments.core.runner import Progress
from experiments.core.tables import (
    best_entry,
    excludes_zero,
    mean_ci,
    mean_pm_ci,
    paired_difference,
    verdict,
    write_csv,
)
from experiments.reproductions import accuracy_vs_nu, personalized_budgets, synthetic_ablation
from experiments.reproductions.personalized_budgets import NONIID_BUDGETS
from settings import AGGREGATIONS


def _summary(rounds: int = 3, params: int = 2) -> dict[str, Any]:
    history = [{"round": t, "val_loss": 1.0 / (t + 1), "val_metrics": {"accuracy": 0.5 + t / 10},
                "cluster_sizes": [1], "replies": 1, "declined": 0, "dropped": [],
                "failures": 0} for t in range(rounds + 1)]
    return {"config": {}, "task_info": {"num_parameters": params}, "rounds_completed": rounds,
            "stopped_early": False, "best_val_loss": history[-1]["val_loss"],
            "best_round": rounds, "hypotheses": [[0.0] * params],
            "last_hypotheses": [[0.0] * params],
            "history": history, "privacy": {"per_client": {}, "median": None, "max": None}}


class _FakeLaunch:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> deploy.launcher.LaunchResult:
        self.calls.append(kwargs)
        return deploy.launcher.LaunchResult(kwargs["out_dir"], _summary(), None, 0)


def test_spec_key_depends_on_config_and_supernodes_only() -> None:
    a = FederationSpec("a", {"x": 1, "y": 2}, 10)
    assert a.key == FederationSpec("other label", {"y": 2, "x": 1}, 10).key
    assert a.key != FederationSpec("a", {"x": 1, "y": 3}, 10).key
    assert a.key != FederationSpec("a", {"x": 1, "y": 2}, 11).key
    assert FederationSpec("digits nu=0.1 k=2 seed=0", {}, 1).slug == "digits-nu=0.1-k=2-seed=0"


def test_an_in_process_result_is_kept_with_its_time_and_counted_when_read_back(
        tmp_path: Path) -> None:
    calls: list[int] = []

    def compute() -> dict[str, int]:
        calls.append(1)
        time.sleep(0.05)
        return {"value": 7}

    ctx = Context(name="t", out=tmp_path / "out", cache=tmp_path / "cache")
    first = ctx.cached("exp", "cell", {"seed": 0}, compute)
    again = Context(name="t", out=tmp_path / "out", cache=tmp_path / "cache")
    second = again.cached("exp", "cell", {"seed": 0}, compute)
    # Computed once; a later invocation that reads it back still counts what it cost.
    assert calls == [1] and first["value"] == second["value"] == 7
    assert second["_cached"] is True and (again.launched, again.reused) == (0, 1)
    assert 0.05 <= ctx.federation_s == again.federation_s < 5


def test_run_launches_once_then_reuses_the_cache(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeLaunch()
    monkeypatch.setattr(deploy.launcher, "launch", fake)
    ctx = Context(name="t", out=tmp_path / "out", cache=tmp_path / "cache", engine="simulation")
    spec = FederationSpec("one", {"task": "synthetic", "seed": 0}, 5)
    first = ctx.run(spec)
    second = ctx.run(spec)
    assert len(fake.calls) == 1 and fake.calls[0]["engine"] == "simulation"
    assert fake.calls[0]["supernodes"] == 5 and fake.calls[0]["run_config"]["seed"] == 0
    assert first["_cached"] is False and second["_cached"] is True
    assert (ctx.launched, ctx.reused) == (1, 1)
    # Each run counted by the engine that ran it (the one read back too).
    assert ctx.engines == {"simulation": 2}
    done = json.loads((ctx.run_dir(spec) / "done.json").read_text())
    assert done.pop("engine") == "simulation"
    # The run config as launched: the experiments' draw by name and the papers' plain cluster
    # mean, then the spec's own.
    assert done["run_config"] == {"sample-by": "name", "divergence-factor": 0.0,
                                  "cluster-aggregator": "mean", "persistence-threshold": 0.0,
                                  "task": "synthetic", "seed": 0}
    assert fake.calls[0]["run_config"]["sample-by"] == "name"
    fresh = Context(name="t", out=tmp_path / "out", cache=tmp_path / "cache", fresh=True,
                    engine="simulation")
    fresh.run(spec)
    assert len(fake.calls) == 2


def test_a_run_without_done_marker_is_run_again(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeLaunch()
    monkeypatch.setattr(deploy.launcher, "launch", fake)
    ctx = Context(name="t", out=tmp_path / "out", cache=tmp_path / "cache", engine="simulation")
    spec = FederationSpec("one", {"seed": 1}, 2)
    directory = ctx.run_dir(spec)
    directory.mkdir(parents=True)
    (directory / "summary.json").write_text(json.dumps(_summary(rounds=1)))  # interrupted
    assert ctx.run(spec)["rounds_completed"] == 3
    assert len(fake.calls) == 1


def test_compact_summary_drops_large_hypotheses_only() -> None:
    small = compact_summary(_summary(params=2))
    assert small["hypotheses"] == [[0.0, 0.0]]
    large = compact_summary(_summary(params=83_562))
    assert large["hypotheses"] is None and large["last_hypotheses"] is None
    assert "83562" in large["hypotheses_dropped"]


def test_best_entry_is_the_best_validation_round() -> None:
    s = _summary(rounds=4)
    s["best_round"] = 2
    assert best_entry(s)["round"] == 2
    s["best_round"] = None
    assert best_entry(s)["round"] == 4
    with pytest.raises(ValueError, match="no validated round"):
        best_entry({"history": [{"round": 0, "val_loss": None}]})


def test_write_csv_has_a_header_and_rejects_unknown_keys(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "r.csv", [{"nu": 0.1, "k": 2, "seed": 0, "accuracy": math.nan},
                                          {"nu": 1, "k": 1, "seed": 1, "accuracy": None}],
                     ["nu", "k", "seed", "accuracy"])
    with open(path, newline="") as fh:
        assert list(csv.reader(fh)) == [["nu", "k", "seed", "accuracy"], ["0.1", "2", "0", "nan"],
                                        ["1", "1", "1", ""]]
    with pytest.raises(ValueError):
        write_csv(tmp_path / "bad.csv", [{"nu": 1, "extra": 2}], ["nu"])


def test_progress_prints_a_counted_line_per_configuration() -> None:
    out = io.StringIO()
    p = Progress("exp", 2, out)
    p.step("a", "done")
    p.step("b", "done")
    lines = out.getvalue().splitlines()
    # Not a terminal (a CI log): the lines alone, no bar and no control characters.
    assert len(lines) == 2 and "\x1b" not in out.getvalue()
    assert lines[0].startswith("exp 1/2 a: done (") and "left)" in lines[0]
    assert lines[1].startswith("exp 2/2 b: done (") and "left" not in lines[1]


def test_progress_keeps_a_long_line_whole_and_brackets_as_they_are() -> None:
    out = io.StringIO()
    Progress("exp", 1, out).step("x" * 150, "done [cached]")
    (line,) = out.getvalue().splitlines()
    assert line.startswith(f"exp 1/1 {'x' * 150}: done [cached] (")


def test_memory_monitor_measures_this_process() -> None:
    with MemoryMonitor(interval=0.05) as monitor:
        monitor.sample()
    assert monitor.peak > 10 * 2**20 and monitor.peak_processes >= 1


def test_profiles_follow_the_papers_where_asked() -> None:
    paper_nus = [0.0, 0.001, 0.01, 0.1, 1.0, 3.0, 5.0, 10.0, 15.0]
    for profile in ("full", "quick"):  # the paper's nine ν at k = 2 with both of its losses
        arms = {(k, loss): nus for k, loss, nus in accuracy_vs_nu.PROFILES[profile]["arms"]}
        assert arms[2, "cross-entropy"] == arms[2, "rmse"] == paper_nus
        assert accuracy_vs_nu.PROFILES[profile]["seeds"] == [0, 1, 2, 3, 4]
    assert {k for k, _, _ in accuracy_vs_nu.PROFILES["full"]["arms"]} == {1, 2}
    grid = accuracy_vs_nu.specs("full", [0])
    assert {spec.run_config["mechanism"] for nu, *_, spec in grid if nu == 0} == {"none"}
    assert {spec.run_config.get("loss", "cross-entropy") for _, _, loss, _, spec in grid
            if loss == "rmse"} == {"rmse"}
    methods = {m: spec.run_config for m, _, spec in synthetic_ablation.specs("full", [0])}
    assert methods["ours"]["noise-multiplier"] == 5.0 and methods["ours"]["num-hypotheses"] == 2
    assert methods["fedavg"]["num-hypotheses"] == 1 and methods["ifca"]["mechanism"] == "none"
    assert all(c["clients-per-round"] == 7 and c["learning-rate"] == 0.1
               for c in methods.values())
    specs = personalized_budgets.specs("full", [0])
    budgets = {s.run_config.get("client-epsilons") for *_, s in specs
               if s.run_config["task"] == "digits" and s.run_config["mechanism"] == "gaussian"}
    assert {"1,1,10", "1,5,10", "1,10,10", "1", "5", "10"} <= budgets
    assert all(s.run_config["num-hypotheses"] == 1 for *_, s in specs)


def test_quick_budgets_are_the_readable_ones_of_each_reading() -> None:
    # The quick profile compares A, B and C at budgets where A learns; each reading gets its
    # own (composed: round totals at or below what the per-release budgets compose to), the
    # sign panel runs A and C.
    specs = personalized_budgets.specs("quick", [0, 1, 2, 3, 4])
    asked = {(panel, accounting, budgets, agg) for panel, accounting, setting, budgets, agg, *_
             in specs if setting == "personalized"}
    gauss, sign = "digits-iid-gaussian", "digits-dirichlet-sign"
    own = set(personalized_budgets.PAPER_BUDGETS["gaussian"])
    assert {(a, b) for p, a, b, _ in asked if p == gauss} == {
        ("per-round", "10,10,100"), ("composed", "50,50,500"),
        *(("per-round", b) for b in own)}
    # The readable sign budgets with A and C; 002's own with A, B and C (B on non-IID data).
    readable = NONIID_BUDGETS["readable"]["per-round"]
    assert {g for p, _, b, g in asked if p == sign and b == readable} == {"mean", "probability"}
    assert {(b, g) for p, a, b, g in asked if p == sign and a == "per-round" and b != readable
            } == {(b, g) for b in personalized_budgets.PAPER_BUDGETS["sign"]
                  for g in ("mean", "weighted", "probability")}
    assert {g for p, _, _, g in asked if p == gauss} == {"mean", "weighted", "probability"}
    # 002's uniform budgets in its own reading, each once (A, B and C coincide).
    uniform = [(p, a, b, g) for p, a, setting, b, g, seed, _ in specs
               if setting == "uniform" and seed == 0]
    assert sorted(uniform) == sorted(
        [(gauss, "per-round", b, "mean") for b in ("1", "5", "10")]
        + [(sign, "per-round", b, "mean") for b in ("5", "10", "15")])
    per_release = [s.run_config for panel, accounting, setting, *_, s in specs
                   if accounting == "per-round"]
    assert per_release and all(c["planned-releases"] == 1 for c in per_release)
    assert {seed for *_, seed, _ in specs} == {0, 1, 2, 3, 4}


def test_scale_repeats_are_separate_seeded_federations() -> None:
    ctx = Context(name="scale", out=Path("unused"), cache=Path("unused"), profile="quick")
    cells = scale.grid(ctx)
    assert [c.keys["repeat"] for c in cells] == [0, 1, 2, 3, 4]
    assert sorted(c.spec.run_config["seed"] for c in cells if c.spec) == [0, 1, 2, 3, 4]
    rows = [{"users": "1000", "repeat": str(i), "clients_per_round": "100", "rounds": "10",
             "wall_s": "40", "startup_s": "20", "rounds_per_minute": str(40 + i),
             "seconds_per_round": "1.5", "peak_rss_mb": "1500", "peak_processes": "15",
             "final_val_loss": "5"} for i in range(5)]
    # 40..44: mean 42, sd 1.58, t(0.975, 4) = 2.776: half-width 1.96.
    assert "| 1000 | 100 | 10 | 5 | 42.0 ± 2.0 |" in "\n".join(scale.table(rows))


def test_cli_rejects_unknown_experiments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["no-such-experiment"])
    assert "invalid choice" in capsys.readouterr().err


def test_report_from_results_alone(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    cells = [(0.0, 1, 0.8), (0.0, 2, 0.9), (1.0, 2, 0.88), (15.0, 2, 0.7)]
    # Two seeds: k = 2 is ahead of k = 1 by 0.10 and 0.12 (interval above 0); ν = 15 is
    # behind ν = 1 by 0.18 and 0.02 (too spread for two seeds: the interval contains 0).
    rows = [{"nu": nu, "k": k, "seed": 0, "accuracy": acc} for nu, k, acc in cells]
    rows += [{"nu": 0.0, "k": 1, "seed": 1, "accuracy": 0.78},
             {"nu": 0.0, "k": 2, "seed": 1, "accuracy": 0.90},
             {"nu": 1.0, "k": 2, "seed": 1, "accuracy": 0.86},
             {"nu": 15.0, "k": 2, "seed": 1, "accuracy": 0.84}]
    write_csv(root / "accuracy-vs-nu" / "results.csv", rows, accuracy_vs_nu.COLUMNS)
    (root / "accuracy-vs-nu" / "meta.json").write_text(json.dumps({"profile": "quick",
                                                                   "runtime_s": 12.0}))
    text = write_report(root, tmp_path / "docs" / "RESULTS.md", checked=False).read_text()
    # t(0.975, 1) = 12.706: the half-width of two values a, b is 12.706 * |a - b| / 2.
    assert "| 15 | - | 0.770 ± 0.889 (2) | 0.561 ± 0.005 |" in text
    assert ("k = 2 beats k = 1 on rotated digits without noise (accuracy, k = 2 − k = 1, "
            "ν = 0): +0.110 [-0.017, +0.237], n = 2; **not supported**") in text
    assert "accuracy falls as ν grows (k = 2: ν = 15 − ν = 1): -0.100 [" in text
    assert "profile **quick**: 0 min" in text
    assert "Not run yet: `python -m experiments synthetic-ablation --quick`" in text


def test_mean_ci_is_the_student_t_interval() -> None:
    from scipy import stats

    values = [0.91, 0.93, 0.95, 0.90, 0.96]
    mean, half, n = mean_ci(values)
    low, high = stats.t.interval(0.95, 4, loc=np.mean(values), scale=stats.sem(values))
    assert n == 5 and mean == pytest.approx(np.mean(values))
    assert (mean - half, mean + half) == pytest.approx((low, high))
    assert math.isnan(mean_ci([0.5])[1]) and mean_ci([])[2] == 0
    assert mean_ci([0.5, math.nan, 0.5]) == (0.5, 0.0, 2)
    assert mean_pm_ci([0.5]) == "0.500 (1 seed)" and mean_pm_ci([]) == "-"


def test_mean_ci_covers_the_mean_95_percent_of_the_time() -> None:
    # 4,000 seeded experiments of 5 normal draws each. A correct 95 % interval covers the true
    # mean with probability 0.95: the count has a binomial sd of 0.0034, so [0.935, 0.965] is
    # ±4.4 sd (false-positive rate ~1e-5). A normal (z) interval in place of Student's t
    # covers ~0.88 at n = 5 and fails.
    rng = np.random.default_rng(20261124)
    draws = rng.normal(3.0, 2.0, size=(4000, 5))
    covered = 0
    for row in draws:
        mean, half, _ = mean_ci(row.tolist())
        covered += abs(mean - 3.0) <= half
    assert 0.935 <= covered / 4000 <= 0.965


def test_paired_difference_pairs_by_seed() -> None:
    a = {0: 0.9, 1: 0.8, 2: 0.85, 3: 0.5}
    b = {0: 0.8, 1: 0.7, 2: 0.74, 4: 0.1}  # seed 3 and 4 have no pair
    mean, half, n = paired_difference(a, b)
    assert n == 3 and mean == pytest.approx(0.10333, abs=1e-4)
    # Pairing removes the seeds' shared level: the difference's interval is far narrower
    # than either mean's.
    assert half < mean_ci([0.9, 0.8, 0.85])[1] / 5
    assert excludes_zero(mean, half, n) and not excludes_zero(0.1, 0.2, 3)
    assert not excludes_zero(0.1, math.nan, 1)
    assert verdict(0.1, 0.05, 3) == "+0.100 [+0.050, +0.150], n = 3"


def test_meta_keeps_the_runtime_of_the_invocation_that_ran_the_federations(
        tmp_path: Path) -> None:
    ctx = Context(name="x", out=tmp_path, cache=tmp_path / "_runs", profile="quick")
    ctx.launched = 3
    ctx.write_meta(0.0)  # monotonic() - 0: a long "run"
    first = json.loads((tmp_path / "meta.json").read_text())
    assert first["compute_s"] == first["runtime_s"] > 0
    # A rerun that reuses every federation (to redraw figures) keeps the first one's cost...
    again = Context(name="x", out=tmp_path, cache=tmp_path / "_runs", profile="quick")
    again.reused = 3
    again.write_meta(time.monotonic())
    second = json.loads((tmp_path / "meta.json").read_text())
    assert second["runtime_s"] < 1 and second["compute_s"] == first["compute_s"]
    assert second["compute_finished"] == first["compute_finished"]
    # ...but not across profiles, and a rerun that launches anything measures itself.
    other = Context(name="x", out=tmp_path, cache=tmp_path / "_runs", profile="smoke")
    other.write_meta(time.monotonic())
    assert json.loads((tmp_path / "meta.json").read_text())["compute_s"] < 1


def test_budget_aggregation_is_an_experiment_of_the_common_runner(tmp_path: Path) -> None:
    from experiments.reproductions import budget_aggregation as ba

    ctx = Context(name=ba.NAME, out=tmp_path, cache=tmp_path / "_runs", seeds=[3])
    cells = ba.grid(ctx, rounds=4)
    assert [c.keys for c in cells] == [{"aggregation": a, "seed": 3} for a in AGGREGATIONS]
    assert {c.spec.run_config["num-rounds"] for c in cells if c.spec} == {4}
    row = ba.measure(cells[0], {"hypotheses": [[5.0, 9.0]], "best_val_loss": 1.5})
    assert row == {"aggregation": "mean", "seed": 3, "val_rmse": 1.5, "distance": 3.0}
    rows = [{**row, "seed": s, "val_rmse": str(v)} for s, v in ((0, 1.0), (1, 3.0))]
    assert "| mean | 2.000 ± 1.414 | 3.000 ± 0.000 | |" in ba.EXPERIMENT.report(rows)


def test_the_report_keeps_the_sections_after_its_marker(tmp_path: Path) -> None:
    from experiments.core.report import KEPT_MARKER

    doc = tmp_path / "docs" / "RESULTS.md"
    doc.parent.mkdir()
    doc.write_text(f"old generated text\n\n{KEPT_MARKER}\n\n## Rogue devices\n\n| a | b |\n")

    text = write_report(tmp_path / "runs", doc, checked=False).read_text()

    assert "old generated text" not in text
    assert text.endswith(f"{KEPT_MARKER}\n\n## Rogue devices\n\n| a | b |\n")
    again = write_report(tmp_path / "runs", doc, checked=False).read_text()
    assert again.count("## Rogue devices") == 1


def test_the_report_says_which_engine_ran_each_experiment_from_its_declaration() -> None:
    from experiments.core.report import ORDER, _engines, _experiments
    from experiments.core.runner import ENGINES

    experiments = _experiments()
    text = _engines(experiments)

    for name in ORDER:
        assert experiments[name].engine in ENGINES
        assert text.count(f"`{name}`") == 1
    assert experiments["mia"].engine == "in-process"
    assert experiments["accuracy-vs-nu"].engine == "simulation"


def test_the_mia_verdict_reads_the_intervals() -> None:
    from experiments.audits.privacy_report import mia_verdict

    # (mean, half-width, seeds) of noisy − shadow in AUC and TPR, and of the cost ratio.
    assert mia_verdict((0.0, 0.02, 5), (-0.01, 0.03, 5), (4.0, 1.0, 5)) == "reproduced"
    assert mia_verdict((-0.12, 0.03, 5), (0.0, 0.01, 5), (4.0, 1.0, 5)) == "not reproduced"
    assert mia_verdict((0.0, 0.02, 5), (0.0, 0.01, 5), (0.8, 0.1, 5)) == "not reproduced"
    assert mia_verdict((-0.05, 0.05, 5), (0.0, 0.01, 5), (4.0, 1.0, 5)) == "inconclusive"
    assert mia_verdict((0.0, math.nan, 1), (0.0, math.nan, 1), (4.0, math.nan, 1)) \
        == "inconclusive"
