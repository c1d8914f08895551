"""`python -m broker.observability.healthcheck [host:port]`: exit 0 when the broker answers ApiVersions.

The Docker image's HEALTHCHECK. Without an address it asks 127.0.0.1 on the port of the first
plaintext listener of the configuration the broker itself reads from the environment (KAFKA_*
variables, as apache/kafka's image takes them; 9092 by default). A node of a cluster
(KAFKA_ETCD_ENDPOINTS) is healthy once it is a live broker: its Metadata lists its own node id
(it has registered with the controller and is not fenced).
"""

from __future__ import annotations

import os
import socket
import struct
import sys

from broker.config import BrokerConfig, env_properties
from protocol import frames
from protocol import messages as M

API_VERSIONS, METADATA, METADATA_VERSION = 18, 3, 12
TIMEOUT_S = 3.0
MAX_FRAME = 1 << 20


def default_address(environ: dict[str, str]) -> tuple[str, int]:
    config = BrokerConfig(env_properties(environ))
    protocols = config.security_protocol_map
    listeners = config.listeners
    plain = [listener for listener in listeners if protocols.get(listener.name.upper(), "PLAINTEXT") == "PLAINTEXT"]
    return "127.0.0.1", (plain or listeners)[0].port


def api_versions_frame(host: str, port: int, timeout: float = TIMEOUT_S) -> bytes | None:
    """Send ApiVersions v0; the response frame (without its size), None if the port does not
    answer with one (also when what comes back cannot be a Kafka frame). Used by bench/ too."""
    return _call(host, port, API_VERSIONS, 0, M.ApiVersionsRequest(), timeout)


def _call(host: str, port: int, api_key: int, version: int, request: M.MessageBase,
          timeout: float = TIMEOUT_S) -> bytes | None:
    """One request, its response frame (without its size), None when the port does not answer
    with one (also when what comes back cannot be a Kafka frame)."""
    payload = frames.encode_request_header(api_key, version, 1, "healthcheck") + M.encode(request, version)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(payload)) + payload)
            data = b""
            while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
                chunk = sock.recv(65536)
                if not chunk:
                    return None
                data += chunk
                if len(data) >= 4 and not 6 <= struct.unpack(">i", data[:4])[0] < MAX_FRAME:
                    return None
    except OSError:
        return None
    return data[4:]


def check(host: str, port: int, node_id: int | None = None) -> bool:
    frame = api_versions_frame(host, port)
    if frame is None:
        return False
    response = M.decode_response(API_VERSIONS, 0, memoryview(frame)[4:])  # after the correlation id
    if int(response.error_code) != 0:
        return False
    if node_id is None:
        return True
    found = _call(host, port, METADATA, METADATA_VERSION, M.MetadataRequest(topics=[], allow_auto_topic_creation=False))
    if found is None:
        return False
    metadata = M.decode_response(METADATA, METADATA_VERSION, memoryview(found)[5:])  # header v1: id + tags
    return any(b.node_id == node_id for b in metadata.brokers)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args:
        host, _, port = args[0].rpartition(":")
        address = (host or "127.0.0.1", int(port))
    else:
        address = default_address(dict(os.environ))
    config = BrokerConfig(env_properties(dict(os.environ)))
    node_id = config.node_id if config["etcd.endpoints"] else None
    if not check(*address, node_id=node_id):
        print("unhealthy: %s:%d does not answer ApiVersions without an error%s" % (
            *address, "" if node_id is None else ", or is not a live broker of its cluster yet"), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
