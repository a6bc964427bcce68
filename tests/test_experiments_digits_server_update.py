"""The digits server-update experiment: its arms differ only in the update, and its claims."""

from __future__ import annotations

from pathlib import Path

from experiments.common import Context
from experiments.digits_server_update import TOLERANCE, UPDATES, grid, no_worse, section


def test_the_two_arms_of_a_seed_differ_only_in_the_server_update(tmp_path: Path) -> None:
    ctx = Context("digits-server-update", out=tmp_path, cache=tmp_path / "cache",
                  profile="quick")

    cells = grid(ctx)

    # 5 seeds × ν ∈ {1, 5} × two updates, each with its own data draw (data-seed = seed).
    assert len(cells) == 20
    pairs: dict[tuple[float, int], dict[str, dict[str, object]]] = {}
    for cell in cells:
        assert cell.spec is not None
        config = dict(cell.spec.config)
        assert config["data-seed"] == config["seed"] == cell.keys["seed"]
        assert config["task"] == "digits" and config["num-hypotheses"] == 2
        pairs.setdefault((cell.keys["nu"], cell.keys["seed"]), {})[cell.keys["update"]] = config
    for arms in pairs.values():
        papers, plateau = arms["papers"], arms["plateau"]
        differing = {key for key in papers.keys() | plateau.keys()
                     if papers.get(key) != plateau.get(key)}
        assert differing == {"server-update", "reseed-after"}
        assert papers["server-update"] == "mean" and plateau["server-update"] == "plateau"
    assert set(UPDATES) == {"papers", "plateau"}


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
