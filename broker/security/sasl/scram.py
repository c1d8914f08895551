"""SCRAM (RFC 5802) as Kafka implements it: mechanisms, stored credentials, key derivation.

A credential is kept salted, never in clear: the salt, the iteration count, StoredKey =
H(HMAC(SaltedPassword, "Client Key")) and ServerKey = HMAC(SaltedPassword, "Server Key"), as
Kafka's UserScramCredentialRecord holds them. AlterUserScramCredentials sends the salted
password (the client salts), from which the broker derives the two keys and forgets it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass


@dataclass(frozen=True)
class ScramMechanism:
    name: str  # SASL mechanism name
    type: int  # Kafka's ScramMechanism type code (AlterUserScramCredentials, the metadata records)
    hash_name: str
    min_iterations: int = 4096
    max_iterations: int = 16384


SCRAM_SHA_256 = ScramMechanism("SCRAM-SHA-256", 1, "sha256")
SCRAM_SHA_512 = ScramMechanism("SCRAM-SHA-512", 2, "sha512")
MECHANISMS = {m.name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
BY_TYPE = {m.type: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
MAX_ITERATIONS = 16384  # ScramControlManager's bound on upserted credentials


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def hmac_of(mechanism: ScramMechanism, key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, mechanism.hash_name).digest()


def salted_password(mechanism: ScramMechanism, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) of RFC 5802: PBKDF2 with the mechanism's HMAC."""
    return hashlib.pbkdf2_hmac(mechanism.hash_name, password.encode(), salt, iterations)


def credential_from_salted(mechanism: ScramMechanism, salt: bytes, salted: bytes, iterations: int) -> ScramCredential:
    client_key = hmac_of(mechanism, salted, b"Client Key")
    stored_key = hashlib.new(mechanism.hash_name, client_key).digest()
    server_key = hmac_of(mechanism, salted, b"Server Key")
    return ScramCredential(salt, stored_key, server_key, iterations)


def credential_from_password(mechanism: ScramMechanism, password: str, iterations: int = 4096,
                             salt: bytes | None = None) -> ScramCredential:
    salt = salt if salt is not None else secrets.token_bytes(32)
    return credential_from_salted(mechanism, salt, salted_password(mechanism, password, salt, iterations), iterations)


def username_of(sasl_name: str) -> str:
    """A SCRAM saslname (',' and '=' escaped as =2C and =3D) as the user name (ScramFormatter)."""
    name = sasl_name.replace("=2C", ",")
    if "=" in name.replace("=3D", ""):
        raise ValueError("Invalid username: %s" % sasl_name)
    return name.replace("=3D", "=")
