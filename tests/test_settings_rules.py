"""Each allowed value set is declared once, each cross-setting rule is one function, and the
strategy and local training take their defaults and bounds from the declarations."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import mechanisms.clipping
import mechanisms.laplace
import strategies
import strategies.device_keys
import strategies.replies
from mechanisms import GaussianMechanism
from server.settings import RunSettings
from settings import AGGREGATIONS, CLIP_MODES, MECHANISMS, SETTINGS, SettingError
from settings.rules import (
    check_quorum,
    check_run_rules,
    check_sigma_declared,
    check_sign_single_model,
    declares_sigma,
)
from strategies import ClusteredStrategy
from strategies.server_update import ServerUpdate
from tasks.training import check_training_args


def test_the_value_sets_are_the_declarations() -> None:
    assert SETTINGS["aggregation"].choices is AGGREGATIONS
    assert SETTINGS["clip-mode"].choices is CLIP_MODES
    assert SETTINGS["mechanism"].choices is MECHANISMS
    assert strategies.AGGREGATIONS is AGGREGATIONS
    assert strategies.replies.MECHANISMS is MECHANISMS
    assert strategies.device_keys.SAMPLE_BY is SETTINGS["sample-by"].choices
    # mechanisms imports no gpfl package (the import contract): its implemented clip modes and
    # calibrations are its own tuples, which must be the declared ones.
    assert mechanisms.clipping.CLIP_MODES == CLIP_MODES
    assert mechanisms.laplace.CALIBRATIONS == SETTINGS["calibration"].choices


@pytest.mark.parametrize("mode", CLIP_MODES)
def test_every_declared_clip_mode_is_implemented(mode: str) -> None:
    # The declared tuple is a copy of the implemented one (the import contract): each of its
    # modes has a sensitivity, and a clipping mechanism takes it.
    assert mechanisms.clipping.l2_sensitivity(mode, 1.0, 4) > 0.0
    mechanism = GaussianMechanism(clip=1.0, clip_mode=mode, epsilon=1.0, delta=1e-5,
                                  planned_releases=1)
    assert mechanism.clip_mode == mode


def test_the_strategy_defaults_are_the_declarations() -> None:
    params = inspect.signature(ClusteredStrategy).parameters
    checked = 0
    for name, param in params.items():
        key = name.replace("_", "-")
        if key in SETTINGS and param.default is not inspect.Parameter.empty:
            if param.default is None:  # an object built from the declarations
                continue
            assert param.default == SETTINGS[key].default, name
            checked += 1
    assert checked == 8  # min-replies, round-timeout, aggregation, ... patience, persistence
    # The server update, when none is given, is the declared one.
    declared = ServerUpdate(*(SETTINGS[k].default for k in (
        "server-update", "server-step", "anneal-after", "anneal-rounds", "reseed-after",
        "plateau-factor")))
    assert ServerUpdate() == declared
    assert params["patience"].default == SETTINGS["patience"].default


@pytest.mark.parametrize("arg", ["epochs", "learning_rate", "batch_size"])
def test_local_training_takes_its_bounds_from_the_declarations(arg: str) -> None:
    declared = SETTINGS[{"epochs": "local-epochs", "learning_rate": "learning-rate",
                         "batch_size": "batch-size"}[arg]]
    ok = {"epochs": 1, "learning_rate": 0.1, "batch_size": 1}
    assert declared.minimum is not None
    edge = declared.type(declared.minimum)
    if declared.open_minimum:
        with pytest.raises(ValueError, match=rf"^{arg} must be .*\(the {declared.name} setting\)"):
            check_training_args(**{**ok, arg: edge})
    else:
        check_training_args(**{**ok, arg: edge})
        check_training_args(**{**ok, arg: np.int64(edge)})
        with pytest.raises(ValueError, match=rf"{arg}={edge - 1}"):
            check_training_args(**{**ok, arg: edge - 1})
    with pytest.raises(ValueError, match=arg):
        check_training_args(**{**ok, arg: "1"})


def _run(**overrides: object) -> dict:
    return {"mechanism": "laplace", "num-hypotheses": 2, "aggregation": "mean",
            "calibration": "neighbourhood", "min-replies": 1, "clients-per-round": 7,
            **overrides}


@pytest.mark.parametrize(
    ("overrides", "rule", "match"),
    [
        ({"mechanism": "sign"}, lambda v: check_sign_single_model(v["mechanism"],
                                                                   v["num-hypotheses"]),
         "num-hypotheses=1, got num-hypotheses=2"),
        ({"aggregation": "weighted"}, lambda v: check_sigma_declared(
            v["aggregation"], v["mechanism"], v["calibration"]), "aggregation='weighted'"),
        ({"min-replies": 8}, lambda v: check_quorum(v["min-replies"], v["clients-per-round"]),
         "min-replies=8 can never be reached"),
    ],
)
def test_each_rule_is_one_function_used_by_every_reader(overrides, rule, match) -> None:
    rule(_run())
    with pytest.raises(SettingError, match=match):
        rule(_run(**overrides))
    with pytest.raises(SettingError, match=match):
        check_run_rules(_run(**overrides))
    # The ServerApp's settings apply the same function.
    with pytest.raises(SettingError, match=match):
        RunSettings.from_run_config({**overrides, "clients-per-round": 7})


def test_the_strategy_applies_the_sign_rule() -> None:
    hyp = [[np.zeros(2, np.float32)], [np.ones(2, np.float32)]]
    with pytest.raises(SettingError, match="num-hypotheses=1, got num-hypotheses=2"):
        ClusteredStrategy(initial_hypotheses=hyp, clients_per_round=2, release="sign")


def test_sigma_is_declared_by_exactly_the_data_independent_releases() -> None:
    assert declares_sigma("gaussian", "neighbourhood") and declares_sigma("sign", "fixed")
    assert declares_sigma("laplace", "fixed")
    assert not declares_sigma("laplace", "neighbourhood") and not declares_sigma("none", "fixed")
