"""Test PKI for the fake internet: one self-signed CA and one server leaf it signs.

Keys are ECDSA P-256 (fast to make). Validity: from 1 hour before creation to
``days`` days (default 2) after. Everything is written as PEM files.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class TestPKI:
    """Paths of the PEM files made by :func:`make_pki`."""

    ca_cert: str  # CA certificate (give this to clients as trust anchor)
    ca_key: str  # CA private key (mode 0600)
    server_cert: str  # leaf certificate followed by nothing else (no chain needed: CA is the issuer)
    server_key: str  # leaf private key (mode 0600)


def _write(path: str, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def make_pki(directory: str, dns_names: list[str], ip_addrs: list[str], days: int = 2) -> TestPKI:
    """Create a CA and a server certificate in ``directory``.

    ``dns_names`` go into the leaf's subjectAltName as DNS entries (wildcards
    such as ``*.allowed.test`` allowed), ``ip_addrs`` (IPv4/IPv6 strings) as IP
    entries. The leaf has EKU serverAuth, the CA has keyCertSign and the
    key identifiers that strict verifiers (OpenSSL 3 X509_V_FLAG_X509_STRICT,
    Go, rustls/webpki) want.
    """
    now = _dt.datetime.now(_dt.timezone.utc)
    not_before = now - _dt.timedelta(hours=1)
    not_after = now + _dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gatewrap tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, "gatewrap fake internet test CA"),
        ]
    )
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    leaf_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addrs]
    leaf_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    pem_key = lambda k: k.private_bytes(  # noqa: E731
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    pki = TestPKI(
        ca_cert=os.path.join(directory, "ca.pem"),
        ca_key=os.path.join(directory, "ca.key"),
        server_cert=os.path.join(directory, "server.pem"),
        server_key=os.path.join(directory, "server.key"),
    )
    _write(pki.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(pki.ca_key, pem_key(ca_key), 0o600)
    _write(pki.server_cert, leaf_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(pki.server_key, pem_key(leaf_key), 0o600)
    return pki
