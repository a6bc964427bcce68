"""The import contract (pyproject's ``[tool.importlinter]``), the real import graph and the
picture of it in docs/ARCHITECTURE.md agree; the contract fails when a forbidden import is added.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
PACKAGES: list[str] = CONFIG["root_packages"]
CONTRACTS: list[dict] = CONFIG["contracts"]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _layers() -> list[list[str]]:
    (layers,) = (c["layers"] for c in CONTRACTS if c["type"] == "layers")
    return [[name.strip() for name in layer.split("|")] for layer in layers]


def forbidden_by_contract(importer: str, imported: str) -> str | None:
    """Name the contract that forbids ``importer`` -> ``imported`` (packages), or None."""
    for contract in CONTRACTS:
        if contract["type"] == "forbidden":
            if importer in contract["source_modules"] and imported in contract["forbidden_modules"]:
                return contract["id"]
    level = {name: i for i, layer in enumerate(_layers()) for name in layer}
    if importer in level and imported in level and level[importer] >= level[imported]:
        return "layers"
    return None


def real_arrows() -> dict[str, set[str]]:
    """Which gpfl packages each gpfl package imports, from the code (grimp, as lint-imports)."""
    graph = grimp.build_graph(*PACKAGES)
    return {
        a: {b for b in PACKAGES if b != a
            and graph.direct_import_exists(importer=a, imported=b, as_packages=True)}
        for a in PACKAGES
    }


def render_layers() -> str:
    """The layer picture, drawn from the contract."""
    rows = [" | ".join(layer) for layer in _layers()]
    return "\n    ↓\n".join(rows)


def render_arrows(arrows: dict[str, set[str]]) -> str:
    """One line per package, in layer order: what it imports."""
    order = [name for layer in _layers() for name in layer]
    width = max(map(len, order))
    return "\n".join(
        f"{name:<{width}} -> {', '.join(sorted(arrows[name])) or '(no gpfl package)'}"
        for name in order
    )


def _doc_block(marker: str) -> str:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    match = re.search(rf"<!-- {marker} -->\n```\n(.*?)\n```", text, re.S)
    assert match, f"docs/ARCHITECTURE.md has no ```-block after <!-- {marker} -->"
    return match.group(1)


def test_every_package_is_in_the_contract() -> None:
    found = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert found == set(PACKAGES)
    assert sorted(name for layer in _layers() for name in layer) == sorted(PACKAGES)


def test_every_private_module_below_experiments_is_forbidden_to_them() -> None:
    # A private module (its name starts with one underscore) added to a package must join the
    # contract that keeps experiments on the public API.
    private = {f"{p.parent.name}.{p.stem}" for package in PACKAGES if package != "experiments"
               for p in (ROOT / package).glob("_*.py")
               if not p.stem.startswith("__")}
    (contract,) = (c for c in CONTRACTS if c["id"] == "experiments-public")
    assert private and set(contract["forbidden_modules"]) == private


def test_the_real_imports_keep_the_contract() -> None:
    broken = {
        (a, b): forbidden_by_contract(a, b) for a, bs in real_arrows().items() for b in bs
    }
    assert {k: v for k, v in broken.items() if v} == {}


def test_architecture_md_draws_the_contract_and_the_real_arrows() -> None:
    assert _doc_block("layers") == render_layers(), (
        "docs/ARCHITECTURE.md's layers differ from the contract; they should read:\n"
        + render_layers()
    )
    arrows = real_arrows()
    assert _doc_block("arrows") == render_arrows(arrows), (
        "docs/ARCHITECTURE.md's arrows differ from the code's imports; they should read:\n"
        + render_arrows(arrows)
    )


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("mechanisms/ledger.py", "import flwr", "mechanisms imports no other gpfl package"),
        ("mechanisms/laplace.py", "import settings", "mechanisms imports no other gpfl package"),
        ("strategies/sampling.py", "import client", "Layers"),
        ("client/policy.py", "import deploy.cli", "Layers"),
        ("server/app.py", "import deploy.launcher", "Layers"),
        ("client/supernode.py", "import deploy.processes", "Layers"),
        ("experiments/core/claims.py", "import mechanisms._numeric",
         "experiments imports no private module"),
        ("tasks/base.py", "import experiments", "Layers"),
        ("strategies/norms.py", "import tasks", "strategies works on arrays"),
        ("experiments/core/runner.py", "import experiments.audits.mia",
         "experiments.core imports no experiment"),
        ("experiments/core/report.py", "import experiments.cli",
         "experiments.core imports no experiment"),
        ("experiments/audits/rogue_devices.py",
         "import experiments.reproductions.small_federations",
         "reproductions, audits and benchmarks never import one another"),
        ("experiments/benchmarks/bench_suite.py", "import experiments.audits.privacy_audit",
         "reproductions, audits and benchmarks never import one another"),
        ("experiments/reproductions/leakage.py", "import experiments.cli",
         "No experiment imports the experiments' command line"),
    ],
)
def test_lint_imports_fails_on_a_forbidden_import(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    """The real ``lint-imports`` on a copy of the code with one forbidden import added."""
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    lint = [str(LINT_IMPORTS), "--no-cache", "--no-logo"]
    clean = subprocess.run(lint, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    with (tmp_path / module).open("a") as f:
        f.write(f"\n{line}  # forbidden\n")
    broken = subprocess.run(lint, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    report = broken.stdout.split("Broken contracts", 1)[-1]
    assert contract in report and module.removesuffix(".py").replace("/", ".") in report


@pytest.mark.parametrize(
    ("module", "line", "package"),
    [
        ("experiments/core/tables.py", "import experiments.core.runner", "experiments.core"),
        ("experiments/audits/privacy_report.py", "import experiments.audits.mia",
         "experiments.audits"),
        ("strategies/geometry.py", "import strategies.norms", "strategies"),
    ],
)
def test_lint_imports_fails_on_an_import_cycle(
    tmp_path: Path, module: str, line: str, package: str
) -> None:
    """The real ``lint-imports`` on a copy where a module imports back one that imports it."""
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with (tmp_path / module).open("a") as f:
        f.write(f"\n{line}  # a cycle\n")
    lint = [str(LINT_IMPORTS), "--no-cache", "--no-logo"]
    broken = subprocess.run(lint, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    report = broken.stdout.split("Broken contracts", 1)[-1]
    assert f"No cycles are allowed in {package}." in report, report
