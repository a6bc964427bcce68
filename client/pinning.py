"""Which runs a device serves: the pin of the device runner (``gpfl supernode``).

Under Flower's Deployment Engine the SuperLink hands every SuperNode the app (FAB) of a run, and
Flower's own executor installs and imports it: whoever submits a run chooses the code a device
runs. The device runner never does that. It serves every task with the gpfl client *installed on
the device*, and only for runs that claim to be that same app:

* the run's app id (``publisher/name`` of the FAB's ``pyproject.toml``) and version must be those
  of the gpfl installed here (:func:`installed_app`);
* if the device's policy lists ``trusted-fab-hashes``, the run's FAB hash must be one of them.

Anything else is refused before the device's data, policy-bound settings or ledger are touched.
The pin is a pure decision (:func:`check_run`) so that it can be tested without Flower.

What the pin does *not* do: the FAB is never executed, so the pin is not what keeps the server's
code off the device; it keeps the device from serving runs of *another* app (whose run config and
messages gpfl's client was not written for) and, with the hash list, runs of FAB releases the
owner has not reviewed. The app id, version and hash are the server's claims about its own FAB.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

__all__ = ["PUBLISHER", "AppPin", "Verdict", "check_run", "installed_app", "parse_fab_hashes"]

#: ``[tool.flwr.app] publisher`` of gpfl's pyproject.toml; installed metadata does not carry it
#: (a test keeps the two equal).
PUBLISHER = "gpfl"
#: The distribution name of gpfl.
DISTRIBUTION = "gpfl"


@dataclass(frozen=True)
class AppPin:
    """The app a device serves.

    Attributes
    ----------
    fab_id : str
        ``publisher/name``, as Flower names a run's app.
    version : str
        The app's version (``[project] version``).
    fab_hashes : frozenset of str
        FAB hashes (sha256 hex) the device accepts; empty: any FAB of this id and version.
    """

    fab_id: str
    version: str
    fab_hashes: frozenset[str] = frozenset()

    def with_hashes(self, hashes: frozenset[str]) -> AppPin:
        """Return this pin narrowed to the given FAB hashes (none: unchanged)."""
        return AppPin(self.fab_id, self.version, hashes)


@dataclass(frozen=True)
class Verdict:
    """The decision about one run: serve it or not, and why (a public sentence)."""

    serve: bool
    reason: str


def parse_fab_hashes(text: str) -> frozenset[str]:
    """Return the hashes of the ``trusted-fab-hashes`` setting (already checked)."""
    return frozenset(h for h in str(text).split(",") if h)


def installed_app(root: Path | None = None) -> AppPin:
    """Return the app id and version of the gpfl installed on this device.

    A source checkout (an editable install, a deploy image's ``/app``) has ``pyproject.toml``
    next to the packages: its ``[tool.flwr.app] publisher`` and ``[project]`` name and version
    are what ``flwr build`` puts in a FAB. Without one (a wheel install) the installed
    distribution's metadata gives name and version, with gpfl's publisher.
    """
    root = root or Path(__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        data = tomllib.loads(pyproject.read_text())
        project = data.get("project", {})
        publisher = data.get("tool", {}).get("flwr", {}).get("app", {}).get("publisher")
        if project.get("name") == DISTRIBUTION and publisher:
            return AppPin(f"{publisher}/{project['name']}", str(project["version"]))
    return AppPin(f"{PUBLISHER}/{DISTRIBUTION}", metadata.version(DISTRIBUTION))


def check_run(fab_id: str, fab_version: str, fab_hash: str, pin: AppPin) -> Verdict:
    """Decide whether the device serves a run of app ``fab_id`` ``fab_version`` (FAB ``fab_hash``).

    Parameters
    ----------
    fab_id, fab_version, fab_hash : str
        What the run claims (Flower's run record and the FAB the SuperLink sent).
    pin : AppPin
        What the device serves.

    Returns
    -------
    Verdict
        ``serve=True`` only for the pinned app id and version and, if the pin lists hashes, one
        of them. The reason names the app and, when refused, what did not match.
    """
    app = f"{fab_id or '<no app id>'} {fab_version or '<no version>'}"
    if fab_id != pin.fab_id:
        return Verdict(False, f"app {app}: not the app installed on this device "
                              f"({pin.fab_id} {pin.version})")
    if fab_version != pin.version:
        return Verdict(False, f"app {app}: version {fab_version!r} is not the installed "
                              f"{pin.version!r}")
    if pin.fab_hashes and fab_hash not in pin.fab_hashes:
        return Verdict(False, f"app {app}: FAB hash {fab_hash or '<none>'} is not among this "
                              f"device's trusted-fab-hashes")
    return Verdict(True, f"app {app} (FAB {fab_hash[:12] or '<none>'}): served by the gpfl "
                         "client installed on this device")
