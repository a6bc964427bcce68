"""Tests of ``python -m experiments bench``: the benchmarks' outputs read back, its wiring.

No timing is asserted: the machine's speed is not the code's. The suite's own reading of each
benchmark's table is checked on tables the benchmark modules render themselves (where they have
a function for it) or print in their format, with ratios computed by hand.
"""

from __future__ import annotations

import io

import pytest

from experiments import cli
from experiments.benchmarks import bench_release, bench_round, bench_sampling, bench_suite
from experiments.benchmarks.bench_suite import (
    Benchmark,
    Result,
    markdown_tables,
    run_suite,
    suite_table,
)


def test_markdown_tables_reads_header_and_rows() -> None:
    text = "intro\n| a | b |\n| --- | ---: |\n| x | 1 |\n| y | 2 |\nafter\n| c |\n| --- |\n"
    assert markdown_tables(text) == [[{"a": "x", "b": "1"}, {"a": "y", "b": "2"}], []]


def test_sampling_and_release_tables_give_ratios_to_their_floors() -> None:
    # Prepare: the modules' own tables (seconds in, milliseconds printed).
    sampling = bench_sampling.markdown([(1000, 0.002, 0.003)])
    sampling += ("\n\nn = 1,000,000, best of 3:\n  one reused generator:                4.000 ms "
                 "per release\n  device_rng() per release (CSPRNG):   5.000 ms per release\n")
    release = bench_release.markdown([bench_release.Row("gaussian", 10_000, 0.004, 0.010, 3)])
    # Execute
    laplace, rng = bench_suite.sampling_results(sampling)
    (gaussian,) = bench_suite.release_results(release)
    # Assert: 3 ms / 2 ms, 5 / 4, 10 / 4.
    assert laplace.measured == pytest.approx(3.0) and laplace.ratio == pytest.approx(1.5)
    assert rng.ratio == pytest.approx(1.25)
    assert gaussian.benchmark == "release: gaussian, n = 10,000"
    assert gaussian.ratio == pytest.approx(2.5)


def test_round_tables_set_each_run_against_fedavg() -> None:
    default = ("| run (2 SuperNodes, 1 rounds, one SuperLink) | s / round | ratio |\n"
               "| --- | ---: | ---: |\n| Flower FedAvg | 8.00 | 1.00 |\n| gpfl | 2.00 | 0.25 |\n")
    model = bench_round.model_size_table([
        bench_round.ModelRow("Flower FedAvg", 1000, 4.0, 100.0, 50.0, 60.0),
        bench_round.ModelRow("Flower FedAvg", 2000, 5.0, 100.0, 50.0, 60.0),
        bench_round.ModelRow("gpfl", 1000, 2.0, 120.0, 70.0, 60.0),
        bench_round.ModelRow("gpfl", 2000, 10.0, 130.0, 70.0, 60.0),
    ], 2, 1)
    ratios = {r.benchmark: r.ratio for r in bench_suite.round_results(default + "\n" + model)}
    assert ratios["round: gpfl"] == pytest.approx(0.25)
    assert ratios["round: gpfl, P = 1,000"] == pytest.approx(0.5)
    assert ratios["round: gpfl, P = 2,000"] == pytest.approx(2.0)
    assert ratios["round: gpfl, P = 2,000, peak RSS a device"] is None


def test_aggregate_tables_keep_the_benchmarks_own_ratios() -> None:
    def arm(name: str, memory: str) -> str:
        return (f"aggregate_fit, arm {name} ({{}}): U=4 replies\n\n"
                "| measure | value | / replies' size |\n| --- | ---: | ---: |\n"
                "| CPU time (best of 2) | 0.250 s | |\n| replies' size | 8 MiB | 1.00 |\n"
                f"| peak extra memory, tracemalloc | {memory} |\n\n")
    out = (arm("mean", "57 MiB | 7.50") + arm("robust", "10 MiB | 1.30")
           + "robust / mean, CPU time: 0.200 s / 0.250 s = 0.81\n")
    mean, robust, timing = bench_suite.aggregate_results(out)
    # 57 / 8 would be 7.12: the printed ratio comes from the unrounded sizes.
    assert mean.benchmark == "aggregate_fit mean: peak extra memory, tracemalloc"
    assert (mean.measured, mean.anchor, mean.ratio) == (57.0, 8.0, 7.5)
    assert robust.benchmark.startswith("aggregate_fit robust:") and robust.ratio == 1.3
    assert (timing.measured, timing.anchor, timing.ratio) == (0.2, 0.25, 0.81)


def test_fab_scale_and_deploy_tables() -> None:
    fab = ("| FAB built from | files | CPU s |\n| --- | ---: | ---: |\n"
           "| the app folder | 100 | 4.00 |\n| gpfl's copy (copy + build) | 10 | 0.50 + 0.50 |\n")
    scale = ("| run (2 a round) | users | s / round, mean | range | ratio to FedAvg "
             "| later rounds, s / round | later rounds, ratio to 4 users | peak RSS, GB |\n"
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
             "| Flower FedAvg | 4 | 2.00 | 2-2 | 1.00 | 1.00 | 1.00 | 1 |\n"
             "| gpfl | 4 | 3.00 | 3-3 | 1.50 | 2.00 | 1.00 | 1 |\n"
             "| Flower FedAvg | 40 | 4.00 | 4-4 | 1.00 | 1.50 | 1.50 | 1 |\n"
             "| gpfl | 40 | 2.00 | 2-2 | 0.50 | 2.50 | 1.25 | 1 |\n")
    deploy = ("| devices (1 rounds) | s / round | MB / device | x |\n"
              "| ---: | ---: | ---: | ---: |\n| 1 | 3.5 | 82.0 | 0 |\n| 2 | skipped | | |\n")
    assert [r.ratio for r in bench_suite.fab_results(fab)] == [pytest.approx(0.25)]
    ratios = {r.benchmark: r.ratio for r in bench_suite.scale_results(scale)}
    assert ratios == {"scale: Flower FedAvg, 4 users": 1.0, "scale: gpfl, 4 users": 1.5,
                      "scale: Flower FedAvg, 40 users": 1.0, "scale: gpfl, 40 users": 0.5,
                      "scale: Flower FedAvg, later rounds at 40 users": 1.5,
                      "scale: gpfl, later rounds at 40 users": 1.25}
    memory, rounds = bench_suite.deploy_results(deploy)
    assert memory.ratio == pytest.approx(82.0 / bench_suite.DOCUMENTED_DEVICE_MB)
    assert rounds.measured == pytest.approx(3.5) and rounds.ratio is None


def test_suite_table_has_one_row_per_result_and_failure() -> None:
    table = suite_table([Result("a", 2.0, 4.0, "ms", "floor"), Result("b", 1.0, None, "s")],
                        ["c"])
    lines = table.splitlines()
    assert lines[0] == "| benchmark | measured | floor / anchor | ratio |"
    assert lines[2] == "| a | 2 ms | 4 ms (floor) | 0.50 |"
    assert lines[3] == "| b | 1 s | - | - |"
    assert lines[4] == "| c: FAILED | | | |"


def test_every_benchmark_has_every_profile() -> None:
    for bench in bench_suite.BENCHMARKS:
        assert set(bench.args) == {"smoke", "quick", "full"}, bench.name


def test_run_suite_runs_the_benchmark_processes_and_reads_them() -> None:
    # Execute: two real benchmark processes at the smoke profile's tiny sizes.
    out = io.StringIO()
    results, failed = run_suite("smoke", ["release", "aggregate"], stream=out, timeout=300)
    # Assert: both read, every anchored ratio positive, the table printed last.
    assert failed == []
    names = [r.benchmark for r in results]
    assert any(n.startswith("release: ") for n in names)
    assert any(n.startswith("aggregate_fit robust: peak extra memory") for n in names)
    assert "aggregate_fit: robust clusters, CPU time" in names
    assert all(r.ratio is None or r.ratio > 0 for r in results)
    assert out.getvalue().rstrip().splitlines()[-len(results) - 2] == (
        "| benchmark | measured | floor / anchor | ratio |")


def test_a_failing_benchmark_is_reported_and_the_rest_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    broken = Benchmark("broken", "experiments.benchmarks.bench_fab",
                       {"smoke": ("--no-such-flag",), "quick": (), "full": ()},
                       bench_suite.fab_results)
    monkeypatch.setattr(bench_suite, "BENCHMARKS", (broken, bench_suite.BENCHMARKS[0]))
    out = io.StringIO()
    results, failed = run_suite("smoke", stream=out, timeout=300)
    assert failed == ["broken"]
    assert results and all(r.benchmark.startswith("sampling") for r in results)
    assert "| broken: FAILED | | | |" in out.getvalue()


def test_cli_bench_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--profile", "smoke", "--only", "no-such"]) == 2
    assert "no benchmark named no-such" in capsys.readouterr().err
    assert cli.main(["bench", "--profile", "smoke", "--only", "sampling"]) == 0
    assert "| sampling: Euclidean Laplace, n = 1,000 |" in capsys.readouterr().out
