"""Empirical privacy: each mechanism's charged ε against an empirical lower bound on it.

For every mechanism gpfl releases with and a small grid of its parameter, the audit of
`experiments.audits.privacy_audit` runs the real mechanism object many times on two neighbouring
inputs (k = 1, and k = 2 with data sets that choose different hypotheses), bounds ε from below
at 95 % confidence, and sets the bound beside the ledger's charge and the law's exact ε
(``exact``: what an unbounded number of trials could approach). The ``power`` rows inject the
accounting errors the regression test (tests/test_privacy_audit.py) must catch and show the
bound each reaches; the ``catch-rate`` rows repeat the test's audits under three of them over
fresh seeds and count how often the error is caught (the test's power), and the
``false-positive`` rows repeat its tight Laplace and DP-SGD audits and count how often a
correct mechanism would fail them. The record-level mode (``dpsgd``) is audited with crafted
canary records in or out of a device's data (`experiments.audits.record_audit`), at the relation the
device declares (add/remove or replace-one), with one and several steps, Poisson sampling and
the k = 2 hypothesis choice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import numpy as np

from experiments.audits import privacy_audit as pa
from experiments.audits import privacy_report
from experiments.audits import record_audit as ra
from experiments.core.common import Context
from experiments.core.runner import Cell, Experiment
from experiments.core.sanity import within
from experiments.core.tables import fmt

NAME = "empirical-privacy"
COLUMNS = ("kind", "scenario", "mechanism", "k", "parameter", "delta", "unit", "charged",
           "exact", "epsilon_lb", "confidence", "trials", "tpr", "fpr", "exceed_rate", "repeats",
           "seed")
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"laplace": 100_000, "gaussian": 1_000_000, "sign": 100_000, "dpsgd": 1_000_000,
             "choice": 20_000, "single": 20_000, "repeats": 500, "power_repeats": 200},
    "quick": {"laplace": 20_000, "gaussian": 100_000, "sign": 20_000, "dpsgd": 100_000,
              "choice": 2_000, "single": 4_000, "repeats": 100, "power_repeats": 50},
    # The tests: small grids, the injected errors at the regression test's own sizes only.
    "smoke": {"laplace": 2_000, "gaussian": 4_000, "sign": 2_000, "dpsgd": 4_000,
              "choice": 200, "single": 200, "repeats": 5, "power_repeats": 0},
}
#: The regression test's own settings (tests/test_privacy_audit.py).
TEST_DELTA, TEST_LAPLACE, TEST_GAUSSIAN = 0.01, 4_000, 20_000
TEST_RECORD, TEST_CHOICE = 10_000, 200
Scenario = pa.Scenario | ra.RecordScenario


def _scenarios(profile: dict[str, Any]) -> list[tuple[str, Callable[[], Scenario], int,
                                                      float, int]]:
    """(label, scenario, trials, parameter, k) of the audit grid."""
    out: list[tuple[str, Callable[[], Scenario], int, float, int]] = []
    for eps in (0.5, 1.0, 2.0):
        out.append((f"laplace fixed eps={eps:g}", functools.partial(pa.laplace_fixed, eps),
                    profile["laplace"], eps, 1))
    for nu in (0.5, 1.0, 2.0):
        out.append((f"laplace neighbourhood nu={nu:g}",
                    functools.partial(pa.laplace_neighbourhood, nu), profile["laplace"], nu, 1))
    for k in (1, 2):
        for eps in (0.5, 1.0, 2.0, 4.0):
            out.append((f"gaussian k={k} eps={eps:g}",
                        functools.partial(pa.gaussian, eps, delta=1e-5, k=k),
                        profile["gaussian"], eps, k))
        for eps in (1.0, 4.0):
            out.append((f"sign k={k} eps={eps:g}", functools.partial(pa.sign, eps, delta=1e-5, k=k),
                        profile["sign"], eps, k))
    for s in _record_grid():
        trials = profile["choice" if s.k == 2 else "single" if s.canaries == 1 else "dpsgd"]
        out.append((s.name, functools.partial(_given, s), trials, s.noise_multiplier, s.k))
    return out


def _given(scenario: ra.RecordScenario) -> ra.RecordScenario:
    return scenario


def _record(relation: str, nu: float, *, q: float = 1.0, steps: int = 1, k: int = 1,
            canaries: int = 100, delta: float = 1e-5) -> ra.RecordScenario:
    name = f"dpsgd {relation} nu={nu:g} q={q:g} T={steps}" + (f" k={k}" if k > 1 else "") + (
        f", one canary per release, delta={delta:g}" if canaries == 1 else "")
    return ra.RecordScenario(name, relation, nu, steps, q, k, canaries, delta)


def _record_grid() -> list[ra.RecordScenario]:
    """DP-SGD: ν at one step and both relations; several steps; sampling; the choice; K = 1."""
    grid = [_record(rel, nu) for rel in ("add-remove", "replace-one") for nu in (0.5, 1.0, 2.0)]
    grid += [_record("add-remove", 2.0, steps=4),
             *(_record(rel, 1.0, q=0.5) for rel in ("add-remove", "replace-one")),
             _record("add-remove", 1.0, k=2),
             _record("add-remove", 1.0, canaries=1, delta=TEST_DELTA)]
    return grid


def _run_audit(scenario: Scenario, *, trials: int, seed: int) -> pa.AuditResult:
    if isinstance(scenario, ra.RecordScenario):
        return ra.audit_record(scenario, trials=trials, seed=seed)
    return pa.audit(scenario, trials=trials, seed=seed)


@contextlib.contextmanager
def _halved_gaussian() -> Iterator[None]:
    from mechanisms.gaussian import _ClippedGaussianBase

    original = _ClippedGaussianBase._noise_sigma
    with mock.patch.object(_ClippedGaussianBase, "_noise_sigma",
                           lambda self, n, spread: original(self, n, spread) / 2), \
            pa.release_check_off():
        yield


@contextlib.contextmanager
def _halved_laplace() -> Iterator[None]:
    from mechanisms import laplace

    sample = laplace.sample_euclidean_laplace
    with mock.patch.object(laplace, "sample_euclidean_laplace",
                           lambda n, epsilon, rng: sample(n, 2 * epsilon, rng)), \
            pa.release_check_off():
        yield


@contextlib.contextmanager
def _spread_left_out() -> Iterator[None]:
    from mechanisms import GaussianMechanism

    with mock.patch.object(GaussianMechanism, "_CENTRED_ON_REFERENCE", False), \
            pa.release_check_off():
        yield


@contextlib.contextmanager
def _unclipped() -> Iterator[None]:
    with mock.patch("mechanisms.gaussian.clip_l2", lambda arrays, c: list(arrays)), \
            pa.release_check_off():
        yield


def _far_sign() -> pa.Scenario:
    return dataclasses.replace(pa.sign(1.0, delta=TEST_DELTA),
                               a=([np.zeros(1)], [np.full(1, -10.0)]),
                               b=([np.zeros(1)], [np.full(1, 10.0)]))


#: The injected errors of the regression test: (label, context, scenario, trials).
POWER: tuple[tuple[str, Callable[[], Any], Callable[[], Scenario], int], ...] = (
    ("gaussian, noise halved", _halved_gaussian,
     lambda: pa.gaussian(1.0, delta=TEST_DELTA), TEST_GAUSSIAN),
    # The same error at the default δ = 1e-5: the tails it shows in need ten times the releases.
    ("gaussian at delta=1e-5, noise halved", _halved_gaussian,
     lambda: pa.gaussian(1.0, delta=1e-5), 200_000),
    ("laplace fixed, noise halved", _halved_laplace, lambda: pa.laplace_fixed(1.0),
     TEST_LAPLACE),
    ("laplace neighbourhood, noise halved", _halved_laplace,
     lambda: pa.laplace_neighbourhood(1.0), TEST_LAPLACE),
    ("gaussian k=2, spread left out of sigma", _spread_left_out,
     lambda: pa.gaussian(1.0, delta=TEST_DELTA, k=2), TEST_GAUSSIAN),
    ("sign, update not clipped", _unclipped, _far_sign, TEST_GAUSSIAN),
    ("dpsgd add-remove, noise multiplier halved", ra.halved_noise,
     lambda: _record("add-remove", 1.0, delta=TEST_DELTA), TEST_RECORD),
    ("dpsgd replace-one charged as add-remove", ra.replace_one_charged_as_add_remove,
     lambda: _record("replace-one", 1.0, delta=TEST_DELTA), TEST_RECORD),
    ("dpsgd k=2, choice without noise and not charged", ra.uncharged_choice,
     lambda: _record("add-remove", 1.0, k=2, delta=TEST_DELTA), TEST_CHOICE),
)


#: The injected errors whose catch rate is measured over fresh seeds.
CATCH_RATE = ("gaussian, noise halved", "laplace fixed, noise halved",
              "laplace neighbourhood, noise halved", "dpsgd add-remove, noise multiplier halved",
              "dpsgd replace-one charged as add-remove")
#: The regression test's tight audits whose false-positive rate is measured over fresh seeds.
FALSE_POSITIVE: tuple[tuple[str, Callable[[], Scenario], int], ...] = (
    ("laplace fixed eps=1", lambda: pa.laplace_fixed(1.0), TEST_LAPLACE),
    ("laplace neighbourhood nu=1", lambda: pa.laplace_neighbourhood(1.0), TEST_LAPLACE),
    ("dpsgd add-remove nu=1 q=1 T=1, delta=0.01",
     lambda: _record("add-remove", 1.0, delta=TEST_DELTA), TEST_RECORD),
)


def grid(ctx: Context) -> list[Cell]:
    """List the audit grid, then the injected errors, then the false-positive repeats."""
    profile = PROFILES[ctx.profile]
    seed = ctx.pick_seeds([0])[0]
    cells = [Cell(label, {"kind": "audit", "scenario": label, "k": k, "parameter": p,
                          "seed": seed, "make": make, "trials": trials})
             for label, make, trials, p, k in _scenarios(profile)]
    cells += [Cell(label, {"kind": "power", "scenario": label, "k": 2 if "k=2" in label else 1,
                           "parameter": 1.0, "seed": seed, "make": make, "trials": trials,
                           "inject": inject})
              for label, inject, make, trials in POWER
              if ctx.profile != "smoke" or trials <= TEST_GAUSSIAN]
    # The floating-point leak that rounded scores once kept out of the audit: none is rounded.
    cells.append(Cell("float-leak laplace neighbourhood nu=2",
                      {"kind": "float-leak", "scenario": "laplace neighbourhood nu=2, scores "
                       "not rounded", "k": 1, "parameter": 2.0, "seed": seed,
                       "make": functools.partial(pa.laplace_neighbourhood, 2.0),
                       "trials": profile["laplace"]}))
    for label, make, trials in FALSE_POSITIVE:
        cells.append(Cell(f"false-positive {label}",
                          {"kind": "false-positive", "scenario": label, "k": 1,
                           "parameter": 1.0, "seed": seed, "make": make,
                           "trials": trials, "repeats": profile["repeats"]}))
    # The power over fresh seeds of the regression test's own audits (δ = 0.01 and Laplace).
    for label, inject, make, trials in POWER if profile["power_repeats"] else ():
        if label not in CATCH_RATE:
            continue
        cells.append(Cell(f"catch-rate {label}",
                          {"kind": "catch-rate", "scenario": label, "k": 1, "parameter": 1.0,
                           "seed": seed, "make": make, "trials": trials, "inject": inject,
                           "repeats": profile["power_repeats"]}))
    return cells


def perform(ctx: Context, cell: Cell) -> dict[str, Any]:
    """Run one audit (under its injected error, or over many seeds)."""
    keys = cell.keys
    seed, trials = int(keys["seed"]), int(keys["trials"])
    if keys["kind"] in ("false-positive", "catch-rate"):
        repeats = int(keys["repeats"])
        inject = keys["inject"]() if keys["kind"] == "catch-rate" else contextlib.nullcontext()
        with inject:
            results = [_run_audit(keys["make"](), trials=trials, seed=1000 + r)
                       for r in range(repeats)]
        exceed = sum(not r.consistent for r in results) / repeats
        return {"result": results[0], "exceed_rate": exceed, "trials": trials,
                "repeats": repeats}
    context = keys["inject"]() if keys["kind"] == "power" else contextlib.nullcontext()
    with context:
        result = _run_audit(keys["make"](), trials=trials, seed=seed)
    return {"result": result, "exceed_rate": None, "trials": trials, "repeats": None}


def measure(cell: Cell, out: dict[str, Any]) -> dict[str, Any]:
    """Return the row of one audit."""
    r: pa.AuditResult = out["result"]
    delta = r.unit.removeprefix("at delta=") if r.unit.startswith("at") else 0.0
    return {
        "kind": cell.keys["kind"], "scenario": cell.keys["scenario"], "mechanism": r.mechanism,
        "k": cell.keys["k"], "parameter": cell.keys["parameter"], "delta": delta,
        "unit": r.unit, "charged": r.charged, "exact": r.exact, "epsilon_lb": r.epsilon_lb,
        "confidence": r.bound.confidence, "trials": out["trials"], "tpr": r.bound.tpr,
        "fpr": r.bound.fpr, "exceed_rate": out["exceed_rate"], "repeats": out["repeats"],
        "seed": cell.keys["seed"],
    }


def table(rows: list[dict[str, str]]) -> list[str]:
    """Markdown: the audit grid, the injected errors, and the false-positive rates."""
    lines = ["| mechanism, setting | unit | charged ε | exact ε of the law | empirical lower "
             "bound (95 %) | releases per input | within the charge |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in (r for r in rows if r["kind"] == "audit"):
        ok = "yes" if float(r["epsilon_lb"]) <= float(r["charged"]) else "**NO**"
        lines.append(f"| {r['scenario']} | {r['unit']} | {fmt(float(r['charged']))} | "
                     f"{fmt(float(r['exact']))} | {fmt(float(r['epsilon_lb']))} | "
                     f"{int(r['trials']):,} | {ok} |")
    power = [r for r in rows if r["kind"] == "power"]
    if power:
        lines += ["", "Injected accounting errors (the regression test's; each must be caught, "
                  "i.e. its lower bound must exceed the charge):", "",
                  "| injected error | charged ε | empirical lower bound (95 %) | releases per "
                  "input | caught |", "| --- | --- | --- | --- | --- |"]
        for r in power:
            caught = "yes" if float(r["epsilon_lb"]) > float(r["charged"]) else "**NO**"
            lines.append(f"| {r['scenario']} | {fmt(float(r['charged']))} | "
                         f"{fmt(float(r['epsilon_lb']))} | {int(r['trials']):,} | {caught} |")
    for r in (r for r in rows if r["kind"] == "catch-rate"):
        lines += ["", f"Power of the regression test's audit against \"{r['scenario']}\" "
                  f"({int(r['trials']):,} releases per input, fresh seeds): caught in "
                  f"{fmt(100 * float(r['exceed_rate']))} % of {r['repeats']} repeats."]
    for r in (r for r in rows if r["kind"] == "float-leak"):
        leaked = float(r["epsilon_lb"]) > float(r["charged"])
        lines += ["", f"The last bit of the release ({r['scenario']}, "
                  f"{int(r['trials']):,} releases per input): lower bound "
                  f"{fmt(float(r['epsilon_lb']))} per unit against a charge of "
                  f"{fmt(float(r['charged']))}. "
                  + ("That is the floating-point leak of a release computed as fl(x + ρ), whose "
                     "float lattice differs between the two inputs (Mironov 2012): these rows "
                     "were made before releases were rounded onto a public grid, which closes "
                     "it" if leaked else
                     "The release lies on a public grid and leaves as float32")
                  + " (the low-bit audit on the grid: PRIVACY.md, \"Floating point\")."]
    fp = [r for r in rows if r["kind"] == "false-positive"]
    for r in fp:
        lines += ["", f"False positives of the regression test's {r['scenario']} audit "
                  f"({int(r['trials']):,} releases per input, 95 % confidence), correct "
                  f"mechanism, fresh seeds: the bound exceeded the charge in "
                  f"{fmt(100 * float(r['exceed_rate']))} % of {r['repeats']} repeats."]
    return lines


def audit_section(rows: list[dict[str, str]]) -> list[str]:
    """Return the Markdown of this experiment's section of docs/RESULTS.md from its rows."""
    return [privacy_report.INTRO, "", privacy_report.MECHANISMS_TEXT, "",
            privacy_report.RECORD_TEXT, "", *table(rows)]


EXPERIMENT = Experiment(NAME, COLUMNS, grid, measure, shown=("charged", "epsilon_lb"),
                        perform=perform, report=audit_section,
                        paper="004 ch. 4: empirical ε against the charge",
                        engine="in-process", profiles=PROFILES,
                        checks=tuple(within(("tpr", "fpr", "confidence", "exceed_rate"), 0, 1)))
