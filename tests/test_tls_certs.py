"""Certificates and SuperNode keys (deploy/certs.py, ``gpfl certs``): no processes."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.verification import PolicyBuilder, Store

from deploy.certs import make_deployment, make_local_tls, make_supernode_keys
from deploy.cli import main


def _sans(cert: x509.Certificate) -> set[str]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {*ext.get_values_for_type(x509.DNSName),
            *(str(ip) for ip in ext.get_values_for_type(x509.IPAddress))}


def _verifies(ca_path: Path, cert_path: Path, name: str) -> bool:
    ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    verifier = PolicyBuilder().store(Store([ca])).build_server_verifier(
        x509.IPAddress(ipaddress.ip_address(name)) if name[0].isdigit() or ":" in name
        else x509.DNSName(name))
    try:
        verifier.verify(cert, [])
    except x509.verification.VerificationError:
        return False
    return True


def test_local_tls_names_and_chain(tmp_path: Path) -> None:
    tls = make_local_tls(tmp_path, extra_names=["superlink"])
    cert = x509.load_pem_x509_certificate(tls.server_cert.read_bytes())
    assert _sans(cert) == {"localhost", "127.0.0.1", "::1", "superlink"}
    for name in ("localhost", "127.0.0.1", "::1", "superlink"):
        assert _verifies(tls.ca_cert, tls.server_cert, name)
    assert not _verifies(tls.ca_cert, tls.server_cert, "elsewhere.example.org")
    other = make_local_tls(tmp_path / "other")
    assert not _verifies(other.ca_cert, tls.server_cert, "localhost")
    key = serialization.load_pem_private_key(tls.server_key.read_bytes(), None)
    assert key.public_key() == cert.public_key()
    assert stat.S_IMODE(tls.server_key.stat().st_mode) == 0o600


def test_supernode_keys_in_flowers_formats(tmp_path: Path) -> None:
    keys = make_supernode_keys(tmp_path, 3)
    assert len(keys) == 3
    assert len({k.public_key.read_bytes() for k in keys}) == 3
    for k in keys:
        # What flower-supernode --auth-supernode-private-key reads...
        private = serialization.load_ssh_private_key(k.private_key.read_bytes(), None)
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert stat.S_IMODE(k.private_key.stat().st_mode) == 0o600
        # ... and what `flwr supernode register` accepts, of the same key.
        public = serialization.load_ssh_public_key(k.public_key.read_bytes())
        assert isinstance(public, ec.EllipticCurvePublicKey)
        assert public.curve.name == "secp384r1"  # a NIST curve, as Flower requires
        assert public == private.public_key()
        assert k.public_key.read_text().startswith("ecdsa-sha2-nistp384 ")


def test_deployment_without_local_names(tmp_path: Path) -> None:
    dep = make_deployment(tmp_path, ["fl.example.org", "10.1.2.3"], 0, local=False)
    cert = x509.load_pem_x509_certificate(dep.tls.server_cert.read_bytes())
    assert _sans(cert) == {"fl.example.org", "10.1.2.3"}
    assert dep.supernodes == []
    with pytest.raises(ValueError):
        make_deployment(tmp_path / "none", [], 0, local=False)


def test_gpfl_certs_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    assert main(["certs", "--out", str(out), "--san", "superlink,fl.example.org",
                 "--san", "192.0.2.7", "--supernodes", "2"]) == 0
    printed = capsys.readouterr().out
    assert "--ssl-certfile" in printed and "flwr supernode register" in printed
    for name in ("ca.crt", "server.pem", "server.key", "supernodes/supernode-0.key",
                 "supernodes/supernode-0.key.pub", "supernodes/supernode-1.key.pub"):
        assert (out / name).is_file(), name
    cert = x509.load_pem_x509_certificate((out / "server.pem").read_bytes())
    assert {"superlink", "fl.example.org", "192.0.2.7", "localhost"} <= _sans(cert)
    # An existing CA is not replaced silently.
    before = (out / "ca.crt").read_bytes()
    assert main(["certs", "--out", str(out)]) == 1
    assert (out / "ca.crt").read_bytes() == before
    assert main(["certs", "--out", str(out), "--force"]) == 0
    assert (out / "ca.crt").read_bytes() != before
