"""Share sessions (Kafka's ShareSessionCache): which partitions a member fetches, and the epochs.

A member opens its session with a ShareFetch at epoch 0 listing the partitions to fetch; every
later request carries the next epoch (after INT32_MAX comes 1) and adds partitions (Topics) or
removes them (ForgottenTopicsData); the partitions keep the order in which they joined, which
each fetch rotates by its epoch (manager.py, as Kafka's ShareSession and
PartitionRotateStrategy); epoch -1 closes it (the member's acquired records are
released). At most `group.share.max.share.sessions` sessions exist; a session also ends when the
connection that opened it closes. Errors are Kafka's: SHARE_SESSION_NOT_FOUND,
INVALID_SHARE_SESSION_EPOCH, SHARE_SESSION_LIMIT_REACHED, INVALID_REQUEST.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from protocol.errors import ErrorCode, KafkaError

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
INT32_MAX = 2**31 - 1

TopicIdPartition = tuple[uuid.UUID, int]  # (topic id, partition index)
SessionKey = tuple[str, str]  # (group id, member id)


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= INT32_MAX else epoch + 1


@dataclass
class ShareSession:
    key: SessionKey
    epoch: int
    partitions: dict[TopicIdPartition, None] = field(default_factory=dict)  # ordered set
    connection: object = None


class ShareSessionCache:
    def __init__(self, max_sessions: int = 2000) -> None:
        self.max_sessions = max_sessions
        self.sessions: dict[SessionKey, ShareSession] = {}

    def __len__(self) -> int:
        return len(self.sessions)

    def get(self, key: SessionKey) -> ShareSession | None:
        return self.sessions.get(key)

    def fetch(self, group_id: str, member_id: str, epoch: int, add: Iterable[TopicIdPartition],
              forget: Iterable[TopicIdPartition], acknowledging: bool, connection: object = None,
              ) -> ShareSession | None:
        """The session of a ShareFetch (None for epoch -1: the request only acknowledges, and the
        caller closes the session once it has). Raises KafkaError as Kafka's newContext does."""
        key = (group_id, member_id)
        add = list(add)
        if epoch == FINAL_EPOCH:
            if add:
                raise KafkaError(ErrorCode.INVALID_REQUEST, "A share session is closed with no partitions to fetch.")
            if key not in self.sessions:
                raise KafkaError(ErrorCode.SHARE_SESSION_NOT_FOUND)
            return None
        if epoch == INITIAL_EPOCH:
            if acknowledging:
                raise KafkaError(ErrorCode.INVALID_REQUEST, "Acknowledge data present in Initial Fetch Request.")
            self.sessions.pop(key, None)
            if len(self.sessions) >= self.max_sessions:
                raise KafkaError(ErrorCode.SHARE_SESSION_LIMIT_REACHED)
            session = ShareSession(key, next_epoch(INITIAL_EPOCH), dict.fromkeys(add), connection)
            self.sessions[key] = session
            return session
        existing = self.sessions.get(key)
        if existing is None:
            raise KafkaError(ErrorCode.SHARE_SESSION_NOT_FOUND)
        session = existing
        if session.epoch != epoch:
            raise KafkaError(ErrorCode.INVALID_SHARE_SESSION_EPOCH)
        for tp in add:
            session.partitions[tp] = None
        for tp in forget:
            session.partitions.pop(tp, None)
        session.epoch = next_epoch(epoch)
        return session

    def acknowledge(self, group_id: str, member_id: str, epoch: int) -> None:
        """The epoch checks of a ShareAcknowledge (Kafka's acknowledgeSessionUpdate)."""
        if epoch == INITIAL_EPOCH:
            raise KafkaError(ErrorCode.INVALID_SHARE_SESSION_EPOCH)
        session = self.sessions.get((group_id, member_id))
        if session is None:
            raise KafkaError(ErrorCode.SHARE_SESSION_NOT_FOUND)
        if epoch == FINAL_EPOCH:
            return
        if session.epoch != epoch:
            raise KafkaError(ErrorCode.INVALID_SHARE_SESSION_EPOCH)
        session.epoch = next_epoch(epoch)

    def remove(self, key: SessionKey) -> ShareSession | None:
        return self.sessions.pop(key, None)

    def on_connection_closed(self, connection: object) -> list[ShareSession]:
        """Sessions opened on the connection end with it."""
        gone = [s for s in self.sessions.values() if s.connection is connection]
        for s in gone:
            del self.sessions[s.key]
        return gone

    def members_of(self, group_id: str) -> int:
        return sum(1 for k in self.sessions if k[0] == group_id)
