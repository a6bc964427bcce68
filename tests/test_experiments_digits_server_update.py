"""The digits server-update experiment: its arms differ only in the update, and its claims."""

from __future__ import annotations

from pathlib import Path

from deploy.quickstart import ROBUST_CLUSTERS
from experiments.core.common import Context
from experiments.reproductions.digits_server_update import (
    TOLERANCE,
    UPDATES,
    grid,
    no_worse,
    section,
)


def test_the_arms_of_a_seed_differ_only_in_the_update_or_the_aggregation(tmp_path: Path) -> None:
    ctx = Context("digits-server-update", out=tmp_path, cache=tmp_path / "cache",
                  profile="quick")

    cells = grid(ctx)

    # 5 seeds × ν ∈ {1, 5} × three arms, each seed with its own data draw (data-seed = seed).
    assert len(cells) == 30
    arms: dict[tuple[float, int], dict[str, dict[str, object]]] = {}
    for cell in cells:
        assert cell.spec is not None
        config = dict(cell.spec.config)
        assert config["data-seed"] == config["seed"] == cell.keys["seed"]
        assert config["task"] == "digits" and config["num-hypotheses"] == 2
        arms.setdefault((cell.keys["nu"], cell.keys["seed"]), {})[cell.keys["update"]] = config

    def differing(a: dict[str, object], b: dict[str, object]) -> set[str]:
        return {key for key in a.keys() | b.keys() if a.get(key) != b.get(key)}

    for arm in arms.values():
        papers, plateau, gpfl = arm["papers"], arm["plateau"], arm["gpfl"]
        assert differing(papers, plateau) == {"server-update", "reseed-after"}
        assert differing(plateau, gpfl) == {"cluster-aggregator", "persistence-threshold"}
        assert papers["server-update"] == "mean" and plateau["server-update"] == "plateau"
        assert papers["cluster-aggregator"] == plateau["cluster-aggregator"] == "mean"
        # gpfl is what `gpfl launch` runs from 10 SuperNodes.
        assert gpfl["cluster-aggregator"] == ROBUST_CLUSTERS["cluster-aggregator"]
        assert gpfl["persistence-threshold"] == ROBUST_CLUSTERS["persistence-threshold"] > 0
    assert set(UPDATES) == {"papers", "plateau", "gpfl"}


def test_no_worse_reads_the_lower_end_of_the_paired_interval() -> None:
    assert "no worse" in no_worse("x", 0.0, TOLERANCE / 2, 5)
    assert "and better" in no_worse("x", 0.05, 0.01, 5)
    assert "**worse**" in no_worse("x", -0.05, 0.01, 5)
    assert "not shown to be no worse" in no_worse("x", -0.01, 0.05, 5)
    assert "not claimed" in no_worse("x", 0.0, float("nan"), 1)


def _row(nu: float, update: str, seed: int, accuracy: float, final: float) -> dict[str, str]:
    return {"nu": str(nu), "update": update, "seed": str(seed), "accuracy": str(accuracy),
            "final_accuracy": str(final), "mean_accuracy": str(accuracy - 0.1),
            "best_round": "20", "rounds": "30", "median_spend": "12", "max_spend": "12"}


def test_section_pairs_by_seed() -> None:
    # plateau − papers per seed: +0.01, +0.02, +0.03 (delivered); −0.10 each (final).
    rows = [_row(5.0, "papers", s, 0.80, 0.80) for s in range(3)]
    rows += [_row(5.0, "plateau", s, 0.81 + 0.01 * s, 0.70) for s in range(3)]

    text = "\n".join(section(rows))

    assert "| 5 | papers | 0.800 ± 0.000 (3) | 0.800 ± 0.000 (3) |" in text
    assert "ν = 5, delivered accuracy: +0.020 [" in text
    assert "ν = 5, final accuracy: -0.100 [-0.100, -0.100], n = 3; **worse**" in text
