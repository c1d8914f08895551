"""The security side of a connection: TLS accept with logged handshake failures, the principal
a client certificate maps to, and the SASL authenticator of a SASL listener's connection.

TLS listeners accept sockets themselves and hand each to the event loop's TLS transport
(`loop.connect_accepted_socket(..., ssl=...)`), which completes the handshake before the
connection's protocol sees a byte. A failed handshake (a plaintext client on a TLS port, an
untrusted or missing client certificate, a protocol mismatch) is logged with the peer and the
reason and closes only that socket; nothing reaches the request path.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.observability.logger import get_logger
from broker.security.listeners import Listener
from broker.security.principal import ANONYMOUS, NoMatchingRule, distinguished_name, user

if TYPE_CHECKING:
    from broker.security.sasl.authenticator import SaslAuthenticator
    from broker.security.sasl.scram import ScramCredential

log = get_logger("broker.security")

HANDSHAKE_TIMEOUT_S = 60.0


def new_authenticator(listener: Listener, broker: Any) -> SaslAuthenticator:
    """The SASL authenticator of a new connection on a SASL listener; SCRAM credentials come from
    the metadata image as it is when the client authenticates. The first one imports SASL."""
    from broker.security.sasl.authenticator import SaslAuthenticator
    from broker.security.sasl.scram import MECHANISMS as SCRAM_MECHANISMS
    from broker.security.sasl.scram import ScramCredential

    def credential_of(mechanism: str, name: str) -> ScramCredential | None:
        record = broker.metadata.image.scram.get((name, SCRAM_MECHANISMS[mechanism].type))
        if record is None:
            return None
        return ScramCredential(record.salt, record.stored_key, record.server_key, record.iterations)

    return SaslAuthenticator(listener.sasl, credential_of, time.monotonic, lambda: int(time.time() * 1000))


def tls_principal(transport: Any, listener: Listener) -> str:
    """The principal of a TLS connection: its client certificate's subject DN mapped by
    ssl.principal.mapping.rules, or ANONYMOUS without a certificate (DefaultKafkaPrincipalBuilder)."""
    cert = transport.get_extra_info("peercert")
    if not cert or listener.principal_mapper is None:
        return ANONYMOUS
    dn = distinguished_name(cert.get("subject", ()))
    try:
        return user(listener.principal_mapper.name(dn))
    except NoMatchingRule:
        # Kafka fails the authentication; the connection is closed by the server
        log.warning("closing connection: no ssl.principal.mapping.rules rule applies to the client certificate",
                    listener=listener.name, dn=dn)
        transport.close()
        return ANONYMOUS


def _bind(host: str, port: int) -> socket.socket:
    if not host and socket.has_dualstack_ipv6():
        return socket.create_server(("::", port), family=socket.AF_INET6, backlog=1024, dualstack_ipv6=True)
    return socket.create_server((host or "0.0.0.0", port), backlog=1024)


class TlsAcceptor:
    """A TLS listening socket: accepts, handshakes (bounded in time), then runs the protocol."""

    def __init__(self, protocol_factory: Callable[[], asyncio.BaseProtocol], listener: Listener, host: str,
                 port: int) -> None:
        self.protocol_factory = protocol_factory
        self.listener = listener
        self.sock = _bind(host, port)
        self.sock.setblocking(False)
        self._accepting: asyncio.Task[None] | None = None
        self._handshakes: set[asyncio.Task[None]] = set()

    def start(self) -> int:
        self._accepting = asyncio.get_running_loop().create_task(self._accept())
        return int(self.sock.getsockname()[1])

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, peer = await loop.sock_accept(self.sock)
            except OSError as exc:  # out of file descriptors, a client gone before accept: keep serving
                log.warning("accept failed", listener=self.listener.name, error=str(exc))
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._handshake(sock, peer))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, sock: socket.socket, peer: Any) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(self.protocol_factory, sock, ssl=self.listener.ssl_context,
                                               ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
        except (TimeoutError, OSError) as exc:
            sock.close()
            where = "%s:%s" % tuple(peer[:2]) if isinstance(peer, tuple) else str(peer)
            if not isinstance(exc, (ssl.SSLError, TimeoutError)):
                # gone before or during the handshake (a port probe, a health check)
                log.debug("connection closed during the TLS handshake", listener=self.listener.name, peer=where)
                return
            reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
            log.warning("closing connection: TLS handshake failed", listener=self.listener.name, peer=where,
                        reason=reason)

    def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
        for task in list(self._handshakes):
            task.cancel()
        self.sock.close()

    async def wait_closed(self) -> None:
        tasks = [t for t in [self._accepting, *self._handshakes] if t is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
