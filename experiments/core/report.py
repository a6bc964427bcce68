"""``python -m experiments report``: regenerate docs/RESULTS.md from the experiments' outputs.

First publishes: every experiment that has run under ``<root>`` (``runs/experiments`` by
default) has its ``results.csv``, ``meta.json`` and figures copied to
``docs/results/<experiment>/``, the raw files committed with the report. Then writes the
Markdown from those committed files alone (`render`): an index, each experiment's own section
(its `experiments.core.runner.Experiment.report`: the papers' numbers, ours, and what differs and
why), then what differs overall. An experiment without committed raw files keeps its previous
section, marked as not regenerated. Nothing here runs a federation, and the same raw files give
the same text (``tests/test_results_regenerate.py`` checks docs/RESULTS.md against them).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from experiments.core.claims import flow
from experiments.core.provenance import federation_configs
from experiments.core.provenance import problems as provenance_problems
from experiments.core.registry import EXPERIMENTS, load
from experiments.core.runner import ENGINES, Experiment
from experiments.core.sanity import problems as sanity_problems
from experiments.core.tables import fmt, read_csv

__all__ = ["KEPT_MARKER", "ORDER", "RAW_DIR", "not_regenerated", "publish", "render",
           "write_report"]


#: The experiments, in the order the report shows them (the order ``all`` runs them).
ORDER = tuple(EXPERIMENTS)


def _experiments() -> dict[str, Experiment]:
    # Each experiment brings its own section (`Experiment.report`); the registry names them.
    return {name: load(name) for name in ORDER}


_HOW = flow("""
`gpfl-experiment` is the same command once the package is installed. Each experiment writes
`runs/experiments/<name>/results.csv`, `figures/*.png` and `meta.json`; finished federations
are cached in `runs/experiments/_runs/` (keyed by their run config), so an interrupted sweep
resumes and `leakage` reuses the federations of `accuracy-vs-nu`; `--fresh` runs them again.
Federations run on the direct engine unless `--engine simulation` asks for Flower's Simulation
Engine (the same numbers; docs/REPRODUCING.md). `./gpfl.sh report` runs two experiments at a
time (`all --jobs 2`; `scale`, a timing, alone). The table gives each experiment's size: its
federations, their users (SuperNodes) and rounds, and its seeds; the quick profiles have fewer
users, rounds or seeds than the papers' experiments (each section's differences say which).
""")
_DIFFERENCES = (
    flow("""
- **Data.** No downloads here: scikit-learn's bundled 8×8 digits stand in for FEMNIST and
MNIST (002 uses them for its IID MNIST panel; its non-IID MNIST panel, 10 clients with batches
of 400 and 2,400 test images, needs more images than their 1,797, so it is MNIST's own), the
fairness task generates 004's synthetic data, the hospital table needs the CMS CSV from the
user (docs/REPRODUCING.md says how to run on a copy of it and of FEMNIST).
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
- **Seeds and pairing.** A seed fixes a federation's data draw (`data-seed` = `seed`, except where
a section says otherwise), its initial hypotheses, its training order and its devices' seeded
noise; each round's devices are drawn by their names, so runs at one seed that differ in ν, k or
aggregation ask the same devices in the same rounds. A paired difference removes all of that;
an interval over seeds covers the data as well as the noise.
"""),
    flow("""
- **Delivered model.** Accuracies and fairness gaps are those of the best validation round
(the hypotheses a run delivers), each validation user scored with the hypothesis that fits it
best (001's Eq. 15); personalized-budgets reports the final model after R rounds, as 002 does.
"""),
)


#: The committed raw files, relative to the report's folder: ``results/<experiment>/`` holds an
#: experiment's ``results.csv``, ``meta.json`` and ``*.png`` figures, from which the report is
#: written (and which a test regenerates it from).
RAW_DIR = "results"
#: What an experiment's folder of committed raw files holds besides its figures.
RAW_FILES = ("results.csv", "meta.json")
#: Opens the section of an experiment that has neither raw files nor a previous section.
NOT_RUN = "Not run yet:"
#: Opens a section kept from the previous report because no raw files of it are committed.
NOT_REGENERATED = "<!-- not regenerated: no committed raw files -->"


def _load(raw: Path, name: str) -> tuple[list[dict[str, str]], dict[str, Any]] | None:
    path = raw / name / "results.csv"
    if not path.is_file():
        return None
    meta_path = raw / name / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    return read_csv(path), meta


def publish(root: Path, raw: Path) -> list[str]:
    """Copy each experiment's raw files and figures from ``root`` into ``raw``; return names.

    An experiment whose ``root/<name>/results.csv`` exists replaces its folder under ``raw``
    (results.csv, meta.json, figures); the others are left as they are. Nothing is copied
    when ``root`` is ``raw``.
    """
    if root.resolve() == raw.resolve():
        return []
    published = []
    for name in ORDER:
        source = root / name
        if not (source / "results.csv").is_file():
            continue
        target = raw / name
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for file in RAW_FILES:
            if (source / file).is_file():
                shutil.copy2(source / file, target / file)
        for png in sorted((source / "figures").glob("*.png")):
            shutil.copy2(png, target / png.name)
        published.append(name)
    return published


def _figures(raw: Path, name: str) -> list[str]:
    """Markdown image lines of the experiment's committed figures (beside the report)."""
    return [f"![{name}: {png.stem}]({RAW_DIR}/{name}/{png.name})"
            for png in sorted((raw / name).glob("*.png"))]


def _compute_s(meta: dict[str, Any]) -> float | None:
    """Return the seconds the experiment's federations took when they ran.

    Without that record: those of the last invocation that ran federations (older metas: the
    last one's).
    """
    value = meta.get("federations_s") or meta.get("compute_s", meta.get("runtime_s"))
    return None if value is None else float(value)


#: How a section's note names the engine its federations ran on.
ENGINE_NAMES = {"simulation": "Flower's Simulation Engine", "direct": "direct"}


def _profile_note(meta: dict[str, Any]) -> str:
    profile = meta.get("profile", "?")
    runtime = meta.get("runtime_s")
    launched = meta.get("federations_launched", 0)
    reused = meta.get("federations_reused", 0)
    when = meta.get("finished", "?")
    note = (f"*Profile **{profile}**, finished {when}; this run took "
            f"{fmt(runtime, 4) if runtime is not None else '?'} s "
            f"({launched} federations launched, {reused} reused from the cache)")
    if meta.get("federations_s"):
        note += f"; its federations took {fmt(float(meta['federations_s']), 4)} s when they ran"
    engines = meta.get("federation_engines") or {}
    if engines:
        note += "; engine: " + ", ".join(f"{ENGINE_NAMES.get(e, e)} ({n})"
                                          for e, n in sorted(engines.items()))
    if "compute_s" in meta and meta.get("compute_finished") != when:
        note += (f"; the federations were run by the invocation that finished "
                 f"{meta.get('compute_finished', '?')}, in {fmt(_compute_s(meta), 4)} s")
    commit = (meta.get("code") or {}).get("commit")
    if commit:
        note += f"; code: commit `{commit[:12]}`, a clean checkout"
    return note + ".*"


#: Everything after this line of docs/RESULTS.md is kept when the report is regenerated.
KEPT_MARKER = "<!-- Kept by `python -m experiments report`: measured by the commands below. -->"


def previous_sections(text: str) -> dict[str, str]:
    """Split a previous report into its ``## name`` sections (bodies without the heading).

    A body that was itself kept loses its note, so that keeping it again does not nest.
    """
    generated = text.split(KEPT_MARKER, 1)[0]
    sections: dict[str, str] = {}
    parts = generated.split("\n## ")
    for part in parts[1:]:
        heading, _, body = part.partition("\n")
        if NOT_REGENERATED in body:
            body = body.split(NOT_REGENERATED, 1)[1]
        if not body.strip().startswith(NOT_RUN):  # nothing to keep
            sections[heading.strip()] = body.strip("\n")
    return sections


def not_regenerated(doc: Path) -> list[str]:
    """Return the experiments whose sections of ``doc`` are kept, not written from raw files."""
    text = doc.read_text(encoding="utf-8") if doc.is_file() else ""
    return [name for name in ORDER if f"## {name}\n\n{_kept_note(name)}" in text]


def _kept_note(name: str) -> str:
    return (f"**Not regenerated from raw files:** `{RAW_DIR}/{name}/results.csv` is not "
            "committed. Its last raw files were made before `meta.json` named the code that "
            "made them (the commit, the hashes), and the experiment has not been run again "
            "since, so they were withdrawn. The text below is the last published one, kept as "
            "it was; `python -m experiments verify` cannot check it, and it predates later "
            "changes to the code it measured. Regenerate: "
            f"`python -m experiments {name} --quick`, then `python -m experiments report`.")


def write_report(root: Path, doc: Path, *, checked: bool = True) -> Path:
    """Publish the raw files under ``root`` beside ``doc``, then write ``doc`` from them.

    Returns the path of ``doc``. ``checked=False`` publishes raw files that `refusals` would
    refuse (the tests' hand-made rows, which no commit made).

    Raises
    ------
    RefusedRawFiles
        If a folder under ``root`` is refused; nothing is copied then.
    """
    doc = Path(doc)
    doc.parent.mkdir(parents=True, exist_ok=True)
    raw = doc.parent / RAW_DIR
    # Refused before anything is copied: the published raw files stay as they were.
    if checked and Path(root).resolve() != raw.resolve():
        fresh = {name: _load(Path(root), name) for name in ORDER}
        refused = refusals(Path(root), fresh, _experiments())
        if refused:
            raise RefusedRawFiles("the report refuses these raw files (nothing was published):"
                                  "\n  " + "\n  ".join(refused))
    publish(Path(root), raw)
    previous = doc.read_text(encoding="utf-8") if doc.is_file() else ""
    doc.write_text(render(raw, previous, checked=checked), encoding="utf-8")
    return doc


class RefusedRawFiles(ValueError):
    """Raw files the report will not publish: no commit, a dirty run, a hash or a row amiss."""


def refusals(raw: Path, loaded: dict[str, tuple[list[dict[str, str]], dict[str, Any]] | None],
             experiments: dict[str, Experiment]) -> list[str]:
    """Return why each experiment's raw files may not be published (empty: all may be).

    The provenance of `experiments.core.provenance.problems` (a commit of this history, a
    clean checkout, matching hashes, settings per row) and the relations its rows must
    satisfy (`experiments.core.sanity`).
    """
    out = []
    for name, item in loaded.items():
        if item is None:
            continue
        rows, meta = item
        found = provenance_problems(raw / name, meta) + sanity_problems(
            rows, experiments[name].checks)
        out += [f"{raw / name}: {problem}" for problem in found]
    return out


def render(raw: Path, previous: str, *, checked: bool = True) -> str:
    """Return the report written from the raw files under ``raw`` alone.

    ``previous`` (the report as it stands) gives the sections after `KEPT_MARKER` and those
    of experiments without raw files, kept as they are and marked. The same files give the
    same text. ``checked=False`` skips `refusals` (the tests that edit a raw value to see the
    text follow it).

    Raises
    ------
    RefusedRawFiles
        If raw files lack a commit, come from a dirty checkout, do not match their hashes or
        break their experiment's relations.
    """
    loaded = {name: _load(raw, name) for name in ORDER}
    experiments = _experiments()
    if checked:
        refused = refusals(raw, loaded, experiments)
        if refused:
            raise RefusedRawFiles("the report refuses these raw files:\n  "
                                  + "\n  ".join(refused))
    kept_sections = previous_sections(previous)
    finished = sorted(str(item[1].get("finished", "")) for item in loaded.values() if item)
    out: list[str] = [
        "# Results: the papers' experiments, reproduced",
        "",
        "<!-- Generated by `python -m experiments report`; do not edit by hand. -->",
        "",
        f"Written from the raw files committed in `docs/{RAW_DIR}/<experiment>/` "
        f"(`results.csv`, `meta.json`; the newest finished {finished[-1] if finished else '-'}"
        "); `tests/test_results_regenerate.py` writes this file again from them and fails on "
        "any difference. Every number below comes from the `results.csv` of an experiment; "
        f"{_engines(experiments)}. The "
        "papers' numbers are quoted from the papers themselves (001 = Galli et al., conference "
        "version; 000 = its extended version; 004 = Galli's thesis; 002 = Wu, Xu, Zhu 2023).",
        "",
        "## Regenerate",
        "",
        "```bash",
        "./gpfl.sh report           # from a clean clone: set up .venv, every experiment --quick "
        "(two at a time; see the runtimes below), then this file",
        "./gpfl.sh report --full    # the papers' settings: many hours",
        "",
        "# the same, step by step, inside the environment (.venv/bin/python or gpfl-experiment):",
        "python -m experiments all --quick --jobs 2 && python -m experiments report",
        "python -m experiments all && python -m experiments report           # the papers' "
        "settings: many hours",
        "python -m experiments NAME [--quick] [--seeds 0 1 2] [--out DIR]    # one experiment",
        "python -m experiments leakage --data-path Inpatient.csv              # + hospital table",
        "python -m experiments report --out docs/results   # this file from the committed raw "
        "files alone",
        "```",
        "",
        _HOW,
        "",
        "| experiment | paper | profile | runtime | rows | federations | users | rounds "
        "| seeds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in ORDER:
        item = loaded[name]
        if item is None:
            state = "not regenerated" if name in kept_sections else "not run"
            out.append(f"| {name} | {experiments[name].paper} | {state} | - | - | - | - | - "
                       "| - |")
        else:
            rows, meta = item
            out.append(f"| [{name}](#{name}) | {experiments[name].paper} | "
                       f"{meta.get('profile', '?')} | "
                       f"{fmt(_compute_s(meta), 4)} s | {len(rows)} | {_sizes(rows, meta)} |")
    totals: dict[str, float] = {}
    counted: set[str] = set()
    for item in loaded.values():
        seconds = None if item is None else _compute_s(item[1])
        if item is not None and seconds is not None:
            # An experiment whose federations are all another's (leakage reads accuracy-vs-nu's
            # from the shared cache) adds no time of its own.
            configs = {json.dumps(c, sort_keys=True) for c in federation_configs(item[1])}
            if configs and configs <= counted:
                continue
            counted |= configs
            profile = str(item[1].get("profile", "?"))
            totals[profile] = totals.get(profile, 0.0) + seconds
    took = "; ".join(f"profile **{p}**: {t / 60:.0f} min" for p, t in sorted(totals.items()))
    out += ["", "A runtime is that of the last invocation that ran the experiment's federations "
            "(one that reuses them all from the cache, to redraw figures, keeps it; see each "
            "section's note). Summed over the experiments regenerated from raw files, "
            "federations shared by two experiments counted once: "
            f"{took or 'nothing run'} (on a machine shared with other work, each experiment "
            "takes longer than alone).", ""]
    for name in ORDER:
        out += [f"## {name}", ""]
        item = loaded[name]
        if item is None:
            if name in kept_sections:
                out += [_kept_note(name), "", NOT_REGENERATED, kept_sections[name], ""]
            else:
                out += [f"{NOT_RUN} `python -m experiments {name} --quick`.", ""]
            continue
        rows, meta = item
        out += [_profile_note(meta), ""]
        out += experiments[name].report(rows)
        figures = _figures(raw, name)
        out += ["", *figures, ""] if figures else [""]
    out += _differences()
    # Sections measured by other commands (each names its own) follow the marker: kept.
    kept = previous.split(KEPT_MARKER, 1)
    if len(kept) == 2:
        out += ["", KEPT_MARKER + kept[1].rstrip()]
    return "\n".join(out).rstrip() + "\n"


def _sizes(rows: list[dict[str, str]], meta: dict[str, Any]) -> str:
    """Return the table cells of a run's size: federations, users, rounds, seeds.

    An experiment that runs no federation has its seeds counted in its rows.
    """
    configs = federation_configs(meta)
    if not configs:
        in_rows = {r["seed"] for r in rows if r.get("seed") not in (None, "")}
        return f"- | - | - | {len(in_rows) or '-'}"

    def span(key: str) -> str:
        values = sorted({int(c[key]) for c in configs if key in c})
        if not values:
            return "-"
        return f"{values[0]:,}" if len(values) == 1 else f"{values[0]:,}-{values[-1]:,}"

    seeds = len({c["seed"] for c in configs if "seed" in c})
    return f"{len(configs)} | {span('supernodes')} | {span('num-rounds')} | {seeds}"


def _engines(experiments: dict[str, Experiment]) -> str:
    """Say which experiments ran on which engine, from each one's own declaration."""
    parts = []
    for engine, words in ENGINES.items():
        names = [f"`{name}`" for name in ORDER if experiments[name].engine == engine]
        if names:
            parts.append(f"{', '.join(names)} ran with {words}")
    return "; ".join(parts)


def _differences() -> list[str]:
    return [
        "## What differs from the papers, and why (summary)",
        "",
        *_DIFFERENCES,
    ]
