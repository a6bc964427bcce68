"""What every experiment shares: profiles, a cache of federation runs, progress, CSV and figures.

An experiment is a list of federations (`FederationSpec`: a run config and a number of virtual
SuperNodes) run one at a time on Flower's Simulation Engine through `server.launcher.launch`,
plus the code that turns their ``summary.json`` files into ``results.csv`` and figures.

Runs are cached by content: the run directory of a spec is ``<cache>/<slug>-<hash>`` where the
hash covers the run config and the SuperNode count, and a finished run leaves ``done.json``
there. Running an experiment again (or another experiment that needs the same federation, as
``leakage`` does with ``accuracy-vs-nu``'s runs) reuses it instead of launching it again, so an
interrupted sweep resumes where it stopped. ``--fresh`` ignores the cache.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "DEFAULT_CACHE",
    "DEFAULT_ROOT",
    "PROFILES",
    "Context",
    "FederationSpec",
    "MemoryMonitor",
    "Progress",
    "best_entry",
    "experiment_policy",
    "fmt",
    "last_entry",
    "mean_std",
    "read_csv",
    "write_csv",
]

#: Where ``python -m experiments NAME`` writes by default: ``runs/experiments/<name>``.
DEFAULT_ROOT = Path("runs") / "experiments"
#: The shared cache of federation runs.
DEFAULT_CACHE = DEFAULT_ROOT / "_runs"
#: ``full`` follows the papers; ``quick`` finishes in minutes; ``smoke`` is the tests' own.
PROFILES = ("full", "quick", "smoke")
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
    def key(self) -> str:
        """A content hash of the run config and the SuperNode count."""
        blob = json.dumps(
            {"supernodes": self.supernodes, "run_config": dict(self.run_config)},
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def slug(self) -> str:
        """The label made safe for a directory name."""
        keep = "".join(c if c.isalnum() or c in ".-_=" else "-" for c in self.label)
        return "-".join(part for part in keep.split("-") if part)[:80]


class Progress:
    """A progress bar of one line per finished configuration.

    Parameters
    ----------
    name : str
        The experiment's name, printed on every line.
    total : int
        Configurations to run.
    stream : file-like
        Where the lines go (stdout).
    """

    def __init__(self, name: str, total: int, stream: Any = None) -> None:
        self.name = name
        self.total = max(total, 1)
        self.count = 0
        self.start = time.monotonic()
        self.stream = stream if stream is not None else sys.stdout

    def step(self, label: str, message: str) -> None:
        """Count one configuration as finished and print its line."""
        self.count += 1
        elapsed = time.monotonic() - self.start
        width = 20
        filled = round(width * self.count / self.total)
        eta = elapsed / self.count * (self.total - self.count)
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {self.count}/{self.total} {self.name} "
            f"{label}: {message} ({_duration(elapsed)} elapsed"
            + (f", ~{_duration(eta)} left)" if self.count < self.total else ")")
        )
        print(line, file=self.stream, flush=True)

    def note(self, message: str) -> None:
        """Print a line that does not count as a configuration."""
        print(f"{self.name}: {message}", file=self.stream, flush=True)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


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
    """

    name: str
    out: Path
    cache: Path = DEFAULT_CACHE
    profile: str = "full"
    seeds: list[int] | None = None
    fresh: bool = False
    data_path: str = ""
    timeout: float = 3600.0
    stream: Any = None
    launched: int = field(default=0, init=False)
    reused: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile must be one of {PROFILES}, got profile={self.profile!r}")
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

        Raises
        ------
        server.launcher.LaunchError
            If the federation fails (its logs stay in the run directory).
        """
        directory = self.run_dir(spec)
        done = directory / "done.json"
        summary_path = directory / "summary.json"
        if not self.fresh and done.is_file() and summary_path.is_file():
            self.reused += 1
            with open(summary_path, encoding="utf-8") as fh:
                summary: dict[str, Any] = json.load(fh)
            summary["_run_dir"] = str(directory)
            summary["_cached"] = True
            return summary
        from server.launcher import launch  # Flower is imported only when a run is needed

        if directory.exists():
            import shutil

            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        self.log(f"--- {self.name} {spec.label}: {directory}")
        started = time.monotonic()
        result = launch(
            supernodes=spec.supernodes,
            simulation=True,
            run_config=dict(spec.run_config),
            policy=experiment_policy(spec.run_config),
            out_dir=directory,
            echo=self.log,
            timeout=self.timeout,
        )
        wall = time.monotonic() - started
        summary = compact_summary(result.summary)
        _write_json(summary_path, summary)
        _write_json(done, {"label": spec.label, "supernodes": spec.supernodes,
                           "run_config": dict(spec.run_config), "wall_s": wall,
                           "finished": time.strftime("%Y-%m-%dT%H:%M:%S")})
        self.launched += 1
        summary["_run_dir"] = str(directory)
        summary["_cached"] = False
        summary["_wall_s"] = wall
        return summary

    def write_meta(self, started: float, extra: Mapping[str, Any] | None = None) -> None:
        """Write ``meta.json``: profile, seeds, runtime, how many runs were launched or reused."""
        meta = {
            "experiment": self.name,
            "profile": self.profile,
            "seeds": self.seeds,
            "runtime_s": round(time.monotonic() - started, 1),
            "federations_launched": self.launched,
            "federations_reused": self.reused,
            "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(["python -m experiments", *sys.argv[1:]]),
            **dict(extra or {}),
        }
        _write_json(self.out / "meta.json", meta)


def experiment_policy(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Return the device policy of an experiment's virtual devices.

    The experimenter owns these devices and reproduces the papers' settings, so the policy
    lets the run's request through: every mechanism (the non-private baselines included),
    bounds and caps that no request reaches, the ledger reporting at the run's δ, training on
    the CPU (small models, many Ray workers), and seeded noise keyed by the run's seed so that
    a rerun gives the same numbers. A real device would never opt in to seeded noise.
    """
    seed = int(run_config.get("seed", 0))
    return {
        "mechanisms": "laplace,gaussian,sign,none",
        "noise-multiplier": 1e-9, "d-epsilon": 1e12, "public-radius": 1e-12, "epsilon": 1e12,
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
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, default=_json_default)
        fh.write("\n")
    os.replace(tmp, path)


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _validated(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    history = [e for e in summary.get("history", []) if e.get("val_loss") is not None]
    if not history:
        raise ValueError("the run has no validated round")
    return history


def best_entry(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Return the history entry of the best validation round (what the run delivers).

    Falls back on the last validated round when ``best_round`` is missing.
    """
    best = summary.get("best_round")
    for entry in _validated(summary):
        if entry["round"] == best:
            return dict(entry)
    return last_entry(summary)


def last_entry(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Return the history entry of the last validated round (the final model)."""
    return dict(_validated(summary)[-1])


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Path:
    """Write ``rows`` with a header row of ``columns`` (extra keys are an error)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for row in rows:
        extra = sorted(set(row) - set(columns))
        if extra:
            raise ValueError(f"row has keys that are not columns of {path.name}: {extra}")
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="raise")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(row.get(k)) for k in columns})
    os.replace(tmp, path)
    return path


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.6g}"
    return value


def read_csv(path: Path) -> list[dict[str, str]]:
    """Read a ``results.csv`` back as a list of dicts of strings."""
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) of the finite values; NaN if none."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite:
        return math.nan, math.nan
    if len(finite) == 1:
        return finite[0], 0.0
    return statistics.fmean(finite), statistics.stdev(finite)


def fmt(value: float | None, digits: int = 3) -> str:
    """Format a number for a table: ``-`` for None/NaN, else ``digits`` significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    return f"{value:.{digits}g}"


class MemoryMonitor:
    """Samples the RSS of this process and all its descendants; keeps the peak of the sum.

    A context manager; sampling runs on a daemon thread every ``interval`` seconds.
    ``samples`` holds ``(seconds since start, total RSS in bytes, processes)``.
    """

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.samples: list[tuple[float, int, int]] = []
        self.peak = 0
        self.peak_processes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0

    def __enter__(self) -> MemoryMonitor:
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def sample(self) -> int:
        """Take one sample now; return the total RSS in bytes."""
        root = psutil.Process()
        total, count = 0, 0
        for proc in [root, *root.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
                count += 1
            except psutil.Error:
                continue
        self.samples.append((time.monotonic() - self._start, total, count))
        if total > self.peak:
            self.peak = total
            self.peak_processes = count
        return total

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)


def plt_module() -> Any:
    """matplotlib.pyplot with the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def spends_of(summary: Mapping[str, Any]) -> list[float]:
    """Every client's total spend (clients that never released count with 0)."""
    per_client = summary.get("privacy", {}).get("per_client", {})
    return [float(c["spend"]) for c in per_client.values() if c.get("spend") is not None]


def nan_if_none(value: Any) -> float:
    """``float(value)``, NaN for None."""
    return math.nan if value is None else float(value)


ProgressFn = Callable[[str], None]
