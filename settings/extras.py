"""The optional parts of gpfl: what each extra installs and which settings need it.

``pip install gpfl`` runs federations of real SuperNodes (and the ``direct`` engine) on the
built-in synthetic, fairness, hospital, digits and FEMNIST tasks with every device-level
mechanism (d-privacy, Gaussian, sign). The heavier dependencies come with an extra, named where
a feature needs it (``pip install "gpfl[dpsgd,tabular]"``):

==============  =====================================================  =========================
extra           what it gives                                          what it installs
==============  =====================================================  =========================
``simulation``  Flower's Simulation Engine (``--engine simulation``)   Ray (``flwr[simulation]``)
``dpsgd``       record-level DP-SGD (``mechanism=dpsgd``)              Opacus
``tabular``     the tabular task (``task=tabular``: CSV, Parquet)      pandas, PyArrow, Flower
                                                                       Datasets, datasets
``tracking``    per-round metrics to TensorBoard or MLflow             tensorboard, mlflow-skinny
                (``log-to``)
``experiments`` the papers' experiments (``python -m experiments``)    all of the above but
                                                                       tracking, scikit-image
==============  =====================================================  =========================

A feature whose extra is missing fails when the run starts, naming the setting, the extra and
the modules it did not find; a device asked for a task or mechanism whose extra it lacks declines
the round with a fixed reason, before anything is built, read or charged. Which modules an extra
provides is checked with :func:`importlib.util.find_spec`, which imports nothing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from settings.checks import LOG_TO_PACKAGES, parse_log_to

__all__ = [
    "EXTRAS",
    "Extra",
    "MissingExtraError",
    "check_run_extras",
    "extras_for_device",
    "extras_for_run",
    "missing_modules",
    "require_extra",
]


@dataclass(frozen=True)
class Extra:
    """One optional dependency group of the ``gpfl`` distribution.

    Attributes
    ----------
    name : str
        The extra's name in ``pip install "gpfl[NAME]"`` (pyproject.toml's
        ``[project.optional-dependencies]``).
    modules : tuple of str
        The top-level modules it provides: the extra counts as installed when all are found.
    gives : str
        What it is for, in the words an error message uses.
    """

    name: str
    modules: tuple[str, ...]
    gives: str


_SIMULATION = Extra("simulation", ("ray",), "Flower's Simulation Engine")
_DPSGD = Extra("dpsgd", ("opacus",), "record-level DP-SGD")
_TABULAR = Extra("tabular", ("pandas", "pyarrow", "datasets", "flwr_datasets"), "the tabular task")

#: Every extra a feature can need; the tests hold it against pyproject.toml. ``experiments``
#: holds the three extras before it, as its requirements do, and scikit-image.
EXTRAS: dict[str, Extra] = {
    extra.name: extra
    for extra in (
        _SIMULATION,
        _DPSGD,
        _TABULAR,
        Extra("tracking", ("tensorboard", "mlflow"), "per-round metrics to TensorBoard or MLflow"),
        Extra("experiments", (*_SIMULATION.modules, *_DPSGD.modules, *_TABULAR.modules,
                              "skimage"), "the papers' experiments"),
    )
}


class MissingExtraError(RuntimeError):
    """A feature was asked for whose optional dependencies are not installed."""


def missing_modules(name: str, modules: tuple[str, ...] | None = None) -> list[str]:
    """Return the modules of extra ``name`` (or just ``modules`` of it) that are not installed.

    Raises
    ------
    KeyError
        If ``name`` is not an extra of :data:`EXTRAS`.
    """
    wanted = EXTRAS[name].modules if modules is None else modules
    return [module for module in wanted if importlib.util.find_spec(module) is None]


def require_extra(name: str, feature: str, modules: tuple[str, ...] | None = None) -> None:
    """Fail unless extra ``name`` (or the listed ``modules`` of it) is installed.

    Parameters
    ----------
    name : str
        The extra, a key of :data:`EXTRAS`.
    feature : str
        What asked for it, as the user wrote it (``"task='tabular'"``, ``"--engine
        simulation"``): the message starts with it.
    modules : tuple of str, optional
        Only these of the extra's modules are needed (``log-to=tensorboard:...`` needs
        tensorboard, not MLflow).

    Raises
    ------
    MissingExtraError
        Naming the feature, the extra, the command that installs it and the missing modules.
    """
    missing = missing_modules(name, modules)
    if missing:
        raise MissingExtraError(
            f"{feature} needs gpfl[{name}] ({EXTRAS[name].gives}): pip install "
            f"\"gpfl[{name}]\" (not installed here: {', '.join(missing)})")


def extras_for_device(values: Mapping[str, Any]) -> list[tuple[str, str, None]]:
    """Return what a run's task and mechanism need on a device: ``(extra, "setting=value", None)``.

    A device asked for them without the extra declines the round before anything is built,
    read or charged (`client.settings.ClientSettings.resolve`).
    """
    needs: list[tuple[str, str, None]] = []
    if values.get("task") == "tabular":
        needs.append(("tabular", "task='tabular'", None))
    if values.get("mechanism") == "dpsgd":
        needs.append(("dpsgd", "mechanism='dpsgd'", None))
    return needs


def extras_for_run(values: Mapping[str, Any]) -> list[tuple[str, str, tuple[str, ...] | None]]:
    """Return what a checked run config needs: ``(extra, "setting=value", modules)`` each.

    ``modules`` is ``None`` for the whole extra. The run's task and mechanism
    (:func:`extras_for_device`) and ``log-to`` (the ServerApp's) are read; the engine is the
    launcher's to check (it is not a run-config setting).
    """
    needs: list[tuple[str, str, tuple[str, ...] | None]] = [*extras_for_device(values)]
    log_to = str(values.get("log-to") or "")
    kinds = [kind for kind, _ in parse_log_to(log_to)]
    if kinds:
        needs.append(("tracking", f"log-to={log_to!r}",
                      tuple(LOG_TO_PACKAGES[kind] for kind in kinds)))
    return needs


def check_run_extras(values: Mapping[str, Any]) -> None:
    """Fail unless everything a checked run config asks for is installed here.

    Raises
    ------
    MissingExtraError
        For the first missing extra (:func:`require_extra`'s message).
    """
    for name, feature, modules in extras_for_run(values):
        require_extra(name, feature, modules)
