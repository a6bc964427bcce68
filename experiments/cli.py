"""``python -m experiments NAME`` (or ``gpfl-experiment NAME``): the papers' experiments.

Each experiment runs its configurations one at a time (federations of gpfl's ServerApp and
ClientApp, on the direct engine by default or on Flower's Simulation Engine with
``--engine simulation``; or gpfl's own parts in process: each declares its ``engine``) and writes
``results.csv`` (a header row, one row per configuration and seed), PNG figures under
``figures/`` and ``meta.json`` into ``--out`` (default ``runs/experiments/<name>``), printing a
progress line per finished configuration. ``--quick`` uses reduced settings (five seeds; on 2
cores an experiment's federations take up to about 45 minutes, ``all``'s about 4 h, which
``--jobs 2`` runs in about 1.5 h); without it the settings follow the papers (many hours).
``report`` regenerates ``docs/RESULTS.md`` from those folders; ``bench`` runs every benchmark
and prints one table of ratios against their floors or anchors
(`experiments.benchmarks.bench_suite`; ``--quick``: a few minutes on 2 cores). From a clean clone::

    python -m experiments all --quick && python -m experiments report
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from experiments.core.common import DEFAULT_CACHE, DEFAULT_ROOT, ENGINES, PROFILES, Context
from experiments.core.provenance import code_state, combine, float_environment, raw_digests
from experiments.core.registry import EXPERIMENTS, load
from experiments.core.runner import run
from settings.extras import MissingExtraError, require_extra

__all__ = ["COMMANDS", "EXPERIMENTS", "build_parser", "main", "run_experiment"]

COMMANDS = (*EXPERIMENTS, "all", "report", "bench", "verify")


def build_parser() -> argparse.ArgumentParser:
    """Build the command-line parser."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments",
        description="Reproduce the papers' experiments on Flower's Simulation Engine.",
        epilog="From a clean clone: python -m experiments all --quick && "
               "python -m experiments report",
    )
    parser.add_argument("name", choices=COMMANDS,
                        help="the experiment, 'all', 'report', 'bench' (every benchmark) or "
                             "'verify' (check the committed raw files and rerun some rows)")
    parser.add_argument("experiments", nargs="*", default=[], metavar="EXPERIMENT",
                        help="verify: the experiments to verify (default: every one with raw "
                             "files)")
    parser.add_argument("--quick", action="store_true",
                        help="reduced settings: five seeds, up to ~45 minutes an experiment on 2 "
                             "cores, about 4 h of federations for 'all' (86 min with --jobs 2)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default runs/experiments/<name>; for 'all' and "
                             "'report': the folder holding one folder per experiment, default "
                             "runs/experiments)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="seeds (default: the profile's)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="where finished federations are kept and reused (default "
                             f"{DEFAULT_CACHE}, or <out>/_runs for 'all' with --out)")
    parser.add_argument("--fresh", action="store_true",
                        help="run every federation again even if the cache has it")
    parser.add_argument("--data-path", default="",
                        help="leakage: the CMS inpatient charges CSV (adds the hospital table)")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds one federation may run on the Simulation Engine (default "
                             "3600; the direct engine runs in this process, to the end)")
    parser.add_argument("--engine", choices=ENGINES, default="direct",
                        help="what runs the federations: 'direct' (default: the ServerApp and "
                             "ClientApp in this process, the same results as the Simulation "
                             "Engine without its start-up and polls) or 'simulation' (Flower's "
                             "Simulation Engine on Ray)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="'all': run this many experiments at once, one process each "
                             "(default 1; scale always runs alone)")
    parser.add_argument("--doc", type=Path, default=Path("docs") / "RESULTS.md",
                        help="report: the Markdown file to write (default docs/RESULTS.md)")
    parser.add_argument("--only", nargs="+", default=None, metavar="BENCHMARK",
                        help="bench: run only these benchmarks (sampling, release, aggregate, "
                             "fab, round, round-model, scale, deploy)")
    parser.add_argument("--rows", type=int, default=1,
                        help="verify: rows to rerun per experiment, drawn at random (default 1)")
    parser.add_argument("--row", type=int, nargs="+", default=None, metavar="INDEX",
                        help="verify: rerun these rows (0 is the first data row of results.csv)")
    parser.add_argument("--seed", type=int, default=None,
                        help="verify: the seed of the row draw (default: a fresh one, printed)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="verify: draw only among rows that took at most this long when "
                             "they ran (default: any row)")
    # The tests' own settings, smaller than --quick; not part of the documented interface.
    parser.add_argument("--profile", choices=PROFILES, default=None, help=argparse.SUPPRESS)
    return parser


def run_experiment(name: str, *, out: Path, cache: Path, profile: str,
                   seeds: list[int] | None = None, fresh: bool = False, data_path: str = "",
                   timeout: float = 3600.0, stream: TextIO | None = None,
                   engine: str = "direct") -> list[dict[str, Any]]:
    """Run one experiment and write its outputs; return its rows."""
    experiment = load(name)
    ctx = Context(name=name, out=out, cache=cache, profile=profile, seeds=seeds, fresh=fresh,
                  data_path=data_path, timeout=timeout, stream=stream, engine=engine)
    started = time.monotonic()
    code_at_start = code_state()
    rows = run(experiment, ctx)
    ctx.write_meta(started, {
        "code": combine(code_at_start, code_state()),
        "float_environment": float_environment(),
        "raw_files": raw_digests(out),
        "rows": len(rows),
        "row_settings": list(ctx.row_settings),
    })
    print(f"{name}: {len(rows)} rows in {out / 'results.csv'}, figures in {out / 'figures'} "
          f"({time.monotonic() - started:.0f} s; {ctx.launched} federations run, "
          f"{ctx.reused} reused)", file=stream or sys.stdout, flush=True)
    return rows


def _verify(args: argparse.Namespace) -> int:
    from experiments.core.verify import verify

    unknown = [n for n in args.experiments if n not in EXPERIMENTS]
    if unknown:
        print(f"verify: unknown experiments {unknown}; known: {', '.join(EXPERIMENTS)}",
              file=sys.stderr)
        return 2
    if args.rows < 1:
        print(f"verify: --rows must be at least 1, got {args.rows}", file=sys.stderr)
        return 2
    root = args.out or Path("docs") / "results"
    verdicts = verify(root, args.experiments, count=args.rows, seed=args.seed,
                      indices=args.row, max_seconds=args.max_seconds)
    failed = [v.name for v in verdicts if not v.ok]
    unsure = [v.name for v in verdicts if v.ok and v.inconclusive]
    confirmed = len(verdicts) - len(failed) - len(unsure)
    print(f"verify: {confirmed} of {len(verdicts)} experiments ok"
          + (f"; inconclusive (made on another float environment): {', '.join(unsure)}"
             if unsure else "")
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m experiments`` and ``gpfl-experiment``."""
    args = build_parser().parse_args(argv)
    profile = args.profile or ("quick" if args.quick else "full")
    if args.name != "report":  # the report only reads raw files and draws
        try:
            require_extra("experiments", f"python -m experiments {args.name}")
        except MissingExtraError as err:
            print(err, file=sys.stderr)
            return 2
    if args.name == "bench":
        from experiments.benchmarks.bench_suite import run_suite

        try:
            _, failed_benchmarks = run_suite(profile, args.only)
        except ValueError as err:
            print(f"bench: {err}", file=sys.stderr)
            return 2
        return 1 if failed_benchmarks else 0
    if args.experiments and args.name != "verify":
        print(f"{args.name}: takes no experiment names, got {' '.join(args.experiments)}",
              file=sys.stderr)
        return 2
    if args.name == "verify":
        return _verify(args)
    if args.name == "report":
        from experiments.core.report import RefusedRawFiles, write_report

        root = args.out or DEFAULT_ROOT
        try:
            path = write_report(root, args.doc)
        except RefusedRawFiles as err:
            print(f"report: {err}", file=sys.stderr)
            return 1
        print(f"report: wrote {path} from {root}")
        return 0
    names = list(EXPERIMENTS) if args.name == "all" else [args.name]
    if args.name == "all":
        root = args.out or DEFAULT_ROOT
        cache = args.cache or (root / "_runs" if args.out else DEFAULT_CACHE)
    else:
        root = None
        cache = args.cache or DEFAULT_CACHE
    if args.name == "all" and args.jobs != 1:
        from experiments.core.jobs import experiment_command, run_jobs

        assert root is not None
        options = [*(["--profile", profile] if args.profile else ["--quick"] if args.quick
                     else []),
                   "--cache", str(cache), "--timeout", str(args.timeout),
                   "--engine", args.engine,
                   *(["--seeds", *map(str, args.seeds)] if args.seeds else []),
                   *(["--fresh"] if args.fresh else []),
                   *(["--data-path", args.data_path] if args.data_path else [])]
        try:
            failed = run_jobs(names, lambda name: experiment_command(
                name, [*options, "--out", str(root / name)]), args.jobs)
        except ValueError as err:
            print(f"all: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"all: interrupted; finished federations stay in {cache}", file=sys.stderr)
            return 130
        if failed:
            print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1 if failed else 0
    failed = []
    for name in names:
        out = (root / name) if root is not None else (args.out or DEFAULT_ROOT / name)
        try:
            run_experiment(name, out=out, cache=cache, profile=profile, seeds=args.seeds,
                           fresh=args.fresh, data_path=args.data_path, timeout=args.timeout,
                           engine=args.engine)
        except KeyboardInterrupt:
            print(f"{name}: interrupted; finished federations stay in {cache}", file=sys.stderr)
            return 130
        except Exception as err:  # report and go on with the next experiment under 'all'
            print(f"{name}: FAILED: {type(err).__name__}: {err}", file=sys.stderr)
            failed.append(name)
            if args.name != "all":
                return 1
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
