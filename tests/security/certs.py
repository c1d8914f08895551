"""Keys and certificates made at test time (never committed): a CA, a server certificate for
127.0.0.1/localhost and client certificates, written as PEM files into a test directory."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(**attrs: str) -> x509.Name:
    oids = {"C": NameOID.COUNTRY_NAME, "O": NameOID.ORGANIZATION_NAME, "OU": NameOID.ORGANIZATIONAL_UNIT_NAME,
            "CN": NameOID.COMMON_NAME}
    return x509.Name([x509.NameAttribute(oids[k], v) for k, v in attrs.items()])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey, password: str | None = None) -> bytes:
    encryption = (serialization.BestAvailableEncryption(password.encode()) if password
                  else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass
class Issued:
    key_pem: bytes
    cert_pem: bytes
    key: Path  # key file
    cert: Path  # certificate file
    combined: Path  # key and certificate in one file (ssl.keystore.location with type PEM)


class TestCA:
    """A certificate authority that issues server and client certificates into `directory`."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, name: str = "Test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.key = _key()
        now = datetime.datetime.now(datetime.UTC)
        subject = _name(O="Broker Tests", CN=name)
        self.cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(self.key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.cert_pem = _cert_pem(self.cert)
        self.path = directory / ("%s.pem" % name.replace(" ", "-").lower())
        self.path.write_bytes(self.cert_pem)

    def issue(self, file_stem: str, server: bool = False, password: str | None = None,
              hosts: tuple[str, ...] = ("localhost", "127.0.0.1"), client_too: bool = False, **subject: str) -> Issued:
        """A certificate: a server's for `hosts` (its subject alternative names), a client's, or
        with `client_too` a server's that is also a client's (a broker's, used both ways)."""
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder().subject_name(_name(**subject)).issuer_name(self.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        )
        if server:
            import ipaddress

            def name(host: str) -> x509.GeneralName:
                try:
                    return x509.IPAddress(ipaddress.ip_address(host))
                except ValueError:
                    return x509.DNSName(host)

            builder = builder.add_extension(x509.SubjectAlternativeName([name(h) for h in hosts]), critical=False)
            usages = [ExtendedKeyUsageOID.SERVER_AUTH] + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client_too else [])
            builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        else:
            builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        issued = Issued(_key_pem(key, password), _cert_pem(cert), self.directory / ("%s.key" % file_stem),
                        self.directory / ("%s.crt" % file_stem), self.directory / ("%s.pem" % file_stem))
        issued.key.write_bytes(issued.key_pem)
        issued.cert.write_bytes(issued.cert_pem)
        issued.combined.write_bytes(issued.key_pem + issued.cert_pem)
        for path in (issued.key, issued.combined):
            path.chmod(0o600)
        return issued
