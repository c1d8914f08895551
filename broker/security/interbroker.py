"""This broker as a client of the other brokers of its cluster: the security of its connections
to their inter-broker listener.

Kafka builds these connections with ChannelBuilders.clientChannelBuilder(the inter-broker
security protocol, JaasContext.Type.SERVER, the broker's config, the inter-broker listener name,
sasl.mechanism.inter.broker.protocol) wherever a broker talks to another (NetworkUtils,
TransactionMarkerChannelManager, NodeToControllerChannelManager), and so does this module:

- the listener's security protocol (listener.security.protocol.map);
- SSL / SASL_SSL: the listener's own ssl.* settings (listener.name.<l>.ssl.* over ssl.*) as a
  client: its key store is the client certificate (the principal a mutual-TLS listener maps),
  its trust store verifies the other broker, ssl.endpoint.identification.algorithm (https by
  default) checks the other broker's certificate against the advertised host;
- SASL_PLAINTEXT / SASL_SSL: sasl.mechanism.inter.broker.protocol, which must be one of the
  listener's sasl.enabled.mechanisms, with the credentials of the listener's JAAS entry for that
  mechanism (JaasContext.loadServerContext: listener.name.<l>.<mechanism>.sasl.jaas.config; here
  also sasl.jaas.config, as this broker's listeners read it): `username` and `password` for PLAIN
  and SCRAM (a SCRAM user is created with AlterUserScramCredentials before the brokers use it),
  the unsecuredLogin* options for OAUTHBEARER.

Settings that cannot work are refused at start-up (SecurityConfigError), not at the first call.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.config import BrokerConfig
from broker.security.errors import AuthenticationError, SecurityConfigError
from broker.security.listeners import PLAINTEXT, SASL_PLAINTEXT, SASL_SSL, SSL, protocol_of
from broker.security.tls import client_context

if TYPE_CHECKING:
    from broker.security.sasl.client import SaslExchange


@dataclass(frozen=True)
class InterBrokerSecurity:
    listener: str
    protocol: str = PLAINTEXT
    ssl_context: ssl.SSLContext | None = None
    mechanism: str | None = None  # SASL: sasl.mechanism.inter.broker.protocol
    credentials: Mapping[str, str] = field(default_factory=dict, repr=False)  # the JAAS entry's options

    @property
    def uses_sasl(self) -> bool:
        return self.mechanism is not None

    def exchange(self, versions: tuple[int, int] | None = None) -> SaslExchange:
        """A new SASL exchange for a connection (`versions`: of its first one, to re-authenticate)."""
        from broker.security.sasl.client import SaslExchange, mechanism_client

        assert self.mechanism is not None
        return SaslExchange(mechanism_client(self.mechanism, self.credentials), versions)


def inter_broker_security(config: BrokerConfig, listener: str) -> InterBrokerSecurity:
    name = listener.upper()
    protocol = protocol_of(config, name)
    context = None
    if protocol in (SSL, SASL_SSL):
        context = client_context(lambda prop: config.listener_value(name, prop))
    if protocol not in (SASL_PLAINTEXT, SASL_SSL):
        return InterBrokerSecurity(name, protocol, context)
    from broker.security.sasl.client import mechanism_client
    from broker.security.sasl.mechanisms import OAUTHBEARER
    from broker.security.sasl.settings import sasl_settings

    settings = sasl_settings(config, name)
    mechanism = str(config["sasl.mechanism.inter.broker.protocol"] or "GSSAPI").strip().upper()
    if mechanism not in settings.mechanisms:
        raise SecurityConfigError("sasl.mechanism.inter.broker.protocol must be included in sasl.enabled.mechanisms "
                                  "when SASL is used for inter-broker communication (listener %s enables %s, "
                                  "sasl.mechanism.inter.broker.protocol is %s)"
                                  % (name, ",".join(settings.mechanisms), mechanism))
    entry = settings.jaas.get(mechanism)
    options = dict(entry.options) if entry is not None else {}
    where = "listener.name.%s.%s.sasl.jaas.config" % (name.lower(), mechanism.lower())
    if mechanism != OAUTHBEARER and not (options.get("username") and options.get("password")):
        raise SecurityConfigError(
            "The inter-broker listener %s authenticates with %s: its JAAS entry (%s) needs the username and "
            "password options, the credentials this broker presents to the others" % (name, mechanism, where))
    try:
        mechanism_client(mechanism, options)  # an unsecured token that cannot be made fails now
    except AuthenticationError as exc:
        raise SecurityConfigError("Invalid %s for the inter-broker listener %s: %s" % (where, name, exc)) from None
    return InterBrokerSecurity(name, protocol, context, mechanism, options)
