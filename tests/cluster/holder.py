"""A node that only holds its etcd session and campaigns for controller, as a child process the
failover tests kill -9: `python -m tests.cluster.holder ENDPOINTS CLUSTER_ID NODE_ID TTL_MS`.
Prints `controller <epoch>` once it is the controller; exits by itself after 120 s."""

from __future__ import annotations

import asyncio
import sys

from broker.cluster.election import ControllerElection, Session, claim_node_id
from broker.cluster.etcd_http import HttpEtcd
from broker.cluster.keys import ClusterKeys


async def main(endpoints: str, cluster_id: str, node_id: int, ttl_ms: int) -> None:
    etcd = HttpEtcd(endpoints.split(","))
    keys = ClusterKeys(cluster_id)
    session = Session(etcd, ttl_ms)
    await session.start()
    await claim_node_id(etcd, keys, node_id, "dir-%d" % node_id, session.lease)
    election = ControllerElection(etcd, keys, node_id, session)
    election.start()
    await election.wait_for(lambda e: e.leadership is not None, timeout=30)
    assert election.leadership is not None
    print("controller %d" % election.leadership.epoch, flush=True)
    await asyncio.sleep(120)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
