"""Throwaway certificates for TLS tests: a CA, a server certificate for loopback, a client certificate.

Each call makes a new CA: a second call (another folder, another `ca_name`) gives certificates that the first
CA does not vouch for."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class CertFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, issuer_key: ec.EllipticCurvePrivateKey,
           ca: bool, san: x509.SubjectAlternativeName | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if san is not None:
        builder = builder.add_extension(san, critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certs(folder: Path, host: str = "127.0.0.1", *, dns_names: Sequence[str] = ("localhost",),
               ca_name: str = "loadaware test CA") -> CertFiles:
    """A CA named `ca_name`, a server certificate for `host` (IP SAN) and `dns_names` (DNS SANs), and a client
    certificate, all signed by that CA, as PEM files in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue(ca_name, ca_key, _name(ca_name), ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host)),
                                       *(x509.DNSName(name) for name in dns_names)])
    server = _issue("loadaware picker", server_key, ca.subject, ca_key, ca=False, san=san)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _issue("gateway", client_key, ca.subject, ca_key, ca=False)
    pem = serialization.Encoding.PEM
    return CertFiles(
        ca=_write(folder / "ca.pem", ca.public_bytes(pem)),
        server_cert=_write(folder / "server.pem", server.public_bytes(pem)),
        server_key=_write(folder / "server-key.pem", _key_pem(server_key)),
        client_cert=_write(folder / "client.pem", client.public_bytes(pem)),
        client_key=_write(folder / "client-key.pem", _key_pem(client_key)))
