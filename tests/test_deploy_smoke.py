"""deploy/smoke.sh: the compose deployment in real containers, end to end.

Minutes, and it installs podman where no container engine answers: it runs only
with GPFL_SMOKE=1 (CI sets it, or calls deploy/smoke.sh directly).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SMOKE = Path(__file__).resolve().parent.parent / "deploy" / "smoke.sh"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("GPFL_SMOKE") != "1",
                       reason="set GPFL_SMOKE=1 to run deploy/smoke.sh (containers, minutes)"),
]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("flags", [[], ["--auth"]], ids=["plain", "tls-auth"])
def test_smoke(flags: list[str]) -> None:
    done = subprocess.run([str(SMOKE), *flags], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=880, check=False)
    assert done.returncode == 0, done.stderr[-5000:]
    assert "all checks passed" in done.stderr
