"""The one settings schema: declarations, parsing, owners, and the files generated from it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from settings import (
    SETTINGS,
    SettingError,
    check_node_config,
    check_run_config,
    federation_defaults,
    read,
    setting,
    stricter,
)
from settings.render import markdown

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_run_config_is_exactly_the_federation_defaults() -> None:
    # Prepare / Execute
    app_config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"][
        "config"
    ]
    # Assert: same keys, same values, same types (1 and 1.0 differ for Flower's parser)
    expected = federation_defaults()
    assert app_config == expected
    assert {k: type(v) for k, v in app_config.items()} == {
        k: type(v) for k, v in expected.items()
    }


def test_settings_doc_is_generated_from_the_schema() -> None:
    assert (ROOT / "docs" / "SETTINGS.md").read_text() == markdown(), (
        "docs/SETTINGS.md is stale: run `python -m settings --markdown > docs/SETTINGS.md`"
    )


def test_every_setting_appears_in_the_doc_with_its_owner() -> None:
    doc = markdown()
    for s in SETTINGS.values():
        line = next(line for line in doc.splitlines() if line.startswith(f"| `{s.name}` |"))
        assert (s.owner if s.owner != "both" else "both:") in line


@pytest.mark.parametrize(
    ("key", "raw", "parsed"),
    [("num-rounds", "30", 30), ("num-rounds", 30.0, 30), ("learning-rate", "0.5", 0.5),
     ("learning-rate", 2, 2.0), ("per-layer", "true", True),
     ("mechanism", " gaussian ", "gaussian"),
     ("mechanisms", "laplace, sign", "laplace,sign"), ("seed", -1, -1)],
)
def test_values_are_parsed_to_their_declared_type(key: str, raw: object, parsed: object) -> None:
    value = setting(key).parse(raw)
    assert value == parsed and type(value) is type(parsed)


@pytest.mark.parametrize(
    ("key", "raw", "allowed"),
    [("num-rounds", 0, ">= 1"), ("num-rounds", 2.5, "an integer"), ("num-rounds", True, "integer"),
     ("noise-multiplier", 0.0, "> 0"), ("noise-multiplier", float("nan"), "a number"),
     ("delta", 1.0, "< 1"), ("mechanism", "rot13", "one of laplace | gaussian | sign | none"),
     ("mechanisms", "laplace,rot13", "each one of"), ("per-layer", "yes", "true | false"),
     ("client-epsilons", "1,-5", "positive"), ("optima", "1,2;3", "same length"),
     ("client-name", "../etc", "letters")],
)
def test_bad_values_name_the_key_the_value_and_what_is_allowed(
    key: str, raw: object, allowed: str
) -> None:
    with pytest.raises(SettingError) as caught:
        setting(key).parse(raw, "run config")
    message = str(caught.value)
    assert f"{key}=" in message and allowed in message and repr(raw) in message


def test_run_config_refuses_unknown_and_device_keys_and_reports_all_problems() -> None:
    with pytest.raises(SettingError) as caught:
        check_run_config({"ledger-dir": "/tmp/x", "nosie-multiplier": 5, "num-rounds": -2})
    message = str(caught.value)
    assert "ledger-dir belongs to the device" in message
    assert "'nosie-multiplier'" in message
    assert "num-rounds must be an integer >= 1" in message


def test_run_config_fills_defaults_and_a_device_may_ignore_foreign_keys() -> None:
    values = check_run_config({"num-rounds": 3})
    assert values["num-rounds"] == 3 and values["task"] == SETTINGS["task"].default
    lenient = check_run_config({"ledger-dir": "/tmp/x", "unknown": 1}, ignore_foreign=True)
    assert "ledger-dir" not in lenient and "unknown" not in lenient


def test_node_config_takes_device_and_shared_keys_only() -> None:
    assert check_node_config({"partition-id": "3", "cap-epsilon": 2}) == {
        "partition-id": 3, "cap-epsilon": 2.0,
    }
    with pytest.raises(SettingError, match="num-rounds is a run-config setting"):
        check_node_config({"num-rounds": 3})
    with pytest.raises(SettingError, match="'privacy-budget'"):
        check_node_config({"privacy-budget": 1.0})


def test_stricter_of_request_and_bound_wins() -> None:
    # A noise multiplier is a minimum on the device: the larger wins.
    assert stricter("noise-multiplier", 0.5, 2.0) == 2.0
    assert stricter("noise-multiplier", 8.0, 2.0) == 8.0
    # An epsilon, a delta and a cap are maxima: the smaller wins.
    assert stricter("epsilon", 50.0, 10.0) == 10.0
    assert stricter("delta", 0.5, 1e-5) == 1e-5
    assert stricter("cap-epsilon", 3.0, 10.0) == 3.0
    # A cap request of 0 means "no request": the device's cap applies.
    assert stricter("cap-d-privacy", 0.0, 50.0) == 50.0
    # Only shared settings combine.
    with pytest.raises(ValueError, match="not owned by both"):
        setting("num-rounds").combine(1, 2)


def test_every_shared_setting_has_a_device_default_that_privatizes() -> None:
    shared = {s.name: s for s in SETTINGS.values() if s.owner == "both"}
    assert {"noise-multiplier", "epsilon", "delta", "cap-d-privacy", "cap-epsilon"} <= set(shared)
    for s in shared.values():
        assert s.device_default is not None
        assert s.device_default > 0  # finite caps, positive noise, delta > 0
    # A device with no policy never allows the non-private baseline.
    assert "none" not in SETTINGS["mechanisms"].default.split(",")


def test_read_returns_the_declared_default() -> None:
    assert read({}, "validation-users") == SETTINGS["validation-users"].default
    assert read({"validation-users": "3"}, "validation-users") == 3
