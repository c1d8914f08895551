"""Sanity checks of the definition files in schemas/messages and schemas/records.

The expected version ranges are Apache Kafka 4.2's stable ones (a version marked
`latestVersionUnstable` upstream is not advertised), cross-checked against kio 0.6.5, which
ships newer schemas for three APIs (listed in KIO_AHEAD).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kio.schema.index import api_key_map, schema_name_map

from protocol.messages import CODECS, REQUESTS, RESPONSES, SPECS
from protocol.schema import MAX_VERSION, PRIMITIVES, SCHEMA_DIR, FieldSpec, StructSpec, Versions, snake_case

# name: (api key, lowest, highest stable version, first flexible version or None)
KAFKA_42: dict[str, tuple[int, int, int, int | None]] = {
    "Produce": (0, 3, 13, 9),
    "Fetch": (1, 4, 18, 12),
    "ListOffsets": (2, 1, 11, 6),
    "Metadata": (3, 0, 13, 9),
    "OffsetCommit": (8, 2, 10, 8),
    "OffsetFetch": (9, 1, 10, 6),
    "FindCoordinator": (10, 0, 6, 3),
    "JoinGroup": (11, 0, 9, 6),
    "Heartbeat": (12, 0, 4, 4),
    "LeaveGroup": (13, 0, 5, 4),
    "SyncGroup": (14, 0, 5, 4),
    "DescribeGroups": (15, 0, 6, 5),
    "ListGroups": (16, 0, 5, 3),
    "SaslHandshake": (17, 0, 1, None),
    "ApiVersions": (18, 0, 4, 3),
    "CreateTopics": (19, 2, 7, 5),
    "DeleteTopics": (20, 1, 6, 4),
    "DeleteRecords": (21, 0, 2, 2),
    "InitProducerId": (22, 0, 5, 2),  # v6 (KIP-939 2PC) is unstable in 4.2
    "OffsetForLeaderEpoch": (23, 2, 4, 4),
    "AddPartitionsToTxn": (24, 0, 5, 3),
    "AddOffsetsToTxn": (25, 0, 4, 3),
    "EndTxn": (26, 0, 5, 3),
    "WriteTxnMarkers": (27, 1, 2, 1),
    "TxnOffsetCommit": (28, 0, 5, 3),
    "DescribeAcls": (29, 1, 3, 2),
    "CreateAcls": (30, 1, 3, 2),
    "DeleteAcls": (31, 1, 3, 2),
    "DescribeConfigs": (32, 1, 4, 4),
    "AlterConfigs": (33, 0, 2, 2),
    "AlterReplicaLogDirs": (34, 1, 2, 2),
    "DescribeLogDirs": (35, 1, 4, 2),
    "SaslAuthenticate": (36, 0, 2, 2),
    "CreatePartitions": (37, 0, 3, 2),
    "DeleteGroups": (42, 0, 2, 2),
    "ElectLeaders": (43, 0, 2, 2),
    "IncrementalAlterConfigs": (44, 0, 1, 1),
    "AlterPartitionReassignments": (45, 0, 1, 0),
    "ListPartitionReassignments": (46, 0, 0, 0),
    "OffsetDelete": (47, 0, 0, None),
    "DescribeClientQuotas": (48, 0, 1, 1),
    "AlterClientQuotas": (49, 0, 1, 1),
    "DescribeUserScramCredentials": (50, 0, 0, 0),
    "AlterUserScramCredentials": (51, 0, 0, 0),
    "DescribeQuorum": (55, 0, 2, 0),
    "UpdateFeatures": (57, 0, 2, 0),
    "DescribeCluster": (60, 0, 2, 0),
    "DescribeProducers": (61, 0, 0, 0),
    "DescribeTransactions": (65, 0, 0, 0),
    "ListTransactions": (66, 0, 2, 0),
    "ConsumerGroupHeartbeat": (68, 0, 1, 0),
    "ConsumerGroupDescribe": (69, 0, 1, 0),
    "GetTelemetrySubscriptions": (71, 0, 0, 0),
    "PushTelemetry": (72, 0, 0, 0),
    "ListConfigResources": (74, 0, 1, 0),
    "DescribeTopicPartitions": (75, 0, 0, 0),
    "ShareGroupHeartbeat": (76, 1, 1, 0),
    "ShareGroupDescribe": (77, 1, 1, 0),
    "ShareFetch": (78, 1, 2, 0),
    "ShareAcknowledge": (79, 1, 2, 0),
    "DescribeShareGroupOffsets": (90, 0, 1, 0),
    "AlterShareGroupOffsets": (91, 0, 0, 0),
    "DeleteShareGroupOffsets": (92, 0, 0, 0),
    # between brokers and to the controller (cluster mode); advertised by ApiVersions only once
    # an API has a handler (broker/apis/registry.py)
    "AlterPartition": (56, 2, 3, 0),  # v0-1 removed in 4.0
    "Envelope": (58, 0, 0, 0),
    "BrokerRegistration": (62, 0, 4, 0),  # v5 (CordonedLogDirs, KIP-1066) is newer than 4.2
    "BrokerHeartbeat": (63, 0, 1, 0),  # v2 (CordonedLogDirs, KIP-1066) is newer than 4.2
    "UnregisterBroker": (64, 0, 0, 0),
    "AllocateProducerIds": (67, 0, 0, 0),
    "InitializeShareGroupState": (83, 0, 0, 0),
    "ReadShareGroupState": (84, 0, 0, 0),
    "WriteShareGroupState": (85, 0, 1, 0),  # v1: DeliveryCompleteCount (KIP-1226)
    "DeleteShareGroupState": (86, 0, 0, 0),
    "ReadShareGroupStateSummary": (87, 0, 1, 0),  # v1: DeliveryCompleteCount (KIP-1226)
}

# kio 0.6.5 versions that Kafka 4.2 does not offer as stable: name -> kio's highest version
KIO_AHEAD = {
    "InitProducerId": 6,  # unstable in 4.2 (latestVersionUnstable)
    "DescribeLogDirs": 5,  # IsCordoned (KIP-1066), added after 4.2
    "BrokerHeartbeat": 2,  # CordonedLogDirs (KIP-1066), added after 4.2
}

FILES = sorted((SCHEMA_DIR / "messages").glob("*.json")) + sorted((SCHEMA_DIR / "records").glob("*.json"))

TOP_KEYS = {"apiKey", "type", "name", "validVersions", "flexibleVersions", "fields", "commonStructs"}
FIELD_KEYS = {
    "name", "type", "versions", "nullableVersions", "taggedVersions", "tag", "default",
    "ignorable", "mapKey", "entityType", "flexibleVersions", "zeroCopy", "fields",
}  # fmt: skip
NULLABLE_TYPES = {"string", "bytes", "records"}


def _raw(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _walk_raw(fields: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for f in fields:
        out.append(f)
        out.extend(_walk_raw(f.get("fields", [])))
    return out


def _structs(spec: Any) -> list[StructSpec]:
    return [spec.root, *spec.structs.values()]


def _kio_range(name: str) -> tuple[int, int]:
    versions = sorted(schema_name_map[api_key_map[KAFKA_42[name][0]]])
    return versions[0], versions[-1]


@pytest.mark.parametrize("api", sorted(KAFKA_42))
def test_api_definitions(api: str) -> None:
    key, lo, hi, flex = KAFKA_42[api]
    for kind in ("Request", "Response"):
        spec = SPECS.get(api + kind)
        assert spec is not None, "schemas/messages/%s%s.json is missing" % (api, kind)
        assert spec.name == api + kind
        assert spec.type == kind.lower()
        assert spec.api_key == key
        assert spec.valid_versions == Versions(lo, hi), "%s%s: %s" % (api, kind, spec.valid_versions)
        assert spec.flexible_versions == (Versions(flex, MAX_VERSION) if flex is not None else Versions(1, 0))
    assert REQUESTS[key].spec.name == api + "Request"
    assert RESPONSES[key].spec.name == api + "Response"


def test_no_other_apis() -> None:
    assert sorted(REQUESTS) == sorted(k for k, *_ in KAFKA_42.values())


@pytest.mark.parametrize("api", sorted(KAFKA_42))
def test_ranges_against_kio(api: str) -> None:
    key, lo, hi, _flex = KAFKA_42[api]
    kio_lo, kio_hi = _kio_range(api)
    assert kio_lo == lo
    assert kio_hi == KIO_AHEAD.get(api, hi)


def test_headers() -> None:
    req, resp = SPECS["RequestHeader"], SPECS["ResponseHeader"]
    assert (req.type, resp.type) == ("header", "header")
    assert req.valid_versions == Versions(1, 2) and req.flexible_versions == Versions(2, MAX_VERSION)
    assert resp.valid_versions == Versions(0, 1) and resp.flexible_versions == Versions(1, MAX_VERSION)
    assert [f.name for f in req.root.fields] == [
        "RequestApiKey",
        "RequestApiVersion",
        "CorrelationId",
        "ClientId",
    ]
    client_id = req.root.fields[3]
    assert client_id.flexible == Versions(1, 0), "ClientId is an int16-length string even in header v2"
    assert 1 in client_id.nullable and 2 in client_id.nullable
    assert [f.name for f in resp.root.fields] == ["CorrelationId"]


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_file_shape(path: Path) -> None:
    raw = _raw(path)
    assert raw["name"] == path.stem
    assert set(raw) <= TOP_KEYS, "unexpected keys %s" % (set(raw) - TOP_KEYS)
    assert "about" not in path.read_text(), "no copied prose in definition files"
    for common in raw.get("commonStructs", []):
        assert set(common) <= {"name", "versions", "fields"}
    for f in _walk_raw(raw["fields"]) + [
        g for c in raw.get("commonStructs", []) for g in _walk_raw(c["fields"])
    ]:
        assert set(f) <= FIELD_KEYS, "%s: unexpected keys %s" % (f["name"], set(f) - FIELD_KEYS)
        # Kafka lets `versions` default to `taggedVersions`; one of them must be there
        assert "versions" in f or "taggedVersions" in f, f["name"]
        if "tag" in f:
            assert "taggedVersions" in f, f["name"]
        if "fields" in f:
            assert f["type"].removeprefix("[]") not in PRIMITIVES, f["name"]


def _check_field(spec_name: str, struct: StructSpec, f: FieldSpec, flexible: Versions) -> None:
    where = "%s %s.%s" % (spec_name, struct.name, f.name)
    assert not f.versions.empty, where
    assert f.elem_type in PRIMITIVES or f.struct is not None, where + ": unknown type " + f.type
    assert f.attr == snake_case(f.name)
    if not f.nullable.empty:
        assert f.is_array or f.struct is not None or f.type in NULLABLE_TYPES, where + " cannot be nullable"
    if f.default is None:
        # a null default needs every version to be nullable (Kafka's generator rejects it
        # otherwise); so a tagged field, absent from the wire, always decodes to a valid value
        assert f.nullable.lo <= f.versions.lo and f.nullable.hi >= f.versions.hi, where
    if f.tag is not None:
        assert f.tag >= 0, where
        assert not f.tagged.empty and f.tagged.hi == MAX_VERSION, (
            where + ": taggedVersions must be open-ended"
        )
        assert f.versions.lo <= f.tagged.lo and f.versions.hi == MAX_VERSION, (
            where + ": tagged outside versions"
        )
        assert f.tagged.lo in flexible, where + ": tagged in a non-flexible version"
        nullable_tagged = [v in f.nullable for v in (f.tagged.lo, f.tagged.lo + 1)]
        assert len(set(nullable_tagged)) == 1, where + ": all tagged versions nullable, or none"
    else:
        assert f.tagged.empty, where + ": taggedVersions without a tag"
    if f.flexible is not None:
        assert f.type in ("string", "bytes"), where


@pytest.mark.parametrize("name", sorted(SPECS))
def test_struct_invariants(name: str) -> None:
    spec = SPECS[name]
    assert not spec.valid_versions.empty
    for struct in _structs(spec):
        names = [f.name for f in struct.fields]
        assert len(names) == len(set(names)), "%s: duplicate field" % struct.name
        attrs = [f.attr for f in struct.fields]
        assert len(attrs) == len(set(attrs)), "%s: duplicate attribute" % struct.name
        tags = [f.tag for f in struct.fields if f.tag is not None]
        assert len(tags) == len(set(tags)), "%s: duplicate tag in %s" % (name, struct.name)
        for f in struct.fields:
            # fields outside every valid version are allowed: Kafka keeps them (ShareFetch v0's
            # PartitionMaxBytes, InitProducerId's unstable v6 fields) and they never reach the wire
            _check_field(name, struct, f, spec.flexible_versions)
            if f.struct is not None:
                # every nested field exists in some version of its parent field
                for g in f.struct.fields:
                    assert any(v in f.versions for v in g.versions), "%s.%s" % (f.struct.name, g.name)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_codecs_built(name: str) -> None:
    codec = CODECS[name]
    assert codec.root_class.__name__ == name
    for struct in SPECS[name].structs:
        assert getattr(codec.root_class, struct).__name__ == struct


def test_records_definitions() -> None:
    kinds = {s.type for s in SPECS.values() if s.api_key is None or s.type not in ("request", "response")}
    assert kinds <= {"header", "coordinator-key", "coordinator-value", "metadata", "data"}
    for name, spec in SPECS.items():
        if spec.type == "coordinator-key":
            value = SPECS.get(name[: -len("Key")] + "Value")
            assert value is not None and value.type == "coordinator-value", name
            assert spec.api_key == value.api_key, name
