"""docker/ for real, with podman (tests/docker/podman.py): the image is built, runs as a non-root
user without a compiler or an editable install, takes its settings from KAFKA_* variables as
apache/kafka's image does, passes its health check, serves confluent-kafka through a published
port and stops cleanly; docker-compose.yml runs the broker with its client service, and
docker-compose.cluster.yml a cluster of three broker containers and etcd. Skipped, with the reason, where podman
cannot run images."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaException, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from tests.docker.podman import IMAGE, Podman, Unavailable, free_ports, image_store_lock  # noqa: E402
from tests.harness import wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(900)  # the first build on a fresh machine makes a base image too
TIMEOUT = 60


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    try:
        p = Podman(tmp_path_factory.mktemp("podman"))
    except Unavailable as exc:
        pytest.skip(str(exc))
    with image_store_lock():  # one run at a time builds and runs images on this machine
        try:
            p.ensure_base_image()
        except Unavailable as exc:
            pytest.skip(str(exc))
        p.build_image()
        yield p
        p.run("image", "prune", "-f", check=False)  # the build stages left behind


def round_trip(bootstrap: str, topic: str) -> bytes:
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"through the container")
    assert producer.flush(TIMEOUT) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "docker-test", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                return bytes(msg.value())
        raise AssertionError("nothing consumed from %s" % topic)
    finally:
        consumer.close()


@contextmanager
def logs_on_failure(podman: Podman, project: str, services: list[str]) -> Iterator[None]:
    """A failure inside says what the containers printed last (CI keeps only the test's report)."""
    try:
        yield
    except Exception as exc:
        tails = []
        for service in services:
            logs = podman.run("logs", "%s_%s_1" % (project, service), check=False)
            tails.append("--- %s:\n%s" % (service, "\n".join((logs.stdout + logs.stderr).splitlines()[-40:])))
        raise AssertionError("%s: %s\n%s" % (type(exc).__name__, exc, "\n".join(tails))) from exc


def test_the_image(podman: Podman) -> None:
    inside = podman.run("run", "--rm", "--entrypoint", "sh", IMAGE, "-c",
                        "id -u; command -v gcc cc || echo no-compiler; python -c 'import protocol.accel as a; "
                        "print(a.ENABLED)'; cat /usr/local/lib/python3*/site-packages/pykafka_broker-*.dist-info/"
                        "direct_url.json").stdout.split("\n")
    assert inside[0] == "1000"  # not root
    assert inside[1] == "no-compiler"
    assert inside[2] == "True"  # the C accelerator was built into the wheel
    assert "editable" not in json.loads(inside[3]).get("dir_info", {})  # installed from a wheel
    sizes = {image: int(json.loads(podman.run("image", "inspect", image).stdout)[0]["Size"])
             for image in (IMAGE, "docker.io/library/python:3.11-slim")}
    added = sizes[IMAGE] - sizes["docker.io/library/python:3.11-slim"]
    assert added < 60 * 1024 * 1024, added  # the broker and its dependencies over the Python base image


def test_a_container_serves_clients(podman: Podman) -> None:
    port = free_ports(1)
    name = "pykafka-broker-test-%d" % port
    podman.run("run", "-d", "--name", name, "-p", "%d:9092" % port,
               "-e", "KAFKA_ADVERTISED_LISTENERS=PLAINTEXT://localhost:%d" % port,  # listeners: 0.0.0.0:9092 from it
               "-e", "KAFKA_NUM_PARTITIONS=3", "-e", "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS=0", IMAGE)
    try:
        wait_for(lambda: podman.run("healthcheck", "run", name, check=False).returncode == 0, TIMEOUT,
                 what="the container's health check")
        assert round_trip("127.0.0.1:%d" % port, "auto-created") == b"through the container"
        md = AdminClient({"bootstrap.servers": "127.0.0.1:%d" % port}).list_topics("auto-created", timeout=10)
        assert len(md.topics["auto-created"].partitions) == 3  # KAFKA_NUM_PARTITIONS -> num.partitions
        podman.run("stop", "-t", "30", name, timeout=60)
        state = json.loads(podman.run("inspect", name).stdout)[0]["State"]
        assert state["ExitCode"] == 0
        assert "broker stopped" in podman.run("logs", name).stderr + podman.run("logs", name).stdout
    finally:
        podman.run("rm", "-f", "-v", name, check=False)


def test_compose_runs_the_broker_and_its_client(podman: Podman) -> None:
    port, metrics = free_ports(1), free_ports(1)
    project = "pykafka-compose-%d" % port
    env = {"KAFKA_PORT": str(port), "KAFKA_METRICS_HOST_PORT": str(metrics)}
    podman.compose("docker-compose.yml", project, "up", "-d", "--build", "kafka", "client", env=env)
    try:
        wait_for(lambda: "round trip 2 ok" in podman.run("logs", project + "_client_1").stdout, TIMEOUT,
                 what="the client's round trips inside the compose network")
        assert round_trip("127.0.0.1:%d" % port, "from-the-host") == b"through the container"
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics, timeout=10).read().decode()
        assert 'kafka_consumergroup_current_offset{consumergroup="demo"' in text
    finally:
        podman.compose("docker-compose.yml", project, "down", "-v", env=env)


def test_compose_runs_a_cluster_of_three_broker_containers_on_etcd(podman: Podman) -> None:
    base = free_ports(3)
    project = "pykafka-cluster-%d" % base
    env = {"KAFKA_PORT": str(base), "KAFKA_PORT_1": str(base + 1), "KAFKA_PORT_2": str(base + 2)}
    podman.compose("docker-compose.cluster.yml", project, "up", "-d", "--build", env=env)
    try:
        with logs_on_failure(podman, project, ["client", "etcd", "kafka-1", "kafka-2", "kafka-3"]):
            # three brokers to register, the client's topic (replication factor 3) and group: slower than one
            wait_for(lambda: "round trip 2 ok" in podman.run("logs", project + "_client_1").stdout, 2 * TIMEOUT,
                     what="the client's round trips on the cluster")
            md = AdminClient({"bootstrap.servers": "127.0.0.1:%d" % base}).list_topics("demo", timeout=10)
            assert sorted(md.brokers) == [1, 2, 3]
            assert sorted(b.port for b in md.brokers.values()) == [base, base + 1, base + 2]
            assert all(sorted(p.replicas) == [1, 2, 3] for p in md.topics["demo"].partitions.values())
            assert round_trip("127.0.0.1:%d" % (base + 2), "cluster-from-the-host") == b"through the container"
            # a broker container stopped is fenced and leaves Metadata; with three replicas and
            # min.insync.replicas 2 producers (acks=all) and consumers go on meanwhile, the demo client's
            # group included; started again, it is back
            podman.run("stop", "-t", "20", project + "_kafka-2_1")

            def brokers() -> list[int]:
                admin = AdminClient({"bootstrap.servers": "127.0.0.1:%d" % base})
                try:
                    return sorted(admin.list_topics(timeout=10).brokers)
                except KafkaException:  # no answer in time (a loaded machine): ask again
                    return []

            def round_trips() -> int:
                return podman.run("logs", project + "_client_1").stdout.count(" ok: ")

            wait_for(lambda: brokers() == [1, 3], TIMEOUT, what="the stopped broker to leave the metadata")
            # a topic made before (a new one needs three live brokers for its replication factor 3)
            assert round_trip("127.0.0.1:%d" % base, "cluster-from-the-host") == b"through the container"
            done = round_trips()
            wait_for(lambda: round_trips() > done, TIMEOUT, what="the client's round trips with a broker stopped")
            assert "failed" not in podman.run("logs", project + "_client_1").stdout
            podman.run("start", project + "_kafka-2_1")
            wait_for(lambda: brokers() == [1, 2, 3], TIMEOUT, what="the restarted broker to be back")
            assert round_trip("127.0.0.1:%d" % (base + 1), "after-restart") == b"through the container"
    finally:
        podman.compose("docker-compose.cluster.yml", project, "down", "-v", env=env)


def test_the_dashboard_is_provisioned() -> None:
    docker = Path(__file__).resolve().parents[2] / "docker"
    assert (docker / "grafana" / "provisioning" / "dashboards" / "dashboards.yml").exists()
    assert json.loads((docker / "grafana" / "dashboards" / "kafka-broker.json").read_text())["panels"]
