"""The metadata quorum of this one node: its epoch, kept in Kafka's `quorum-state` file.

This node is the single voter of `__cluster_metadata`, so it wins every election: as a KRaft
leader it starts a new epoch at every start. The file sits in the metadata log's directory, in
the format Kafka's QuorumStateData (data_version 1) uses.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field

from broker.log.checkpoint import write_atomic

QUORUM_STATE_FILE = "quorum-state"


def read_epoch(directory: str) -> int:
    try:
        with open(os.path.join(directory, QUORUM_STATE_FILE), "rb") as f:
            return int(json.loads(f.read()).get("leaderEpoch", 0))
    except (OSError, ValueError, AttributeError):
        return 0


def start_new_epoch(directory: str, node_id: int) -> int:
    """The epoch after the recorded one, written durably before it is used."""
    epoch = read_epoch(directory) + 1
    state = {"leaderId": node_id, "leaderEpoch": epoch, "votedId": -1, "data_version": 1}
    write_atomic(os.path.join(directory, QUORUM_STATE_FILE), json.dumps(state, separators=(",", ":")).encode())
    return epoch


@dataclass(frozen=True)
class Replica:
    node_id: int
    directory_id: uuid.UUID
    log_end_offset: int  # -1: not known here


@dataclass(frozen=True)
class QuorumState:
    """The metadata log's quorum as DescribeQuorum reports it. A single node: itself, the only
    voter and the leader. A node of a cluster on etcd: the active controller is the leader (its
    epoch the controller epoch), the voter that writes the log; the other brokers are observers
    (they replay it); etcd's own members, who vote on the log's order, are not Kafka replicas."""

    leader_id: int
    leader_epoch: int
    high_watermark: int
    voters: list[Replica]
    observers: list[Replica] = field(default_factory=list)
