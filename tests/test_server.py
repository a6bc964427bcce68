"""Server side without processes: run-config validation, the results, the CLI parsing."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any
from unittest.mock import Mock

import numpy as np
import pytest
from flwr.common.config import parse_config_args
from flwr.server import Grid, Server
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.superlink.grid import InMemoryGrid

import server.legacy_server as legacy_server
from deploy.cli import parse_node_configs, parse_pairs
from server.app import build_components
from server.results import plot_summary, privacy_report
from server.settings import RunSettings, SettingError
from settings.render import toml_value

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"][
    "app"
]["config"]


def test_the_shipped_defaults_are_valid() -> None:
    settings = RunSettings.from_run_config(DEFAULTS)
    assert (settings.task, settings.num_hypotheses, settings.mechanism) == ("synthetic", 2,
                                                                          "laplace")
    assert settings.values["noise-multiplier"] == 5.0


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"num-hypotheses": 0}, "num-hypotheses"),
        ({"mechanism": "sign", "num-hypotheses": 2}, "num-hypotheses"),
        ({"aggregation": "median"}, "aggregation"),
        ({"aggregation": "weighted"}, "aggregation"),  # laplace/neighbourhood declares no σ
        ({"clients-per-round": 0}, "clients-per-round"),
        ({"num-rounds": 1.5}, "num-rounds"),
        ({"eval-every": 0}, "eval-every"),
        ({"ledger-dir": "/tmp/fresh"}, "ledger-dir belongs to the device"),
        ({"privacy-budget": 2.0}, "unknown run-config setting"),
    ],
)
def test_invalid_run_config_names_the_setting(override: dict[str, Any], named: str) -> None:
    with pytest.raises(SettingError, match=named):
        RunSettings.from_run_config({**DEFAULTS, **override})


def test_weighted_aggregation_is_accepted_for_gaussian() -> None:
    settings = RunSettings.from_run_config(
        {**DEFAULTS, "mechanism": "gaussian", "aggregation": "weighted", "num-hypotheses": 1}
    )
    assert settings.aggregation == "weighted"


def test_bad_task_setting_fails_at_the_server_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="optima"):
        build_components({**DEFAULTS, "optima": "5,6;4", "out-dir": str(tmp_path)})


class Record:
    def __init__(self, participations: int, metrics: dict[str, Any]) -> None:
        self.participations = participations
        self.declines = int(metrics.get("declines", 0))
        self.dropped = 0
        self.metrics = metrics


def test_privacy_report_median_and_max_in_the_mechanisms_terms() -> None:
    clients = {
        "11": Record(1, {"client-name": "client-0", "spend-d": 0.4, "releases": 1}),
        "12": Record(3, {"client-name": "client-1", "spend-d": 1.2, "releases": 3}),
        "13": Record(2, {"client-name": "client-2", "spend-d": 0.8, "releases": 2}),
    }
    report = privacy_report("laplace", clients)
    assert report["median"] == pytest.approx(0.8) and report["max"] == pytest.approx(1.2)
    assert report["per_client"]["client-1"]["participations"] == 3

    gauss = privacy_report("gaussian", {"1": Record(1, {"client-name": "a", "spend-epsilon": 2.5,
                                                        "spend-d": 9})})
    assert gauss["max"] == pytest.approx(2.5)
    assert privacy_report("none", clients)["max"] is None


def test_plot_of_a_two_parameter_run(tmp_path: Path) -> None:
    summary = {
        "hypotheses": [[5.0, 6.0], [4.0, -4.5]],
        "task_info": {"optima": [[5, 6], [4, -4.5]]},
        "history": [{"round": 1, "val_loss": 2.0, "released": [[1.0, 2.0], [3.0, -1.0]]},
                    {"round": 2, "val_loss": 1.0, "released": [[4.0, 5.0]]}],
    }
    path = plot_summary(summary, tmp_path / "figure.png")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_build_components_gives_k_hypotheses_and_the_round_budget(tmp_path: Path) -> None:
    components, _ = build_components({**DEFAULTS, "out-dir": str(tmp_path), "seed": 1})
    strategy = components.server.strategy
    assert components.config.num_rounds == DEFAULTS["num-rounds"]
    assert len(strategy.hypotheses) == 2  # type: ignore[attr-defined]
    # Round 0 is evaluated and written at once.
    strategy.evaluate(0, strategy.initialize_parameters(None))  # type: ignore[arg-type]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["history"][0]["round"] == 0
    assert np.asarray(summary["hypotheses"]).shape == (2, 2)
    assert summary["task_info"]["optima"] == [[5.0, 6.0], [4.0, -4.5]]
    assert len(summary["optima_distances"]) == 2 and min(summary["optima_distances"]) > 0
    # Every sampled client's instruction goes out at once (Flower's default pool is CPUs + 4).
    assert components.server.max_workers == DEFAULTS["clients-per-round"]


@pytest.mark.parametrize(("grid", "workers"), [(InMemoryGrid, 16), (Grid, 100)])
def test_the_pool_is_capped_per_cpu_on_the_simulation_engine_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, grid: type, workers: int
) -> None:
    # Prepare: 100 sampled clients a round on a 2-CPU machine; Flower's round itself is not run.
    components, _ = build_components({**DEFAULTS, "out-dir": str(tmp_path),
                                      "clients-per-round": 100})
    server = components.server
    monkeypatch.setattr(legacy_server, "_cpus", lambda: 2)
    monkeypatch.setattr(Server, "fit_round", lambda self, server_round, timeout: None)
    server.client_manager().register(GridClientProxy(node_id=7, grid=Mock(spec=grid), run_id=1))

    # Execute
    server.fit_round(1, None)

    # Assert: the in-memory grid (Simulation Engine) gets 8 threads per CPU, a real grid
    # (Deployment Engine) one per sampled device.
    assert server.max_workers == workers


def test_cli_pairs_take_toml_values() -> None:
    assert parse_pairs('num-rounds=3 noise-multiplier=2.5 task="digits" per-layer=true x=abc',
                       "--run-config") == {
        "num-rounds": 3, "noise-multiplier": 2.5, "task": "digits", "per-layer": True,
        "x": "abc"}
    assert parse_node_configs(["2:cap-d-privacy=0.8", "2:epsilon=1"]) == {
        2: {"cap-d-privacy": 0.8, "epsilon": 1}}
    with pytest.raises(SystemExit):
        parse_node_configs(["cap-d-privacy=0.8"])


def test_cli_pairs_read_toml_values_as_flower_does() -> None:
    line = 'num-rounds=3 noise-multiplier=2.5 task="digits" per-layer=true out-dir="my runs" a.b=-1'
    assert parse_pairs(line, "--run-config") == parse_config_args([line])
    assert parse_pairs(line, "--run-config")["out-dir"] == "my runs"


def test_toml_values_the_launcher_writes_read_back_in_flower() -> None:
    # deploy/launcher.py passes run configs to `flwr run --run-config` as key=toml_value pairs.
    config = {"num-rounds": 3, "noise-multiplier": 2.5, "per-layer": False, "seed": -1,
              "task": "digits", "optima": "5,6;4,-4.5", "out-dir": "runs/é 1", "eps": 1e-300,
              "where": Path("/var/lib/gpfl")}
    line = " ".join(f"{k}={toml_value(v)}" for k, v in config.items())
    assert parse_config_args([line]) == {**config, "where": "/var/lib/gpfl"}
    assert parse_pairs(line, "--run-config") == parse_config_args([line])
    assert [toml_value(v) for v in (True, 3, 2.5, "a\"b", float("inf"))] == [
        "true", "3", "2.5", '"a\\"b"', "inf"]


def test_optima_distances_take_each_optimum_to_its_nearest_hypothesis() -> None:
    from server.results import optima_distances

    hyps = [[5.0, 6.5], [4.0, -4.5], [100.0, 100.0]]
    assert optima_distances(hyps, [[5, 6], [4, -4.5]]) == pytest.approx([0.5, 0.0])
    # Both optima nearest to one hypothesis: the other optimum stays far.
    assert optima_distances([[5.0, 6.0], [5.0, 6.0]], [[5, 6], [4, -4.5]]) == pytest.approx(
        [0.0, float(np.hypot(1.0, 10.5))])
    assert optima_distances(hyps, None) is None
    assert optima_distances(hyps, [[1.0, 2.0, 3.0]]) is None  # another dimension: not comparable


def test_the_round_line_shows_the_largest_distance_to_the_optima() -> None:
    from types import SimpleNamespace

    from server.results import round_line

    record = SimpleNamespace(round=3, val_loss=0.7, val_metrics={}, cluster_sizes=[5, 5],
                             replies=10, missing=[], declined=0, dropped=[], failures=0, kept=None)
    line = round_line(record, 40, {"median": 1.2, "max": 1.6}, [0.31, 2.5])
    assert "round 3/40" in line and line.endswith("spend(median/max) 1.2/1.6 to-optima 2.50")
    assert "to-optima" not in round_line(record, 40, {}, None)


def test_summary_json_keeps_large_hypotheses_exact_and_still_nulls_non_finite(
        tmp_path: Path) -> None:
    from server.results import write_json_atomic

    rng = np.random.default_rng(0)
    big = rng.standard_normal(1000).tolist()
    bad = [*big[:99], float("nan"), *big[100:]]
    write_json_atomic(tmp_path / "s.json", {"h": [big], "bad": bad}, indent=None)
    back = json.loads((tmp_path / "s.json").read_text())
    assert back["h"] == [big]  # exact: repr of a float round-trips
    # The fast path only vouches for finite lists; a NaN still becomes null, not invalid JSON.
    assert back["bad"][99] is None and back["bad"][:99] == big[:99]
    assert len((tmp_path / "s.json").read_text().splitlines()) == 1
