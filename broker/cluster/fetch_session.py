"""The follower's side of incremental fetch sessions (KIP-227): Kafka's FetchSessionHandler, as
a replica fetcher uses it against one leader.

The first fetch is a full one at epoch 0; once the leader answers with a session id, each next
fetch names the session at the next epoch and carries only the partitions added or changed
since the last (a new fetch offset, log start offset, leader epoch or last fetched epoch) and
forgets those no longer fetched (removed, backing off, throttled). The leader reads them all and
answers those with news. A response without a session id (the leader's cache is full, or it
closed the session) goes back to full fetches at epoch 0; a session error (the leader lost the
session, a wrong epoch) or a failed request closes the session with the next full fetch.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from protocol import messages as M
from protocol.errors import ErrorCode

Q = M.FetchRequest
INVALID_SESSION_ID, INITIAL_EPOCH = 0, 0
INT_MAX = 2**31 - 1

TopicPartition = tuple[str, int]


def _params(p: Q.FetchPartition) -> tuple[int, int, int, int, int]:
    return (p.fetch_offset, p.log_start_offset, p.partition_max_bytes, p.current_leader_epoch, p.last_fetched_epoch)


@dataclass
class SessionFetch:
    """One fetch as the session frames it."""

    session_id: int
    epoch: int
    send: dict[TopicPartition, tuple[uuid.UUID, Q.FetchPartition]]  # the partitions the request carries
    forget: dict[TopicPartition, uuid.UUID]

    @property
    def full(self) -> bool:
        return self.epoch == INITIAL_EPOCH


class FetchSessionHandler:
    def __init__(self) -> None:
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self.partitions: dict[TopicPartition, tuple[uuid.UUID, Q.FetchPartition]] = {}  # as the session holds them

    def build(self, wanted: dict[TopicPartition, tuple[uuid.UUID, Q.FetchPartition]]) -> SessionFetch:
        """The request for `wanted` (every partition to fetch now, in order)."""
        if self.epoch == INITIAL_EPOCH:
            self.partitions = dict(wanted)
            return SessionFetch(self.session_id, INITIAL_EPOCH, dict(wanted), {})
        forget = {tp: topic_id for tp, (topic_id, _) in self.partitions.items() if tp not in wanted}
        send = {tp: entry for tp, entry in wanted.items()
                if tp not in self.partitions or _params(self.partitions[tp][1]) != _params(entry[1])}
        self.partitions = dict(wanted)
        return SessionFetch(self.session_id, self.epoch, send, forget)

    def handle_response(self, fetch: SessionFetch, response: M.FetchResponse) -> bool:
        """Move the session on from the leader's answer; False when it was a session error (the
        partitions got nothing: fetch again, in full)."""
        if response.error_code:
            if response.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND:
                self.session_id = INVALID_SESSION_ID
            self.epoch = INITIAL_EPOCH  # the next full fetch closes the session it names
            return False
        if response.session_id == INVALID_SESSION_ID:  # none made, or the leader closed it
            self.session_id, self.epoch = INVALID_SESSION_ID, INITIAL_EPOCH
        elif fetch.full:
            self.session_id, self.epoch = response.session_id, 1
        else:
            self.epoch = 1 if self.epoch == INT_MAX else self.epoch + 1
        return True

    def handle_error(self) -> None:
        """The request failed (no answer): start over with a full fetch that closes the session."""
        self.epoch = INITIAL_EPOCH
