"""Every third-party package the code imports is declared in pyproject.toml.

The imports are read from the source (every ``import`` statement, nested ones too), mapped to
the distributions that provide them with :func:`importlib.metadata.packages_distributions`, and
compared with the declared requirements: the product's packages against ``dependencies`` and its
extras, the tests against those plus the ``dev`` extra. Each extra's modules, as
:data:`settings.extras.EXTRAS` names them for its messages, are the ones its requirements provide.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from settings.extras import EXTRAS

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
    "root_packages"
]


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def imported_top_levels(folders: list[str]) -> dict[str, str]:
    """Top-level module names imported in ``folders`` -> one file importing each."""
    found: dict[str, str] = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def undeclared(folders: list[str], declared: set[str]) -> dict[str, str]:
    """Imported third-party modules whose distribution is not declared, with a file each."""
    providers = metadata.packages_distributions()
    own = {*PACKAGES, "tests", *(path.stem for path in (ROOT / "tests").glob("*.py"))}
    missing = {}
    for module, where in imported_top_levels(folders).items():
        if module in sys.stdlib_module_names or module in own or module == "__future__":
            continue
        dists = {_name(d) for d in providers.get(module, [])}
        if not dists:
            missing[module] = f"{where} (no installed distribution provides it)"
        elif not dists & declared:
            missing[module] = f"{where} (from {', '.join(sorted(dists))})"
    return missing


def extra_requirements(name: str) -> set[str]:
    """The distributions extra ``name`` asks for, its ``gpfl[...]`` references followed."""
    out: set[str] = set()
    for requirement in PROJECT["optional-dependencies"][name]:
        nested = re.fullmatch(r"gpfl\[([a-z,]+)\]", requirement)
        if nested:
            for other in nested.group(1).split(","):
                out |= extra_requirements(other)
        else:
            out.add(_name(requirement))
    return out


CORE = {_name(r) for r in PROJECT["dependencies"]}
EXTRA_NAMES = [e for e in PROJECT["optional-dependencies"] if e != "dev"]
RUNTIME = CORE.union(*(extra_requirements(e) for e in EXTRA_NAMES))
DEV = extra_requirements("dev")


def test_the_product_imports_only_declared_packages() -> None:
    assert undeclared(PACKAGES, RUNTIME) == {}


def test_every_extra_is_named_for_its_messages_with_the_modules_it_installs() -> None:
    # The extras of pyproject.toml and of settings.extras are the same, and each one's modules
    # are provided by its requirements (flwr[simulation] by Ray, an extra of Flower's).
    providers = metadata.packages_distributions()
    assert set(EXTRAS) == set(EXTRA_NAMES)
    for name, extra in EXTRAS.items():
        wanted = extra_requirements(name) | ({"ray"} if name in ("simulation", "experiments")
                                             else set())
        for module in extra.modules:
            assert {_name(d) for d in providers.get(module, [])} & wanted, (name, module)


def test_the_tests_import_only_declared_packages() -> None:
    assert undeclared(["tests"], RUNTIME | DEV) == {}


@pytest.mark.parametrize("module", ["rich", "cryptography", "httpx", "flwr", "torch"])
def test_a_missing_declaration_is_found(module: str) -> None:
    declared = {d for d in RUNTIME if _name(d) != module}
    assert module in undeclared(PACKAGES, declared)


def test_a_test_only_import_is_found() -> None:
    assert "click" in undeclared(["tests"], RUNTIME | {d for d in DEV if d != "click"})
