"""The metadata quorum of this one node: its epoch, kept in Kafka's `quorum-state` file.

This node is the single voter of `__cluster_metadata`, so it wins every election: as a KRaft
leader it starts a new epoch at every start. The file sits in the metadata log's directory, in
the format Kafka's QuorumStateData (data_version 1) uses.
"""

from __future__ import annotations

import json
import os

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
