"""Certificates and SuperNode keys for an encrypted, authenticated federation.

Two uses:

* :func:`make_local_tls` — a throw-away CA and a server certificate for
  ``gpfl launch --tls`` (and the tests): everything on this machine, valid a
  few days, SANs ``localhost``, ``127.0.0.1``, ``::1`` plus any extra names.
* :func:`make_deployment` (``gpfl certs``) — the same for a real deployment:
  the CA, a SuperLink certificate whose SANs name every host/IP the SuperNodes
  and the ``flwr`` CLI use, and one key pair per SuperNode.

SuperNode authentication in Flower 1.39: the SuperLink runs with
``--enable-supernode-auth`` (TLS required); each SuperNode holds an ECDSA
private key on a NIST curve in OpenSSH format (``--auth-supernode-private-key``,
read with ``load_ssh_private_key``) and its public key (OpenSSH one-line format)
is registered through the SuperLink's control API:
``flwr supernode register <key.pub> <connection>``. A SuperNode whose key is
not registered is refused when it activates (it signs its Fleet requests with
its key; the SuperLink checks them against the registered keys).

Private keys are written with mode 0600 and never leave the folder they are
made in; nothing here talks to the network.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Names every local certificate carries.
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")

#: Curve of every key (Flower's docs use ``ssh-keygen -t ecdsa -b 384``).
CURVE = ec.SECP384R1


@dataclass
class TlsFiles:
    """Certificates for an encrypted federation (PEM files)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


@dataclass
class SupernodeKeys:
    """One SuperNode's authentication key pair (OpenSSH formats)."""

    private_key: Path
    public_key: Path


def _write(path: Path, data: bytes, *, private: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if private:
        # Created 0600 from the start: the key is never readable by others.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(path, 0o600)
    else:
        path.write_bytes(data)
    return path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(CURVE())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _san(names: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    seen: set[str] = set()
    for name in names:
        name = name.strip()
        if not name or name in seen:
            continue
        seen.add(name)
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def make_ca(common_name: str = "gpfl CA", days: int = 365
            ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """Make a self-signed CA key and certificate."""
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpfl")])
    now = _dt.datetime.now(_dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True,
            content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_server_cert(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
                     names: Sequence[str], days: int = 365
                     ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """Make a SuperLink certificate signed by the CA, valid for every name in ``names``."""
    if not names:
        raise ValueError("a server certificate needs at least one name")
    key = _key()
    now = _dt.datetime.now(_dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(_san(names)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_encipherment=True, key_agreement=True,
            content_commitment=False, data_encipherment=False, key_cert_sign=False,
            crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def write_tls(directory: Path, names: Sequence[str], *, days: int = 365,
              ca_name: str = "gpfl CA") -> TlsFiles:
    """Write ``ca.crt``, ``server.pem`` and ``server.key`` into ``directory``.

    The CA's private key is not kept (a new CA is made every time): a
    deployment that needs to issue more certificates later makes a new set.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = make_ca(ca_name, days)
    key, cert = make_server_cert(ca_key, ca_cert, list(names), days)
    pem = serialization.Encoding.PEM
    return TlsFiles(
        ca_cert=_write(directory / "ca.crt", ca_cert.public_bytes(pem)),
        server_cert=_write(directory / "server.pem", cert.public_bytes(pem)),
        server_key=_write(directory / "server.key", _key_pem(key), private=True),
    )


def make_local_tls(directory: Path, extra_names: Sequence[str] = ()) -> TlsFiles:
    """Make a throw-away CA and SuperLink certificate for this machine (valid 7 days).

    SANs: ``localhost``, ``127.0.0.1``, ``::1`` and ``extra_names`` (e.g. the
    compose service name ``superlink``).
    """
    return write_tls(Path(directory), [*LOCAL_NAMES, *extra_names], days=7,
                     ca_name="gpfl throw-away CA")


def make_supernode_key(private_path: Path) -> SupernodeKeys:
    """Make one ECDSA P-384 key pair: ``private_path`` (OpenSSH) and ``<private_path>.pub``."""
    key = _key()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    private_path = Path(private_path)
    return SupernodeKeys(
        private_key=_write(private_path, private, private=True),
        public_key=_write(private_path.with_name(private_path.name + ".pub"), public + b"\n"),
    )


def make_supernode_keys(directory: Path, n: int, prefix: str = "supernode") -> list[SupernodeKeys]:
    """Make ``n`` SuperNode key pairs ``<prefix>-<i>.key`` and ``<prefix>-<i>.key.pub``."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [make_supernode_key(Path(directory) / f"{prefix}-{i}.key") for i in range(n)]


@dataclass
class Deployment:
    """What :func:`make_deployment` wrote."""

    tls: TlsFiles
    supernodes: list[SupernodeKeys]
    names: list[str]


def make_deployment(directory: Path, names: Sequence[str], supernodes: int,
                    *, days: int = 365, local: bool = True) -> Deployment:
    """Make certificates and keys for a real deployment (``gpfl certs``).

    Parameters
    ----------
    directory : Path
        Output folder (``ca.crt``, ``server.pem``, ``server.key``, ``supernodes/``).
    names : Sequence[str]
        DNS names and IP addresses the SuperLink is reached by.
    supernodes : int
        Number of SuperNode key pairs to make.
    days : int
        Validity of the certificates.
    local : bool
        Also add ``localhost``, ``127.0.0.1`` and ``::1`` to the SANs.
    """
    all_names = [*names, *(LOCAL_NAMES if local else ())]
    all_names = list(dict.fromkeys(n.strip() for n in all_names if n.strip()))
    if not all_names:
        raise ValueError("give at least one --san name (or keep the local names)")
    tls = write_tls(Path(directory), all_names, days=days)
    keys = make_supernode_keys(Path(directory) / "supernodes", supernodes)
    return Deployment(tls=tls, supernodes=keys, names=all_names)


def describe_deployment(dep: Deployment) -> str:
    """Say what goes where (printed by ``gpfl certs``)."""
    t = dep.tls
    lines = [
        f"gpfl: certificates for {', '.join(dep.names)}",
        "",
        "SuperLink (server) — keep server.key secret:",
        f"  flower-superlink --ssl-ca-certfile {t.ca_cert} --ssl-certfile {t.server_cert} \\",
        f"      --ssl-keyfile {t.server_key} [--enable-supernode-auth] ...",
        "",
        f"Every SuperNode and every `flwr` user gets the CA certificate only: {t.ca_cert}",
        "  gpfl supernode --root-certificates ca.crt --superlink <server>:9092 \\",
        "      --node-config 'partition-id=0 num-partitions=N "
        "policy-file=\"/etc/gpfl/policy.toml\"'",
        "  (the gpfl client installed on the device serves the run; plain flower-supernode",
        "  would run the app code the server sends)",
        "  ~/.flwr/config.toml:  [superlink.<name>]  address = \"<server>:8000\"",
        "                        root-certificates = \"/path/to/ca.crt\"",
    ]
    if dep.supernodes:
        lines += [
            "",
            "SuperNode authentication (SuperLink started with --enable-supernode-auth):",
            "  copy each private key to its device only, and register its public key:",
        ]
        for i, k in enumerate(dep.supernodes):
            lines.append(f"  device {i}: gpfl supernode ... --auth-supernode-private-key "
                         f"{k.private_key.name}")
            lines.append(f"            flwr supernode register {k.public_key} <connection>")
    return "\n".join(lines)
