"""Secure clusters, the ServerApp's round: Flower's ``SecAggPlusWorkflow`` inside the legacy loop.

A secure-clusters run keeps gpfl's legacy ``Server`` loop (sampling, validation, early stop,
checkpoints, the round's line) and replaces only the training round: :meth:`SecureServer.fit_round`
runs Flower's own ``SecAggPlusWorkflow`` (setup, share keys, collect masked vectors, unmask) on
the run's grid, with the run's :class:`~strategies.secure.SecureClustersStrategy` as the
workflow's strategy. The workflow is given:

* ``num_shares = 1.0``: every sampled device holds a share of every other's secrets;
* ``reconstruction_threshold = min-cohort``: the sum is unmasked only with at least that many
  devices' vectors in it (devices check it too, :mod:`client.secure`); a device lost after it
  sent its vector is recovered from the others' shares, one lost before leaves the sum without
  it; fewer than the threshold and the round changes nothing;
* ``max_weight = 1`` (each device counts once) and :data:`TERMS`, the quantization and clipping
  ranges every device's integers are encoded for exactly (:mod:`mechanisms.distributed`);
* ``timeout = round-timeout`` for each of the four stages.

:class:`MaskedOnlyGrid` stands between the workflow and the grid: every reply the ServerApp
receives is checked to carry no arrays (a plain model would be an array record) and, at the
collect stage, only integer masked vectors; the round's count of replies, of plain ones, and
the bytes each device sent and received go to ``secure_rounds.jsonl`` beside ``summary.json``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.common import ConfigRecord, Parameters, Scalar, bytes_to_ndarray
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from flwr.compat.common import recorddict_compat as compat
from flwr.server import ServerConfig
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.server import FitResultsAndFailures
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WfKey

from mechanisms.distributed import SecureTerms
from server.legacy_server import GpflServer
from strategies.secure import SecureClustersStrategy, StageReplies

__all__ = ["TERMS", "DropoutSafeSecAggPlus", "MaskedOnlyGrid", "SecureServer"]

logger = logging.getLogger(__name__)

#: Flower's defaults for SecAgg+'s ranges (quantization 2^22, clipping 8, modulus 2^32): each
#: device's integers are bounded by 2^12 and encoded exactly (mechanisms.distributed).
TERMS = SecureTerms(quantization_range=2 ** 22, clipping_range=8.0, modulus_range=2 ** 32)

#: The file of each secure round's check of what the ServerApp received.
SECURE_ROUNDS = "secure_rounds.jsonl"


def _config_bytes(record: ConfigRecord) -> int:
    total = 0
    for value in record.values():
        items = value if isinstance(value, list) else [value]
        total += sum(len(v) if isinstance(v, (bytes, str)) else 8 for v in items)
    return total


def message_bytes(content: RecordDict) -> int:
    """Return the payload bytes of a message: its arrays' data and its config values."""
    arrays = sum(len(a.data) for record in content.array_records.values()
                 for a in record.values())
    configs = sum(_config_bytes(r) for r in content.config_records.values())
    metrics = 8 * sum(len(r) for r in content.metric_records.values())
    return arrays + configs + metrics


class MaskedOnlyGrid:
    """A grid wrapper that checks every reply carries only SecAgg+'s masked data (see module).

    Parameters
    ----------
    grid : Grid
        The run's grid (Flower's, or gpfl's :class:`~server.polling.PollingGrid`).
    replies : StageReplies
        Where each node's error reply (a decline, a failure) is noted for the strategy.
    """

    def __init__(self, grid: Any, replies: StageReplies) -> None:
        self.grid = grid
        self.replies = replies
        self.received = 0
        self.plain = 0
        self.masked_vectors = 0
        self.sent_bytes: dict[int, int] = {}
        self.received_bytes: dict[int, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> list[Message]:
        """Send through the grid; check and count every reply."""
        messages = list(messages)
        for msg in messages:
            node = msg.metadata.dst_node_id
            self.sent_bytes[node] = self.sent_bytes.get(node, 0) + message_bytes(msg.content)
        replies = self.grid.send_and_receive(messages, timeout=timeout)
        for reply in replies:
            self.received += 1
            node = reply.metadata.src_node_id
            if reply.has_error():
                self.replies.errors[str(node)] = str(reply.error.reason)[:300]
                continue
            content = reply.content
            self.received_bytes[node] = self.received_bytes.get(node, 0) + message_bytes(content)
            if any(len(record) for record in content.array_records.values()):
                self.plain += 1
                logger.error("node %d sent arrays in a secure round: a plain release", node)
            configs = content.config_records.get(RECORD_KEY_CONFIGS)
            if configs is not None and Key.MASKED_PARAMETERS in configs:
                arrays = [bytes_to_ndarray(b) for b in configs[Key.MASKED_PARAMETERS]]
                if all(a.dtype.kind in "iu" for a in arrays):
                    self.masked_vectors += 1
                else:
                    self.plain += 1
                    logger.error("node %d sent a masked vector that is not integers", node)
        return replies


class DropoutSafeSecAggPlus(SecAggPlusWorkflow):
    """Flower's ``SecAggPlusWorkflow``, with a device lost before it shared its keys left out.

    Flower 1.39 counts every sampled device as a participant to the end: one that fails the
    setup or the key sharing (killed, declined, late) is "dead" at the unmask stage, and every
    other device is asked for its key share, which none of them ever received: each answers
    with an error (a ``KeyError`` in ``secaggplus_mod``) and the round is lost. No device's
    vector was masked with such a device (its masks are drawn only with the devices whose key
    shares it received), so after the key sharing the participants are those that shared
    their keys; a device lost after that is recovered from its shares, as SecAgg+ intends.
    """

    def share_keys_stage(self, grid: Any, context: LegacyContext, state: Any) -> bool:
        """Run Flower's stage; keep as participants only the devices that shared their keys."""
        going_on = super().share_keys_stage(grid, context, state)
        state.sampled_node_ids = set(state.active_node_ids)
        return bool(going_on)


class SecureServer(GpflServer):
    """gpfl's legacy server whose training round is Flower's SecAgg+ workflow (module notes)."""

    def __init__(self, *, min_cohort: int, round_timeout: float, out_dir: Path,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.min_cohort = min_cohort
        self.round_timeout = round_timeout
        self.out_dir = Path(out_dir)

    def fit_round(
        self, server_round: int, timeout: float | None
    ) -> tuple[Parameters | None, dict[str, Scalar], FitResultsAndFailures] | None:
        """Run one SecAgg+ round; return the strategy's new hypotheses (None: unchanged)."""
        strategy = self.strategy
        assert isinstance(strategy, SecureClustersStrategy)
        if strategy.stopped_early or strategy.incomplete_reason is not None:
            return None  # as Flower's round when configure_fit samples no one
        started = time.monotonic()
        # The grid is the client proxies' (Flower registers them as nodes connect).
        self.client_manager().wait_for(1, timeout=int(self.round_timeout))
        self._poll_replies_often()
        proxy = next(iter(self.client_manager().all().values()), None)
        if proxy is None:
            return None
        strategy.stage_replies.clear()
        # Flower's GridClientProxy (or gpfl's PollingGrid put in its place) holds the grid.
        grid = MaskedOnlyGrid(getattr(proxy, "grid"), strategy.stage_replies)  # noqa: B009
        context = LegacyContext(
            context=Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                            run_config={}),
            config=ServerConfig(num_rounds=1, round_timeout=self.round_timeout),
            strategy=strategy, client_manager=self.client_manager())
        context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord(
            {WfKey.CURRENT_ROUND: server_round})
        context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
            self.parameters, keep_input=True)
        completed = strategy.rounds_completed
        workflow = DropoutSafeSecAggPlus(
            num_shares=1.0, reconstruction_threshold=self.min_cohort, max_weight=1.0,
            clipping_range=TERMS.clipping_range, quantization_range=TERMS.quantization_range,
            modulus_range=TERMS.modulus_range, timeout=self.round_timeout)
        workflow(grid, context)  # type: ignore[arg-type]
        if not strategy.aggregated(server_round):
            if strategy.incomplete_reason is not None:
                return None  # configure_fit found too few devices: the run stops (on_stop)
            # The workflow stopped before its unmask stage (too few devices for the threshold):
            # the strategy records the round as one that changed nothing.
            strategy.aggregate_fit(server_round, [], [])
        self._write_check(strategy.run_round(server_round), grid, time.monotonic() - started)
        parameters = None
        if strategy.rounds_completed > completed:
            parameters = compat.arrayrecord_to_parameters(
                context.state.array_records[MAIN_PARAMS_RECORD], keep_input=True)
        metrics: dict[str, Scalar] = {}
        return parameters, metrics, ([], [])

    def _write_check(self, t: int, grid: MaskedOnlyGrid, seconds: float) -> None:
        devices = max(len(grid.sent_bytes), 1)
        line = {
            "round": t, "replies": grid.received, "plain_replies": grid.plain,
            "masked_vectors": grid.masked_vectors,
            "errors": len(grid.replies.errors),
            "bytes_sent_per_device": sum(grid.sent_bytes.values()) / devices,
            "bytes_received_per_device": sum(grid.received_bytes.values()) / devices,
            "seconds": round(seconds, 3),
        }
        logger.info("secure round %d: %d replies, %d masked vectors, %d plain, %d errors", t,
                    grid.received, grid.masked_vectors, grid.plain, len(grid.replies.errors))
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with (self.out_dir / SECURE_ROUNDS).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
