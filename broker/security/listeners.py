"""Listeners: which address speaks which security protocol, checked as Kafka checks them.

`listeners` names each listener (PLAINTEXT://:9092,SSL://:9093,INTERNAL://:9094) and
`listener.security.protocol.map` gives each name its security protocol (PLAINTEXT, SSL,
SASL_PLAINTEXT, SASL_SSL). `Listener` is what a connection knows of the listener it came in on:
its name (Metadata advertises the addresses of that listener), its protocol, its TLS context and
principal mapper, and its SASL settings. Everything is built and checked once at start-up; a
setting the broker cannot serve stops the start with a SecurityConfigError naming it.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

from broker.config import BrokerConfig, parse_listener
from broker.config import Listener as Address
from broker.security.errors import SecurityConfigError
from broker.security.principal import SslPrincipalMapper
from broker.security.tls import server_context

PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL = "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"
PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)


@dataclass
class Listener:
    name: str
    protocol: str
    host: str
    port: int
    ssl_context: ssl.SSLContext | None = None
    principal_mapper: SslPrincipalMapper | None = None
    sasl: Any = None  # broker.security.sasl.SaslSettings on SASL listeners

    @property
    def uses_tls(self) -> bool:
        return self.ssl_context is not None


def protocol_of(config: BrokerConfig, name: str) -> str:
    protocol = config.security_protocol_map.get(name.upper())
    if protocol is None:
        raise SecurityConfigError("No security protocol defined for listener %s" % name)
    if protocol not in PROTOCOLS:
        raise SecurityConfigError("No enum constant SecurityProtocol.%s (listener %s): use one of %s"
                                  % (protocol, name, ", ".join(PROTOCOLS)))
    return protocol


def check_listeners(config: BrokerConfig) -> list[Address]:
    """Kafka's checks of listeners, advertised.listeners and inter.broker.listener.name."""
    try:
        listeners = config.listeners
        advertised = config.advertised_listeners
    except Exception as exc:
        raise SecurityConfigError(str(exc)) from None
    names = [listener.name.upper() for listener in listeners]
    if len(set(names)) != len(names):
        raise SecurityConfigError("Each listener must have a different name, listeners: %s"
                                  % ",".join(config["listeners"]))
    ports = [listener.port for listener in listeners if listener.port]
    if len(set(ports)) != len(ports):
        raise SecurityConfigError("Each listener must have a different port, listeners: %s"
                                  % ",".join(config["listeners"]))
    for listener in listeners:
        protocol_of(config, listener.name)
    controllers = {n.upper() for n in config["controller.listener.names"] or []}
    for a in advertised:
        if a.name.upper() not in names:
            raise SecurityConfigError("advertised.listeners listener names must be equal to or a subset of the ones "
                                      "defined in listeners. Found %s. The valid options based on the current "
                                      "configuration are %s" % (a.name, ",".join(names)))
        if a.name.upper() in controllers:
            raise SecurityConfigError("The advertised.listeners config must not contain KRaft controller listeners "
                                      "from controller.listener.names when process.roles contains the broker role "
                                      "because Kafka clients that send requests via advertised listeners do not "
                                      "send requests to KRaft controllers -- they only send requests to KRaft "
                                      "brokers.")
    inter = config["inter.broker.listener.name"]
    if inter and inter.upper() not in {a.name.upper() for a in advertised}:
        raise SecurityConfigError("inter.broker.listener.name must be a listener name defined in "
                                  "advertised.listeners. The valid options based on currently configured listeners "
                                  "are %s" % ",".join(a.name for a in advertised))
    return listeners


def build_listener(config: BrokerConfig, address: Address) -> Listener:
    """The security settings of one listener (TLS context, principal mapper, SASL settings)."""
    name = address.name.upper()
    protocol = protocol_of(config, name)
    listener = Listener(name, protocol, address.host, address.port)

    def value(prop: str) -> Any:
        return config.listener_value(name, prop)

    if protocol in (SSL, SASL_SSL):
        listener.ssl_context = server_context(value)
        try:
            listener.principal_mapper = SslPrincipalMapper(value("ssl.principal.mapping.rules"))
        except ValueError as exc:
            raise SecurityConfigError("Invalid ssl.principal.mapping.rules: %s" % exc) from None
    if protocol in (SASL_PLAINTEXT, SASL_SSL):
        from broker.security.sasl.settings import sasl_settings

        listener.sasl = sasl_settings(config, name)
    return listener


DEFAULT_PRINCIPAL_BUILDER = "org.apache.kafka.common.security.authenticator.DefaultKafkaPrincipalBuilder"


def build_listeners(config: BrokerConfig) -> list[Listener]:
    builder = str(config["principal.builder.class"] or DEFAULT_PRINCIPAL_BUILDER)
    if builder != DEFAULT_PRINCIPAL_BUILDER:
        raise SecurityConfigError("principal.builder.class=%s is not available: only Kafka's %s (with "
                                  "ssl.principal.mapping.rules) is" % (builder, DEFAULT_PRINCIPAL_BUILDER))
    return [build_listener(config, address) for address in check_listeners(config)]


def advertised_address(config: BrokerConfig, listener_name: str) -> tuple[str, int] | None:
    """(host, port) advertised for a listener (None: not advertised, a controller listener)."""
    for a in config.advertised_listeners:
        if a.name.upper() == listener_name.upper():
            return a.host, a.port
    return None


__all__ = ["Listener", "build_listeners", "check_listeners", "advertised_address", "parse_listener"]
