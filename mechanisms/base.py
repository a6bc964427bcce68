"""The ``Mechanism`` interface shared by every local-privacy mechanism, and its factory.

A mechanism turns one client's model after local training (``updated``) into a
release, given the hypothesis it started from (``reference``, public: the server
sent it). The client calls, in this order::

    spread = hypotheses_diameter(hypotheses)           # public: the k hypotheses sent
    event = mechanism.event(reference, updated)        # cheap, deterministic, no noise
    ledger.charge(event, cap=...)                      # on disk before anything leaves
    released = mechanism.sanitize(reference, updated, rng=device_rng(), spread=spread)

``reference`` and ``updated`` are sequences of floating-point arrays (one model's
layers, same count and shapes, finite values); every method validates them.

With k ≥ 2 hypotheses ``reference`` is the one the client picked with its private
loss, so a release centred on it depends on the data through that choice too.
``spread`` (the largest L2 distance between the hypotheses, see
:func:`mechanisms.clipping.hypotheses_diameter`) lets a mechanism whose guarantee
needs it account for that; each mechanism's docstring says what it does with it.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from mechanisms._validation import check_model_pair
from mechanisms.events import PrivacyEvent

#: Every setting any mechanism accepts (snake_case; ``build_mechanism`` also takes kebab-case).
KNOWN_SETTINGS: frozenset[str] = frozenset(
    {
        "calibration",
        "noise_multiplier",
        "epsilon",
        "public_radius",
        "per_layer",
        "delta",
        "clip",
        "clip_mode",
        "planned_releases",
    }
)

_REGISTRY: dict[str, type[Mechanism]] = {}


class Mechanism(ABC):
    """A local-privacy mechanism for one model update.

    Subclasses set ``name`` (the value of the ``mechanism`` setting and metric)
    and take their privacy parameters as keyword-only constructor arguments,
    validated into plain floats.
    """

    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if isinstance(name, str) and name:
            _REGISTRY[name] = cls

    @abstractmethod
    def event(
        self, reference: Sequence[np.ndarray], updated: Sequence[np.ndarray]
    ) -> PrivacyEvent:
        """Return the privacy cost of releasing ``sanitize(reference, updated)``.

        Deterministic and cheap: it draws no noise, so the client can charge its
        ledger (and decline) before anything is sampled or sent.
        """

    @abstractmethod
    def sanitize(
        self,
        reference: Sequence[np.ndarray],
        updated: Sequence[np.ndarray],
        *,
        rng: np.random.Generator,
        spread: float = 0.0,
    ) -> list[np.ndarray]:
        """Return the release: new arrays with the shapes and dtypes of ``updated``.

        Parameters
        ----------
        reference, updated : sequence of numpy.ndarray
            The hypothesis the client trained, and the model after training.
        rng : numpy.random.Generator
            Where the noise comes from; on a device, :func:`mechanisms.device_rng`.
        spread : float
            The diameter (largest pairwise L2 distance) of the hypotheses the
            server sent, >= 0 and finite; 0 for a single hypothesis.
        """

    @abstractmethod
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

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> Mechanism:
        """Build from a dict of snake_case settings, ignoring other mechanisms' keys."""
        return cls()

    @staticmethod
    def _check(
        reference: Sequence[np.ndarray], updated: Sequence[np.ndarray]
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        return check_model_pair(reference, updated)


def _require(name: str, settings: Mapping[str, Any], keys: Sequence[str]) -> None:
    missing = [k for k in keys if settings.get(k) is None]
    if missing:
        raise ValueError(
            f"mechanism {name!r} needs the setting(s) {', '.join(missing)}; "
            f"got {sorted(k for k, v in settings.items() if v is not None)}"
        )


def build_mechanism(name: str, **settings: Any) -> Mechanism:
    """Make the mechanism called ``name`` from the run's settings.

    Parameters
    ----------
    name : str
        ``"laplace"``, ``"gaussian"``, ``"sign"`` or ``"none"``.
    **settings
        Any of :data:`KNOWN_SETTINGS`, in snake_case or kebab-case (as in the
        run configuration). Settings that belong to another mechanism or another
        calibration are ignored, so a whole privacy section can be passed;
        a key that no mechanism knows raises (it is most likely a typo).

    Returns
    -------
    Mechanism

    Raises
    ------
    ValueError
        Unknown ``name``, a required setting missing, or a setting out of range.
    TypeError
        A setting no mechanism knows, or a setting of the wrong type.

    Examples
    --------
    >>> build_mechanism("laplace", calibration="neighbourhood", noise_multiplier=5.0)
    EuclideanLaplace(calibration='neighbourhood', noise_multiplier=5.0, per_layer=False)
    """
    # Importing the implementations fills the registry (mechanisms/__init__ does it too).
    for module in ("gaussian", "laplace", "none", "sign"):
        importlib.import_module(f"mechanisms.{module}")

    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unknown mechanism {name!r}; known mechanisms: {sorted(_REGISTRY)}")
    normalised = {key.replace("-", "_"): value for key, value in settings.items()}
    unknown = sorted(set(normalised) - KNOWN_SETTINGS)
    if unknown:
        raise TypeError(
            f"unknown mechanism setting(s) {', '.join(unknown)}; "
            f"known settings: {', '.join(sorted(KNOWN_SETTINGS))}"
        )
    return _REGISTRY[name].from_settings(normalised)
