"""One round's replies and failures, screened before anything touches the model.

:meth:`ReplyScreen.screen` takes what Flower's ``fit_round`` collected and returns the usable
releases as one matrix, in a canonical order (by ``client-name``, then node id: arrival order
must not change the result), with every other reply accounted for:

declined
    the device's next release would pass its cap (or its policy forbids the request);
dropped
    a reply that fails a check, in this order: ``num_examples``; the metrics
    (:func:`strategies.replies.parse_metrics`); the name binding
    (:class:`strategies.replies.NameBook`); the tensors' type and size (before parsing); the
    arrays' count, dtype, shape and finite values (:func:`strategies.validation.check_reply`);
    sign releases exactly ±1; the magnitude (:func:`strategies.norms.screen_norms`);
failed
    the device answered with an error;
missing
    a sampled device that sent nothing in time.

Each dropped, failed or missing device gets one log line naming it and the reason, and is
counted in its :class:`~strategies.records.ClientRecord`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.common import FitRes, Parameters
from flwr.server.client_proxy import ClientProxy

from strategies.divergence import pullers
from strategies.geometry import CountSketch, RoundGeometry, measure_round
from strategies.norms import NormLimits, screen_norms
from strategies.proxies import FAILED, DeviceFailure
from strategies.records import ClientRecord
from strategies.replies import (
    NameBook,
    check_num_examples,
    check_tensor_sizes,
    merge_spend,
    parse_metrics,
    tensor_limits,
)
from strategies.validation import check_reply, npy_view

__all__ = ["Intake", "ReplyScreen", "pushed_away"]

_LOG = logging.getLogger(__name__)
_NPY_TENSOR_TYPE = "numpy.ndarray"


@dataclass
class Intake:
    """The screened replies of one round.

    Attributes
    ----------
    released : np.ndarray
        (m, n) float32: the usable releases, one per row, in canonical order.
    sigmas : np.ndarray
        (m,) float64: each release's declared σ (0 where none was declared).
    cids : list of str
        The node id of each row.
    declined : int
        Declines.
    dropped, failed : list of (str, str)
        ``(device, reason)`` of each dropped reply and each device that answered with an error.
    missing : list of str
        Sampled devices that sent nothing in time.
    failures : int
        ``len(failed)`` plus failures Flower reported without naming a device.
    refusing : list of (str, str)
        ``(device, reason)`` of the failed devices that refused the hypotheses themselves
        (beyond their ``max-parameter``), before anything was charged.
    answering : int
        Devices that answered (a reply, a decline or an error).
    trust : np.ndarray or None
        (m,) each row's weight in its cluster from the persistence test
        (:meth:`strategies.persistence.Persistence.trust`); None: every row weighs 1.
    geometry : RoundGeometry or None
        The rows measured against the round's hypotheses, in the rows' order (the persistence
        test and the robust clusters reuse it); None for sign releases and empty rounds.
    """

    released: np.ndarray
    sigmas: np.ndarray
    cids: list[str]
    declined: int = 0
    dropped: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    failures: int = 0
    refusing: list[tuple[str, str]] = field(default_factory=list)
    answering: int = 0
    trust: np.ndarray | None = None
    geometry: RoundGeometry | None = None

    def keep_rows(self, keep: list[int]) -> None:
        """Keep only the rows ``keep`` (indices, in order) of every per-row field."""
        if list(keep) == list(range(len(self.cids))):
            return  # nothing dropped: no copy of the round's matrix
        self.released = self.released[keep]
        self.sigmas = self.sigmas[keep]
        self.cids = [self.cids[i] for i in keep]
        if self.trust is not None:
            self.trust = self.trust[keep]
        if self.geometry is not None:
            self.geometry = self.geometry.subset(keep)


#: What a device's error says when it refuses the hypotheses (client.release.check_instruction).
_REFUSAL = "max-parameter"
#: The public tag of a gpfl device's failure (client.numpy_client.FAILURE_TAG): its name, the
#: failure's class.
_FAILURE_TAG = re.compile(r"\[device=([A-Za-z0-9_.:-]{1,64}) class=([a-z-]{1,32})\]")


def pushed_away(server_round: int, intake: Intake,
                clients: Mapping[str, ClientRecord]) -> str | None:
    """Why the hypotheses look pushed away by some devices' releases, or None.

    They are when at least half of the devices that answered the round refused the
    hypotheses (values beyond their ``max-parameter``): honest devices train from them, so a
    federation whose devices refuse its model no longer learns anything, whatever the devices
    still releasing do. The devices named are those whose accepted releases lay, on average,
    farthest from their hypothesis relative to their rounds' median
    (:func:`strategies.divergence.pullers`).
    """
    if not intake.refusing or 2 * len(intake.refusing) < intake.answering:
        return None
    device, reason = intake.refusing[0]
    text = (f"round {server_round}: the hypotheses were pushed away: {len(intake.refusing)} of "
            f"{intake.answering} devices refused them ({device}: {reason[:200]}); the releases "
            f"that moved them came from {pullers(clients)}")
    _LOG.error("%s; the run stops here", text)
    return text


class ReplyScreen:
    """Screens each round's replies; keeps the name bindings and the norm reference across rounds.

    Parameters
    ----------
    shapes : sequence of tuple of int
        The layer shapes of one hypothesis.
    release : {"parameters", "sign"}
        What the devices release.
    need_sigma : bool
        Whether each release must declare ``sigma`` (budget-aware aggregation).
    limits : NormLimits
        The run's mechanism and clipping (magnitude rules).
    by_key : bool
        ``node-identity = "key"``: a node id is its SuperNode key and a name never moves
        (:mod:`strategies.identity`).
    """

    def __init__(
        self,
        shapes: Sequence[tuple[int, ...]],
        *,
        release: str,
        need_sigma: bool,
        limits: NormLimits,
        by_key: bool = False,
    ) -> None:
        self.shapes = [tuple(s) for s in shapes]
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(int).tolist()
        self.release = release
        self.limits = limits
        self.need_sigma = need_sigma or limits.mechanism == "gaussian"
        self.byte_limits = tensor_limits(self.shapes, np.float32)
        self.names = NameBook(by_key)
        #: Distances of the releases accepted in the last round that accepted any (rule 3 of
        #: :mod:`strategies.norms`).
        self.reference = np.zeros(0)

    def device(self, cid: str) -> str:
        """Return how a node is named in log lines: its name and node id, or its id."""
        label = self.names.label(cid)
        return label if label.startswith("node ") else f"{label} (node {cid})"

    def screen(
        self,
        server_round: int,
        results: Sequence[tuple[ClientProxy, FitRes]],
        failures: Sequence[tuple[ClientProxy, FitRes] | BaseException],
        *,
        sampled: Sequence[str],
        hypotheses: np.ndarray,
        record: Callable[[str], ClientRecord],
        gram: bool = False,
        sketch: CountSketch | None = None,
    ) -> Intake:
        """Screen one round (see the module notes); update the devices' records.

        Parameters
        ----------
        server_round : int
            The round, for log lines and records.
        results, failures
            As Flower's ``aggregate_fit`` receives them.
        sampled : sequence of str
            Node ids sent the hypotheses this round.
        hypotheses : np.ndarray
            (k, n) float32: the hypotheses the replies were computed from.
        record : callable
            Returns (creating it if needed) the record of a node id.
        gram, sketch
            What the round's one pass over the releases measures beyond the screening's norms
            and distances (:func:`strategies.geometry.measure_round`), kept in
            ``Intake.geometry`` for the steps after the screening.
        """
        t = server_round
        out = Intake(np.zeros((0, hypotheses.shape[1]), np.float32), np.zeros(0), [])
        answered, reasons = self._take_failures(t, failures, out, record)
        candidates = self._read_metrics(t, results, answered, out, record)
        released, sigmas, cids = self._read_releases(t, candidates, hypotheses.shape[1], out,
                                                     record)
        released, sigmas, cids, geometry = self._screen_magnitudes(
            t, released, sigmas, cids, hypotheses, out, record, gram=gram, sketch=sketch)
        for cid in cids:
            record(cid).participations += 1
        self._count_missing(t, sampled, answered, reasons, out, record)
        out.released = released
        # A missing σ weighs nothing under the plain mean, the only aggregation that allows it.
        out.sigmas = np.nan_to_num(sigmas, nan=0.0)
        out.cids = cids
        out.geometry = geometry
        out.failures += len(out.failed)
        out.answering = len(answered)
        return out

    def _take_failures(
        self, t: int, failures: Sequence[tuple[ClientProxy, FitRes] | BaseException],
        out: Intake, record: Callable[[str], ClientRecord],
    ) -> tuple[set[str], dict[str, str]]:
        """Record the round's failures; return who answered with one, and why the others did not.

        The second is by node id, for each device that sent nothing where Flower said which.
        """
        answered: set[str] = set()
        reasons: dict[str, str] = {}
        for failure in failures:
            if isinstance(failure, DeviceFailure):
                if failure.kind == FAILED:
                    answered.add(failure.cid)
                    self._failed(t, out, failure.cid, failure.reason, record)
                else:
                    reasons[failure.cid] = failure.reason
            elif isinstance(failure, tuple):
                proxy, res = failure
                answered.add(proxy.cid)
                status = f"error status {res.status.code.name}: {res.status.message}"[:300]
                self._failed(t, out, proxy.cid, status, record)
            else:
                out.failures += 1
                _LOG.warning("round %d: a device failed (Flower did not say which): %s", t,
                             str(failure)[:300])
        return answered, reasons

    def _drop(self, t: int, out: Intake, cid: str, reason: str,
              record: Callable[[str], ClientRecord]) -> None:
        """Drop the reply of ``cid``, counted and logged with its reason."""
        out.dropped.append((self.names.label(cid), reason))
        record(cid).dropped += 1
        _LOG.warning("round %d: dropped the reply of %s: %s", t, self.device(cid), reason)

    def _read_metrics(
        self, t: int, results: Sequence[tuple[ClientProxy, FitRes]], answered: set[str],
        out: Intake, record: Callable[[str], ClientRecord],
    ) -> list[tuple[str, str, FitRes, float]]:
        """Read each reply's metrics and name; count declines; drop what does not parse.

        Adds every replying node to ``answered``. Returns ``(name, node id, reply, σ)`` of the
        releases left to read, in canonical order (by name, then node id): the same replies
        give the same matrix, whatever order they came in.
        """
        # A name stays with its node if that node answered this round (NameBook.check).
        replied = answered | {proxy.cid for proxy, _ in results}
        candidates: list[tuple[str, str, FitRes, float]] = []
        for proxy, res in results:
            cid = proxy.cid
            answered.add(cid)
            reason = check_num_examples(res.num_examples)
            parsed = None
            if reason is None:
                parsed = parse_metrics(res.metrics, need_sigma=self.need_sigma,
                                       mechanism=self.limits.mechanism)
                if isinstance(parsed, str):
                    reason = parsed
            if reason is None and parsed is not None and not isinstance(parsed, str):
                owner = self.names.name_node.get(parsed.name)
                reason = self.names.check(cid, parsed.name, replied)
                if reason is None and owner not in (None, cid):
                    _LOG.warning("round %d: %r now speaks from node %s; its node %s is "
                                 "superseded (a restarted device; not asked again)", t,
                                 parsed.name, cid, owner)
            if reason is not None or parsed is None or isinstance(parsed, str):
                self._drop(t, out, cid, reason or "unreadable reply", record)
                continue
            client = record(cid)
            client.name = parsed.name
            client.metrics = merge_spend(client.metrics, parsed.values)
            client.last_round = t
            if "record-clip-final" in parsed.values and "record-lr-final" in parsed.values:
                client.record_schedule.append([t, parsed.values["record-clip-final"],
                                               parsed.values["record-lr-final"]])
            if parsed.declined:
                out.declined += 1
                client.declines += 1
                continue
            sigma = parsed.sigma if parsed.sigma is not None else np.nan
            candidates.append((parsed.name, cid, res, sigma))
        candidates.sort(key=lambda c: (c[0], c[1]))
        return candidates

    def _read_releases(
        self, t: int, candidates: list[tuple[str, str, FitRes, float]], n: int, out: Intake,
        record: Callable[[str], ClientRecord],
    ) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Copy each candidate's release into one float32 matrix; drop what does not read.

        Returns the matrix (one row a kept release), their σ, and their node ids.
        """
        matrix = np.empty((len(candidates), n), dtype=np.float32)
        sigmas = np.empty(len(candidates), dtype=np.float64)
        cids: list[str] = []
        for _, cid, res, sigma in candidates:
            row = matrix[len(cids)]
            try:
                reason = self._load(res.parameters, row)
            except Exception as err:  # a last guard: a reply never stops the ServerApp
                _LOG.exception("round %d: unexpected error reading a reply", t)
                reason = f"unreadable reply ({type(err).__name__})"
            if reason is not None:
                self._drop(t, out, cid, reason, record)
                continue
            sigmas[len(cids)] = sigma
            cids.append(cid)
        return matrix[: len(cids)], sigmas[: len(cids)], cids

    def _screen_magnitudes(
        self, t: int, released: np.ndarray, sigmas: np.ndarray, cids: list[str],
        hypotheses: np.ndarray, out: Intake, record: Callable[[str], ClientRecord], *,
        gram: bool, sketch: CountSketch | None,
    ) -> tuple[np.ndarray, np.ndarray, list[str], RoundGeometry | None]:
        """Drop the releases whose size no honest device's could have; update each pull.

        The round's one pass over its releases (:func:`strategies.geometry.measure_round`)
        measures the screening's norms and distances, and what the persistence test and the
        robust clusters ask for; it is returned for those steps, on the kept releases.
        """
        geometry = None
        measured = None
        if self.release != "sign" and self.limits.mechanism != "sign" and cids:
            geometry = measure_round(released, hypotheses, gram=gram, sketch=sketch)
            measured = geometry.norms, geometry.nearest_distances()
        refusals, distances = screen_norms(released, hypotheses, sigmas, self.reference,
                                           self.limits, measured)
        keep = np.array([r is None for r in refusals], dtype=bool)
        for cid, reason in zip(cids, refusals, strict=True):
            if reason is not None:
                self._drop(t, out, cid, reason, record)
        if not keep.all():
            released, sigmas, distances = released[keep], sigmas[keep], distances[keep]
            cids = [c for c, k in zip(cids, keep, strict=True) if k]
            if geometry is not None:
                geometry = geometry.subset(keep)
        if cids and self.release != "sign":
            self.reference = distances.copy()
            scale = float(np.median(distances))
            if scale > 0:
                for cid, distance in zip(cids, distances.tolist(), strict=True):
                    record(cid).pull += distance / scale
        return released, sigmas, cids, geometry

    def _count_missing(self, t: int, sampled: Sequence[str], answered: set[str],
                       reasons: Mapping[str, str], out: Intake,
                       record: Callable[[str], ClientRecord]) -> None:
        """Record who answered, and each sampled device that sent nothing, with its reason."""
        lost = [cid for cid in dict.fromkeys([*sampled, *reasons]) if cid not in answered]
        for cid in answered:
            record(cid).answered()
        for cid in sorted(lost, key=self.names.label):
            record(cid).missed(t)
            out.missing.append(self.names.label(cid))
            _LOG.warning("round %d: no reply from %s: %s", t, self.device(cid),
                         reasons.get(cid, "no reply before the round ended"))

    def _failed(self, t: int, out: Intake, cid: str, reason: str,
                record: Callable[[str], ClientRecord]) -> None:
        client = record(cid)
        client.failures += 1
        tagged = _FAILURE_TAG.search(reason)
        if tagged:
            client.failed_as, client.failure = tagged.group(1), tagged.group(2)
        else:
            client.failure = "refused-hypotheses" if _REFUSAL in reason else "error"
        out.failed.append((self.names.label(cid), reason))
        if _REFUSAL in reason:
            out.refusing.append((self.names.label(cid), reason))
        _LOG.warning("round %d: %s failed: %s", t, self.device(cid), reason)

    def _load(self, parameters: Parameters, row: np.ndarray) -> str | None:
        """Check one reply's tensors and copy them into ``row``; return why not, or None."""
        if parameters.tensor_type != _NPY_TENSOR_TYPE:
            return f"tensor_type is {parameters.tensor_type!r}, expected {_NPY_TENSOR_TYPE!r}"
        reason = check_tensor_sizes(parameters.tensors, self.byte_limits)
        if reason is not None:
            return reason
        try:
            arrays = [npy_view(bytes(tensor)) for tensor in parameters.tensors]
        except ValueError as exc:
            return f"unreadable array: {exc}"
        reason = check_reply(arrays, self.shapes, np.float32)
        if reason is not None:
            return reason
        for array, start, stop in zip(arrays, self.offsets[:-1], self.offsets[1:], strict=True):
            np.copyto(row[start:stop].reshape(array.shape), array)
        if self.release == "sign" and not ((row == 1.0) | (row == -1.0)).all():
            return "a sign release must hold only +1 and -1"
        return None

    def to_dict(self) -> dict[str, object]:
        """Return the state kept across rounds as plain JSON values (for a checkpoint)."""
        return {"names": self.names.to_dict(), "reference": self.reference.tolist()}

    def load_dict(self, data: dict[str, object]) -> None:
        """Restore :meth:`to_dict`."""
        # The identity rule is this run's setting (node-identity), not the checkpoint's.
        self.names = NameBook.from_dict(data.get("names", {}),  # type: ignore[arg-type]
                                        by_key=self.names.by_key)
        self.reference = np.asarray(data.get("reference", []), dtype=np.float64)
