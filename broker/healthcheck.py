"""`python -m broker.healthcheck [host:port]`: exit 0 when the broker answers ApiVersions.

The Docker image's HEALTHCHECK. Without an address it asks 127.0.0.1 on the port of the first
plaintext listener of the configuration the broker itself reads from the environment (KAFKA_*
variables, as apache/kafka's image takes them; 9092 by default).
"""

from __future__ import annotations

import os
import socket
import struct
import sys

from broker.config import BrokerConfig, env_properties
from protocol import frames
from protocol import messages as M

API_VERSIONS = 18
TIMEOUT_S = 3.0


def default_address(environ: dict[str, str]) -> tuple[str, int]:
    config = BrokerConfig(env_properties(environ))
    protocols = config.security_protocol_map
    listeners = config.listeners
    plain = [listener for listener in listeners if protocols.get(listener.name.upper(), "PLAINTEXT") == "PLAINTEXT"]
    return "127.0.0.1", (plain or listeners)[0].port


def check(host: str, port: int) -> bool:
    request = frames.encode_request_header(API_VERSIONS, 0, 1, "healthcheck") + M.encode(M.ApiVersionsRequest(), 0)
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = sock.recv(65536)
            if not chunk:
                return False
            data += chunk
    response = M.decode_response(API_VERSIONS, 0, memoryview(data)[8:])  # size, correlation id
    return int(response.error_code) == 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args:
        host, _, port = args[0].rpartition(":")
        address = (host or "127.0.0.1", int(port))
    else:
        address = default_address(dict(os.environ))
    try:
        healthy = check(*address)
    except OSError as exc:
        print("unhealthy: %s:%d: %s" % (*address, exc), file=sys.stderr)
        return 1
    if not healthy:
        print("unhealthy: %s:%d answered ApiVersions with an error" % address, file=sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
