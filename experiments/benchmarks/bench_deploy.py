"""Benchmark: one SuperLink and N real ``gpfl supernode`` devices, N growing, until it strains.

For each N in ``--devices``: a SuperLink and N devices started as devices start (``gpfl
supernode``: Flower's SuperNode in process isolation, one warm gpfl executor each), then one gpfl
run (synthetic task, k = 2, Laplace ν = 5, every device sampled every round). Reported per N:

* s/round, from Flower's own closing line ("Run finished R round(s) in T s"), start-up excluded;
* the devices' memory: the proportional set size (PSS: a page shared by k processes counts 1/k
  in each) of every device's process tree, summed, divided by N;
* the SuperLink's CPU: CPU seconds of the SuperLink's process tree (its ServerApp included)
  during the run, per round and as a share of one core;
* replies, missing and failed devices over the run (what breaks first shows here, or in the
  start-up: a device that never registers).

Before starting N devices the benchmark estimates their memory from the previous N's figure and
skips an N whose devices would need more than ``--max-memory-gb``: a shared machine is not
pushed into swap or the OOM killer.

    python -m experiments.benchmarks.bench_deploy --devices 10 50 100 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import psutil

from deploy.launcher import Federation, project_root
from experiments.benchmarks.bench_round import timed_run


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _pss(procs: list[psutil.Process]) -> int:
    """Proportional set size, summed: shared pages (libraries, the interpreter) counted once."""
    total = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss
        except psutil.Error:
            continue
    return total


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return total


def measure(n: int, rounds: int, work: Path) -> dict[str, float | int | str]:
    """Start a SuperLink and ``n`` devices, run gpfl ``rounds`` rounds; return the figures."""
    out = work / f"n{n}"
    row: dict[str, float | int | str] = {"devices": n}
    with Federation(workdir=out) as fed:
        fed.start_superlink()
        started = time.monotonic()
        for i in range(n):
            fed.start_supernode(i, {"partition-id": i, "num-partitions": n,
                                    "ledger-dir": str(out / "ledgers"), "cap-d-privacy": 1e6})
        # Every device's executor is warm once its process tree stops growing in memory.
        time.sleep(10 + 0.5 * n)
        row["start_s"] = round(time.monotonic() - started, 1)
        devices = [p for name, proc in fed.procs.procs.items() if name.startswith("supernode-")
                   for p in _tree(proc.pid)]
        row["device_mb"] = round(_pss(devices) / n / 2**20, 1)
        link = fed.procs.procs["superlink"].pid
        cpu_before, wall_before = _cpu(_tree(link)), time.monotonic()
        config = {"num-rounds": rounds, "clients-per-round": n, "num-hypotheses": 2,
                  "mechanism": "laplace", "noise-multiplier": 5.0, "patience": 0,
                  "round-timeout": 300.0, "out-dir": str(out / "run")}
        try:
            row["s_per_round"] = round(timed_run(fed, project_root(), config, out / "run.log"), 2)
        except RuntimeError as err:
            row["error"] = str(err)
        link_cpu = _cpu(_tree(link)) - cpu_before
        wall = time.monotonic() - wall_before
        row["superlink_cpu_s_per_round"] = round(link_cpu / rounds, 2)
        row["superlink_cpu_share"] = round(link_cpu / wall, 2)
        summary_path = out / "run" / "summary.json"
        if summary_path.exists():
            history = json.loads(summary_path.read_text())["history"][1:]
            row["replies"] = sum(e["replies"] for e in history)
            row["missing"] = sum(len(e["missing"]) for e in history)
            row["failed"] = sum(e["failures"] for e in history)
    return row


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-memory-gb", type=float, default=8.0,
                        help="skip an N whose devices would need more memory than this")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gpfl-bench-deploy-"))
    rows: list[dict[str, float | int | str]] = []
    for n in sorted(args.devices):
        need_gb = float(rows[-1]["device_mb"]) * n / 1024 if rows else 0.0
        if need_gb > args.max_memory_gb:
            rows.append({"devices": n, "error": f"skipped: ~{need_gb:.1f} GB of devices > "
                         f"--max-memory-gb {args.max_memory_gb}"})
            break
        rows.append(measure(n, args.rounds, work))
        print(json.dumps(rows[-1]), flush=True)
    cores = psutil.cpu_count()
    print(f"\n| devices ({args.rounds} rounds, all sampled; {cores} cores) | s / round | "
          "MB / device | SuperLink CPU s / round | SuperLink CPU share | replies | missing | "
          "failed | start s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "s_per_round" not in r:
            print(f"| {r['devices']} | {r.get('error', '-')} | | | | | | | |")
            continue
        print(f"| {r['devices']} | {r['s_per_round']} | {r['device_mb']} | "
              f"{r['superlink_cpu_s_per_round']} | {r['superlink_cpu_share']} | "
              f"{r.get('replies', '-')} | {r.get('missing', '-')} | {r.get('failed', '-')} | "
              f"{r['start_s']} |")
    print(f"\nlogs in {work}")


if __name__ == "__main__":
    main()
