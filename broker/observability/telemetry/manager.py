"""Client metrics subscriptions and client instances (KIP-714), as Kafka's ClientMetricsManager.

Subscriptions are CLIENT_METRICS config resources (`metrics`: metric name prefixes, `*` for all;
`interval.ms`: push interval; `match`: `attribute=regex` selectors over the client's identity).
A client asks GetTelemetrySubscriptions for what to push (the union of the subscriptions that
match it, the shortest interval) and pushes with PushTelemetry; both are rate limited to one per
push interval per client instance, as Kafka does. Time is injected (milliseconds).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from protocol import checksum
from protocol.errors import ErrorCode, KafkaError

METRICS, INTERVAL_MS, MATCH = "metrics", "interval.ms", "match"
CONFIG_NAMES = (METRICS, INTERVAL_MS, MATCH)
ALL_METRICS = "*"
DEFAULT_INTERVAL_MS = 300_000
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 100, 3_600_000
MATCH_ATTRIBUTES = ("client_instance_id", "client_id", "client_software_name", "client_software_version",
                    "client_source_address", "client_source_port")
# CompressionType ids the broker offers for pushes, in Kafka's order (zstd, lz4, gzip, snappy)
ACCEPTED_COMPRESSION_TYPES = [4, 3, 1, 2]
KNOWN_COMPRESSION_TYPES = (0, 1, 2, 3, 4)
CACHE_EXPIRY_MS = 60_000
MAX_CLIENT_INSTANCES = 16_384


def _list(value: str | None) -> list[str]:
    return [p.strip() for p in (value or "").split(",") if p.strip()]


def parse_match(patterns: list[str]) -> dict[str, re.Pattern[str]]:
    """ClientMetricsConfigs.parseMatchingPatterns (INVALID_CONFIG for a bad selector)."""
    parsed: dict[str, re.Pattern[str]] = {}
    for pattern in patterns:
        name, sep, regex = pattern.partition("=")
        if not sep or "=" in regex or name.strip() not in MATCH_ATTRIBUTES:
            raise KafkaError(ErrorCode.INVALID_CONFIG, "Illegal client matching pattern: " + pattern)
        try:
            parsed[name.strip()] = re.compile(regex.strip())
        except re.error:
            raise KafkaError(ErrorCode.INVALID_CONFIG, "Illegal client matching pattern: " + pattern) from None
    return parsed


def validate_subscription(name: str, configs: Mapping[str, str]) -> None:
    """ClientMetricsConfigs.validate: the whole set of configs of one subscription."""
    if not name:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Subscription name can't be empty")
    for key in configs:
        if key not in CONFIG_NAMES:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "Unknown client metrics configuration: " + key)
    if INTERVAL_MS in configs:
        try:
            interval = int(configs[INTERVAL_MS].strip())
        except ValueError:
            raise KafkaError(ErrorCode.INVALID_CONFIG, "Invalid value %s for configuration %s: Not a number of "
                             "type INT" % (configs[INTERVAL_MS], INTERVAL_MS)) from None
        if not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "Invalid value %d for %s, interval must be between 100 and "
                             "3600000 (1 hour)" % (interval, INTERVAL_MS))
    if MATCH in configs:
        parse_match(configs[MATCH].split(","))


@dataclass(frozen=True)
class Subscription:
    metrics: tuple[str, ...]
    interval_ms: int
    match: dict[str, re.Pattern[str]]

    @classmethod
    def from_configs(cls, configs: Mapping[str, str]) -> Subscription:
        interval = configs.get(INTERVAL_MS)
        return cls(tuple(_list(configs.get(METRICS))), int(interval) if interval else DEFAULT_INTERVAL_MS,
                   parse_match(_list(configs.get(MATCH))))

    def matches(self, attributes: Mapping[str, str]) -> bool:
        return all(attributes.get(k) is not None and p.fullmatch(attributes[k]) for k, p in self.match.items())


def kafka_uuid_string(u: uuid.UUID) -> str:
    """Kafka's Uuid.toString: URL-safe base64 without padding."""
    import base64

    return base64.urlsafe_b64encode(u.bytes).rstrip(b"=").decode()


def _java_uuid_hash(u: uuid.UUID) -> int:
    hilo = (u.int >> 64) ^ (u.int & ((1 << 64) - 1))
    return _int32((hilo >> 32) ^ hilo)


def _int32(n: int) -> int:
    n &= 0xFFFFFFFF
    return n - (1 << 32) if n >= 1 << 31 else n


def subscription_id(metrics: list[str], interval_ms: int, instance: uuid.UUID) -> int:
    """A number that changes whenever what the client must push changes (Kafka hashes the same inputs)."""
    text = ("[%s]%d" % (", ".join(metrics), interval_ms)).encode()
    return _int32(checksum.crc32c(text) + _java_uuid_hash(instance))


@dataclass
class ClientInstance:
    instance_id: uuid.UUID
    attributes: dict[str, str]
    subscription_id: int
    subscription_version: int
    metrics: list[str]
    push_interval_ms: int
    last_get_ms: int = 0
    last_push_ms: int = 0
    terminating: bool = False
    last_seen_ms: int = 0
    last_error: ErrorCode = ErrorCode.NONE

    def may_get(self, now: int) -> bool:
        if now - max(self.last_get_ms, self.last_push_ms) >= self.push_interval_ms:
            self.last_get_ms = now
            return True
        return False

    def may_push(self, now: int) -> bool:
        # a push right after a GetTelemetrySubscriptions is accepted early: clients jitter the interval
        ok = self.last_get_ms > self.last_push_ms or now - max(self.last_get_ms, self.last_push_ms) >= \
            self.push_interval_ms
        if ok:
            self.last_push_ms = now
        return ok


@dataclass
class GetAnswer:
    error: ErrorCode
    instance_id: uuid.UUID = field(default_factory=lambda: uuid.UUID(int=0))
    subscription_id: int = 0
    metrics: list[str] = field(default_factory=list)
    push_interval_ms: int = 0


class ClientMetricsManager:
    """The client instances this broker knows and the subscriptions they match."""

    def __init__(self, subscriptions: Callable[[], Mapping[str, Mapping[str, str]]],
                 clock_ms: Callable[[], int], telemetry_max_bytes: int = 1 << 20) -> None:
        self._subscriptions = subscriptions  # name -> configs, read from the metadata image
        self.clock_ms = clock_ms
        self.telemetry_max_bytes = telemetry_max_bytes
        self.instances: dict[uuid.UUID, ClientInstance] = {}
        self.version = 0  # bumped whenever a subscription changes
        self._seen: dict[str, dict[str, str]] = {}

    def _check_subscriptions(self) -> None:
        current = {name: dict(configs) for name, configs in self._subscriptions().items()}
        if current != self._seen:
            self._seen = current
            self.version += 1

    def _create(self, instance_id: uuid.UUID, attributes: dict[str, str]) -> ClientInstance:
        interval = DEFAULT_INTERVAL_MS
        metrics: set[str] = set()
        every = False
        for configs in self._seen.values():
            try:
                sub = Subscription.from_configs(configs)
            except (KafkaError, ValueError):
                continue
            if sub.matches(attributes):
                every = every or ALL_METRICS in sub.metrics
                metrics.update(sub.metrics)
                interval = min(interval, sub.interval_ms)
        chosen = [ALL_METRICS] if every else sorted(metrics)
        return ClientInstance(instance_id, attributes, subscription_id(chosen, interval, instance_id), self.version,
                              chosen, interval)

    def instance(self, instance_id: uuid.UUID, attributes: dict[str, str]) -> ClientInstance:
        """The cached instance, made again when the subscriptions changed since (Kafka re-evaluates)."""
        self._check_subscriptions()
        now = self.clock_ms()
        self._expire(now)
        found = self.instances.get(instance_id)
        if found is None or found.subscription_version < self.version:
            fresh = self._create(instance_id, found.attributes if found is not None else attributes)
            self.instances[instance_id] = fresh
            found = fresh
        found.last_seen_ms = now
        return found

    def _expire(self, now: int) -> None:
        if len(self.instances) < MAX_CLIENT_INSTANCES and not any(
                now - i.last_seen_ms > max(CACHE_EXPIRY_MS, 3 * i.push_interval_ms) for i in self.instances.values()):
            return
        for key, inst in list(self.instances.items()):
            if now - inst.last_seen_ms > max(CACHE_EXPIRY_MS, 3 * inst.push_interval_ms):
                del self.instances[key]
        while len(self.instances) >= MAX_CLIENT_INSTANCES:
            del self.instances[min(self.instances, key=lambda k: self.instances[k].last_seen_ms)]

    def get_subscriptions(self, instance_id: uuid.UUID, attributes: dict[str, str]) -> GetAnswer:
        """GetTelemetrySubscriptions: a zero id gets a new one."""
        if instance_id.int == 0:
            instance_id = uuid.uuid4()
        attributes = {**attributes, "client_instance_id": kafka_uuid_string(instance_id)}
        inst = self.instance(instance_id, attributes)
        now = self.clock_ms()
        if not inst.may_get(now) and inst.last_error not in (ErrorCode.UNKNOWN_SUBSCRIPTION_ID,
                                                             ErrorCode.UNSUPPORTED_COMPRESSION_TYPE):
            inst.last_error = ErrorCode.THROTTLING_QUOTA_EXCEEDED
            return GetAnswer(ErrorCode.THROTTLING_QUOTA_EXCEEDED)
        inst.last_error = ErrorCode.NONE
        return GetAnswer(ErrorCode.NONE, instance_id, inst.subscription_id, list(inst.metrics), inst.push_interval_ms)

    def check_push(self, instance_id: uuid.UUID, attributes: dict[str, str], subscription: int, terminating: bool,
                   compression: int, size: int) -> ClientInstance:
        """PushTelemetry's checks, in Kafka's order (KafkaError on failure); the client instance."""
        if instance_id.int in (0, 1):
            raise KafkaError(ErrorCode.INVALID_REQUEST, "Invalid request from the client [%s], invalid client "
                             "instance id" % kafka_uuid_string(instance_id))
        attributes = {**attributes, "client_instance_id": kafka_uuid_string(instance_id)}
        inst = self.instance(instance_id, attributes)
        try:
            if inst.terminating:
                raise KafkaError(ErrorCode.INVALID_REQUEST, "Client [%s] sent the previous request with state "
                                 "terminating to TRUE, can not accept any requests after that"
                                 % kafka_uuid_string(instance_id))
            if not terminating and not inst.may_push(self.clock_ms()):
                raise KafkaError(ErrorCode.THROTTLING_QUOTA_EXCEEDED, "Request from the client [%s] arrived before "
                                 "the throttling time" % kafka_uuid_string(instance_id))
            if subscription != inst.subscription_id:
                raise KafkaError(ErrorCode.UNKNOWN_SUBSCRIPTION_ID, "Unknown client subscription id for the client "
                                 "[%s]" % kafka_uuid_string(instance_id))
            if compression not in KNOWN_COMPRESSION_TYPES:
                raise KafkaError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, "Unknown compression type [%d] received for "
                                 "the client [%s]" % (compression, kafka_uuid_string(instance_id)))
            if size > self.telemetry_max_bytes:
                raise KafkaError(ErrorCode.TELEMETRY_TOO_LARGE, "Telemetry request from [%s] is larger than the "
                                 "maximum allowed size [%d]" % (kafka_uuid_string(instance_id),
                                                                self.telemetry_max_bytes))
        except KafkaError as exc:
            inst.last_error = exc.code
            raise
        if terminating:
            inst.terminating = True
        inst.last_error = ErrorCode.NONE
        return inst
