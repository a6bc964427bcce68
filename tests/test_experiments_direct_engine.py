"""The direct engine checks a launch as `gpfl launch` does, before any of the run starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.launcher import LaunchError
from experiments.direct_engine import launch_direct


@pytest.mark.parametrize(("run_config", "policy", "named"), [
    ({"num-rounds": 0}, {}, "num-rounds"),
    ({"task": "no-such-task"}, {}, "no-such-task"),
    ({"clients-per-round": 2, "min-replies": 3}, {}, "min-replies"),
    ({}, {"epsilon": float("nan")}, "launch policy"),
])
def test_a_bad_launch_fails_before_the_run_naming_the_setting(
    tmp_path: Path, run_config: dict[str, object], policy: dict[str, object], named: str
) -> None:
    lines: list[str] = []
    with pytest.raises(LaunchError, match=named):
        launch_direct(run_config, 4, tmp_path, policy, lines.append)
    # Nothing ran: no round line, no summary, no policy handed to devices.
    assert lines == []
    assert not (tmp_path / "summary.json").exists()
    assert not (tmp_path / "policy.toml").exists()
