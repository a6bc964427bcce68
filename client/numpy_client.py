"""The gpfl NumPyClient: Algorithm 1's client side and Algorithm 2 (SanitizeUpdate).

Everything the server sends (the run config, the instruction, the hypotheses) is treated as
chosen by an adversary; the device's policy (:mod:`client.policy`) bounds what is done with it.
One ``fit``, in an order that keeps every signal before the release independent of the data:

1. **Public decisions** (:mod:`client.release`): combine the run config's request with the
   policy, check the instruction (k within the device's ``max-hypotheses``, finite float values
   within its ``max-parameter``) and every noise scale the request implies. A forbidden or
   absurd request is declined (:class:`~client.policy.PolicyDecline`: nothing read, computed or
   charged; a log line, ``declined-by = "policy"`` and the reason in the reply).
2. **The task's preflight** (`tasks.Task.preflight`): a cheap check of what does not depend
   on the data's records: the device's file exists, its header has the columns the run names,
   it has rows. If not, the round is declined (``declined-by = "task-data"``, the fixed reason
   :data:`TASK_DATA_DECLINED`): nothing charged, the details (file, column) in the device's
   log only. The server learns one bit per round, a fact about the file's schema.
3. **The charge**, from the hypotheses' shapes alone: the ledger records the release, or the
   round is declined because the cap would be passed (``declined-by = "budget"``), before any
   record is read: a decline neither depends on the data's values nor takes a time that does.
4. **The private part**, charged whatever happens: build the task (it may read the device's
   data file), choose the best hypothesis on the local data, train it (a diverged model is
   replaced by its hypothesis), sanitize with noise from the device's own entropy, and check
   the release invariant (:func:`mechanisms.invariant.verify_release`) at the very last step.
   Any failure here (a value of the file that does not parse, too) reaches the server as one
   fixed message; the details stay in the device's log.

A reply carries the release and public metrics: the mechanism's data-independent parameters
and this federation's spend (releases tagged in the ledger with the federation's id), never
the device's lifetime spend. ``evaluate`` answers nothing.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.client import NumPyClient

from client.device_budget import budget_text, family_of
from client.policy import DevicePolicy, PolicyDecline
from client.record_release import RecordPlan, plan_record_release, release_record
from client.release import (
    InstructionError,
    ReleasePlan,
    build_mechanism,
    check_instruction,
    check_shapes,
    choose_hypothesis,
    make_release,
    plan_release,
    usable_model,
)
from client.secure import SecureDecline, SecurePlan, make_share, plan_share
from client.settings import ClientSettings
from mechanisms import (
    BudgetExceededError,
    LedgerCorruptError,
    PrivacyEvent,
    PrivacyLedger,
    Spend,
    device_rng,
    seeded_rng,
)
from mechanisms.distributed import SecureTerms
from tasks import Task, TaskDataError, declared_shapes, preflight_task

__all__ = [
    "FAILURE_TAG",
    "RELEASE_FAILED",
    "TASK_DATA_DECLINED",
    "GpflClient",
    "InstructionError",
    "ReleaseFailedError",
    "build_mechanism",
    "federation_key",
]

logger = logging.getLogger(__name__)

Arrays = list[np.ndarray]

#: The only text a failure of the private part of a round sends to the server.
RELEASE_FAILED = (
    "gpfl: the device could not complete this round; the details are in the device's log"
)

#: The only reason a decline by the task's preflight sends (``declined-by = "task-data"``).
TASK_DATA_DECLINED = (
    "declined: this device's data does not fit the run's task settings (found before anything "
    "was charged, from the file's schema alone); the details are in the device's log"
)

_FEDERATION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


#: The public tag a failure carries after :data:`RELEASE_FAILED`: the device's ``client-name``
#: (every reply of it carries the name anyway) and the failure's class, so that the server can
#: name a device that fails every round (it never sends a reply with its name).
FAILURE_TAG = "[device={name} class={kind}]"


class ReleaseFailedError(RuntimeError):
    """A failure of the private part of a round: :data:`RELEASE_FAILED` and :data:`FAILURE_TAG`.

    Parameters
    ----------
    name : str
        The device's ``client-name``.
    kind : str
        ``ledger`` (the privacy ledger is unusable: nothing was charged or released) or
        ``release`` (the round failed after its charge). Nothing else is said.
    """

    def __init__(self, name: str = "", kind: str = "release") -> None:
        tag = FAILURE_TAG.format(name=name, kind=kind) if name else ""
        super().__init__(f"{RELEASE_FAILED} {tag}".rstrip())


def train_rng(seed: int | None, *keys: int) -> np.random.Generator:
    """Return the generator of local training (batch order); the run's seed fixes it.

    Training randomness is not privacy noise: the release's guarantee holds for any
    deterministic training, so the federation may fix it. The noise never uses it.
    """
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(np.random.SeedSequence([seed, *keys]))


def federation_key(config: dict[str, Any], run_id: int | None) -> str:
    """Return the tag of this federation's releases in the ledger.

    The ServerApp sends a random ``federation-id`` (kept across ``--resume``); without a
    well-formed one, the Flower run id. Only releases with this tag are reported back, so a
    server learns nothing of the device's spend in other federations (it would have to know
    their random ids).
    """
    given = config.get("federation-id")
    if isinstance(given, str) and _FEDERATION_ID.fullmatch(given):
        return given
    return f"run-{run_id}" if run_id is not None else "run-unknown"


def round_prefix(run_id: int | None, server_round: int, federation: str, name: str) -> str:
    """Return the start of the device's line for one round: ``gpfl device: run R round T ...``.

    Every round a device serves logs one line that starts so (a release, a decline or a
    failure), so that its owner can follow the device with ``grep 'gpfl device:'``. It names
    only what the server sent (run, round, federation) and the device's own name.
    """
    run = "unknown" if run_id is None else str(run_id)
    return f"gpfl device: run {run} round {server_round} federation {federation}: {name} "


def charge_text(
    mechanism: str, family: str, *, cost: float, spent: float, cap: float | None,
    delta: float, verb: str = "charged",
) -> str:
    """Return what a charge costs and leaves, e.g. ``laplace release charged 0.4 d-privacy (...)``.

    Parameters
    ----------
    mechanism : str
        The mechanism applied.
    family : str
        The charged event's family (it names the unit).
    cost : float
        The release's cost in its family's unit: what the family's spend grows by.
    spent : float
        The family's lifetime spend on the device (what the cap bounds, not a federation's
        share) after the charge, or, for a refused one, as it stays.
    cap : float or None
        The cap applied to the family in this round.
    delta : float
        The ledger's δ, at which the ε of the Gaussian and record-level families is stated.
    verb : str
        ``charged``, or ``would cost`` for a release the cap refused.
    """
    unit = family_of(family)
    if unit is None:  # mechanism none: no noise, so no unit and no cap
        return f"{mechanism} release {verb} no budget (no noise: no guarantee, no cap)"
    return (f"{mechanism} release {verb} {cost:.6g} {unit.unit(delta)} "
            f"({budget_text(spent, cap)})")


def _one_line(text: object) -> str:
    # A reason or an error text may span lines; the round's line must stay one line.
    return " ".join(str(text).split())


def spend_metrics(spend: Spend) -> dict[str, float | int]:
    """Return the public spend report: exact sums of the costs charged in this federation.

    ``spend-central-epsilon`` (secure clusters: what the sums give away) only where the
    federation holds secure shares.
    """
    central = {"spend-central-epsilon": float(spend.central_epsilon)} if (
        spend.central_epsilon > 0) else {}
    return {
        "spend-d": float(spend.d_privacy),
        "spend-epsilon": float(spend.epsilon),
        "spend-epsilon-rdp": float(spend.epsilon_rdp),
        "spend-epsilon-pld": float(spend.epsilon_pld),
        "spend-record-epsilon": float(spend.record_epsilon),
        "spend-delta": float(spend.delta),
        "releases": int(spend.releases),
        **central,
    }


class GpflClient(NumPyClient):
    """Choose the best hypothesis, train it locally, sanitize, release.

    Parameters
    ----------
    task : Task or callable
        The learning task, or a function that builds it (called only once the round is
        charged: building a task may read the device's data). Either way the preflight of the
        task's class (`tasks.Task.preflight`) runs before the charge.
    run_config : dict
        The run config as the server sent it (a request).
    policy : DevicePolicy
        The device's own settings and bounds.
    run_id : int, optional
        Flower's run id, the ledger tag of releases when the server sends no federation id.
    secure : SecureTerms, optional
        The terms of the SecAgg+ round this instruction came through (:mod:`client.secure`,
        :class:`~mechanisms.distributed.SecureTerms`); then every
        decline is raised as :class:`~client.secure.SecureDecline` (the protocol counts the
        device as dropped) and the release is a share of the round's sum.
    """

    def __init__(
        self, task: Task | Callable[[], Task], run_config: dict[str, Any], policy: DevicePolicy,
        *, run_id: int | None = None, secure: SecureTerms | None = None,
    ) -> None:
        self._task_source = task
        # A factory is a plain callable; anything else is the task itself (a Task, or an object
        # with the Task interface, e.g. an experiment's wrapper).
        factory = callable(task) and not isinstance(task, Task)
        self._task: Task | None = None if factory else task  # type: ignore[assignment]
        self.run_config = run_config
        self.policy = policy
        self.run_id = run_id
        self.secure = secure

    @property
    def task(self) -> Task:
        """The task, built on first use."""
        if self._task is None:
            source = self._task_source
            assert callable(source)
            self._task = source()
        return self._task

    def get_parameters(self, config: dict[str, Any]) -> Arrays:
        """Return nothing: the server initialises the hypotheses."""
        return []

    def get_properties(self, config: dict[str, Any]) -> dict[str, Any]:
        """Announce the device's ``client-name`` (what every reply of it carries anyway).

        A server that samples by name (``sample-by = "name"``) asks it before the device's
        first round; nothing else is said, nothing is charged.
        """
        return {"client-name": self.policy.client_name}

    def _decline(self, reason: str, by: str, spend: Spend | None) -> tuple[Arrays, int, dict]:
        metrics: dict[str, Any] = {
            "client-name": self.policy.client_name,
            "declined": 1,
            "declined-by": by,
            "decline-reason": reason,
        }
        if spend is not None:
            metrics.update(spend_metrics(spend))
        return [], 1, metrics

    def fit(
        self, parameters: Arrays, config: dict[str, Any]
    ) -> tuple[Arrays, int, dict[str, Any]]:
        """Train the best-fitting hypothesis and release it sanitized.

        Returns the released arrays, a constant sample count of 1 (the real count is not
        revealed) and public metrics; no cluster id is sent. A request the policy forbids, or
        a release that would pass the cap, is declined: no arrays and ``declined=1``; through
        SecAgg+, :class:`~client.secure.SecureDecline` with the same reason instead (a reply
        without a share would break the round's sum).
        """
        released, count, metrics = self._fit(parameters, config)
        if self.secure is not None and metrics.get("declined") == 1:
            raise SecureDecline(str(metrics.get("decline-reason", "declined")))
        return released, count, metrics

    def _fit(
        self, parameters: Arrays, config: dict[str, Any]
    ) -> tuple[Arrays, int, dict[str, Any]]:
        server_round = config.get("server-round", 0)
        if isinstance(server_round, bool) or not isinstance(server_round, int) or server_round < 0:
            raise InstructionError(f"server-round must be an integer >= 0, got {server_round!r}")
        federation = federation_key(config, self.run_id)
        line = round_prefix(self.run_id, server_round, federation, self.policy.client_name)
        try:
            s = ClientSettings.resolve(self.run_config, self.policy)
            hypotheses = check_instruction(parameters, config, max_abs=s.max_parameter,
                                           max_hypotheses=s.max_hypotheses,
                                           max_values=s.max_instruction_values,
                                           shapes=self._public_shapes())
            plan: ReleasePlan | RecordPlan | SecurePlan
            if s.secure:
                if self.secure is None:
                    raise PolicyDecline(
                        "declined: the run asks for secure clusters, but this instruction did "
                        "not come through SecAgg+; nothing is released in the clear")
                plan = plan_share(s, hypotheses, self.secure)
            elif s.privacy.mechanism == "dpsgd":
                plan = plan_record_release(s, hypotheses)
            else:
                plan = plan_release(s.privacy, hypotheses, max_abs=s.max_parameter)
        except PolicyDecline as decline:
            logger.warning("%sdeclines (policy): %s; nothing charged", line, _one_line(decline))
            return self._decline(str(decline), "policy", None)
        problem = self._preflight(s)
        if problem is not None:
            # The message may name the file and its columns: it stays on the device.
            logger.warning("%sdeclines (task-data): %s; nothing charged", line,
                           _one_line(problem))
            return self._decline(TASK_DATA_DECLINED, "task-data", None)
        if not self.policy["data-path"]:
            # No device file to read: building the task is public (its data is generated from
            # the run config), so a malformed instruction, or task settings that do not fit
            # this device's partition, are refused before the round is charged.
            check_shapes(hypotheses, self.task)
            self.task.check_partition(s.partition_id, s.num_partitions)
            if isinstance(plan, RecordPlan) and not _record_capable(self.task):
                reason = ("declined: task does not support mechanism dpsgd (it needs a torch "
                          "classifier with a cross-entropy loss)")
                logger.warning("%sdeclines (policy): %s; nothing charged", line, reason)
                return self._decline(reason, "policy", None)
        base: dict[str, Any] = {"mechanism": s.privacy.mechanism, "client-name": s.name,
                                "relation": plan.event.relation, **plan.metrics}
        family = plan.event.family
        cap = s.privacy.cap(family)
        delta = s.privacy.ledger_delta
        try:
            # Opening the ledger reads and validates it: a corrupt or vanished ledger stops
            # the client here, before it trains or releases anything.
            ledger = PrivacyLedger(s.ledger_path, delta=delta)
            # The (ε, δ) families compose: a release's cost is what it adds to the spend, so
            # the spend before it is read for the round's line (d-privacy costs simply add).
            before = ledger.spent() if family in ("rdp", "record") else None
            # Charged (and on disk) before any private data is read.
            lifetime = ledger.charge(plan.event, cap=cap, round=server_round,
                                     federation=federation)
        except LedgerCorruptError:
            logger.exception("%sfailed (ledger): the privacy ledger is unusable; nothing "
                             "charged or released", line)
            raise ReleaseFailedError(s.name, "ledger") from None
        except BudgetExceededError as err:
            ledger.record_decline()
            logger.warning("%sdeclines (budget): a %s; nothing charged", line, charge_text(
                s.privacy.mechanism, family, cost=err.cost, spent=err.spent, cap=err.cap,
                delta=delta, verb="would cost"))
            reason = f"the next release would pass this device's {plan.event.family} cap"
            _, _, metrics = self._decline(reason, "budget", ledger.spent(federation=federation))
            return [], 1, {**base, **metrics}
        charged = _charged(s.privacy.mechanism, plan.event, before, lifetime, cap=cap,
                           delta=delta)
        extra: dict[str, float] = {}
        picked: list[int] = []
        try:
            if isinstance(plan, RecordPlan):
                released, extra = self._release_record(s, plan, hypotheses, lifetime.releases,
                                                       picked.append)
            elif isinstance(plan, SecurePlan):
                released = self._release_share(s, plan, hypotheses, server_round,
                                               lifetime.releases, picked.append)
            else:
                released = self._release(s, plan, hypotheses, server_round, lifetime.releases,
                                         picked.append)
            spend = ledger.spent(federation=federation)
        except Exception:
            # Charged, and private data was in use: the text of any error could carry it. The
            # device keeps the details; the server learns only that the round failed.
            logger.exception("%sfailed (charged): %s; nothing released", line, charged)
            raise ReleaseFailedError(s.name, "release") from None
        # The device's one line for the round, for its owner: the hypothesis it trained from,
        # the mechanism, the cost and its own budget state. The log stays on the device; the
        # reply carries none of it beyond what its metrics already say (not the choice, which
        # the private loss made).
        k = len(hypotheses)
        logger.info("%sserved: hypothesis %d of %d, %s", line, picked[0] if picked else 0, k,
                    charged)
        return released, 1, {**base, "declined": 0, **extra, **spend_metrics(spend)}

    def _public_shapes(self) -> list[tuple[int, ...]] | None:
        """Return the task's layer shapes where they follow from public values, else None.

        A task given as an object, or one that reads no device file (its data is generated
        from the run config), is built and asked. A task that reads the device's file is not
        built (building it may read the records): its class's ``declared_shapes`` answers
        from the run config and the file's metadata. Any failure here is left for the
        charged path to meet again, as before (None: the shapes are checked once built).
        """
        try:
            if self._task is not None or not self.policy["data-path"]:
                return list(self.task.parameter_shapes)
            return declared_shapes(self.policy.task_config(self.run_config))
        except Exception:
            logger.debug("the task's shapes are not known before the charge", exc_info=True)
            return None

    def _preflight(self, s: ClientSettings) -> str | None:
        """Run the task's preflight; return what it found wrong with the device's data, or None.

        Only a `TaskDataError` declines. Any other failure (a bug, a setting the task refuses)
        is logged and the round goes on to the charge, where building the task meets it again
        and fails charged, as before the preflight existed.
        """
        config = self.policy.task_config(self.run_config)
        try:
            if self._task is None:
                preflight_task(config, s.partition_id, s.num_partitions)
            else:  # a task given as an object: its class's preflight, if it has one
                check = getattr(type(self._task), "preflight", None)
                if check is not None:
                    check(config, s.partition_id, s.num_partitions)
        except TaskDataError as problem:
            return str(problem)
        except Exception:
            logger.exception("%s: the preflight of task %r failed; the round goes on", s.name,
                             self.run_config.get("task"))
        return None

    def _noise_rng(self, s: ClientSettings, releases: int) -> np.random.Generator:
        if s.noise_seed is None:
            return device_rng()
        # Opted in by the device (experiments): keyed by the device's own release count,
        # never by anything the server chose.
        return seeded_rng(s.noise_seed, s.partition_id, releases)

    def _release_record(
        self, s: ClientSettings, plan: RecordPlan, hypotheses: list[Arrays], releases: int,
        on_choice: Callable[[int], None],
    ) -> tuple[Arrays, dict[str, float]]:
        task = self.task
        check_shapes(hypotheses, task)
        data = task.client_dataset(s.partition_id, s.num_partitions)
        return release_record(task, s, plan, hypotheses, data, self._noise_rng(s, releases),
                              on_choice)

    def _trained(
        self, s: ClientSettings, hypotheses: list[Arrays], server_round: int,
        on_choice: Callable[[int], None],
    ) -> tuple[int, Arrays, Arrays]:
        """Pick the hypothesis of least local loss and train it: (its index, it, the model)."""
        task = self.task
        check_shapes(hypotheses, task)
        data = task.client_dataset(s.partition_id, s.num_partitions)
        best = choose_hypothesis(lambda h: _safe_loss(task, h, data), hypotheses)
        on_choice(best)
        reference = hypotheses[best]
        try:
            trained: Any = task.train(
                reference, data, epochs=s.local_epochs, learning_rate=s.learning_rate,
                batch_size=s.batch_size,
                rng=train_rng(s.train_seed, s.partition_id, server_round), device=s.device,
            )
        except Exception:
            logger.exception("%s: local training failed; releasing the hypothesis", s.name)
            trained = None
        updated, ok = usable_model(trained if trained is not None else reference, reference,
                                   max_abs=s.max_parameter)
        if not ok:
            logger.warning("%s: the trained model is not finite or beyond max-parameter; the "
                           "hypothesis is released in its place (with the charged noise)", s.name)
        return best, reference, updated

    def _release_share(
        self, s: ClientSettings, plan: SecurePlan, hypotheses: list[Arrays],
        server_round: int, releases: int, on_choice: Callable[[int], None],
    ) -> Arrays:
        best, reference, updated = self._trained(s, hypotheses, server_round, on_choice)
        # The rounding's coin flips come from the device's generator; the share's noise from
        # OpenDP's exact sampler and the OS's entropy (mechanisms.distributed).
        return make_share(plan, reference, updated, best, self._noise_rng(s, releases))

    def _release(
        self, s: ClientSettings, plan: ReleasePlan, hypotheses: list[Arrays],
        server_round: int, releases: int, on_choice: Callable[[int], None],
    ) -> Arrays:
        _, reference, updated = self._trained(s, hypotheses, server_round, on_choice)
        return make_release(plan, reference, updated, rng=self._noise_rng(s, releases),
                            allow_unsanitized=s.privacy.mechanism == "none")

    def evaluate(
        self, parameters: Arrays, config: dict[str, Any]
    ) -> tuple[float, int, dict[str, Any]]:
        """Answer nothing data-dependent: a local loss would leave the device uncharged.

        The server validates on its own held-out users; a federated evaluation would need a
        privatized, charged statistic, which gpfl does not offer.
        """
        logger.info("%s: evaluate refused (a local loss is private)", self.policy.client_name)
        return 0.0, 0, {"client-name": self.policy.client_name, "refused": 1}


def _charged(
    mechanism: str, event: PrivacyEvent, before: Spend | None, after: Spend, *,
    cap: float | None, delta: float,
) -> str:
    """Return :func:`charge_text` of a charge the ledger made (``before``: (ε, δ) families)."""
    family = family_of(event.family)
    if family is None:
        return charge_text(mechanism, event.family, cost=0.0, spent=0.0, cap=cap, delta=delta)
    if before is None:
        # d-privacy: the costs add, and this release's is its event's.
        cost = float(getattr(event, "cost", 0.0))
    else:
        cost = family.spent(after) - family.spent(before)
    return charge_text(mechanism, event.family, cost=cost, spent=family.spent(after), cap=cap,
                       delta=delta)


def _record_capable(task: Any) -> bool:
    from tasks.dpsgd import supports_record_level

    return supports_record_level(task)


def _safe_loss(task: Task, hypothesis: Arrays, data: Any) -> float:
    """Return a hypothesis's local loss; a failure counts as infinite (never an error)."""
    try:
        return float(task.loss(hypothesis, data))
    except Exception:
        logger.exception("the local loss of a hypothesis failed; it counts as infinite")
        return float("inf")
