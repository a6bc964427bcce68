"""The warm executor's handling of one task, with Flower's Runtime API calls stubbed out."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from flwr.app import Context, Message, RecordDict
from flwr.common.constant import ErrorCode, SubStatus
from flwr.supercore.task_identity import TaskIdentity

from client import executor
from client.pinning import AppPin

PIN = AppPin("gpfl/gpfl", "0.1.0")
HASH = "ab" * 32


@dataclass
class Pushed:
    """What the executor pushed back to the SuperNode."""

    replies: list[Message] = field(default_factory=list)
    outputs: list[tuple[str, str]] = field(default_factory=list)


class _Client:
    def close(self) -> None:
        pass


class _Heartbeat:
    def __init__(self, fn: Any) -> None:
        self.is_running = False

    def start(self) -> None:
        self.is_running = True

    def stop(self) -> None:
        self.is_running = False


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Pushed:
    pushed = Pushed()
    monkeypatch.setattr(executor.RuntimeConnection, "client", lambda self, *a, **k: _Client())
    monkeypatch.setattr(executor, "HeartbeatSender", _Heartbeat)
    monkeypatch.setattr(executor, "make_task_heartbeat_fn_http", lambda client: None)
    monkeypatch.setattr(executor, "push_message",
                        lambda client, reply, context: pushed.replies.append(reply))
    monkeypatch.setattr(executor, "push_task_output",
                        lambda client, context, status, details:
                        pushed.outputs.append((status, details)))
    return pushed


def task(monkeypatch: pytest.MonkeyPatch, fab_id: str, version: str,
         node_config: dict[str, Any] | None = None) -> Message:
    """Make ``pull_task_input`` hand out one train message of the given app."""
    # What Flower's pull_task_input records for the task being served.
    for name, value in (("_task_id", 3), ("_run_id", 7), ("_node_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)
    message = Message(RecordDict(), dst_node_id=1, message_type="train")
    context = Context(run_id=7, node_id=1, node_config=node_config or {}, state=RecordDict(),
                      run_config={})
    run = SimpleNamespace(run_id=7, fab_id=fab_id, fab_version=version)
    fab = SimpleNamespace(hash_str=HASH, content=b"the server's code: never looked at")
    monkeypatch.setattr(executor, "pull_task_input", lambda client: (message, context, run, fab))
    return message


def test_a_run_of_the_installed_app_is_served_by_the_installed_client(
    monkeypatch: pytest.MonkeyPatch, runtime: Pushed
) -> None:
    message = task(monkeypatch, "gpfl/gpfl", "0.1.0")
    calls: list[Message] = []

    def app(message: Message, context: Context) -> Message:
        calls.append(message)
        return Message(RecordDict(), reply_to=message)

    outcome = executor.serve_task(executor.RuntimeConnection("x"), "token", PIN, app)

    assert outcome is not None and outcome.verdict.serve
    assert calls == [message]
    assert len(runtime.replies) == 1 and not runtime.replies[0].has_error()
    assert runtime.outputs == [(SubStatus.COMPLETED, "")]


@pytest.mark.parametrize(("fab_id", "version", "node_config", "why"), [
    ("evil/app", "0.1.0", {}, "not the app installed"),
    ("gpfl/gpfl", "9.9.9", {}, "is not the installed"),
    ("gpfl/gpfl", "0.1.0", {"trusted-fab-hashes": "cd" * 32}, "trusted-fab-hashes"),
    ("gpfl/gpfl", "0.1.0", {"mechanisms": "bogus"}, "policy is invalid"),
])
def test_a_refused_run_gets_an_error_reply_and_never_reaches_the_client(
    monkeypatch: pytest.MonkeyPatch, runtime: Pushed, fab_id: str, version: str,
    node_config: dict[str, Any], why: str, caplog: pytest.LogCaptureFixture
) -> None:
    task(monkeypatch, fab_id, version, node_config)

    def app(message: Message, context: Context) -> Message:
        raise AssertionError("a refused run reached the client")

    outcome = executor.serve_task(executor.RuntimeConnection("x"), "token", PIN, app)

    assert outcome is not None and not outcome.verdict.serve
    (reply,) = runtime.replies
    assert reply.has_error() and reply.error.code == ErrorCode.LOAD_CLIENT_APP_EXCEPTION
    assert why in reply.error.reason and fab_id in reply.error.reason
    ((status, details),) = runtime.outputs
    assert status == SubStatus.FAILED and why in details
    assert any("refuses run 7" in r.message and why in r.message and fab_id in r.message
               for r in caplog.records)
    # The policy's details stay on the device.
    assert "bogus" not in reply.error.reason


def test_a_listed_fab_hash_is_served(monkeypatch: pytest.MonkeyPatch, runtime: Pushed) -> None:
    task(monkeypatch, "gpfl/gpfl", "0.1.0", {"trusted-fab-hashes": f"{'cd' * 32},{HASH}"})
    outcome = executor.serve_task(executor.RuntimeConnection("x"), "token", PIN,
                                  lambda message, context: Message(RecordDict(),
                                                                   reply_to=message))
    assert outcome is not None and outcome.verdict.serve


def test_a_failing_client_becomes_an_error_reply_and_the_executor_goes_on(
    monkeypatch: pytest.MonkeyPatch, runtime: Pushed
) -> None:
    task(monkeypatch, "gpfl/gpfl", "0.1.0")

    def app(message: Message, context: Context) -> Message:
        raise RuntimeError("gpfl: the device could not complete this round")

    assert executor.serve_task(executor.RuntimeConnection("x"), "token", PIN, app) is None
    (reply,) = runtime.replies
    assert reply.has_error() and reply.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    assert runtime.outputs[0][0] == SubStatus.FAILED
