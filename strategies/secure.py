"""Secure clusters, server side: hypotheses updated from SecAgg+'s per-cluster sums alone.

With ``aggregation-privacy = "secure-clusters"`` the round is Flower's ``SecAggPlusWorkflow``
(:mod:`server.secure_round`) and this strategy its legacy ``Strategy``. ``configure_fit`` is
:class:`~strategies.clustered.ClusteredStrategy`'s (the same sampling, the k hypotheses in one
instruction). ``aggregate_fit`` receives what Flower's workflow hands a strategy: one reply per
device whose masked vector is in the sum, each carrying the device's public metrics and the same
aggregate (the average of the dequantized vectors). From it:

* :func:`mechanisms.distributed.decode_sum` recovers Σ a_i, the integer sum of the devices'
  shares, and :func:`~mechanisms.distributed.split_sum` its k per-slot sums of updates and k
  noisy counts;
* hypothesis j moves to θ_j + sum_j / max(count_j, 1) (the mean of its cluster's updates), by
  the run's server update; a slot whose noisy count is below one half keeps its hypothesis.

No individual release, cluster choice or label exists on this side: the round's record holds
the noisy counts (rounded, never below 0) as its cluster sizes, and no releases.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from flwr.common import FitIns, FitRes, Parameters, Scalar, parameters_to_ndarrays
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from mechanisms.distributed import SecureTerms, SlotLayout, decode_sum, split_sum
from strategies.clustered import ClusteredStrategy
from strategies.proxies import TracedProxy
from strategies.recorded import RoundResult
from strategies.replies import merge_spend, parse_metrics

__all__ = ["SecureClustersStrategy", "StageReplies"]

_LOG = logging.getLogger(__name__)

#: A slot whose noisy count is below this keeps its hypothesis (no device is likely in it).
LEAST_COUNT = 0.5


class StageReplies:
    """What the round's SecAgg+ stages received, per node: the errors (declines, failures).

    Filled by the server's grid wrapper (:class:`server.secure_round.MaskedOnlyGrid`), read by
    :meth:`SecureClustersStrategy.aggregate_fit` to tell a device that declined or failed
    from one that sent nothing.
    """

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}

    def clear(self) -> None:
        """Forget the last round."""
        self.errors.clear()


def slot_denominators(counts: np.ndarray, participants: int, count_sd: float) -> np.ndarray:
    """Return what each slot's sum is divided by: its count, trusted down to twice its noise.

    A count is noisy (standard deviation ``count_sd``, public: the run's noise share and the
    cohort); dividing by a count the noise brought near 0 would turn a slot's sum into a leap.
    So the denominator is the count clipped to [lo, participants], with lo = 1 for a precise
    count and, as the noise grows, up to the cohort's even share (participants / k): the step is
    then the slot's sum over its expected size.
    """
    k = len(counts)
    lo = max(1.0, min(participants / k, 2.0 * count_sd))
    return np.clip(counts, lo, float(participants))


def settle_counts(counts: np.ndarray, participants: int) -> np.ndarray:
    """Return the noisy counts moved to sum to ``participants`` and clipped to [0, it].

    Post-processing with a public number (the devices whose shares are in the sum): the
    noise's component along (1, ..., 1) is removed, which leaves each count 1/k less noise
    variance, and no count is negative or beyond the cohort.
    """
    k = len(counts)
    settled = counts + (participants - float(np.sum(counts))) / k
    return np.clip(settled, 0.0, float(participants))


class SecureClustersStrategy(ClusteredStrategy):
    """Clustered FL whose server learns only per-cluster sums (see the module notes).

    Parameters
    ----------
    terms : SecureTerms
        SecAgg+'s quantization, clipping and modulus ranges, as the workflow announces them.
    clip : float
        C, the L2 bound of every device's update (the run's ``clip``).
    share_noise_multiplier : float
        z of the run's noise share (σ = z·2B a device), from its (ε, δ) and planned releases:
        the noise of a count, which :func:`slot_denominators` allows for (0: counts exact).
    **kwargs
        :class:`~strategies.clustered.ClusteredStrategy`'s parameters; ``cluster_aggregator``
        must be ``mean`` and ``persistence_threshold`` 0 (settings.rules).
    """

    def __init__(self, *, terms: SecureTerms, clip: float, share_noise_multiplier: float = 0.0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.cluster_aggregator != "mean" or self.persistence_threshold != 0:
            raise ValueError("secure clusters need cluster-aggregator=mean and "
                             "persistence-threshold=0: the server sees only sums")
        self.terms = terms
        self.clip = float(clip)
        self.share_noise_multiplier = float(share_noise_multiplier)
        self.layout = SlotLayout(self.num_hypotheses, int(self._flat.shape[1]))
        self.stage_replies = StageReplies()

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Sample and instruct as :class:`ClusteredStrategy`, handing Flower's own proxies.

        SecAgg+'s workflow addresses devices by ``node_id`` and reports failures itself, so the
        proxies are not wrapped to trace them.
        """
        pairs = super().configure_fit(server_round, parameters, client_manager)
        return [(proxy.inner if isinstance(proxy, TracedProxy) else proxy, ins)
                for proxy, ins in pairs]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: Sequence[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Update each hypothesis from its slot of the secure sum (None: too few shares)."""
        t = self._round(server_round)
        k = self.num_hypotheses
        sampled = self._sampled[1] if self._sampled[0] == t else []
        in_sum = self._note_devices(t, results, sampled)
        failed = [(self._label(cid), reason) for cid, reason in sorted(
            self.stage_replies.errors.items())]
        missing = [self._label(cid) for cid in sampled
                   if cid not in in_sum and cid not in self.stage_replies.errors]
        n = len(in_sum)
        kept: str | None = None
        counts = np.zeros(k)
        new_flat = self._flat
        if n < max(self.min_replies, 1):
            kept = (f"{n} shares in the secure sum, fewer than min-replies={self.min_replies} "
                    f"({len(failed)} declined or failed, {len(missing)} missing)")
        else:
            try:
                average = parameters_to_ndarrays(results[0][1].parameters)
                total = decode_sum(np.concatenate([a.ravel() for a in average]), n, self.terms)
                sums, counts = split_sum(total, self.layout, self.clip, self.terms.bound)
                counts = settle_counts(counts, n)
            except ValueError as err:
                kept = f"the secure aggregate does not decode: {err}"
            else:
                means = self._flat.astype(np.float64)
                live = counts >= LEAST_COUNT
                denominators = slot_denominators(counts, n, self.count_sd(n))
                means[live] += sums[live] / denominators[live][:, None]
                new_flat, _ = self.server_update.apply(
                    self._flat, means.astype(np.float32), np.zeros((0, self.layout.size),
                                                                   dtype=np.float32),
                    np.zeros(0, dtype=np.intp), self.history, t, self._reseeded, None)
                if not np.isfinite(new_flat).all():
                    kept, new_flat = "the aggregate was not finite", self._flat
        if kept is not None:
            _LOG.warning("round %d: %s; hypotheses unchanged", t, kept)
        sizes = [max(0, round(float(c))) for c in counts] if kept is None else [0] * k
        self._pending = RoundResult(
            round=t, cluster_sizes=sizes, replies=n, declined=0, dropped=[],
            failures=len(failed), released=None, labels=None, missing=missing, failed=failed,
            kept=kept, sampled=len(sampled), asked=self._sampled[2] if sampled else [])
        metrics: dict[str, Scalar] = {"replies": n, "declined": 0, "dropped": 0,
                                      "failures": len(failed), "missing": len(missing)}
        metrics.update({f"cluster-size-{j}": size for j, size in enumerate(sizes)})
        if kept is not None:
            return None, metrics
        self._flat = new_flat
        self.rounds_completed += 1
        return self._parameters(), metrics

    def count_sd(self, participants: int) -> float:
        """Return the standard deviation of a slot's count in a sum of ``participants`` shares."""
        return 2.0 * self.share_noise_multiplier * float(np.sqrt(participants))

    def run_round(self, server_round: int) -> int:
        """Return the run's round of Flower's ``server_round`` (they differ after a resume)."""
        return self._round(server_round)

    def aggregated(self, server_round: int) -> bool:
        """Whether ``aggregate_fit`` recorded ``server_round`` (the workflow may stop before)."""
        pending = self._pending
        return pending is not None and pending.round == self._round(server_round)

    def _label(self, cid: str) -> str:
        record = self.clients.get(cid)
        return record.name if record is not None and record.name else f"node:{cid}"

    def _note_devices(self, t: int, results: Sequence[tuple[ClientProxy, FitRes]],
                      sampled: Sequence[str]) -> set[str]:
        """Record each device's part in the round; return the node ids whose shares are summed."""
        in_sum: set[str] = set()
        for proxy, res in results:
            cid = proxy.cid
            in_sum.add(cid)
            record = self._client(cid)
            record.answered()
            record.last_round = t
            record.participations += 1
            parsed = parse_metrics(res.metrics, need_sigma=False, mechanism="gaussian")
            if isinstance(parsed, str):
                # The share is in the sum whatever its metrics say: only the record is skipped.
                _LOG.warning("round %d: the metrics of node %s do not read: %s", t, cid, parsed)
                continue
            record.name = parsed.name
            record.metrics = merge_spend(record.metrics, parsed.values)
        for cid, reason in self.stage_replies.errors.items():
            record = self._client(cid)
            record.answered()
            record.failures += 1
            record.failure = "declined-or-failed"
            _LOG.warning("round %d: %s left the secure round: %s", t, self._label(cid), reason)
        for cid in sampled:
            if cid not in in_sum and cid not in self.stage_replies.errors:
                self._client(cid).missed(t)
                _LOG.warning("round %d: no reply from %s before the round ended", t,
                             self._label(cid))
        return in_sum
