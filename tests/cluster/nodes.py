"""What the cluster tests ask a node of a ProcessCluster directly, in raw frames (no client's
caching in the way): its Metadata (live brokers, controller, partition leaders), FindCoordinator,
CreateTopics; a cluster started until every node is live; keys coordinated by a chosen node; the
errors the nodes logged."""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from protocol import messages as M
from tests.cluster.harness import ProcessCluster
from tests.harness import RawClient, wait_for

if TYPE_CHECKING:
    from tests.chaos.network import Network

METADATA, FIND_COORDINATOR, CREATE_TOPICS = 3, 10, 19
GROUP, TRANSACTION, SHARE = 0, 1, 2  # FindCoordinator key types


def call(port: int, api_key: int, version: int, request: Any, timeout: float = 10.0) -> Any:
    client = RawClient(port, "cluster-test")
    client.sock.settimeout(timeout)
    try:
        return client.call(api_key, version, request)
    finally:
        client.close()


def metadata(port: int, topics: Iterable[str] | None = None) -> Any:
    """Metadata v12 from the node on `port`: all topics, or those named (never auto-created)."""
    wanted = None if topics is None else [M.MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
    return call(port, METADATA, 12, M.MetadataRequest(topics=wanted, allow_auto_topic_creation=False))


def live_brokers(port: int) -> set[int]:
    return {b.node_id for b in metadata(port, []).brokers}


def controller(port: int) -> int:
    return int(metadata(port, []).controller_id)


def leaders(port: int, topic: str) -> dict[int, int]:
    """Partition -> leader id (-1: none) as the node on `port` sees `topic`."""
    found = metadata(port, [topic]).topics[0]
    assert found.error_code == 0, (topic, found.error_code)
    return {p.partition_index: p.leader_id for p in found.partitions}


def find_coordinator(port: int, key_type: int, key: str) -> tuple[int, int]:
    """(error code, node id) of FindCoordinator v6 for one key (v6: share-partition keys too)."""
    response = call(port, FIND_COORDINATOR, 6, M.FindCoordinatorRequest(key_type=key_type, coordinator_keys=[key]))
    found = response.coordinators[0]
    return int(found.error_code), int(found.node_id)


def coordinator(port: int, key_type: int, key: str, timeout: float = 30.0) -> int:
    """The node coordinating `key`, once there is one (the internal topic may be made on the first ask)."""
    found: list[int] = []

    def known() -> bool:
        code, node = find_coordinator(port, key_type, key)
        found[:] = [node]
        return code == 0 and node >= 0

    wait_for(known, timeout, interval=0.1, what="a coordinator of %r" % key)
    return found[0]


def key_coordinated_by(port: int, key_type: int, node: int, prefix: str, avoid: Iterable[str] = ()) -> str:
    """A group id or transactional id (`prefix` + a number) whose coordinator is `node`."""
    skip = set(avoid)
    for n in range(500):
        key = "%s-%d" % (prefix, n)
        if key not in skip and coordinator(port, key_type, key) == node:
            return key
    raise AssertionError("no key %s-N coordinated by node %d" % (prefix, node))


def create_topic(port: int, name: str, partitions: int, factor: int = 1, timeout: float = 10.0,
                 configs: dict[str, str] | None = None) -> tuple[int, str | None]:
    """CreateTopics v7 sent to the node on `port`: (error code, message)."""
    R = M.CreateTopicsRequest
    topic = R.CreatableTopic(name=name, num_partitions=partitions, replication_factor=factor, assignments=[],
                             configs=[R.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()])
    response = call(port, CREATE_TOPICS, 7, R(topics=[topic], timeout_ms=int(timeout * 1000), validate_only=False),
                    timeout=timeout + 5)
    result = response.topics[0]
    return int(result.error_code), result.error_message


def wait_live(cluster: ProcessCluster, nodes: Iterable[int] | None = None, timeout: float = 30.0) -> None:
    """Until every node of `nodes` (default: all) lists exactly the live ones of `nodes` in Metadata."""
    wanted = set(cluster.nodes if nodes is None else nodes)

    def all_see_all() -> bool:
        try:
            return all(live_brokers(cluster.node(n).port) == wanted for n in wanted)
        except OSError:
            return False

    wait_for(all_see_all, timeout, interval=0.05, what="nodes %s live in every node's Metadata" % sorted(wanted))


def wait_leaders(cluster: ProcessCluster, topic: str, expect: Callable[[dict[int, int]], bool],
                 nodes: Iterable[int] | None = None, timeout: float = 30.0, what: str = "leaders") -> dict[int, int]:
    """Until every node of `nodes` sees leaders of `topic` that satisfy `expect`; returns them."""
    ports = [cluster.node(n).port for n in (cluster.nodes if nodes is None else nodes)]
    seen: list[dict[int, int]] = []

    def agreed() -> bool:
        try:
            views = [leaders(port, topic) for port in ports]
        except (OSError, AssertionError):
            return False
        seen[:] = views[:1]
        return all(v == views[0] for v in views) and expect(views[0])

    wait_for(agreed, timeout, interval=0.05, what="%s of %s" % (what, topic))
    return seen[0]


def start_cluster(base: Path, size: int = 3, overrides: dict[str, str] | None = None,
                  network: Network | None = None, node_overrides: dict[int, dict[str, str]] | None = None,
                  etcd_members: int = 1) -> ProcessCluster:
    """A ProcessCluster whose nodes are all live (registered, unfenced) in every node's Metadata."""
    cluster = ProcessCluster(base, size, overrides, network, node_overrides, etcd_members)
    try:
        cluster.start()
        wait_live(cluster)
    except BaseException:
        print(cluster.logs())
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def running_cluster(base: Path, overrides: dict[str, str] | None = None,
                    topic: tuple[str, int, int] | None = None,
                    node_overrides: dict[int, dict[str, str]] | None = None) -> Iterator[ProcessCluster]:
    """A cluster of three on a test etcd (skipped without one) for the block, with `topic` (name,
    partitions, replication factor) created and led; its nodes' logs printed if the block fails.
    `node_overrides`: more properties of single nodes (node id -> properties)."""
    need_etcd()
    made = start_cluster(base, overrides=overrides, node_overrides=node_overrides)
    try:
        if topic is not None:
            name, partitions, factor = topic
            code, message = create_topic(made.node(1).port, name, partitions, factor=factor)
            assert code == 0, message
            wait_leaders(made, name, lambda ls: len(ls) == partitions and min(ls.values()) >= 0)
        yield made
    except BaseException:
        print(made.logs())
        raise
    finally:
        made.stop()


ERROR_LINE = re.compile(r"\[(error|critical) *\]|Traceback")


def logged_errors(cluster: ProcessCluster, expected: Iterable[str] = ()) -> list[str]:
    """Error lines and tracebacks the nodes logged, but those holding a text of `expected`."""
    allowed = list(expected)
    lines = []
    for node_id, process in cluster.nodes.items():
        for line in process.output().splitlines():
            if ERROR_LINE.search(line) and not any(text in line for text in allowed):
                lines.append("node %d: %s" % (node_id, line))
    return lines


def elapsed_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.02, what: str = "condition"
                  ) -> float:
    """Seconds until `predicate` holds (polled every `interval`), failing after `timeout`."""
    began = time.monotonic()
    wait_for(predicate, timeout, interval=interval, what=what)
    return time.monotonic() - began


def need_etcd() -> None:
    """Skip (fail on CI) when Debian's etcd-server is not installed."""
    import os

    import pytest

    from broker.testing.etcd import etcd_available

    if not etcd_available():
        if os.environ.get("CI"):
            pytest.fail("etcd is not installed: .ci/run installs Debian's etcd-server")
        pytest.skip("etcd is not installed (Debian: etcd-server)")


def shared_cluster(base: Path, expected_errors: Iterable[str] = (), overrides: dict[str, str] | None = None
                   ) -> Iterator[ProcessCluster]:
    """The body of a module-scoped fixture: a live three-node cluster, stopped after the module,
    whose nodes must have logged no error but those `expected_errors` name."""
    need_etcd()
    cluster = start_cluster(base, overrides=overrides)
    try:
        yield cluster
        errors = logged_errors(cluster, expected_errors)
        assert not errors, "\n".join(errors)[-5000:]
    finally:
        cluster.stop()


def roles(cluster: ProcessCluster) -> tuple[int, int]:
    """(the active controller, a node that is not it)."""
    active = controller(cluster.node(min(cluster.nodes)).port)
    assert active in cluster.nodes, active
    return active, next(n for n in sorted(cluster.nodes) if n != active)


def spread(cluster: ProcessCluster, topic: str, partitions: int) -> dict[int, int]:
    """The topic's leaders once every node agrees on them; they must be every node of the cluster."""
    found = wait_leaders(cluster, topic, lambda ls: len(ls) == partitions and min(ls.values()) >= 0)
    assert set(found.values()) == set(cluster.nodes), "not led by every node: %s" % found
    return found


def read_to_end(cluster: ProcessCluster, topic: str, partitions: int, want: int, timeout: float = 30.0,
                isolation: str = "read_uncommitted", errors_fail: bool = False) -> list[bytes]:
    """The values of `topic` from its start until `want` came and every partition is at its end
    (a confluent-kafka consumer assigned all partitions). An error message fails the read when
    `errors_fail`, and is passed over otherwise (a failover in progress)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "reader-" + uuid.uuid4().hex[:6],
                         "isolation.level": isolation, "enable.auto.commit": False, "enable.partition.eof": True})
    got: list[bytes] = []
    at_end: set[int] = set()
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])

        def done() -> bool:
            for msg in consumer.consume(100, 0.2):
                if msg.error() is None:
                    got.append(msg.value())
                    at_end.discard(msg.partition())
                elif msg.error().code() == -191:  # _PARTITION_EOF
                    at_end.add(msg.partition())
                elif errors_fail:
                    raise KafkaException(msg.error())
            return len(got) >= want and len(at_end) == partitions

        try:
            wait_for(done, timeout, interval=0, what="%d records of %s" % (want, topic))
        except TimeoutError as exc:
            raise AssertionError("%s: read %d, at the end of %s" % (exc, len(got), sorted(at_end))) from None
    finally:
        consumer.close()
    return got


def produce_acked(cluster: ProcessCluster, topic: str, tag: str, n: int, linger_ms: int = 0) -> list[bytes]:
    """`n` records to partition 0 of `topic` with acks=all (idempotent, confluent-kafka); the
    values acknowledged, every one of them (a failed send fails the test)."""
    from confluent_kafka import Producer

    acked: list[bytes] = []
    errors: list[Any] = []
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": linger_ms, "message.timeout.ms": 30000})
    for i in range(n):
        producer.produce(topic, b"%s-%d" % (tag.encode(), i), partition=0,
                         on_delivery=lambda err, msg: (errors if err else acked).append(err or msg.value()))
    assert producer.flush(40) == 0 and not errors, errors
    return acked
