"""SASL settings of one listener, read once at start-up with Kafka's property names.

sasl.enabled.mechanisms               PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER (GSSAPI is refused)
listener.name.<l>.<mech>.sasl.jaas.config   the mechanism's JAAS entry; PLAIN users as user_<name>="<password>",
                                      OAUTHBEARER's unsecuredValidator* options
connections.max.reauth.ms             session lifetime (KIP-368), also per mechanism
sasl.server.max.receive.size          largest frame before and during authentication
connection.failed.authentication.delay.ms   delay before a failed authentication is answered and closed
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from broker.config import BrokerConfig
from broker.security.errors import SecurityConfigError
from broker.security.sasl.jaas import JaasEntry, parse_jaas
from broker.security.sasl.mechanisms import OAUTHBEARER, PLAIN
from broker.security.sasl.scram import MECHANISMS as SCRAM_MECHANISMS

SUPPORTED = (PLAIN, *SCRAM_MECHANISMS, OAUTHBEARER)
LOGIN_MODULES = {
    PLAIN: "org.apache.kafka.common.security.plain.PlainLoginModule",
    OAUTHBEARER: "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule",
    **{m: "org.apache.kafka.common.security.scram.ScramLoginModule" for m in SCRAM_MECHANISMS},
}


@dataclass
class SaslSettings:
    mechanisms: list[str]
    jaas: dict[str, JaasEntry | None] = field(default_factory=dict)  # mechanism -> its JAAS entry
    reauth_ms: dict[str, int] = field(default_factory=dict)  # mechanism -> connections.max.reauth.ms
    max_receive_size: int = 524288
    failed_delay_ms: int = 100

    def plain_users(self) -> dict[str, str]:
        entry = self.jaas.get(PLAIN)
        if entry is None:
            return {}
        return {k[len("user_"):]: v for k, v in entry.options.items() if k.startswith("user_")}

    def options(self, mechanism: str) -> dict[str, str]:
        entry = self.jaas.get(mechanism)
        return dict(entry.options) if entry is not None else {}


def jaas_entry(config: BrokerConfig, listener: str, mechanism: str) -> JaasEntry | None:
    """The JAAS entry of a listener's mechanism: listener.name.<l>.<mechanism>.sasl.jaas.config, else
    sasl.jaas.config (None: neither is set)."""
    text: Any = config.listener_value(listener, "sasl.jaas.config", mechanism)
    if text is None or text == "":
        return None
    try:
        entries = parse_jaas(str(text))
    except ValueError as exc:
        raise SecurityConfigError("Invalid sasl.jaas.config of listener %s, mechanism %s: %s"
                                  % (listener, mechanism, exc)) from None
    if len(entries) != 1:
        raise SecurityConfigError("Must supply exactly 1 non-null JAAS mechanism configuration (listener %s, "
                                  "mechanism %s, found %d)" % (listener, mechanism, len(entries)))
    return entries[0]


def sasl_settings(config: BrokerConfig, listener: str) -> SaslSettings:
    mechanisms = [m.strip().upper() for m in config.listener_value(listener, "sasl.enabled.mechanisms") or []]
    if not mechanisms:
        raise SecurityConfigError("No SASL mechanisms are enabled (listener %s): set sasl.enabled.mechanisms" % listener)
    for mechanism in mechanisms:
        if mechanism not in SUPPORTED:
            raise SecurityConfigError(
                "SASL mechanism %s of listener %s is not served (sasl.enabled.mechanisms defaults to GSSAPI, as in "
                "Kafka): use %s" % (mechanism, listener, ", ".join(SUPPORTED)))
    settings = SaslSettings(
        mechanisms=list(dict.fromkeys(mechanisms)),
        max_receive_size=int(config.listener_value(listener, "sasl.server.max.receive.size")),
        failed_delay_ms=int(config["connection.failed.authentication.delay.ms"]),
    )
    for mechanism in settings.mechanisms:
        entry = jaas_entry(config, listener, mechanism)
        if entry is not None and entry.login_module != LOGIN_MODULES[mechanism]:
            raise SecurityConfigError("The JAAS entry of listener %s, mechanism %s names %s: use %s"
                                      % (listener, mechanism, entry.login_module, LOGIN_MODULES[mechanism]))
        settings.jaas[mechanism] = entry
        settings.reauth_ms[mechanism] = int(config.listener_value(listener, "connections.max.reauth.ms", mechanism))
    if PLAIN in settings.mechanisms and not settings.plain_users():
        raise SecurityConfigError(
            "Listener %s enables PLAIN without users: set listener.name.%s.plain.sasl.jaas.config to "
            "org.apache.kafka.common.security.plain.PlainLoginModule required user_<name>=\"<password>\";"
            % (listener, listener.lower()))
    return settings
