"""The device runner (``gpfl supernode``) over real Flower processes.

One federation (a SuperLink and 2 SuperNodes started as devices start them, through
``gpfl supernode``) serves several runs in turn, since a launch costs ~15 s here and a round
~6-12 s: a plain gpfl run; a run whose FAB carries a tampered client under gpfl's own app id and
version (its code must never run on a device); a run of another app id (refused, and the run
ends instead of hanging); a run whose request the device policy declines (a reply, not an error).
The runner's own process handling (signals, a dead runner) is checked on a runner alone.
"""

from __future__ import annotations

import csv
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from client.process_tree import bin_dir, child_env, terminate_tree
from deploy.fab import stage_app
from deploy.federation import CONNECTION
from deploy.launcher import Federation, free_port, project_root, stream_lines
from deploy.processes import SERVERAPP
from deploy.superlink_state import STARTED
from server.results import END_LINE, ROUND_TAG
from settings.pairs import format_pairs
from tests.conftest import close_federation, descendants, flower_processes, ledger_spend

pytestmark = pytest.mark.integration

N_OVER_NU = 2 / 5  # cost of one release: n/ν with n = 2, ν = 5
NAMES = ("client-0", "client-1")
RUN = {"num-rounds": 2, "clients-per-round": 2, "patience": 0, "seed": 11,
       "round-timeout": 30.0}


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    """A SuperLink and 2 SuperNodes through ``gpfl supernode``, shared by this module's runs."""
    work = tmp_path_factory.mktemp("runner-fed")
    before = descendants()
    fed = Federation(workdir=work)
    try:
        fed.start_superlink()
        # Device 1 keeps a CMS charges file with a malformed row (a patient's name where a
        # payment belongs); the synthetic runs never read it.
        bad_file = work / "charges.csv"
        write_malformed_cms_csv(bad_file)
        for i in range(2):
            fed.start_supernode(i, {"partition-id": i, "num-partitions": 2,
                                    "ledger-dir": str(work / "ledgers"),
                                    **({"data-path": str(bad_file)} if i == 1 else {})})
        yield fed
    finally:
        close_federation(fed, before)


PATIENT = "Jane Q. Doe 1961-04-02"


def write_malformed_cms_csv(path: Path) -> None:
    from tests.test_tasks_hospital import HEADER, PNEUMONIA_CC

    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(HEADER)
        writer.writerow([PNEUMONIA_CC, "10001", "H", "1 MAIN ST", "CITY", "ST", "36301", "X",
                         "20", "$35000.00", PATIENT, "$5000.00"])


def run_app(fed: Federation, app: Path, name: str, **config: Any) -> tuple[dict[str, Any], float]:
    """Submit one run, wait for it; return its summary.json and the seconds it took."""
    out = fed.workdir / name
    seen: list[str] = []
    started = time.monotonic()
    proc = fed.submit(app, {**RUN, **config, "out-dir": str(out)})
    for line in stream_lines(proc, fed.logs / f"{name}.log", timeout=240):
        seen.append(line)
        # While the run goes on, no Flower executor serves the SuperNodes' tasks.
        assert not [p for p in flower_processes() if "flwr-clientapp" in p]
    fed.procs.procs.pop("flwr-run", None)
    if proc.stdout is not None:
        proc.stdout.close()
    return json.loads((out / "summary.json").read_text()), time.monotonic() - started


def spent(fed: Federation) -> dict[str, tuple[int, float]]:
    """Releases and d-privacy spend in each device's ledger."""
    return ledger_spend(fed.workdir / "ledgers", NAMES)


def device_logs(fed: Federation) -> str:
    return "".join((fed.logs / f"supernode-{i}.log").read_text(errors="replace")
                   for i in range(2))


def copy_app(dst: Path) -> Path:
    """A copy of this checkout's Flower app (what `flwr run` packs into the FAB)."""
    root = project_root()
    shutil.copytree(root, dst, ignore=shutil.ignore_patterns(
        ".venv", ".git", "runs", "__pycache__", "*.egg-info", "tests", "docs", "deploy",
        "experiments", ".mypy_cache", ".ruff_cache", ".pytest_cache", "build"))
    return dst


def test_a_run_over_the_device_runner(federation: Federation) -> None:
    # Execute
    before = spent(federation)
    summary, _ = run_app(federation, project_root(), "plain")

    # Assert: both rounds completed with both devices, each release charged once.
    assert summary["status"] == "complete" and summary["rounds_completed"] == 2
    assert [e["replies"] for e in summary["history"][1:]] == [2, 2]
    after = spent(federation)
    for name in NAMES:
        assert after[name][0] - before[name][0] == 2
        assert after[name][1] - before[name][1] == pytest.approx(2 * N_OVER_NU)
    logs = device_logs(federation)
    assert "warm executor" in logs and "served by the gpfl client installed" in logs
    # One warm executor per SuperNode served every message (no process per message), and the
    # SuperNode started no executor of its own (no flower-superexec, no flwr-clientapp).
    assert logs.count("warm executor") == 2
    # Each executor was woken by its SuperNode for a task (a broken wake-up leaves every task to
    # the 5 s idle poll, which logs "by the idle poll").
    for i in range(2):
        log = (federation.logs / f"supernode-{i}.log").read_text(errors="replace")
        assert "task found woken by the SuperNode" in log, log[-3000:]
    for i in range(2):
        tree = psutil.Process(federation.procs.procs[f"supernode-{i}"].pid).children(
            recursive=True)
        commands = sorted(" ".join(p.cmdline()) for p in tree)
        assert len(commands) == 2, commands
        assert any("client.executor" in c for c in commands)
        assert any("client.fleet_poll" in c and "--isolation process" in c for c in commands)


TAMPER = '''
    def fit(self, parameters, config):  # tampered: mark, then send the raw hypothesis, uncharged
        import pathlib
        pathlib.Path({marker!r}).write_text("the server's client ran on the device")
        return [p for p in parameters[:len(self.task.parameter_shapes)]], 1, {{
            "client-name": self.policy.client_name, "declined": 0, "mechanism": "laplace"}}

    def _untampered_fit('''


def test_a_fab_with_a_tampered_client_never_runs_on_the_device(
    federation: Federation, tmp_path: Path
) -> None:
    # Prepare: the same app id and version, with a client that writes a marker file and
    # releases the raw hypothesis without charging anything.
    app = copy_app(tmp_path / "app")
    marker = tmp_path / "tampered-client-ran"
    client = app / "client" / "numpy_client.py"
    text = client.read_text()
    assert "    def fit(\n" in text
    client.write_text(text.replace("    def fit(\n", TAMPER.format(marker=str(marker)), 1))
    (app / "client" / "app.py").write_text(
        (app / "client" / "app.py").read_text()
        + f"\nimport pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n")
    # The tamper works where the FAB's code is run: importing it writes the marker.
    subprocess.run([sys.executable, "-c", "import client.app"], cwd=app, check=True,
                   env=child_env({"PYTHONPATH": str(app)}))
    assert marker.exists()
    marker.unlink()
    before = spent(federation)

    # Execute
    summary, _ = run_app(federation, app, "tampered")

    # Assert: the marker never appeared; every release was sanitized and charged by the
    # device's own client.
    assert not marker.exists()
    assert summary["status"] == "complete" and summary["rounds_completed"] == 2
    after = spent(federation)
    for name in NAMES:
        assert after[name][0] - before[name][0] == 2
    sent = np.asarray(summary["initial_hypotheses"], dtype=float)
    for entry in summary["history"][1:]:
        assert entry["replies"] == 2 and entry["failures"] == 0
        for release in entry["released"]:
            # A raw hypothesis would equal one of those sent; Laplace noise (ν = 5) moves it.
            assert np.min(np.abs(sent - np.asarray(release)).max(axis=1)) > 1e-3


def test_a_run_of_another_app_is_refused_and_does_not_hang(
    federation: Federation, tmp_path: Path
) -> None:
    # Prepare: gpfl's code under another app id.
    app = copy_app(tmp_path / "app")
    pyproject = app / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('name = "gpfl"', 'name = "gpfl-other"', 1))
    before = spent(federation)

    # Execute
    summary, seconds = run_app(federation, app, "other-app")

    # Assert: every reply was a failure, reported as such rather than as a device missing the
    # round's deadline, the device logged which app it refused and why, and nothing was charged.
    assert summary["rounds_completed"] == 0
    for entry in summary["history"][1:]:
        assert entry["replies"] == 0 and entry["failures"] == 2 and not entry["missing"]
    print(f"the refused run took {seconds:.1f} s (round-timeout {RUN['round-timeout']} s)")
    logs = device_logs(federation)
    assert "gpfl executor refuses run" in logs
    assert "app gpfl/gpfl-other 0.1.0: not the app installed on this device" in logs
    assert spent(federation) == before


def test_a_policy_decline_is_a_reply_not_an_error(federation: Federation) -> None:
    # Execute: the run asks for no noise; the devices' default policy forbids it.
    before = spent(federation)
    summary, _ = run_app(federation, project_root(), "declined", mechanism="none")

    # Assert: each device replied with a decline (counted as such, not as a failure) and
    # nothing was charged.
    for entry in summary["history"][1:]:
        assert entry["declined"] == 2 and entry["failures"] == 0 and not entry["missing"]
    per_client = summary["privacy"]["per_client"]
    assert all(per_client[n]["declines"] == 2 for n in NAMES)
    assert spent(federation) == before


# --- the runner's own processes ------------------------------------------------------------
# --- gpfl submit: a run followed within deadlines, as the compose deployment submits it ------
def gpfl_submit(fed: Federation, app: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``gpfl submit APP <the federation's connection> ARGS`` to its end."""
    return subprocess.run(
        [str(bin_dir() / "gpfl"), "submit", str(app), CONNECTION, *args],
        capture_output=True, text=True, timeout=300, check=False,
        env=child_env({"FLWR_HOME": str(fed.flwr_home)}))


def run_status(fed: Federation, run_id: int) -> str:
    """The run's status as the SuperLink reports it (``flwr ls --run-id``)."""
    done = subprocess.run([str(bin_dir() / "flwr"), "ls", CONNECTION, "--run-id", str(run_id),
                           "--format", "json"], capture_output=True, text=True, timeout=60,
                          check=True, env=child_env({"FLWR_HOME": str(fed.flwr_home)}))
    (run,) = json.loads(done.stdout)["runs"]
    return str(run["status"])


def test_gpfl_submit_stops_a_run_whose_serverapp_never_starts(
    federation: Federation, tmp_path: Path
) -> None:
    # Prepare: no ServerApp process serves the SuperLink (process isolation): the run stays
    # pending, as when every ServerApp is refused or never comes up.
    app = stage_app(project_root(), tmp_path / "app")
    federation.procs.stop(SERVERAPP)
    before = spent(federation)

    # Execute
    done = gpfl_submit(federation, app, "--startup-timeout", "10", "--run-config",
                       format_pairs({**RUN, "out-dir": str(tmp_path / "out")}))

    # Assert: exit 1 (no round ran), one line saying what and what to try, the run stopped on
    # the SuperLink (no ServerApp started later can pick it up), nothing charged.
    last = [ln for ln in done.stderr.splitlines() if ln.startswith("gpfl submit:")][-1]
    run_id = int(STARTED.search(done.stdout).group(1))  # type: ignore[union-attr]
    assert done.returncode == 1, done.stderr
    assert last == (
        "gpfl submit: failed: the ServerApp did not start within 10 s of the submission (no "
        "[gpfl] line): the host is too slow or overloaded; try again when it is less busy, "
        "with fewer --supernodes, or with a longer --startup-timeout (run "
        f"{run_id} stopped with flwr stop)"), last
    assert run_status(federation, run_id).startswith("finished:stopped")
    assert spent(federation) == before


def test_gpfl_serverapp_serves_run_after_run_and_gpfl_submit_follows_each_to_its_status(
    federation: Federation, tmp_path: Path
) -> None:
    # Prepare: `gpfl serverapp` serving the SuperLink (as the compose deployment's `serverapp`
    # service does), in place of the launcher's own ServerApp process.
    app = stage_app(project_root(), tmp_path / "app")
    federation.procs.stop(SERVERAPP)
    service = subprocess.Popen(
        [str(bin_dir() / "gpfl"), "serverapp", "--superlink",
         f"127.0.0.1:{federation.control_port}"], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env=child_env(), start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(service.stdout or []), daemon=True)
    reader.start()
    try:
        # Execute: two runs, one after the other; then wait for the second run's process to end
        # (it pushes its output after the log has ended) and stop the service.
        runs = [gpfl_submit(federation, app, "--run-config",
                            format_pairs({**RUN, "num-rounds": rounds,
                                          "out-dir": str(tmp_path / f"out{rounds}")}))
                for rounds in (2, 1)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "".join(lines).count("its run ended") < 2:
            time.sleep(0.2)
    finally:
        service.send_signal(signal.SIGTERM)
        code = service.wait(timeout=30)
        reader.join(timeout=10)
        if service.stdout is not None:
            service.stdout.close()
        said = "".join(lines)

    # Assert: each run's log went to stdout, its last line gave the status, the exit status is
    # gpfl launch's for it; each run had its own ServerApp process, and SIGTERM stopped the
    # service (exit 128 + 15).
    for done, rounds in zip(runs, (2, 1), strict=True):
        last = [ln for ln in done.stderr.splitlines() if ln.startswith("gpfl submit:")][-1]
        run_id = int(STARTED.search(done.stdout).group(1))  # type: ignore[union-attr]
        assert done.returncode == 0, done.stderr
        assert f"{ROUND_TAG} round {rounds}/{rounds}" in done.stdout
        assert f"{END_LINE} complete" in done.stdout
        assert last == f"gpfl submit: run {run_id} ended: complete"
        summary = json.loads((tmp_path / f"out{rounds}" / "summary.json").read_text())
        assert summary["status"] == "complete"
    assert said.count("ended with code 0: its run ended") == 2, said
    assert code == 128 + signal.SIGTERM, said


def test_gpfl_submit_refuses_a_bad_run_config_before_submitting(
    federation: Federation, tmp_path: Path
) -> None:
    done = gpfl_submit(federation, tmp_path, "--run-config", "num-rounds=-3")
    assert done.returncode == 1
    assert "nothing submitted" in done.stderr and "num-rounds" in done.stderr
    assert "-3" in done.stderr and "Successfully started run" not in done.stdout


def start_runner(tmp_path: Path) -> tuple[subprocess.Popen[bytes], list[int]]:
    """``gpfl supernode`` towards a SuperLink that is not there; wait for its 2 children."""
    with open(tmp_path / "runner.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [str(bin_dir() / "gpfl"), "supernode", "--insecure", "--superlink",
             f"127.0.0.1:{free_port()}", "--port", str(free_port()), "--node-config",
             f'partition-id=0 ledger-dir="{tmp_path}"'],
            stdout=log, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        kids = psutil.Process(proc.pid).children()
        if len(kids) == 2:
            return proc, [k.pid for k in kids]
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the runner did not start its two children")


def gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not [p for p in pids if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_runner_stops_its_children_on_a_signal(
    tmp_path: Path, signum: int, no_leftover_processes: None
) -> None:
    proc, kids = start_runner(tmp_path)
    proc.send_signal(signum)
    assert proc.wait(timeout=20) == 128 + signum
    assert gone(kids, 10)


@pytest.mark.parametrize("how", ["runner", "tree"])
def test_a_device_stopped_normally_says_so_in_one_line_without_a_traceback(
    tmp_path: Path, how: str, no_leftover_processes: None
) -> None:
    # Execute: SIGTERM to the runner alone (as docker stop and a service manager send it), or
    # to the runner and every process under it at once (as the launcher stops a device).
    proc, kids = start_runner(tmp_path)
    time.sleep(3)  # the executor past its start, waiting on its SuperNode
    if how == "runner":
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    else:
        assert terminate_tree([proc.pid], timeout=10) == []
        proc.wait(timeout=5)

    # Assert: one line saying why it stopped, no traceback from any of its processes.
    log = (tmp_path / "runner.log").read_text(errors="replace")
    assert "Traceback" not in log and "SystemExit" not in log, log
    assert log.count("gpfl supernode: stopped on SIGTERM (signal 15)") == 1, log
    assert gone(kids, 10)


def test_a_warm_executor_signalled_twice_stops_without_a_traceback(tmp_path: Path) -> None:
    # Prepare: an executor with torch loaded, as after a task of a torch model (torch's exit
    # handlers make its interpreter's shutdown long enough for a second signal to land in it).
    code = ("import torch, sys\nfrom client.executor import main\n"
            f"sys.exit(main(['--runtime-api-address', '127.0.0.1:{free_port()}']))")
    with open(tmp_path / "executor.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=log,
                                stderr=subprocess.STDOUT, env=child_env())
    deadline = time.monotonic() + 60
    while "warm executor" not in (tmp_path / "executor.log").read_text(errors="replace"):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)

    # Execute: SIGTERM, then more while it stops (the launcher's and the runner's signals).
    for _ in range(40):
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.01)
    status = proc.wait(timeout=30)

    # Assert: it ended on the first signal's status, quietly.
    text = (tmp_path / "executor.log").read_text(errors="replace")
    assert status == 128 + signal.SIGTERM, text
    assert "Traceback" not in text and "SystemExit" not in text, text


def test_children_of_a_killed_runner_stop_too(tmp_path: Path) -> None:
    # SIGKILL leaves the runner no time to clean up: the kernel tells its children
    # (PR_SET_PDEATHSIG), and the executor also watches its parent.
    proc, kids = start_runner(tmp_path)
    proc.kill()
    proc.wait(timeout=10)
    try:
        assert gone(kids, 15)
    finally:
        for pid in kids:  # never leave one behind, whatever happened
            if psutil.pid_exists(pid):
                psutil.Process(pid).kill()


def test_a_device_whose_superlink_never_answers_stops_within_its_bound_and_says_why(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    # Prepare: nothing listens at the SuperLink's address; the device retries for
    # --max-wait-time (3 s here; 600 s by default) and no longer.
    superlink = f"127.0.0.1:{free_port()}"

    # Execute
    started = time.monotonic()
    done = subprocess.run(
        [str(bin_dir() / "gpfl"), "supernode", "--insecure", "--superlink", superlink,
         "--port", str(free_port()), "--max-wait-time", "3", "--node-config",
         f'partition-id=0 ledger-dir="{tmp_path}"'],
        capture_output=True, text=True, env=child_env(), timeout=120, check=False)
    took = time.monotonic() - started

    # Assert: the runner ended with the SuperNode's code, its last line naming the address,
    # what it found there and the setting that bounded the wait; the executor had started.
    out = done.stderr + done.stdout
    last = [line for line in out.splitlines() if line.startswith("gpfl supernode:")][-1]
    assert done.returncode != 0
    assert last == (
        f"gpfl supernode: stopped: the SuperNode exited with code {done.returncode}: the "
        f"SuperLink at {superlink} does not answer (Connection refused; the SuperNode gives up "
        "after --max-wait-time=3 s); check --superlink and that the SuperLink runs, then start "
        "this device again (its ledger is unchanged)"), last
    assert "warm executor" in out
    assert took < 60, took  # 3 s of retries, plus two interpreters' start and the cleanup


# --- a curious server at the edges of arithmetic, over real processes ------------------------
def test_an_overflowing_noise_multiplier_is_declined_by_every_device(
    federation: Federation, tmp_path: Path
) -> None:
    # Prepare: a server whose own settings accept any finite noise multiplier, asking for one
    # that overflows nu * ||delta|| (the devices released their raw models against it).
    app = copy_app(tmp_path / "app")
    values = app / "settings" / "values.py"
    text = values.read_text()
    assert "MAX_PRIVACY_PARAMETER = 1e6\n" in text
    values.write_text(text.replace("MAX_PRIVACY_PARAMETER = 1e6\n",
                                   "MAX_PRIVACY_PARAMETER = 1.7976931348623157e308\n"))
    before = spent(federation)

    # Execute
    summary, _ = run_app(federation, app, "huge-nu",
                         **{"noise-multiplier": 1e308, "learning-rate": 10.0})

    # Assert: every device declined every round; nothing was released or charged.
    for entry in summary["history"][1:]:
        assert entry["declined"] == 2 and entry["replies"] == 0 and entry["failures"] == 0
    assert spent(federation) == before
    assert "noise-multiplier" in device_logs(federation)


def test_a_vanishing_learning_rate_still_releases_noisy_models(federation: Federation) -> None:
    # Execute: a step of 1e-30 leaves the update at 0 (the release was the hypothesis itself).
    summary, _ = run_app(federation, project_root(), "tiny-step",
                         **{"learning-rate": 1e-30, "num-rounds": 1})

    # Assert: each release is away from every hypothesis sent (noise of nu * least-radius =
    # 0.05 in norm; a release within 1e-4 of one has probability < 2e-5).
    sent = np.asarray(summary["initial_hypotheses"], dtype=float)
    released = summary["history"][1]["released"]
    assert len(released) == 2
    for release in released:
        assert np.min(np.abs(sent - np.asarray(release)).max(axis=1)) > 1e-4


def test_float64_hypotheses_get_float32_releases_from_every_device(
    federation: Federation, tmp_path: Path
) -> None:
    # Prepare: a server that sends its hypotheses as float64 (it chose the release's precision:
    # a float64 release's last bits leak, see docs/PRIVACY.md). Its own screening still
    # expects float32 replies and drops any other dtype.
    app = copy_app(tmp_path / "app")
    strategy = app / "strategies" / "clustered.py"
    text = strategy.read_text()
    sent = "ndarrays_to_parameters([a for hypothesis in layers for a in hypothesis])"
    assert sent in text
    strategy.write_text(text.replace(sent, "ndarrays_to_parameters([a.astype('float64') for "
                                           "hypothesis in layers for a in hypothesis])"))
    before = spent(federation)

    # Execute
    summary, _ = run_app(federation, app, "float64-hypotheses", **{"num-rounds": 1})

    # Assert: both devices released, in float32 (none dropped for its dtype), charged once.
    entry = summary["history"][1]
    assert entry["replies"] == 2 and entry["dropped"] == [] and entry["failures"] == 0
    after = spent(federation)
    assert all(after[name][0] == before[name][0] + 1 for name in NAMES)


def test_a_malformed_data_file_never_reaches_the_server(
    federation: Federation, tmp_path: Path
) -> None:
    # Prepare: the server validates on a good CMS file; device 1's own file is malformed.
    from tests.test_tasks_hospital import write_cms_csv

    server_file = write_cms_csv(tmp_path / "server.csv")
    before = spent(federation)

    # Execute
    summary, _ = run_app(federation, project_root(), "bad-file", task="hospital",
                         **{"server-data-path": str(server_file), "num-rounds": 1})

    # Assert: the server saw two failures, and nowhere the row's content: not in the summary,
    # not in what `flwr run` streamed, not in the SuperLink's log.
    assert summary["history"][1]["failures"] == 2
    seen = "".join([json.dumps(summary), (federation.logs / "bad-file.log").read_text(),
                    (federation.logs / "superlink.log").read_text(errors="replace")])
    assert "Jane" not in seen and "1961" not in seen
    # Device 1 was charged before it read its file; device 0 (no file) refused before that.
    after = spent(federation)
    assert after["client-1"][0] == before["client-1"][0] + 1
    assert after["client-0"] == before["client-0"]
