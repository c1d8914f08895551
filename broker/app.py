"""The broker: wires configuration, storage, metadata, coordinators and the server together."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from pathlib import Path

import structlog

from broker.apis import load_handlers
from broker.config import BrokerConfig, read_properties
from broker.metrics import Metrics
from broker.server import KafkaServer

log = structlog.get_logger("broker")


def new_base64_uuid() -> str:
    """Kafka's textual ids (cluster id, directory id): a random UUID in URL-safe base64, unpadded."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def ensure_meta_properties(log_dir: Path, node_id: int, cluster_id: str | None) -> str:
    """Read or write meta.properties (KRaft's v1 format); returns the cluster id."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / "meta.properties"
    if path.exists():
        props = read_properties(path)
        existing = props.get("cluster.id")
        if existing:
            if cluster_id and cluster_id != existing:
                raise SystemExit("cluster.id %s does not match %s in %s" % (cluster_id, existing, path))
            return existing
    cluster_id = cluster_id or new_base64_uuid()
    text = "#\n#%s\ncluster.id=%s\ndirectory.id=%s\nnode.id=%d\nversion=1\n" % (
        time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime()), cluster_id, new_base64_uuid(), node_id,
    )
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return cluster_id


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.metrics = Metrics()
        self.cluster_id = ""
        self.server = KafkaServer(self, int(config["socket.request.max.bytes"]), int(config["connections.max.idle.ms"]))
        self.ports: list[int] = []
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        load_handlers()
        cluster_id = self.config["cluster.id"]
        for d in self.config.log_dirs:
            cluster_id = ensure_meta_properties(Path(d), self.node_id, cluster_id)
        self.cluster_id = cluster_id
        for listener in self.config.listeners:
            self.ports.append(await self.server.listen(listener.host, listener.port))
        port = int(self.config["metrics.port"])
        if port >= 0:
            self.metrics.serve(port)
        log.info("broker started", node_id=self.node_id, cluster_id=self.cluster_id, ports=self.ports,
                 log_dirs=self.config.log_dirs)

    def advertised(self) -> tuple[str, int]:
        """Host and port given to clients: the first advertised listener, with the bound port for :0."""
        listener = self.config.advertised_listeners[0]
        host = listener.host or "localhost"
        port = listener.port or (self.ports[0] if self.ports else 0)
        return host, port

    async def stop(self) -> None:
        await self.server.stop()
        self._stopped.set()
        log.info("broker stopped")

    async def wait_stopped(self) -> None:
        await self._stopped.wait()
