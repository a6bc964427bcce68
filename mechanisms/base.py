"""The ``Mechanism`` interface shared by every local-privacy mechanism.

A mechanism turns one client's model after local training (``updated``) into a
release, given the hypothesis it started from (``reference``, public: the server
sent it). A device (:mod:`client.numpy_client`, with :mod:`client.release`) uses it in
this order::

    # plan_release: public values only, before any private data is read
    mechanism = build_mechanism(privacy)                   # from the device's settings
    spread = hypotheses_diameter(hypotheses)               # public: the k hypotheses sent
    metrics = mechanism.public_metrics(hypotheses[0], hypotheses[0], spread=spread)
    event = mechanism.event(hypotheses[0], hypotheses[0])  # from the shapes alone, no noise
    ledger.charge(event, cap=...)                          # on disk before any data is read
    # the private part: pick a hypothesis with the local loss, train from it
    reference = hypotheses[choose_hypothesis(loss, hypotheses)]
    updated, _ = usable_model(train(reference), reference, max_abs=...)
    # make_release: the one path of every release
    exact = mechanism.sanitize_exact(reference, updated, rng=rng, spread=spread)
    released = cast_release(exact, updated)                # float32: what is sent
    verify_release(mechanism, event, reference=reference, updated=updated,
                   released=released, exact=exact, spread=spread)

``plan_release`` also declines a request whose noise scale would be out of range, and
asks ``public_metrics`` only where the metrics do not depend on the data (not for the
neighbourhood calibration, whose ``sigma`` follows ‖δ‖).

The event depends only on the layers' shapes (:meth:`Mechanism.event`), so the one
computed from a hypothesis is the release's; the release invariant
(:func:`mechanisms.invariant.verify_release`) recomputes it from ``reference`` and
``updated`` and refuses a release whose charge is not its own.

``sanitize(...)`` is ``cast_release(sanitize_exact(...), updated)``: the release is made in
float64, exactly on a public power-of-two grid (:mod:`mechanisms.grid`), and cast to float32
last (post-processing); the client calls the two steps itself so that the invariant's check
of the noise is made on the float64 release, before the cast.

``reference`` and ``updated`` are sequences of floating-point arrays (one model's
layers, same count and shapes, finite values); every method validates them.

With k ≥ 2 hypotheses ``reference`` is the one the client picked with its private
loss, so a release centred on it depends on the data through that choice too.
``spread`` (the largest L2 distance between the hypotheses, see
:func:`mechanisms.clipping.hypotheses_diameter`) lets a mechanism whose guarantee
needs it account for that; each mechanism's docstring says what it does with it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, Generic, TypeAlias, TypeVar

import numpy as np
from numpy.random import Generator

from mechanisms._validation import check_generator, check_model_pair, check_non_negative_finite
from mechanisms.events import PrivacyEvent
from mechanisms.grid import RELEASE_DTYPE

#: One model's layers, as the mechanisms take and return them.
Layers: TypeAlias = list[np.ndarray]

#: The event a mechanism emits (e.g. ``GaussianReleaseEvent`` for the Gaussian mechanism).
EventT = TypeVar("EventT", bound=PrivacyEvent, covariant=True)


class Mechanism(ABC, Generic[EventT]):
    """A local-privacy mechanism for one model update.

    Subclasses set ``name`` (the value of the ``mechanism`` setting and metric),
    take their privacy parameters as keyword-only constructor arguments,
    validated into plain floats, and implement :meth:`_event`, :meth:`_release`
    and :meth:`_metrics`. The public methods validate every argument first, the
    same way for every mechanism, so that the hooks see only checked inputs.
    """

    name: ClassVar[str]

    def event(self, reference: Sequence[np.ndarray], updated: Sequence[np.ndarray]) -> EventT:
        """Return the privacy cost of releasing ``sanitize(reference, updated)``.

        Deterministic and cheap: it draws no noise, so the client can charge its
        ledger (and decline) before anything is sampled or sent.
        """
        _, upd = check_model_pair(reference, updated)
        return self._event(upd)

    def sanitize(
        self,
        reference: Sequence[np.ndarray],
        updated: Sequence[np.ndarray],
        *,
        rng: np.random.Generator,
        spread: float = 0.0,
    ) -> list[np.ndarray]:
        """Return the release: new float32 arrays with the shapes of ``updated``.

        Parameters
        ----------
        reference, updated : sequence of numpy.ndarray
            The hypothesis the client trained, and the model after training.
        rng : numpy.random.Generator
            Where the noise comes from; on a device, :func:`mechanisms.device_rng`.
        spread : float
            The diameter (largest pairwise L2 distance) of the hypotheses the
            server sent, >= 0 and finite; 0 for a single hypothesis. What the
            mechanism does with it is in its class notes.
        """
        return cast_release(self.sanitize_exact(reference, updated, rng=rng, spread=spread),
                            updated)

    def sanitize_exact(self, reference: Sequence[np.ndarray], updated: Sequence[np.ndarray], *,
                       rng: np.random.Generator, spread: float = 0.0) -> list[np.ndarray]:
        """Return the release in float64, before :meth:`sanitize` casts it to float32.

        The noise is drawn in float64 and the exact real sum is rounded onto the
        release's public grid; casting it to float32 (on the wire) is post-processing of
        this release, so it keeps its guarantee, but it may round away noise smaller
        than float32's resolution at the model's values. A check of the noise
        (:func:`mechanisms.invariant.verify_release`)
        is made on this array; what is sent must be exactly ``cast_release`` of it.
        Same arguments as :meth:`sanitize`.
        """
        check_generator(rng)
        spread = check_non_negative_finite("spread", spread)
        ref, upd = check_model_pair(reference, updated)
        return [np.asarray(a, dtype=np.float64) for a in self._release(ref, upd, rng, spread)]

    def public_metrics(
        self,
        reference: Sequence[np.ndarray],
        updated: Sequence[np.ndarray],
        *,
        spread: float = 0.0,
    ) -> dict[str, float]:
        """Return the public metrics ``sigma``, ``budget-epsilon`` and ``budget-delta``.

        ``sigma`` is the per-coordinate standard deviation of the release's noise
        (0 when there is none) for the same ``spread`` as :meth:`sanitize`; the
        budget keys are the client's declared (epsilon, delta) target, 0 where the
        mechanism has none.
        """
        spread = check_non_negative_finite("spread", spread)
        ref, upd = check_model_pair(reference, updated)
        return self._metrics(ref, upd, spread)

    # -- what each mechanism implements, on validated inputs ---------------------------------

    @abstractmethod
    def _event(self, upd: Layers) -> EventT:
        """Return the event of releasing ``upd`` (only its shapes may enter)."""

    @abstractmethod
    def _release(self, ref: Layers, upd: Layers, rng: Generator, spread: float) -> Layers:
        """Return the release of :meth:`sanitize_exact` (float64, not yet cast)."""

    @abstractmethod
    def _metrics(self, ref: Layers, upd: Layers, spread: float) -> dict[str, float]:
        """Return the metrics of :meth:`public_metrics`."""


def cast_release(exact: Sequence[np.ndarray], like: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Cast a float64 release (:meth:`Mechanism.sanitize_exact`) to the release dtype.

    Every release leaves as :data:`~mechanisms.grid.RELEASE_DTYPE` (float32), whatever the
    dtypes of the hypotheses the server sent or of the model: the device, not the server,
    fixes the precision of what it publishes. ``like`` gives the layers' count and shapes.

    Raises
    ------
    ValueError
        If a value overflows float32 (the noise is too large for it).
    """
    out = []
    for index, (values, model) in enumerate(zip(exact, like, strict=True)):
        with np.errstate(over="ignore"):
            cast = np.asarray(values).astype(RELEASE_DTYPE, copy=True)
        if not np.isfinite(cast).all():
            raise ValueError(
                f"layer {index}: the noisy release overflows {RELEASE_DTYPE}; the noise is too "
                "large for it"
            )
        if cast.shape != np.shape(model):
            raise ValueError(f"layer {index}: the release's shape is not the model's")
        out.append(cast)
    return out
