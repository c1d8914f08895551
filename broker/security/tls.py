"""TLS for SSL and SASL_SSL listeners: Kafka's ssl.* properties turned into an ssl.SSLContext,
the listener's (`server_context`) and, for the inter-broker listener, the one this broker uses
as a client of other brokers (`client_context`).

Key and trust stores are PEM, as `ssl.keystore.type=PEM` / `ssl.truststore.type=PEM` in Kafka:
a file (`ssl.keystore.location`: private key and certificate chain; `ssl.truststore.location`:
CA certificates) or inline text (`ssl.keystore.key` + `ssl.keystore.certificate.chain`,
`ssl.truststore.certificates`); an encrypted key takes `ssl.key.password`. PKCS12 stores are
read when the `cryptography` package is installed; JKS is refused at start-up with the way to
convert it. The same combinations Kafka's DefaultSslEngineFactory refuses are refused here, with
its messages. `ssl.client.auth` maps to the context's verify mode (requested: a certificate is
checked if sent), `ssl.enabled.protocols` to its version range, `ssl.cipher.suites` (IANA names
as Java spells them, or OpenSSL names) to its TLS 1.2 cipher list.
"""

from __future__ import annotations

import os
import re
import ssl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from broker.security.errors import SecurityConfigError

PEM = "PEM"
PKCS12 = "PKCS12"
_VERSIONS = {
    "TLSv1": ssl.TLSVersion.TLSv1, "TLSv1.1": ssl.TLSVersion.TLSv1_1,
    "TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_TLS13_SUITES = {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256",
                 "TLS_AES_128_CCM_SHA256", "TLS_AES_128_CCM_8_SHA256"}


def _text(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


@contextmanager
def _private_files(*contents: str | bytes | None) -> Iterator[list[str | None]]:
    """Inline PEM text in files only this process can read, removed once loaded (the ssl module
    reads keys from files only)."""
    with tempfile.TemporaryDirectory(prefix="broker-tls-") as directory:
        os.chmod(directory, 0o700)
        paths: list[str | None] = []
        for i, content in enumerate(contents):
            if content is None:
                paths.append(None)
                continue
            path = os.path.join(directory, "%d.pem" % i)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(content.encode() if isinstance(content, str) else content)
            paths.append(path)
        yield paths


def _read_pkcs12(path: str, password: str | None) -> tuple[bytes | None, bytes, list[bytes]]:
    """(key PEM, certificate PEM, other certificates PEM) of a PKCS12 store."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.serialization import pkcs12
    except ImportError:
        raise SecurityConfigError("PKCS12 stores need the 'cryptography' package; install it or convert the store "
                                  "to PEM (openssl pkcs12 -in %s -nodes) and set the type to PEM" % path) from None
    try:
        with open(path, "rb") as f:
            key, cert, extra = pkcs12.load_key_and_certificates(f.read(), password.encode() if password else None)
    except (OSError, ValueError) as exc:
        raise SecurityConfigError("Failed to load SSL keystore %s of type PKCS12: %s" % (path, exc)) from None
    key_pem = None if key is None else key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    cert_pem = b"" if cert is None else cert.public_bytes(serialization.Encoding.PEM)
    return key_pem, cert_pem, [c.public_bytes(serialization.Encoding.PEM) for c in extra]


def _refuse_type(kind: str, store_type: str, location: str) -> SecurityConfigError:
    return SecurityConfigError(
        "ssl.%s.type=%s is not supported (%s): use PEM (or PKCS12 with the cryptography package); convert with "
        "keytool -importkeystore -srckeystore %s -destkeystore store.p12 -deststoretype PKCS12, then "
        "openssl pkcs12 -in store.p12 -nodes" % (kind, store_type, location, location))


def _load_keystore(ctx: ssl.SSLContext, value: Any, required: bool = True) -> None:
    store_type = str(value("ssl.keystore.type") or "JKS").upper()
    location = _text(value("ssl.keystore.location"))
    password = _text(value("ssl.keystore.password"))
    key_password = _text(value("ssl.key.password"))
    private_key = _text(value("ssl.keystore.key"))
    chain = _text(value("ssl.keystore.certificate.chain"))
    if not required and private_key is None and chain is None and location is None:
        if password is not None:
            raise SecurityConfigError("SSL key store is not specified, but key store password is specified.")
        return  # a client without a certificate (the server may not ask for one)
    if private_key is not None:
        if store_type != PEM:
            raise SecurityConfigError("SSL private key can be specified only for PEM, but key store type is %s."
                                      % store_type)
        if chain is None:
            raise SecurityConfigError("SSL private key is specified, but certificate chain is not specified.")
        if location is not None:
            raise SecurityConfigError("Both SSL key store location and separate private key are specified.")
        if password is not None:
            raise SecurityConfigError("SSL key store password cannot be specified with PEM format, only key password "
                                      "may be specified.")
        with _private_files(chain, private_key) as (cert_path, key_path):
            _load_chain(ctx, cert_path, key_path, key_password, "ssl.keystore.key")
        return
    if chain is not None:
        raise SecurityConfigError("SSL certificate chain is specified, but private key is not specified")
    if location is None:
        raise SecurityConfigError("The SSL listener needs a key store: set ssl.keystore.location (PEM key and "
                                  "certificate chain) or ssl.keystore.key and ssl.keystore.certificate.chain")
    if store_type == PEM:
        if password is not None:
            raise SecurityConfigError("SSL key store password cannot be specified with PEM format, only key password "
                                      "may be specified")
        _load_chain(ctx, location, None, key_password, location)
    elif store_type == PKCS12:
        if password is None:
            raise SecurityConfigError("SSL key store is specified, but key store password is not specified.")
        key_pem, cert_pem, extra = _read_pkcs12(location, password)
        if key_pem is None:
            raise SecurityConfigError("Failed to load SSL keystore %s of type PKCS12: no private key" % location)
        with _private_files(cert_pem + b"".join(extra), key_pem) as (cert_path, key_path):
            _load_chain(ctx, cert_path, key_path, None, location)
    else:
        raise _refuse_type("keystore", store_type, location)


def _load_chain(ctx: ssl.SSLContext, cert_path: str | None, key_path: str | None, password: str | None,
                what: str) -> None:
    try:
        ctx.load_cert_chain(cert_path or "", key_path, password=password)
    except (OSError, ssl.SSLError) as exc:
        # the reason only: never the key material or its password
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or type(exc).__name__
        raise SecurityConfigError("Failed to load SSL keystore %s: %s" % (what, reason)) from None


def _load_truststore(ctx: ssl.SSLContext, value: Any, purpose: ssl.Purpose = ssl.Purpose.CLIENT_AUTH) -> None:
    store_type = str(value("ssl.truststore.type") or "JKS").upper()
    location = _text(value("ssl.truststore.location"))
    password = _text(value("ssl.truststore.password"))
    certificates = _text(value("ssl.truststore.certificates"))
    try:
        if certificates is not None:
            if store_type != PEM:
                raise SecurityConfigError("SSL trust store certs can be specified only for PEM, but trust store type "
                                          "is %s." % store_type)
            if location is not None:
                raise SecurityConfigError("Both SSL trust store location and separate trust certificates are "
                                          "specified.")
            if password is not None:
                raise SecurityConfigError("SSL trust store password cannot be specified for PEM format.")
            ctx.load_verify_locations(cadata=certificates)
        elif location is not None:
            if store_type == PEM:
                if password is not None:
                    raise SecurityConfigError("SSL trust store password cannot be specified for PEM format.")
                ctx.load_verify_locations(cafile=location)
            elif store_type == PKCS12:
                _, cert_pem, extra = _read_pkcs12(location, password)
                ctx.load_verify_locations(cadata=(cert_pem + b"".join(extra)).decode())
            else:
                raise _refuse_type("truststore", store_type, location)
        elif password is not None:
            raise SecurityConfigError("SSL trust store is not specified, but trust store password is specified.")
        else:
            ctx.load_default_certs(purpose)  # as Java: the platform's CAs
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or type(exc).__name__
        raise SecurityConfigError("Failed to load SSL truststore %s: %s" % (location or "(inline)", reason)) from None


def openssl_cipher_name(name: str) -> str:
    """An IANA cipher suite name as Java writes it (TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256) in
    OpenSSL's spelling (ECDHE-RSA-AES128-GCM-SHA256); OpenSSL names pass unchanged."""
    if not name.startswith("TLS_") or "_WITH_" not in name:
        return name
    kx, _, cipher = name[4:].partition("_WITH_")
    kx = "" if kx == "RSA" else kx.replace("_", "-")
    cipher = re.sub(r"AES_(\d+)", r"AES\1", cipher).replace("_", "-")
    cipher = cipher.replace("CHACHA20-POLY1305-SHA256", "CHACHA20-POLY1305")
    if cipher.endswith("-CBC-SHA"):
        cipher = cipher[: -len("-CBC-SHA")] + "-SHA"
    cipher = cipher.replace("-CBC-SHA256", "-SHA256").replace("-CBC-SHA384", "-SHA384")
    return "%s-%s" % (kx, cipher) if kx else cipher


def _apply_protocols(ctx: ssl.SSLContext, value: Any) -> None:
    enabled = list(value("ssl.enabled.protocols") or [])
    versions = []
    for name in enabled:
        version = _VERSIONS.get(name)
        if version is None:
            raise SecurityConfigError("Invalid value %s for ssl.enabled.protocols: use %s" % (name, ", ".join(_VERSIONS)))
        versions.append(version)
    if versions:
        ctx.minimum_version = min(versions)
        ctx.maximum_version = max(versions)
    suites = list(value("ssl.cipher.suites") or [])
    if suites:
        tls12 = [openssl_cipher_name(s) for s in suites if s not in _TLS13_SUITES]
        if tls12:
            try:
                ctx.set_ciphers(":".join(tls12))
            except ssl.SSLError:
                raise SecurityConfigError("None of ssl.cipher.suites %s is available" % ",".join(suites)) from None
        if not any(s in _TLS13_SUITES for s in suites) and ctx.maximum_version >= ssl.TLSVersion.TLSv1_3:
            # TLS 1.3 suites cannot be narrowed here: without one listed, TLS 1.3 is off, as in Java
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2


def server_context(value: Any) -> ssl.SSLContext:
    """The SSLContext of one listener; `value(name)` reads a property as the listener sees it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client_auth = str(value("ssl.client.auth") or "none").lower()
    if client_auth not in _CLIENT_AUTH:
        raise SecurityConfigError("Invalid value %s for configuration ssl.client.auth: use none, requested or required"
                                  % client_auth)
    _load_keystore(ctx, value)
    ctx.verify_mode = _CLIENT_AUTH[client_auth]
    if client_auth != "none":
        _load_truststore(ctx, value)
    _apply_protocols(ctx, value)
    return ctx


HTTPS = "https"


def client_context(value: Any) -> ssl.SSLContext:
    """The SSLContext of this broker as a client of a listener (the inter-broker one), as Kafka's
    SslFactory in client mode builds it from the same ssl.* settings: the key store, if any, is the
    client certificate; the trust store verifies the server (the platform's CAs without one);
    ssl.endpoint.identification.algorithm=https checks the server's certificate against the host
    connected to, empty turns that check off (the chain is verified either way)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    algorithm = _text(value("ssl.endpoint.identification.algorithm"))
    if algorithm is not None and algorithm.strip().lower() not in (HTTPS, ""):
        raise SecurityConfigError("Invalid value %s for configuration ssl.endpoint.identification.algorithm: use "
                                  "https, or empty to turn host name verification off" % algorithm)
    ctx.check_hostname = algorithm is not None and algorithm.strip().lower() == HTTPS
    ctx.verify_mode = ssl.CERT_REQUIRED
    _load_keystore(ctx, value, required=False)
    _load_truststore(ctx, value, ssl.Purpose.SERVER_AUTH)
    _apply_protocols(ctx, value)
    return ctx
