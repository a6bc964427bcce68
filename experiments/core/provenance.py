"""What ties an experiment's raw files to the code that wrote them, and the checks on that tie.

An experiment's ``meta.json`` records, besides its profile and command:

* ``code``: the commit of the checkout that ran it and whether that checkout had changes of its
  own (``dirty``), read with ``git`` when the run started and again when it ended (a commit
  made in between marks the run dirty: its code is then no single commit's);
* ``raw_files``: the SHA-256 of each raw file it wrote (``results.csv``), so an edit after the
  run is seen;
* ``row_settings``: for every row of ``results.csv``, in order, the label of its configuration,
  its settings (a federation's SuperNode count and full run config, or an in-process
  experiment's keys and profile settings) and the seconds it took, enough for
  ``python -m experiments verify`` to run that row alone again (`experiments.core.verify`).

`problems` is what the report and ``verify`` ask of a folder of raw files before they use it:
a commit that exists in this repository's history, a clean checkout, hashes that match.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["DATA_FILES", "REPOSITORY", "code_state", "combine", "digest", "federation_configs",
           "float_environment", "jsonable", "problems", "raw_digests"]

#: The repository this package was imported from (its git checkout, when it is one).
REPOSITORY = Path(__file__).resolve().parents[2]
#: An experiment's raw data files, hashed into its ``meta.json`` (the figures are drawn from
#: them, ``meta.json`` describes them).
DATA_FILES = ("results.csv",)
#: How many changed paths ``code_state`` names.
_CHANGES_SHOWN = 10


def _git(*args: str, root: Path) -> str | None:
    """Return ``git``'s output in ``root``, or None where git or the checkout is missing."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def code_state(root: Path = REPOSITORY) -> dict[str, Any]:
    """Return the commit checked out at ``root`` and whether the checkout differs from it.

    Returns
    -------
    dict
        ``commit`` (40 hex digits, or None outside a git checkout), ``dirty`` (True when a
        tracked file is changed or an untracked, not ignored, file exists; None when unknown)
        and ``changes`` (the first changed paths, for the reader).
    """
    commit = _git("rev-parse", "HEAD", root=root)
    status = _git("status", "--porcelain", root=root)
    if commit is None or status is None:
        return {"commit": None, "dirty": None, "changes": []}
    changes = [line[3:] for line in status.splitlines() if line.strip()]
    return {"commit": commit.strip(), "dirty": bool(changes),
            "changes": changes[:_CHANGES_SHOWN]}


def float_environment() -> dict[str, Any]:
    """Return what decides how this machine's floating-point kernels round.

    The same seeded run gives the same bits only where the kernels are the same: torch and
    NumPy pick theirs by the instruction sets the CPU has (AVX2 or AVX-512 sum a dot product in
    different orders), and a long noisy training run carries a difference in the last bit of one
    step into its accuracy.

    Returns
    -------
    dict
        ``machine`` (the architecture), ``cpu`` (the model name the kernel reports),
        ``torch_cpu_capability`` (the kernels torch dispatches to) and ``numpy_simd`` (the
        instruction-set groups NumPy found beyond its baseline).
    """
    import numpy as np
    import torch

    cpu = ""
    try:  # Linux names the model here; platform.processor() elsewhere
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    simd = np.show_config(mode="dicts").get("SIMD Extensions", {})
    return {"machine": platform.machine(), "cpu": cpu or platform.processor(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "numpy_simd": sorted(simd.get("found", []))}


def combine(start: Mapping[str, Any], end: Mapping[str, Any]) -> dict[str, Any]:
    """Return the code state of a whole run from its state at the start and at the end.

    The commit is the start's; the run is dirty when either state is, or when the commit
    moved while it ran.
    """
    moved = start.get("commit") != end.get("commit")
    dirty = (None if start.get("dirty") is None or end.get("dirty") is None
             else bool(start["dirty"] or end["dirty"] or moved))
    changes = list(dict.fromkeys([*start.get("changes", []), *end.get("changes", [])]))
    out = {"commit": start.get("commit"), "dirty": dirty, "changes": changes[:_CHANGES_SHOWN]}
    if moved:
        out["commit_at_end"] = end.get("commit")
    return out


def digest(path: Path) -> str:
    """Return ``sha256:<hex>`` of a file's bytes."""
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha.update(block)
    return f"sha256:{sha.hexdigest()}"


def raw_digests(folder: Path) -> dict[str, str]:
    """Return the digest of each raw data file in ``folder``."""
    return {name: digest(folder / name) for name in DATA_FILES if (folder / name).is_file()}


def jsonable(value: Any) -> Any:
    """Return ``value`` as JSON data: a function by its qualified name, tuples as lists.

    An in-process experiment's keys may hold the function that builds its mechanism; the
    record names it (the commit holds its code).
    """
    return json.loads(json.dumps(value, sort_keys=True, default=_describe))


def _describe(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    func = getattr(value, "func", None)  # functools.partial
    if func is not None:
        return {"function": _describe(func), "args": list(getattr(value, "args", ())),
                "keywords": dict(getattr(value, "keywords", {}))}
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{value.__module__}.{value.__qualname__}"
    return str(value)


def federation_configs(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Return each federation row's SuperNode count and run config, one dict per federation.

    Two rows of one federation (none today) would count once.
    """
    seen: dict[str, dict[str, Any]] = {}
    for record in meta.get("row_settings", []):
        federation = record.get("settings", {}).get("federation")
        if federation is not None:
            config = {"supernodes": federation["supernodes"], **federation["run_config"]}
            seen.setdefault(json.dumps(config, sort_keys=True), config)
    return list(seen.values())


def problems(folder: Path, meta: Mapping[str, Any], root: Path = REPOSITORY) -> list[str]:
    """Return what keeps ``folder``'s raw files from being published; empty when nothing.

    Asks for a commit that exists in the history of the checkout at ``root`` (when ``root`` is
    one: an installed copy without history cannot tell), a run from a clean checkout, a hash
    of every raw data file that matches the file, and a settings record per row.
    """
    out: list[str] = []
    code = meta.get("code") or {}
    commit = code.get("commit")
    if not commit:
        out.append("meta.json names no commit: the raw files cannot be traced to code "
                   "(run the experiment again from a git checkout)")
    elif _git("rev-parse", "--git-dir", root=root) is not None and _git(
            "cat-file", "-e", f"{commit}^{{commit}}", root=root) is None:
        out.append(f"meta.json names commit {commit}, which this repository's history lacks")
    if code.get("dirty") is not False:
        shown = ", ".join(code.get("changes", [])) or "unknown"
        out.append(f"the run's checkout had uncommitted changes (dirty={code.get('dirty')}: "
                   f"{shown}): no commit holds the code that ran")
    recorded = meta.get("raw_files") or {}
    for name in DATA_FILES:
        path = folder / name
        if not path.is_file():
            out.append(f"{name} is missing")
        elif name not in recorded:
            out.append(f"meta.json has no hash of {name}")
        elif recorded[name] != digest(path):
            out.append(f"{name} does not match the hash in meta.json "
                       f"({digest(path)} against {recorded[name]}): it was changed after the run")
    rows = meta.get("row_settings")
    if not isinstance(rows, list):
        out.append("meta.json records no settings per row")
    elif rows and meta.get("rows") != len(rows):
        out.append(f"meta.json records {len(rows)} rows' settings for {meta.get('rows')} rows")
    return out
