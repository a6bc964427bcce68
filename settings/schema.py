"""Every gpfl setting, declared once: name, type, default, bounds and owner.

A setting is owned by

``federation``
    the run config (``[tool.flwr.app.config]``, ``flwr run --run-config``): whoever starts the run;
``device``
    the device owner (a SuperNode's node config, or the policy file it names): the run config
    cannot set it, and a device ignores it there;
``both``
    the run config *asks* and the device's value is a *bound*; the stricter of the two wins
    (``stricter="max"``: the larger value, e.g. a noise multiplier; ``"min"``: the smaller, e.g.
    an epsilon or a cap). A device with no policy applies ``device_default`` as its bound.

Everything else reads these declarations: the ServerApp and ``gpfl launch`` check a run config
with :func:`check_run_config`, the client and ``gpfl supernode`` check a node config with
:func:`check_node_config`, the pyproject defaults and ``docs/SETTINGS.md`` are generated from
(and tested against) :data:`SETTINGS`. This module imports nothing of gpfl, Flower or NumPy.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FLOWER_NODE_KEYS",
    "MECHANISMS",
    "SETTINGS",
    "Setting",
    "SettingError",
    "check_node_config",
    "check_run_config",
    "device_settings",
    "federation_defaults",
    "parse_optima",
    "read",
    "setting",
    "stricter",
]

OWNERS = ("federation", "device", "both")
#: Node-config keys Flower itself fills in (the Simulation Engine sets them for every virtual node).
FLOWER_NODE_KEYS = ("partition-id", "num-partitions")


class SettingError(ValueError):
    """A setting has a bad value, is unknown, or is given by a party that does not own it."""


@dataclass(frozen=True)
class Setting:
    """The declaration of one setting.

    Attributes
    ----------
    name : str
        The kebab-case key.
    type : type
        ``bool``, ``int``, ``float`` or ``str``.
    default : Any
        The run config's default (owner ``federation`` or ``both``), or the value a device without
        a policy uses (owner ``device``).
    help : str
        One sentence for the settings table and the pyproject comment.
    owner : str
        ``federation``, ``device`` or ``both`` (see the module notes).
    group : str
        Heading of the settings table the key is listed under.
    minimum, maximum : float, optional
        Bounds of a number; excluded when ``open_minimum`` / ``open_maximum``.
    choices : tuple of str
        The allowed values of a string (each item of a comma-separated list if ``is_list``).
    is_list : bool
        A comma-separated list of ``choices`` (e.g. the mechanisms a device allows).
    stricter : str
        Owner ``both``: ``"max"`` or ``"min"``, which of request and bound is applied.
    device_default : Any
        Owner ``both``: the bound of a device that sets none.
    unset : Any
        Owner ``both``: a run-config value that means "no request" (the device's bound applies).
    check : callable, optional
        Further check of a parsed value: raises ``ValueError`` saying what is wrong.
    """

    name: str
    type: type
    default: Any
    help: str
    owner: str = "federation"
    group: str = "run"
    minimum: float | None = None
    maximum: float | None = None
    open_minimum: bool = False
    open_maximum: bool = False
    choices: tuple[str, ...] = ()
    is_list: bool = False
    stricter: str = ""
    device_default: Any = None
    unset: Any = None
    check: Callable[[Any], None] | None = None

    def __post_init__(self) -> None:
        if self.owner not in OWNERS:
            raise ValueError(f"{self.name}: owner must be one of {OWNERS}, got {self.owner!r}")
        if (self.owner == "both") != (self.stricter in ("min", "max")):
            raise ValueError(f"{self.name}: stricter='min'|'max' is required for owner 'both' only")
        self.parse(self.default)
        if self.owner == "both":
            self.parse(self.device_default)

    # -- reading a value ----------------------------------------------------------------------
    def allowed(self) -> str:
        """Describe the allowed values, for error messages and the settings table."""
        if self.choices:
            what = " | ".join(self.choices)
            return f"comma-separated, each one of {what}" if self.is_list else f"one of {what}"
        if self.type is bool:
            return "true | false"
        if self.type is str:
            return "a string"
        low = "" if self.minimum is None else (
            f"> {self.minimum:g}" if self.open_minimum else f">= {self.minimum:g}"
        )
        high = "" if self.maximum is None else (
            f"< {self.maximum:g}" if self.open_maximum else f"<= {self.maximum:g}"
        )
        kind = "an integer" if self.type is int else "a number"
        bounds = " and ".join(b for b in (low, high) if b)
        return f"{kind} {bounds}".strip()

    def _error(self, value: object, source: str) -> SettingError:
        where = f" in the {source}" if source else ""
        return SettingError(
            f"{self.name} must be {self.allowed()}{where}, got {self.name}={value!r}"
        )

    def parse(self, value: object, source: str = "") -> Any:
        """Return ``value`` as this setting's type, checked against its bounds.

        Numbers may arrive as TOML numbers or as strings (a value typed on a command line);
        ``True``/``False`` are never numbers. ``source`` names where the value came from, for the
        message of the :class:`SettingError` raised on a bad value.
        """
        if self.type is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "false"):
                return value.strip().lower() == "true"
            raise self._error(value, source)
        if self.type is str:
            if not isinstance(value, str):
                raise self._error(value, source)
            text = value.strip()
            if self.choices:
                items = [i.strip() for i in text.split(",")] if self.is_list else [text]
                if self.is_list and text == "":
                    items = []
                if any(i not in self.choices for i in items):
                    raise self._error(value, source)
                return ",".join(items) if self.is_list else text
            return self._checked(text, value, source)
        number = _number(value, integer=self.type is int)
        if number is None:
            raise self._error(value, source)
        low, high = self.minimum, self.maximum
        if low is not None and (number < low or (self.open_minimum and number == low)):
            raise self._error(value, source)
        if high is not None and (number > high or (self.open_maximum and number == high)):
            raise self._error(value, source)
        return self._checked(number, value, source)

    def _checked(self, parsed: Any, value: object, source: str) -> Any:
        if self.check is not None:
            try:
                self.check(parsed)
            except ValueError as err:
                where = f" in the {source}" if source else ""
                message = f"{self.name}{where}: {err}, got {self.name}={value!r}"
                raise SettingError(message) from None
        return parsed

    def combine(self, request: Any, bound: Any) -> Any:
        """Return the stricter of a parsed request and the device's parsed bound."""
        if self.owner != "both":
            raise ValueError(f"{self.name} is not owned by both the federation and the device")
        if request is None or (self.unset is not None and request == self.unset):
            return bound
        return max(request, bound) if self.stricter == "max" else min(request, bound)


def _number(value: object, *, integer: bool) -> int | float | None:
    """Parse an int/float (or its spelling in a string); None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            if not integer:
                return None
            try:
                value = float(text)
            except ValueError:
                return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value if integer else float(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        if integer:
            return int(value) if value.is_integer() else None
        return value
    return None


# ------------------------------------------------------------------------------ value checks
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


def _check_name(text: str) -> None:
    if text and not _NAME.fullmatch(text):
        raise ValueError("must be letters, digits, '_', '-' or '.' (not starting with '.')")


_FAB_HASH = re.compile(r"[0-9a-f]{64}")


def _check_fab_hashes(text: str) -> None:
    if any(not _FAB_HASH.fullmatch(h) for h in text.split(",") if text):
        raise ValueError("must be comma-separated SHA-256 hashes (64 lower-case hex digits)")


def _check_positive_list(text: str) -> None:
    if not text:
        return
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise ValueError("must be comma-separated numbers") from None
    if any(not math.isfinite(v) or v <= 0 for v in values):
        raise ValueError("must hold positive finite numbers")


def _check_optima(text: str) -> None:
    rows = text.split(";")
    if any(not row.strip() for row in rows):
        raise ValueError("must be ';'-separated vectors, none of them empty")
    try:
        vectors = [[float(v) for v in row.split(",")] for row in rows]
    except ValueError:
        raise ValueError("must be ';'-separated vectors of ','-separated numbers") from None
    if not vectors or len({len(v) for v in vectors}) != 1:
        raise ValueError("must hold at least one vector, all of the same length")
    if any(not math.isfinite(x) for v in vectors for x in v):
        raise ValueError("must hold finite numbers")


def parse_optima(text: str) -> list[list[float]]:
    """Parse the ``optima`` setting (already checked) into vectors."""
    return [[float(v) for v in part.split(",")] for part in text.split(";")]


_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def _check_device(text: str) -> None:
    if not _DEVICE.fullmatch(text):
        raise ValueError("must be auto, cpu, cuda or cuda:N")


# ------------------------------------------------------------------------------ declarations
_TASKS = ("synthetic", "fairness", "digits", "femnist", "hospital")
MECHANISMS = ("laplace", "gaussian", "sign", "none")

_DECLARATIONS: tuple[Setting, ...] = (
    # -- the run ---------------------------------------------------------------------------------
    Setting("task", str, "synthetic", "the learning task", choices=_TASKS),
    Setting("num-hypotheses", int, 2, "k, the number of models (one per group of clients)",
            minimum=1),
    Setting("num-rounds", int, 20, "rounds of training", minimum=1),
    Setting("clients-per-round", int, 7, "clients sampled each round (fewer if fewer connect)",
            minimum=1),
    Setting("eval-every", int, 1, "validate on held-out users every this many rounds", minimum=1),
    Setting("patience", int, 6,
            "stop after this many validations without a new best loss (0 = never)", minimum=0),
    Setting("seed", int, -1,
            "server-side randomness (sampling, initial hypotheses, client batch order); "
            "-1 = OS entropy; never the privacy noise", minimum=-1),
    Setting("out-dir", str, "", "where the ServerApp writes summary.json (\"\" = runs/<time>)"),
    # The deadline of a round: Flower's ServerConfig(round_timeout) becomes the TTL of every
    # instruction, and the SuperLink answers an instruction still unanswered at its TTL with an
    # error, so the round ends then with the replies that arrived. 60 s is ~4x a real-process
    # round here (12-16 s with 10 SuperNodes on 2 cores, docs/RESULTS.md) and ~25x a simulated
    # round of 100 clients: honest devices are not cut off, and a stuck one costs one minute.
    Setting("round-timeout", float, 60.0,
            "seconds a round waits for replies (and, before it starts, for min-replies devices "
            "to connect); a device that has not answered by then is recorded as missing",
            minimum=0.0, open_minimum=True),
    Setting("min-replies", int, 1,
            "usable replies a round needs to change the hypotheses (fewer: they are kept); a "
            "round starts only once this many devices are connected", minimum=1),
    Setting("resume-from", str, "",
            "a run directory whose checkpoint the ServerApp continues from (\"\" = a fresh "
            "run); out-dir defaults to it"),
    Setting("server-device", str, "auto",
            "where the ServerApp validates (torch tasks): auto, cpu, cuda or cuda:N",
            check=_check_device),
    # -- local training --------------------------------------------------------------------------
    Setting("local-epochs", int, 1, "E, local epochs per round", group="training", minimum=1),
    Setting("learning-rate", float, 0.1, "s, the local SGD step", group="training",
            minimum=0.0, open_minimum=True),
    Setting("batch-size", int, 10, "B, the local batch size", group="training", minimum=1),
    # -- privacy: what the run asks for -----------------------------------------------------------
    Setting("mechanism", str, "laplace",
            "requested mechanism; a device declines one its `mechanisms` do not allow",
            group="privacy", choices=MECHANISMS),
    Setting("calibration", str, "neighbourhood",
            "laplace: neighbourhood (noise ∝ ‖δ‖, the paper's) or fixed (given d-epsilon)",
            group="privacy", choices=("neighbourhood", "fixed")),
    Setting("noise-multiplier", float, 5.0,
            "nu of the neighbourhood calibration (E‖noise‖ = nu·‖δ‖); the device's is a minimum",
            owner="both", stricter="max", device_default=1.0, group="privacy",
            minimum=0.0, open_minimum=True),
    Setting("d-epsilon", float, 1.0,
            "laplace fixed: epsilon per unit of distance of one release; the device's is a "
            "maximum", owner="both", stricter="min", device_default=10.0, group="privacy",
            minimum=0.0, open_minimum=True),
    Setting("public-radius", float, 1.0,
            "laplace fixed: the radius r a release is charged at (cost d-epsilon·r); the "
            "device's is a minimum", owner="both", stricter="max", device_default=1.0,
            group="privacy", minimum=0.0, open_minimum=True),
    Setting("per-layer", bool, False,
            "laplace: sanitize each layer with its own noise (costs add)", group="privacy"),
    Setting("epsilon", float, 1.0,
            "gaussian/sign: the (epsilon, delta) target the planned releases compose to; the "
            "device's is a maximum", owner="both", stricter="min", device_default=10.0,
            group="privacy", minimum=0.0, open_minimum=True),
    Setting("client-epsilons", str, "",
            "gaussian/sign, simulation: partition p asks for epsilon number p mod len "
            "(e.g. \"1,5,10\")", group="privacy", check=_check_positive_list),
    Setting("delta", float, 1e-5,
            "gaussian/sign: the target delta; the device's is a maximum and the delta its "
            "ledger reports at", owner="both", stricter="min", device_default=1e-5,
            group="privacy", minimum=0.0, maximum=1.0, open_minimum=True, open_maximum=True),
    Setting("clip", float, 1.0, "gaussian/sign: the clipping bound C of the update",
            group="privacy", minimum=0.0, open_minimum=True),
    Setting("clip-mode", str, "l2", "gaussian/sign: clip the L2 norm, or each coordinate",
            group="privacy", choices=("l2", "elementwise")),
    Setting("planned-releases", int, 0,
            "gaussian/sign: releases the epsilon target is spread over (0 = num-rounds)",
            group="privacy", minimum=0),
    Setting("cap-d-privacy", float, 0.0,
            "cap on a client's total d-privacy spend Σ epsilon·r (laplace); 0 = no request, "
            "the device's cap applies", owner="both", stricter="min", device_default=50.0,
            unset=0.0, group="privacy", minimum=0.0),
    Setting("cap-epsilon", float, 0.0,
            "cap on a client's RDP-composed epsilon at its delta (gaussian, sign); 0 = no "
            "request, the device's cap applies", owner="both", stricter="min",
            device_default=10.0, unset=0.0, group="privacy", minimum=0.0),
    # -- aggregation -----------------------------------------------------------------------------
    Setting("aggregation", str, "mean", "how a cluster's releases are weighted",
            group="aggregation", choices=("mean", "weighted", "probability", "inverse-variance")),
    Setting("server-learning-rate", float, 0.01, "sign: step of the majority-vote update",
            group="aggregation", minimum=0.0, open_minimum=True),
    # -- tasks -----------------------------------------------------------------------------------
    Setting("data-seed", int, 0, "generates or splits the task's data (public)", group="tasks",
            minimum=0),
    Setting("optima", str, "5,6;4,-4.5",
            "synthetic, fairness: one optimum per group, `;`-separated vectors", group="tasks",
            check=_check_optima),
    Setting("users", int, 0, "training users (0 = one per SuperNode)", group="tasks", minimum=0),
    Setting("samples-per-user", int, 10, "synthetic, fairness: samples of each user",
            group="tasks", minimum=1),
    Setting("validation-users", int, 20,
            "held-out users the server validates on (>= 1; hospital: at most this many held-out "
            "providers, 0 = all of them)", group="tasks", minimum=0),
    Setting("rotate-probability", float, 0.5,
            "digits, femnist: probability that a user's images are rotated", group="tasks",
            minimum=0.0, maximum=1.0),
    Setting("model", str, "cnn", "digits: the Table 3 CNN or seeds/002's logistic regression",
            group="tasks", choices=("cnn", "logistic")),
    Setting("partition", str, "contiguous", "digits: equal slices or a Dirichlet label skew",
            group="tasks", choices=("contiguous", "dirichlet")),
    Setting("dirichlet-alpha", float, 0.5, "digits: concentration of the dirichlet partition",
            group="tasks", minimum=1e-6),
    Setting("loss", str, "cross-entropy", "digits: the training loss", group="tasks",
            choices=("cross-entropy", "rmse")),
    Setting("labels", str, "digit", "digits: 10 digit classes, or parity flipped for rotated "
            "users (thesis Fig. 2.8)", group="tasks", choices=("digit", "parity")),
    Setting("minority-fraction", float, 0.2, "fairness: share of minority samples",
            group="tasks", minimum=0.0, maximum=1.0),
    Setting("server-data-path", str, "",
            "femnist, hospital: the data the ServerApp validates on (a file or folder)",
            group="tasks"),
    # -- the device (node config, or the policy file it names) ------------------------------------
    Setting("partition-id", int, 0, "which partition of the task's data this device holds",
            owner="device", group="device", minimum=0),
    Setting("num-partitions", int, 1, "how many partitions the task's data is split into",
            owner="device", group="device", minimum=1),
    Setting("client-name", str, "",
            "the device's name in replies and its ledger's file name (\"\" = "
            "client-<partition-id>)", owner="device", group="device", check=_check_name),
    Setting("policy-file", str, "",
            "a TOML file of device settings (node-config keys override it); also "
            "$GPFL_POLICY", owner="device", group="device"),
    Setting("mechanisms", str, "laplace,gaussian,sign",
            "the mechanisms this device releases with; any other request is declined",
            owner="device", group="device", choices=MECHANISMS, is_list=True),
    Setting("ledger-dir", str, "~/.gpfl/ledgers",
            "where the device keeps its privacy ledger (<client-name>.json)", owner="device",
            group="device"),
    Setting("ledger-path", str, "", "an explicit ledger file (overrides ledger-dir)",
            owner="device", group="device"),
    Setting("allow-seeded-noise", bool, False,
            "let noise-seed make the privacy noise reproducible (experiments only)",
            owner="device", group="device"),
    Setting("noise-seed", int, -1,
            "the device's own noise seed, used only with allow-seeded-noise (-1 = none)",
            owner="device", group="device", minimum=-1),
    Setting("device", str, "auto",
            "where this device trains (torch tasks): auto, cpu, cuda or cuda:N", owner="device",
            group="device", check=_check_device),
    Setting("data-path", str, "", "femnist, hospital: this device's data (a file or folder)",
            owner="device", group="device"),
    # Refuses absurd instructions before anything is computed or charged. gpfl's tasks work in
    # units (hospital payments in thousands of dollars, the synthetic optima single digits,
    # network weights O(1)), so 1e6 is far beyond any model they learn, and far below where
    # float32 training overflows (squares of 1e19): a hypothesis of 1e30 would otherwise be
    # trained, charged and then fail or release garbage.
    # The device runner (`gpfl supernode`) serves only runs of the gpfl app installed on the
    # device (its app id and version); this narrows that to FAB releases the owner has reviewed.
    # The FAB is never executed on the device either way (docs/TRUST.md).
    Setting("trusted-fab-hashes", str, "",
            "gpfl supernode: the FAB hashes (sha256, comma-separated) of runs this device "
            "serves, on top of the installed app id and version (\"\" = any FAB of them)",
            owner="device", group="device", check=_check_fab_hashes),
    Setting("max-parameter", float, 1e6,
            "the largest |value| in a hypothesis this device accepts; a larger one is refused "
            "before anything is computed or charged", owner="device", group="device",
            minimum=0.0, open_minimum=True),
)

#: Every setting by name.
SETTINGS: dict[str, Setting] = {s.name: s for s in _DECLARATIONS}
if len(SETTINGS) != len(_DECLARATIONS):  # pragma: no cover - a declaration error
    raise RuntimeError("a setting is declared twice")


def setting(name: str) -> Setting:
    """Return the declaration of ``name``; :class:`SettingError` if there is none."""
    try:
        return SETTINGS[name]
    except KeyError:
        raise SettingError(f"unknown setting {name!r}") from None


def read(config: Mapping[str, Any], name: str) -> Any:
    """Return setting ``name`` from ``config`` (its declared default when absent), parsed.

    Raises
    ------
    SettingError
        If the value is not allowed (the message names the key, the value and what is allowed).
    """
    s = setting(name)
    return s.parse(config.get(name, s.default))


def federation_defaults() -> dict[str, Any]:
    """Return the run config's keys and defaults (``[tool.flwr.app.config]``)."""
    return {s.name: s.default for s in _DECLARATIONS if s.owner != "device"}


def device_settings() -> list[Setting]:
    """Return the settings a device may give (owner ``device`` or ``both``), in order."""
    return [s for s in _DECLARATIONS if s.owner != "federation"]


def stricter(name: str, request: Any, bound: Any) -> Any:
    """Return the stricter of a request and a device bound for the shared setting ``name``."""
    return setting(name).combine(request, bound)


def _unknown(keys: Iterable[str], allowed: Iterable[str], what: str) -> SettingError:
    names = ", ".join(repr(k) for k in sorted(keys))
    return SettingError(
        f"unknown {what} setting(s) {names}; known: {', '.join(sorted(allowed))}"
    )


def check_run_config(
    run_config: Mapping[str, Any], *, ignore_foreign: bool = False
) -> dict[str, Any]:
    """Check a whole run config; return every federation/both setting, defaults filled in.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        ``context.run_config`` or the overrides a user gives.
    ignore_foreign : bool
        Skip unknown keys and keys the device owns instead of refusing them (a device reading
        a run config it did not write ignores what is not the federation's to set).

    Raises
    ------
    SettingError
        For an unknown key, a key the device owns (naming who owns it), or a bad value
        (naming the key, the value and what is allowed). All problems are reported at once.
    """
    problems: list[str] = []
    known = federation_defaults()
    device_only = [k for k in run_config if k in SETTINGS and SETTINGS[k].owner == "device"]
    unknown = [k for k in run_config if k not in SETTINGS]
    if not ignore_foreign:
        for key in device_only:
            problems.append(
                f"{key} belongs to the device (its node config or policy file); the run config "
                f"cannot set it, got {key}={run_config[key]!r}"
            )
        if unknown:
            problems.append(str(_unknown(unknown, known, "run-config")))
    out: dict[str, Any] = {}
    for name, default in known.items():
        try:
            out[name] = SETTINGS[name].parse(run_config.get(name, default), "run config")
        except SettingError as err:
            problems.append(str(err))
    if problems:
        raise SettingError("; ".join(problems))
    return out


def check_node_config(
    node_config: Mapping[str, Any], source: str = "node config"
) -> dict[str, Any]:
    """Check a node config (or a policy file): every key must be a device or shared setting.

    Returns the given keys parsed (no defaults filled in: absent keys mean "use the policy file
    or the device default").

    Raises
    ------
    SettingError
        For a key that is unknown or belongs to the federation alone, or a bad value.
    """
    problems: list[str] = []
    allowed = [s.name for s in device_settings()]
    federation_only = [
        k for k in node_config if k in SETTINGS and SETTINGS[k].owner == "federation"
    ]
    for key in federation_only:
        problems.append(
            f"{key} is a run-config setting (the federation's); a {source} cannot set it, "
            f"got {key}={node_config[key]!r}"
        )
    unknown = [k for k in node_config if k not in SETTINGS]
    if unknown:
        problems.append(str(_unknown(unknown, allowed, source)))
    out: dict[str, Any] = {}
    for key, value in node_config.items():
        if key in SETTINGS and SETTINGS[key].owner != "federation":
            try:
                out[key] = SETTINGS[key].parse(value, source)
            except SettingError as err:
                problems.append(str(err))
    if problems:
        raise SettingError("; ".join(problems))
    return out
