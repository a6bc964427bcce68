"""What every experiment shares: profiles, the context it runs in and a cache of federations.

An experiment's configurations are mostly federations (`FederationSpec`: a run config and a
number of virtual SuperNodes) run one at a time on Flower's Simulation Engine through
`deploy.launcher.launch`; `experiments.core.runner` runs the grid, `experiments.core.tables` turns
the ``summary.json`` files into ``results.csv``.

Runs are cached by content: the run directory of a spec is ``<cache>/<slug>-<hash>`` where the
hash covers the run config and the SuperNode count, and a finished run leaves ``done.json``
there. Running an experiment again (or another experiment that needs the same federation, as
``leakage`` does with ``accuracy-vs-nu``'s runs) reuses it instead of launching it again, so an
interrupted sweep resumes where it stopped. ``--fresh`` ignores the cache.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from mechanisms.atomic_file import write_atomic

__all__ = [
    "DEFAULT_CACHE",
    "DEFAULT_ROOT",
    "EXPERIMENT_RUN_CONFIG",
    "PAPERS_AGGREGATION",
    "PROFILES",
    "Context",
    "FederationSpec",
    "compact_summary",
    "experiment_policy",
    "laplace_or_none",
]

#: Where ``python -m experiments NAME`` writes by default: ``runs/experiments/<name>``.
DEFAULT_ROOT = Path("runs") / "experiments"
#: The shared cache of federation runs.
DEFAULT_CACHE = DEFAULT_ROOT / "_runs"
#: ``full`` follows the papers; ``quick`` finishes in minutes; ``smoke`` is the tests' own.
PROFILES = ("full", "quick", "smoke")
#: What may run an experiment's federations (`Context.engine`).
ENGINES = ("direct", "simulation")
#: What every experiment's federation runs with unless its spec says otherwise: each round's
#: devices are drawn by their names (``client-<partition-id>``), so that runs at one seed that
#: differ only in ν, k or aggregation ask the same devices in the same rounds, and the devices,
#: whose data, batches and seeded noise are keyed on their partition, use the same data. The
#: papers' protocols run their rounds whatever the validation (a model that broke down at a
#: large ν is one of the measurements), so the divergence stop is off. Each cluster is the plain
#: mean of its releases (`PAPERS_AGGREGATION`, the papers' Algorithm 1, asked for explicitly so
#: that a change of the app's defaults cannot change a reproduction) unless the experiment
#: compares aggregations.
PAPERS_AGGREGATION: dict[str, Any] = {"cluster-aggregator": "mean", "persistence-threshold": 0.0}
EXPERIMENT_RUN_CONFIG: dict[str, Any] = {"sample-by": "name", "divergence-factor": 0.0,
                                         **PAPERS_AGGREGATION}
#: Above this many parameters the hypotheses are dropped from a cached summary.json (they
#: are 4 × 83,562 floats for the digits CNN; the experiments never read them).
_KEEP_HYPOTHESES_UP_TO = 1000


@dataclass(frozen=True)
class FederationSpec:
    """One federation: ``supernodes`` virtual SuperNodes and the overrides of the run config.

    Attributes
    ----------
    label : str
        Human-readable name of the configuration (progress lines, run directory).
    run_config : Mapping[str, Any]
        Overrides of ``[tool.flwr.app.config]``.
    supernodes : int
        Virtual SuperNodes (one user each).
    """

    label: str
    run_config: Mapping[str, Any]
    supernodes: int

    @property
    def config(self) -> dict[str, Any]:
        """The run config the federation runs with: `EXPERIMENT_RUN_CONFIG`, then the overrides."""
        return {**EXPERIMENT_RUN_CONFIG, **self.run_config}

    @property
    def key(self) -> str:
        """A content hash of the run config and the SuperNode count."""
        blob = json.dumps({"supernodes": self.supernodes, "run_config": self.config},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def slug(self) -> str:
        """The label made safe for a directory name."""
        keep = "".join(c if c.isalnum() or c in ".-_=" else "-" for c in self.label)
        return "-".join(part for part in keep.split("-") if part)[:80]


@dataclass
class Context:
    """Where an experiment writes, which settings it uses and how it reports.

    Attributes
    ----------
    name : str
        The experiment's name.
    out : Path
        Its output folder: ``results.csv``, ``figures/``, ``meta.json``, ``experiment.log``.
    cache : Path
        The shared cache of federation runs.
    profile : str
        One of `PROFILES`.
    seeds : list of int or None
        Seeds given on the command line (``None``: the profile's).
    fresh : bool
        Re-run federations even when the cache has them.
    data_path : str
        A data file for the experiments that take one (``leakage``: the hospital CSV).
    timeout : float
        Seconds a single federation may run.
    stream : file-like or None
        Where progress lines go (standard output when None).
    engine : str
        What runs a federation: ``"direct"`` (the ServerApp and ClientApp in this process,
        :mod:`deploy.direct_grid`; the same results as the Simulation Engine) or
        ``"simulation"`` (Flower's Simulation Engine, through ``gpfl launch``).
    """

    name: str
    out: Path
    cache: Path = DEFAULT_CACHE
    profile: str = "full"
    seeds: list[int] | None = None
    fresh: bool = False
    data_path: str = ""
    timeout: float = 3600.0
    stream: TextIO | None = None
    engine: str = "direct"
    launched: int = field(default=0, init=False)
    reused: int = field(default=0, init=False)
    #: Seconds the federations run or reused by this invocation took when they ran.
    federation_s: float = field(default=0.0, init=False)
    #: How many of the federations run or reused ran on each engine.
    engines: dict[str, int] = field(default_factory=dict, init=False)
    #: Each finished row's label, settings and seconds, in order (`experiments.core.runner`).
    row_settings: list[dict[str, Any]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile must be one of {PROFILES}, got profile={self.profile!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got engine={self.engine!r}")
        self.out = Path(self.out)
        self.cache = Path(self.cache)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "figures").mkdir(exist_ok=True)

    @property
    def quick(self) -> bool:
        """Whether the settings are reduced (``quick`` or ``smoke``)."""
        return self.profile != "full"

    @property
    def figures(self) -> Path:
        """The figures folder."""
        return self.out / "figures"

    def pick_seeds(self, default: Sequence[int]) -> list[int]:
        """Return the seeds given on the command line, else ``default``."""
        return list(self.seeds) if self.seeds else list(default)

    def log(self, line: str) -> None:
        """Append a line to ``experiment.log`` (the per-round lines of every federation)."""
        with open(self.out / "experiment.log", "a", encoding="utf-8") as fh:
            fh.write(line.rstrip("\n") + "\n")

    def run_dir(self, spec: FederationSpec) -> Path:
        """Return the cache directory of a federation."""
        return self.cache / f"{spec.slug}-{spec.key}"

    def run(self, spec: FederationSpec) -> dict[str, Any]:
        """Run one federation, or reuse its cached result; return its summary.

        A launched run is kept (compacted) with a ``done.json`` marker; it raises what
        `launch` raises.
        """
        directory = self.run_dir(spec)
        done = directory / "done.json"
        summary_path = directory / "summary.json"
        if not self.fresh and done.is_file() and summary_path.is_file():
            self.reused += 1
            with open(summary_path, encoding="utf-8") as fh:
                summary: dict[str, Any] = json.load(fh)
            with open(done, encoding="utf-8") as fh:
                record = json.load(fh)
            self.federation_s += float(record.get("wall_s", 0.0))
            # Runs kept before the direct engine existed ran on the Simulation Engine.
            self._count_engine(str(record.get("engine", "simulation")))
            summary["_run_dir"] = str(directory)
            summary["_cached"] = True
            summary["_wall_s"] = float(record.get("wall_s", 0.0))
            return summary
        started = time.monotonic()
        full = self.launch(spec)
        wall = time.monotonic() - started
        self.federation_s += wall
        summary = compact_summary(full)
        _write_json(summary_path, summary)
        # Written last: a run directory without it is an interrupted run, launched again.
        self._count_engine(self.engine)
        _write_json(done, {"label": spec.label, "supernodes": spec.supernodes,
                           "run_config": spec.config, "wall_s": wall, "engine": self.engine,
                           "finished": time.strftime("%Y-%m-%dT%H:%M:%S")})
        summary["_run_dir"] = str(directory)
        summary["_cached"] = False
        summary["_wall_s"] = wall
        return summary

    def _count_engine(self, engine: str) -> None:
        self.engines[engine] = self.engines.get(engine, 0) + 1

    def cached(self, experiment: str, stem: str, keyed: Mapping[str, Any],
               compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Return an in-process federation's result from the cache, or compute and keep it.

        The file is ``<cache>/<experiment>/<stem>-<hash of keyed>.json``, with the seconds the
        computation took (``_wall_s``, counted in ``federations_s`` whenever it is read back);
        ``--fresh`` computes again. A result read back carries ``_cached``.
        """
        key = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:12]
        path = self.cache / experiment / f"{stem}-{key}.json"
        if not self.fresh and path.is_file():
            self.reused += 1
            kept = json.loads(path.read_text(encoding="utf-8"))
            self.federation_s += float(kept.get("_wall_s", 0.0))
            return {**kept, "_cached": True}
        started = time.monotonic()
        result = compute()
        wall = time.monotonic() - started
        self.federation_s += wall
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**result, "_wall_s": wall}), encoding="utf-8")
        self.launched += 1
        return result

    def launch(self, spec: FederationSpec, echo: Callable[[str], None] | None = None,
               engine: str | None = None) -> dict[str, Any]:
        """Launch one federation in a fresh run directory, past the cache; return its summary.

        ``echo`` gets every line the federation prints (default: `log`); ``engine`` overrides
        the context's (``scale`` measures the Simulation Engine itself).

        Raises
        ------
        deploy.launcher.LaunchError
            If the federation fails (its logs stay in the run directory).
        """
        directory = self.run_dir(spec)
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        engine = engine or self.engine
        self.log(f"--- {self.name} {spec.label} ({engine} engine): {directory}")
        policy, echo = experiment_policy(spec.config), echo or self.log
        from deploy.launcher import launch  # Flower is imported only when a run is needed

        # No figure.png: each experiment draws its own figures from many runs.
        summary = launch(engine=engine, supernodes=spec.supernodes, run_config=spec.config,
                         policy=policy, out_dir=directory, echo=echo, timeout=self.timeout,
                         figure=False).summary
        self.launched += 1
        return summary

    def write_meta(self, started: float, extra: Mapping[str, Any] | None = None) -> None:
        """Write ``meta.json``: profile, seeds, runtime, how many runs were launched or reused.

        ``compute_s`` (with ``compute_finished``) is the runtime of the last invocation that
        launched federations: an invocation that reuses every federation from the cache (to
        redraw the figures, say) keeps the previous one's, so the report still says what the
        numbers cost.
        """
        runtime = round(time.monotonic() - started, 1)
        compute: dict[str, Any] = {"compute_s": runtime,
                                   "compute_finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        previous_path = self.out / "meta.json"
        if self.launched == 0 and previous_path.is_file():
            try:
                previous = json.loads(previous_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                previous = {}
            if previous.get("profile") == self.profile and "compute_s" in previous:
                compute = {k: previous[k] for k in ("compute_s", "compute_finished")
                           if k in previous}
        meta = {
            "experiment": self.name,
            "profile": self.profile,
            "seeds": self.seeds,
            "runtime_s": runtime,
            **compute,
            "federations_launched": self.launched,
            "federations_reused": self.reused,
            "federations_s": round(self.federation_s, 1),
            **({"federation_engines": dict(sorted(self.engines.items()))} if self.engines
               else {}),
            "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(["python -m experiments", *_public_argv(sys.argv[1:])]),
            "versions": _versions(),
            **dict(extra or {}),
        }
        _write_json(self.out / "meta.json", meta)


def _public_argv(argv: list[str]) -> list[str]:
    """Return the command's arguments without the folders it wrote to (this machine's paths)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--out", "--cache"):
            skip = True
        elif not arg.startswith(("--out=", "--cache=")):
            out.append(arg)
    return out


def _versions() -> dict[str, str]:
    """Return the versions of Python and of the packages the numbers depend on."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for package in ("gpfl", "flwr", "numpy", "torch", "scikit-learn", "dp-accounting"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "not installed"
    return out


def experiment_policy(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Return the device policy of an experiment's virtual devices.

    The experimenter owns these devices and reproduces the papers' settings, so the policy
    lets the run's request through: every mechanism (the non-private baselines included),
    bounds and caps that no request reaches, the ledger reporting at the run's δ, training on
    the CPU (small models, many Ray workers), and seeded noise keyed by the run's seed so that
    a rerun gives the same numbers. A real device would never opt in to seeded noise.
    """
    seed = int(run_config.get("seed", 0))
    # The data file belongs to the device; in a simulation every virtual device reads its
    # partition of the one file the server validates on.
    data = {"data-path": run_config["server-data-path"]} if "server-data-path" in run_config else {}
    return {
        **data,
        "mechanisms": "laplace,gaussian,sign,none",
        "noise-multiplier": 1e-9, "d-epsilon": 1e6, "public-radius": 1e-12, "epsilon": 1e6,
        "delta": float(run_config.get("delta", 1e-5)),
        "cap-d-privacy": 1e15, "cap-epsilon": 1e15,
        "allow-seeded-noise": True, "noise-seed": max(seed, 0), "device": "cpu",
    }


def compact_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Drop the hypotheses of large models from a summary (the experiments never read them)."""
    out = dict(summary)
    n = int(out.get("task_info", {}).get("num_parameters", 0) or 0)
    if n > _KEEP_HYPOTHESES_UP_TO:
        for key in ("hypotheses", "last_hypotheses"):
            if key in out:
                out[key] = None
        out["hypotheses_dropped"] = f"{n} parameters per hypothesis: not kept by experiments"
    return out


def _write_json(path: Path, data: Any) -> None:
    # Atomic: an interrupted run never leaves half a summary in the cache (which a later run
    # would reuse); not fsynced: what is lost in a power cut is run again.
    text = json.dumps(data, indent=1, default=_json_default) + "\n"
    write_atomic(path, text, durable=False, mode=0o644)


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def laplace_or_none(nu: float, **extra: Any) -> dict[str, Any]:
    """Return the mechanism part of a run config: Euclidean Laplace at ν, none for ν = 0.

    ν = 0 stands for "no sanitization" in the papers' tables; ``extra`` (a calibration) goes
    with the Laplace mechanism only, so that the ν = 0 run config, and its cache key, hold
    no setting that the run would not use.
    """
    if nu == 0:
        return {"mechanism": "none"}
    return {"mechanism": "laplace", **extra, "noise-multiplier": float(nu)}
