"""Certificates made for a test with `cryptography`: a CA, a server certificate for 127.0.0.1
(IP and DNS `localhost` in its subjectAltName) and a client certificate, both signed by the CA,
plus a second, unrelated CA (a client certificate no server trusts). Written as PEM files."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Certs:
    ca: Path  # the CA certificate (trusted by the server for client certificates)
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # a client certificate signed by another CA
    rogue_key: Path

    def read(self, name: str) -> bytes:
        return getattr(self, name).read_bytes()


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _builder(subject: str, issuer: x509.Name, key) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1)))


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    cert = (_builder(cn, _name(cn), key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(cn: str, ca_key, ca_cert: x509.Certificate, *, server: bool):
    key = _key()
    builder = (_builder(cn, ca_cert.subject, key)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(
                   [ExtendedKeyUsageOID.SERVER_AUTH if server
                    else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def make_certs(directory: Path) -> Certs:
    ca_key, ca = _ca("doppelchip test CA")
    other_key, other = _ca("some other CA")
    files: dict[str, bytes] = {"ca.pem": ca.public_bytes(serialization.Encoding.PEM)}
    for stem, (key, cert) in {
        "server": _leaf("127.0.0.1", ca_key, ca, server=True),
        "client": _leaf("test client", ca_key, ca, server=False),
        "rogue": _leaf("rogue client", other_key, other, server=False),
    }.items():
        files[f"{stem}.pem"] = cert.public_bytes(serialization.Encoding.PEM)
        files[f"{stem}.key"] = _pem_key(key)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    d = directory
    return Certs(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem",
                 d / "client.key", d / "rogue.pem", d / "rogue.key")
