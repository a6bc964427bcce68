"""``python -m experiments report``: regenerate docs/RESULTS.md from the experiments' outputs.

Reads ``<root>/<experiment>/results.csv`` and ``meta.json`` for every experiment that has run
(root: ``runs/experiments`` by default), copies its figures to ``docs/results/<experiment>/`` so
that the report shows them where ``runs/`` is not kept, and writes the Markdown: an index, then
each experiment's own section (its `experiments.runner.Experiment.report`: the papers' numbers,
ours, and what differs and why), then what differs overall. Nothing here runs a federation.
"""

from __future__ import annotations

import importlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from experiments.claims import flow
from experiments.runner import Experiment
from experiments.tables import fmt, read_csv

__all__ = ["ORDER", "write_report"]


def _registered() -> dict[str, str]:
    from experiments.cli import EXPERIMENTS  # the command line's registry: one list of them

    return EXPERIMENTS


#: The experiments, in the order the report shows them (the order ``all`` runs them).
ORDER = tuple(_registered())


def _experiments() -> dict[str, Experiment]:
    return {name: importlib.import_module(module).EXPERIMENT
            for name, module in _registered().items()}


_HOW = flow("""
`gpfl-experiment` is the same command once the package is installed. Each experiment writes
`runs/experiments/<name>/results.csv`, `figures/*.png` and `meta.json`; finished federations
are cached in `runs/experiments/_runs/` (keyed by their run config), so an interrupted sweep
resumes and `leakage` reuses the federations of `accuracy-vs-nu`; `--fresh` runs them again.
""")
_DIFFERENCES = (
    flow("""
- **Data.** No downloads here: scikit-learn's bundled 8×8 digits stand in for FEMNIST and
MNIST (002 itself uses them for its MNIST experiments), the fairness task generates 004's
synthetic data, the hospital table needs the CMS CSV from the user.
"""),
    flow("""
- **Models.** Table 3's CNN sized for 8×8 has 83,562 parameters (1.2 M on FEMNIST). 002's
model is the digits task's `model = "logistic"` (650 parameters), its non-IID split `partition
= "dirichlet"`; the thesis's Fig. 2.8 protocol is `labels = "parity"`.
"""),
    flow("""
- **Scale and rounds.** The quick profiles are sized for 2 cores: tens of users per digits
federation instead of thousands; quick profiles run fixed, short round counts; full profiles
follow the papers' stopping rules where those let the runs converge (the synthetic task's
patience of 6 does not under ν = 5, so it is 40 there).
"""),
    flow("""
- **Accounting.** Gaussian and sign budgets are composed over all releases with dp-accounting
(RDP), stricter than 002's per-round budgets. d-privacy spend is Σ ε·r as in 001.
"""),
    flow("""
- **Delivered model.** Accuracies and fairness gaps are those of the best validation round
(the hypotheses a run delivers), each validation user scored with the hypothesis that fits it
best (001's Eq. 15); personalized-budgets reports the final model after R rounds, as 002 does.
"""),
)


def _load(root: Path, name: str) -> tuple[list[dict[str, str]], dict[str, Any]] | None:
    path = root / name / "results.csv"
    if not path.is_file():
        return None
    meta_path = root / name / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    return read_csv(path), meta


def _figures(root: Path, name: str, doc: Path) -> list[str]:
    """Copy the experiment's PNGs next to the report; return Markdown image lines."""
    source = root / name / "figures"
    if not source.is_dir():
        return []
    target = doc.parent / "results" / name
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    lines = []
    for png in sorted(source.glob("*.png")):
        shutil.copy2(png, target / png.name)
        rel = (target / png.name).relative_to(doc.parent)
        lines.append(f"![{name}: {png.stem}]({rel.as_posix()})")
    return lines


def _compute_s(meta: dict[str, Any]) -> float | None:
    """Seconds of the last invocation that ran federations (older metas: the last one's)."""
    value = meta.get("compute_s", meta.get("runtime_s"))
    return None if value is None else float(value)


def _profile_note(meta: dict[str, Any]) -> str:
    profile = meta.get("profile", "?")
    runtime = meta.get("runtime_s")
    launched = meta.get("federations_launched", 0)
    reused = meta.get("federations_reused", 0)
    when = meta.get("finished", "?")
    note = (f"*Profile **{profile}**, finished {when}; this run took "
            f"{fmt(runtime, 4) if runtime is not None else '?'} s "
            f"({launched} federations launched, {reused} reused from the cache)")
    if "compute_s" in meta and meta.get("compute_finished") != when:
        note += (f"; the federations were run by the invocation that finished "
                 f"{meta.get('compute_finished', '?')}, in {fmt(_compute_s(meta), 4)} s")
    return note + ".*"


#: Everything after this line of docs/RESULTS.md is kept when the report is regenerated.
KEPT_MARKER = "<!-- Kept by `python -m experiments report`: measured by the commands below. -->"


def write_report(root: Path, doc: Path) -> Path:
    """Write the report from the outputs under ``root``; return its path."""
    root = Path(root)
    doc = Path(doc)
    doc.parent.mkdir(parents=True, exist_ok=True)
    loaded = {name: _load(root, name) for name in ORDER}
    experiments = _experiments()
    out: list[str] = [
        "# Results: the papers' experiments, reproduced",
        "",
        "<!-- Generated by `python -m experiments report`; do not edit by hand. -->",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M')} from `{root}`. Every number below comes "
        "from the `results.csv` of an experiment run with this repository's ServerApp and "
        "ClientApp on Flower's Simulation Engine (Ray), one virtual SuperNode per user; the "
        "papers' numbers are quoted from the papers themselves (001 = Galli et al., conference "
        "version; 000 = its extended version; 004 = Galli's thesis; 002 = Wu, Xu, Zhu 2023).",
        "",
        "## Regenerate",
        "",
        "```bash",
        "./gpfl.sh report           # from a clean clone: set up .venv, every experiment --quick "
        "(five seeds; see the runtimes below), then this file",
        "./gpfl.sh report --full    # the papers' settings: many hours",
        "",
        "# the same, step by step, inside the environment (.venv/bin/python or gpfl-experiment):",
        "python -m experiments all --quick && python -m experiments report",
        "python -m experiments all && python -m experiments report           # the papers' "
        "settings: many hours",
        "python -m experiments NAME [--quick] [--seeds 0 1 2] [--out DIR]    # one experiment",
        "python -m experiments leakage --data-path Inpatient.csv              # + hospital table",
        "```",
        "",
        _HOW,
        "",
        "| experiment | paper | profile | runtime | rows |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in ORDER:
        item = loaded[name]
        if item is None:
            out.append(f"| {name} | {experiments[name].paper} | not run | - | - |")
        else:
            rows, meta = item
            out.append(f"| [{name}](#{name}) | {experiments[name].paper} | "
                       f"{meta.get('profile', '?')} | "
                       f"{fmt(_compute_s(meta), 4)} s | {len(rows)} |")
    totals: dict[str, float] = {}
    for item in loaded.values():
        seconds = None if item is None else _compute_s(item[1])
        if item is not None and seconds is not None:
            profile = str(item[1].get("profile", "?"))
            totals[profile] = totals.get(profile, 0.0) + seconds
    took = "; ".join(f"profile **{p}**: {t / 60:.0f} min" for p, t in sorted(totals.items()))
    out += ["", "A runtime is that of the last invocation that ran the experiment's federations "
            "(one that reuses them all from the cache, to redraw figures, keeps it; see each "
            "section's note). Summed over the experiments: "
            f"{took or 'nothing run'} (on a machine shared with other work, each experiment "
            "takes longer than alone).", ""]
    for name in ORDER:
        out += [f"## {name}", ""]
        item = loaded[name]
        if item is None:
            out += [f"Not run yet: `python -m experiments {name} --quick`.", ""]
            continue
        rows, meta = item
        out += [_profile_note(meta), ""]
        out += experiments[name].report(rows)
        out += ["", *_figures(root, name, doc), ""]
    out += _differences()
    # Sections measured by other commands (each names its own) follow the marker: kept.
    kept = doc.read_text(encoding="utf-8").split(KEPT_MARKER, 1) if doc.is_file() else []
    if len(kept) == 2:
        out += ["", KEPT_MARKER + kept[1].rstrip()]
    doc.write_text("\n".join(out).rstrip() + "\n", encoding="utf-8")
    return doc


def _differences() -> list[str]:
    return [
        "## What differs from the papers, and why (summary)",
        "",
        _DIFFERENCES[0],
        _DIFFERENCES[1],
        _DIFFERENCES[2],
        _DIFFERENCES[3],
        _DIFFERENCES[4],
    ]
