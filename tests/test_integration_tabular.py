"""The tabular task and task plugins over real Flower processes.

One federation (a SuperLink and 4 SuperNodes through ``gpfl supernode``, each device with its
own CSV in its node config) serves three runs in turn, since a launch costs ~15 s here and a round
~5 s: a tabular run that learns (k = 2, Laplace); a run of a task device 3 does not allow
(device 3 declines, the others serve); a run of a task the server has installed and the devices
have not (every device declines). A declining device charges nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy.cli import main as cli_main
from deploy.launcher import Federation, project_root, stream_lines
from experiments.reproductions.tabular_seeds import (
    POLICY,
    RUN,
    device_nodes,
    held_out_accuracy,
    write_files,
)
from tasks.delivered import load_delivered
from tests.conftest import close_federation, descendants, ledger_spend, write_task_plugin

pytestmark = pytest.mark.integration

NAMES = tuple(f"client-{i}" for i in range(4))
SEED = 0
#: Held-out accuracy must beat the majority-class rate by this much. Over 5 seeds
#: (`python -m experiments.reproductions.tabular_seeds`, docs/TASKS.md) the margin was +0.265 at the
#: least (mean +0.305); seed 0's run, this test's, is +0.300.
MARGIN = 0.15
#: A task only the server has installed: a package's metadata on the SuperLink's path alone.
SERVER_ONLY = "server-only-linear"


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Federation, dict]]:
    """A SuperLink and 4 SuperNodes, each with its own CSV; device 3 serves tabular only."""
    work = tmp_path_factory.mktemp("tabular-fed")
    files = write_files(work / "data", SEED)
    before = descendants()
    fed = Federation(workdir=work)
    try:
        # The server side sees one more plugin than the devices do (`run` gives it to each
        # run's ServerApp process).
        write_task_plugin(work / "server-plugins", SERVER_ONLY)
        fed.start_superlink()
        # Each device's file and its opted-in noise seed, as the experiment's seed SEED: with
        # the seeded data and server the run is the same every time, so the accuracy check
        # fails for a change of behaviour, not by chance.
        for i, own in device_nodes(files, SEED).items():
            node = {"partition-id": i, "num-partitions": 4, "ledger-dir": str(work / "ledgers"),
                    **own, **POLICY}
            if i == 3:
                node["allowed-tasks"] = "tabular"
            fed.start_supernode(i, node)
        yield fed, files
    finally:
        close_federation(fed, before)


def run(fed: Federation, name: str, config: dict[str, Any]) -> dict[str, Any]:
    """Submit one run, wait for it, return its summary.json."""
    out = fed.workdir / name
    # The ServerApp (the launcher's process of this run) sees the server-only plugin; the
    # SuperNodes, started without it, do not.
    fed.extra_env["PYTHONPATH"] = str(fed.workdir / "server-plugins")
    try:
        proc = fed.submit(project_root(), {**config, "out-dir": str(out)})
    finally:
        del fed.extra_env["PYTHONPATH"]
    for _ in stream_lines(proc, fed.logs / f"{name}.log", timeout=300):
        pass
    fed.procs.procs.pop("flwr-run", None)
    if proc.stdout is not None:
        proc.stdout.close()
    return json.loads((out / "summary.json").read_text())


def spent(fed: Federation) -> dict[str, tuple[int, float]]:
    """Releases and d-privacy spend in each device's ledger."""
    return ledger_spend(fed.workdir / "ledgers", NAMES)


def test_tabular_learns_over_real_processes(federation: tuple[Federation, dict]) -> None:
    # Prepare
    fed, files = federation
    before = spent(fed)
    started = time.monotonic()

    # Execute
    summary = run(fed, "tabular", {**RUN, "seed": SEED,
                                   "server-data-path": str(files["validation"])})

    # Assert: every round had the 4 devices, each release charged (n/ν = 8/2 each), and the
    # delivered hypotheses beat the majority class on rows no one saw.
    print(f"tabular run: {time.monotonic() - started:.0f} s")
    assert summary["status"] == "complete" and summary["rounds_completed"] == RUN["num-rounds"]
    assert all(e["replies"] == 4 for e in summary["history"][1:])
    after = spent(fed)
    for name in NAMES:
        assert after[name][0] - before[name][0] == RUN["num-rounds"]
        assert after[name][1] - before[name][1] == pytest.approx(RUN["num-rounds"] * 8 / 2)
    accuracy = held_out_accuracy(fed.workdir / "tabular", files["test"])
    print(f"held-out accuracy {accuracy:.3f}, majority-class rate {files['majority']:.3f}")
    assert accuracy > files["majority"] + MARGIN


def test_the_run_reports_its_accuracy_and_delivers_models_that_predict(
    federation: tuple[Federation, dict], capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: the learning run above (its folder), or this run alone.
    fed, files = federation
    out = fed.workdir / "tabular"
    if not (out / "models" / "models.json").is_file():
        run(fed, "tabular", {**RUN, "seed": SEED, "server-data-path": str(files["validation"])})
    summary = json.loads((out / "summary.json").read_text())
    log = (fed.logs / "tabular.log").read_text()

    # Execute: load the models as the docs say, and `gpfl predict` on each site's held-out
    # rows (a site is a user: the method serves each with the hypothesis that fits it best).
    delivered = load_delivered(out)
    names = delivered.task.class_names()
    assert names is not None
    accuracies, printed, codes = [], [], []
    for site, path in _site_files(files["test"], fed.workdir / "held-out").items():
        test = delivered.task.file_dataset(path)
        fit = delivered.fit(test)
        labels = delivered.predict_labels(test.x, fit.hypothesis)
        truth = [names[int(v)] for v in test.y]
        accuracies.append(sum(p == t for p, t in zip(labels, truth, strict=True)) / len(truth))
        codes.append(cli_main(["predict", str(out), "--data", str(path),
                               "--out", str(fed.workdir / f"predictions-{site}.csv")]))
        printed.append((fit, accuracies[-1], len(truth), capsys.readouterr().out))

    # Assert: each round line and the summary carry the validation accuracy, overall and per
    # hypothesis (its validation users summing to all of them) ...
    last = summary["history"][-1]["val_metrics"]
    assert f"round {RUN['num-rounds']}/{RUN['num-rounds']} val_loss " in log
    assert f"val_accuracy {last['accuracy']:.3f} (h0 " in log
    assert last["hypothesis_0_users"] + last["hypothesis_1_users"] == 2  # the two sites
    # ... the models are the summary's delivered hypotheses, in the task's torch format ...
    assert summary["models"]["metric"] == "accuracy"
    assert [m["file"] for m in summary["models"]["models"]] == ["hypothesis-0.pt",
                                                                 "hypothesis-1.pt"]
    for flat, params in zip(summary["hypotheses"], delivered.hypotheses, strict=True):
        assert np.concatenate([a.ravel() for a in params]).tolist() == pytest.approx(flat)
    # ... and gpfl predict prints, per site, the accuracy the loaded models give on held-out
    # rows, which beats the majority class as the held-out check above does.
    assert codes == [0, 0]
    for fit, accuracy, count, text in printed:
        assert (f"hypothesis {fit.hypothesis}: loss {fit.metrics[fit.hypothesis]['loss']:.4f}, "
                f"accuracy {accuracy:.4f}  <- fits best") in text
        assert f"gpfl predict: {count} records of " in text
    assert sum(accuracies) / len(accuracies) > files["majority"] + MARGIN
    rows = (fed.workdir / "predictions-a.csv").read_text().splitlines()
    assert rows[0] == "record,prediction,label" and len(rows) == printed[0][2] + 1


def _site_files(test_csv: Path, folder: Path) -> dict[str, Path]:
    """Split a held-out CSV into one file per site (its ``validation-column``)."""
    header, *lines = test_csv.read_text().splitlines()
    column = header.split(",").index(RUN["validation-column"])
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    for site in sorted({line.split(",")[column] for line in lines}):
        out[site] = folder / f"{site}.csv"
        out[site].write_text("\n".join([header, *(line for line in lines
                                                   if line.split(",")[column] == site)]) + "\n")
    return out

def test_a_task_the_device_does_not_allow_is_declined(federation: tuple[Federation, dict]) -> None:
    # Prepare: device 3 allows tabular only.
    fed, _ = federation
    before = spent(fed)

    # Execute
    summary = run(fed, "not-allowed", {"task": "synthetic", "num-rounds": 1, "seed": 1,
                                       "clients-per-round": 4, "patience": 0})

    # Assert: the other devices served; device 3 replied with a decline naming the task and
    # its rule, and its ledger did not move.
    assert summary["history"][1]["replies"] == 3 and summary["history"][1]["declined"] == 1
    record = summary["privacy"]["per_client"]["client-3"]
    assert record["declines"] == 1 and record["declined_by"] == "policy"
    assert record["decline_reason"] == (
        "declined by policy: task='synthetic' is not among this device's allowed-tasks")
    after = spent(fed)
    assert after["client-3"] == before["client-3"]
    assert all(after[n][0] == before[n][0] + 1 for n in NAMES[:3])


def test_a_task_the_device_has_not_installed_is_declined(
    federation: tuple[Federation, dict]
) -> None:
    # Prepare: the server resolves SERVER_ONLY (its plugin); no device has it.
    fed, _ = federation
    before = spent(fed)

    # Execute
    summary = run(fed, "not-installed", {"task": SERVER_ONLY, "num-rounds": 1, "seed": 1,
                                         "clients-per-round": 4, "patience": 0})

    # Assert: every device declined, naming the task; nothing was charged anywhere.
    assert summary["history"][1]["declined"] == 4 and summary["history"][1]["failures"] == 0
    for name in NAMES[:3]:
        assert summary["privacy"]["per_client"][name]["decline_reason"].startswith(
            f"declined by policy: task={SERVER_ONLY!r} is not installed on this device")
    # Device 3 does not allow it either: its allowed-tasks is checked first.
    assert "allowed-tasks" in summary["privacy"]["per_client"]["client-3"]["decline_reason"]
    assert spent(fed) == before


def test_one_file_split_among_virtual_devices_on_the_simulation_engine(tmp_path: Path) -> None:
    # Prepare: the 4 device files as one, which every virtual device reads (the launch policy).
    from deploy.launcher import launch

    files = write_files(tmp_path / "data", SEED)
    shared = tmp_path / "data" / "all.csv"
    lines = [p.read_text().splitlines() for p in files["devices"]]
    shared.write_text("\n".join([lines[0][0], *(row for f in lines for row in f[1:])]) + "\n")

    # Execute: a Dirichlet split over the label (Flower Datasets), 2 rounds.
    result = launch(supernodes=4, engine="simulation", out_dir=tmp_path / "run",
                    policy={"data-path": str(shared)}, echo=lambda line: None,
                    run_config={**RUN, "num-rounds": 2, "seed": SEED, "tabular-split": "dirichlet",
                                "dirichlet-alpha": 1.0})

    # Assert: every virtual device trained on its own partition and released, charged.
    assert result.status == "complete" and result.summary["rounds_completed"] == 2
    assert [e["replies"] for e in result.summary["history"][1:]] == [4, 4]
    ledgers = result.summary["ledgers"]["per_client"]
    assert sorted(ledgers) == list(NAMES)
    assert all(entry["releases"] == 2 for entry in ledgers.values())
