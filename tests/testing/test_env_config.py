"""KAFKA_* environment variables as apache/kafka's image maps them, for the image and for
`python -m broker`, and the image's health check."""

from __future__ import annotations

from pathlib import Path

from broker.config import BrokerConfig, env_properties, env_property_name
from broker.observability.healthcheck import check, default_address, main
from broker.testing import EmbeddedBroker

# apache/kafka's image defaults (docker/resources/common-scripts/configureDefaults)
APACHE_DEFAULTS = {
    "CLUSTER_ID": "5L6g3nShT-eMCtK--X86sw",
    "KAFKA_NODE_ID": "1",
    "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PLAINTEXT_HOST:PLAINTEXT",
    "KAFKA_LISTENERS": "PLAINTEXT://localhost:29092,CONTROLLER://localhost:29093,PLAINTEXT_HOST://0.0.0.0:9092",
    "KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://localhost:29092,PLAINTEXT_HOST://localhost:9092",
    "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
    "KAFKA_PROCESS_ROLES": "broker,controller",
    "KAFKA_HEAP_OPTS": "-Xmx1G",
    "KAFKA_OPTS": "-Dsomething",
    "KAFKA_LOG_DIRS": "/tmp/kraft-combined-logs",
}


def test_names() -> None:
    assert env_property_name("KAFKA_LOG_DIRS") == "log.dirs"
    assert env_property_name("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP") == "listener.security.protocol.map"
    assert env_property_name("KAFKA_LISTENER_NAME_INTERNAL__SSL_CLIENT_AUTH") == "listener.name.internal_ssl.client.auth"
    assert env_property_name("KAFKA_SASL_MECHANISM_INTER___BROKER") == "sasl.mechanism.inter-broker"


def test_the_apache_image_environment() -> None:
    props = env_properties({**APACHE_DEFAULTS, "PATH": "/bin", "KAFKAESQUE": "no"})
    assert props["cluster.id"] == "5L6g3nShT-eMCtK--X86sw"
    assert props["node.id"] == "1" and props["log.dirs"] == "/tmp/kraft-combined-logs"
    assert "heap.opts" not in props and "opts" not in props and "kafkaesque" not in props
    derived = env_properties({"KAFKA_ADVERTISED_LISTENERS": "INTERNAL://kafka:29092,EXTERNAL://localhost:9092"})
    assert derived["listeners"] == "INTERNAL://0.0.0.0:29092,EXTERNAL://0.0.0.0:9092"


def test_file_then_environment_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text("num.partitions=2\nlog.retention.ms=1000\nnode.id=5\n")
    config = BrokerConfig.load(path, ["node.id=7"], {"KAFKA_NUM_PARTITIONS": "4", "KAFKA_NODE_ID": "6"})
    assert (config["num.partitions"], config["log.retention.ms"], config.node_id) == (4, 1000, 7)


def test_health_check() -> None:
    assert default_address({}) == ("127.0.0.1", 9092)
    assert default_address({"KAFKA_LISTENERS": "SSL://:9093,INTERNAL://0.0.0.0:29092",
                            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "SSL:SSL,INTERNAL:PLAINTEXT"}) == ("127.0.0.1", 29092)
    with EmbeddedBroker() as kafka:
        assert main([kafka.bootstrap_servers]) == 0
        port = kafka.port
    assert main(["127.0.0.1:%d" % port]) == 1


def test_health_check_of_a_node_of_a_cluster_waits_for_it_to_be_a_live_broker() -> None:
    with EmbeddedBroker() as kafka:  # node 1: listed in its own Metadata
        host, _, port = kafka.bootstrap_servers.rpartition(":")
        assert check(host, int(port), node_id=1)
        assert not check(host, int(port), node_id=7)  # not (yet) a live broker of the cluster
