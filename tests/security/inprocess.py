"""An in-process broker with security settings (a BrokerThread taking properties as they are
spelled: listener.name.sasl_plaintext.plain.sasl.jaas.config keeps its underscores), and raw
SASL exchanges over tests.harness.RawClient."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from pathlib import Path
from typing import Any

from broker.testing.embedded import EmbeddedBroker
from protocol import messages as M
from tests.harness import RawClient
from tests.integration.test_server_support import BrokerThread

SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS, METADATA = 17, 36, 18, 3
PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
              'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')


class SecureBrokerThread(BrokerThread):
    """A BrokerThread (broker.testing's EmbeddedBroker) from properties spelled as Kafka spells them."""

    def __init__(self, tmp_path: Path, properties: dict[str, str]) -> None:
        self.tmp_path = tmp_path
        EmbeddedBroker.__init__(self, {"log.dirs": str(tmp_path / "data"), "offsets.topic.num.partitions": "1",
                                       **properties})

    def port_of(self, listener: str) -> int:
        return int(self.broker.bound_ports[listener])

    @property
    def port(self) -> int:
        return self.port_of("PLAINTEXT")

    def connect(self, listener: str, client_id: str = "raw-test") -> RawClient:
        return RawClient(self.port_of(listener), client_id)


def handshake(c: RawClient, mechanism: str, version: int = 1) -> Any:
    return c.call(SASL_HANDSHAKE, version, M.SaslHandshakeRequest(mechanism=mechanism))


def authenticate(c: RawClient, token: bytes, version: int = 2) -> Any:
    return c.call(SASL_AUTHENTICATE, version, M.SaslAuthenticateRequest(auth_bytes=token))


def plain_login(c: RawClient, user: str, password: str, version: int = 2) -> Any:
    assert handshake(c, "PLAIN").error_code == 0
    return authenticate(c, b"\x00%s\x00%s" % (user.encode(), password.encode()), version)


class ScramClient:
    """The client side of SCRAM (RFC 5802), enough to test the broker's server side."""

    def __init__(self, hash_name: str, user: str, password: str) -> None:
        self.hash_name, self.user, self.password = hash_name, user, password
        self.nonce = base64.b64encode(os.urandom(18)).decode().replace("=", "")
        self.first_bare = "n=%s,r=%s" % (user.replace("=", "=3D").replace(",", "=2C"), self.nonce)
        self.server_signature = b""

    def first(self) -> bytes:
        return ("n,," + self.first_bare).encode()

    def final(self, server_first: bytes, proof_password: str | None = None) -> bytes:
        fields = dict(item.split("=", 1) for item in server_first.decode().split(","))
        salt, iterations, nonce = base64.b64decode(fields["s"]), int(fields["i"]), fields["r"]
        salted = hashlib.pbkdf2_hmac(self.hash_name, (proof_password or self.password).encode(), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", self.hash_name).digest()
        stored_key = hashlib.new(self.hash_name, client_key).digest()
        without_proof = "c=biws,r=%s" % nonce
        auth_message = ("%s,%s,%s" % (self.first_bare, server_first.decode(), without_proof)).encode()
        signature = hmac.new(stored_key, auth_message, self.hash_name).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        server_key = hmac.new(salted, b"Server Key", self.hash_name).digest()
        self.server_signature = hmac.new(server_key, auth_message, self.hash_name).digest()
        return ("%s,p=%s" % (without_proof, base64.b64encode(proof).decode())).encode()


def scram_login(c: RawClient, mechanism: str, user: str, password: str) -> Any:
    assert handshake(c, mechanism).error_code == 0
    client = ScramClient("sha256" if mechanism.endswith("256") else "sha512", user, password)
    first = authenticate(c, client.first())
    if first.error_code:
        return first
    final = authenticate(c, client.final(bytes(first.auth_bytes)))
    if final.error_code == 0:
        assert bytes(final.auth_bytes) == b"v=" + base64.b64encode(client.server_signature)
    return final


def unsecured_jws(principal: str, lifetime_s: float = 3600, **claims: Any) -> str:
    import json
    import time

    def b64(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    now = int(time.time())  # whole seconds: an iat past the broker's clock is refused
    return "%s.%s." % (b64({"alg": "none"}), b64({"sub": principal, "iat": now, "exp": now + lifetime_s, **claims}))


def oauth_token(jws: str) -> bytes:
    return b"n,,\x01auth=Bearer %s\x01\x01" % jws.encode()
