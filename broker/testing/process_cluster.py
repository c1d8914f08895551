"""A simulated cluster served by several processes, one per node: a prototype for using more cores.

With `simulated.brokers=N` and `simulated.process.node=k`, this process serves node k of the N
(and only it): it listens on each listener's port + k, leads the partitions and coordinators that
the simulated cluster places on node k, and answers a request for anything else as a real cluster
does (NOT_LEADER_OR_FOLLOWER, NOT_COORDINATOR, KIP-951 leader hints); clients spread their work
over the processes as they spread it over Kafka's brokers. Each process has its own log
directories; every partition's data lives with its leader.

One metadata log, as in KRaft: node `node.id` (k = node.id) is the controller and writes it; the
other processes follow it (`simulated.controller.log.dir`: the controller's log directory),
reading the complete batches its metadata log holds, from where they stopped, every
FOLLOW_INTERVAL_S. A follower refuses metadata changes with NOT_CONTROLLER (Metadata names the
controller, so admin clients send them there) and takes producer ids from a range of its own,
reserved durably in its log directory. The controller registers the internal topics at start, so
that no follower needs to. What this prototype leaves out (forwarding, fencing of a follower that
lags, a controller on another machine) is listed in docs/scaling.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.apis import RequestContext
from broker.log.checkpoint import write_atomic
from broker.metadata import PRODUCER_ID_BLOCK, MetadataStore, TopicInfo, decode_record
from broker.observability.logger import get_logger
from protocol.errors import ErrorCode, KafkaError
from protocol.records import decode_batch, iter_batches

log = get_logger("broker.process_cluster")

METADATA_DIR = "__cluster_metadata-0"
CREATE_TOPICS, CREATE_TOPICS_VERSION = 19, 7
FOLLOW_INTERVAL_S = 0.05
# producer ids of follower node k: from (k << NODE_ID_SHIFT), in blocks reserved in a file
NODE_ID_SHIFT = 40
PRODUCER_ID_FILE = "producer-id-block"


class FollowedMetadataLog:
    """The controller's metadata log as a follower reads it: the records of the complete batches
    of its segment files, each read once."""

    def __init__(self, directory: Path, controller: int) -> None:
        self.directory = directory
        self.controller = controller
        self._segment: str | None = None  # the segment file being read, and where
        self._position = 0

    def append(self, values: list[bytes]) -> None:
        raise KafkaError(ErrorCode.NOT_CONTROLLER, "The metadata is changed by the controller, node %d."
                         % self.controller)

    def read_all(self) -> list[bytes]:
        return self.read_new()

    def read_new(self) -> list[bytes]:
        """The record values written since the last call."""
        values: list[bytes] = []
        segments = sorted(p.name for p in self.directory.glob("*.log")) if self.directory.is_dir() else []
        for name in segments:
            if self._segment is not None and name < self._segment:
                continue
            if name != self._segment:
                self._segment, self._position = name, 0
            with open(self.directory / name, "rb") as f:
                f.seek(self._position)
                data = f.read()
            for pos, header in iter_batches(data):  # an incomplete last batch is read next time
                if not header.is_control:
                    values += [r.value for r in decode_batch(data, pos)[1] if r.value is not None]
                self._position += header.size
        return values


class FollowerMetadataStore(MetadataStore):
    """The metadata image of a follower node: replayed from the controller's log, never written."""

    log: FollowedMetadataLog

    def __init__(self, followed: FollowedMetadataLog, node_id: int, node: int, log_dir: Path) -> None:
        super().__init__(followed, node_id)
        self.node = node
        self._block_file = log_dir / PRODUCER_ID_FILE

    def catch_up(self) -> int:
        """Replay what the controller wrote since the last call; returns how many records."""
        values = self.log.read_new()
        for value in values:
            record = decode_record(value)
            if record is None:
                self.image.records += 1
            else:
                self.image.replay(record)
        return len(values)

    def bootstrap(self, static_min_insync_replicas: int) -> bool:
        return False  # the controller does it

    def _reserve_producer_ids(self) -> int:
        """From this node's own range, each block reserved durably in its log directory before
        it is used, so no id is given twice, also after a crash."""
        start = self.node << NODE_ID_SHIFT
        if self._block_file.exists():
            start = max(start, int(self._block_file.read_text().strip()))
        write_atomic(str(self._block_file), b"%d\n" % (start + PRODUCER_ID_BLOCK))
        return start


class TopicChanges:
    """What a replay changed in the topics: created, deleted, grown (by name)."""

    def __init__(self, before: dict[str, TopicInfo], after: dict[str, TopicInfo]) -> None:
        self.created = {n for n in after if n not in before}
        self.deleted = {n for n in before if n not in after}
        self.grown = {n for n, info in after.items() if n in before and info.partitions > before[n].partitions}


async def follow_once(broker: Any, store: FollowerMetadataStore) -> None:
    """Replay the controller's new records and make the logs, partitions and groups follow (new
    partitions, deleted topics, changed configs); run every FOLLOW_INTERVAL_S."""
    before = {n: TopicInfo(i.name, i.topic_id, i.partitions, i.configs) for n, i in store.topics.items()}
    if store.catch_up():
        await apply(broker, TopicChanges(before, store.topics))


async def apply(broker: Any, changes: TopicChanges) -> None:
    for name in sorted(changes.created | changes.grown):
        info = broker.metadata.topic(name)
        if info is not None:
            broker._ensure_partitions(info)
    for name in sorted(changes.deleted):
        await broker.partitions.remove_topic(name)
    broker.apply_dynamic_configs()
    if changes.created or changes.deleted or changes.grown:
        log.info("metadata followed", created=sorted(changes.created), deleted=sorted(changes.deleted),
                 grown=sorted(changes.grown))
        await broker._topics_changed(created=changes.created, deleted=changes.deleted, changed=changes.grown)


def controller_dir(config: Any) -> Path:
    found = config["simulated.controller.log.dir"]
    if not found:
        raise ValueError("simulated.process.node needs simulated.controller.log.dir (the controller's log directory)")
    return Path(found) / METADATA_DIR


def own_log_dir(config: Any) -> Path:
    return Path(config.log_dirs[0])


async def forward_to_controller(broker: Any, ctx: RequestContext, request: Any) -> Any:
    """A metadata change sent to a follower: the controller serves it (Kafka's forwarding, without
    the Envelope: the controller sees this broker, not the client's principal), and the follower
    has replayed its records before it answers, so the client's next request here sees them."""
    from broker.testing.addressing import fail_whole

    try:
        response = await broker.node_client(broker.node_id).call(ctx.api_key, ctx.api_version, request)
    except KafkaError as exc:
        return fail_whole(ctx, request, exc.code)
    await follow_once(broker, broker.follower)
    return response


async def create_topic_on_controller(broker: Any, name: str, partitions: int, configs: dict[str, str],
                                     replication_factor: int | None) -> TopicInfo:
    """A topic created by a follower itself (auto-creation through its Metadata): CreateTopics to
    the controller, as Kafka's AutoTopicCreationManager sends it; the topic as replayed here."""
    from protocol import messages as M

    R = M.CreateTopicsRequest
    request = R(topics=[R.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=-1 if replication_factor is None else replication_factor,
        assignments=[], configs=[R.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()])],
        timeout_ms=30000, validate_only=False)
    response = await broker.node_client(broker.node_id).call(CREATE_TOPICS, CREATE_TOPICS_VERSION, request)
    result = response.topics[0]
    await follow_once(broker, broker.follower)
    info = broker.metadata.topic(name)
    if result.error_code != ErrorCode.NONE or info is None:
        code = result.error_code or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        raise KafkaError(ErrorCode(code), result.error_message or "")  # type: ignore[call-arg]
    return info  # type: ignore[no-any-return]
