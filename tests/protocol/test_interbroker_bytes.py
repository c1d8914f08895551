"""Encodings of the inter-broker and KRaft definitions, written out byte by byte from their fields.

Round trips and the kio differential cannot see two fields of the same type swapped in one of our
definitions when kio has no such message (the metadata records) or when both sides would read the
same bytes either way; these do. Each expected encoding lists one field per line, in definition
order, with its wire type: int32 big-endian, compact strings and arrays as uvarint(length + 1),
then the tagged fields (count, then tag, size and value of each) closing every flexible struct.
"""

from __future__ import annotations

import uuid

from protocol import messages as M
from protocol.frames import decode_request_header

U1 = uuid.UUID("00010203-0405-0607-0809-0a0b0c0d0e0f")
U1_HEX = "000102030405060708090a0b0c0d0e0f"
U2 = uuid.UUID(int=0x0102)
U2_HEX = "00000000000000000000000000000102"


def wire(*fields: str) -> bytes:
    return bytes.fromhex("".join(fields).replace(" ", ""))


def test_broker_heartbeat_request_v1() -> None:
    request = M.BrokerHeartbeatRequest(broker_id=1, broker_epoch=42, current_metadata_offset=1000,
                                       want_fence=False, want_shut_down=True, offline_log_dirs=[U1])
    assert M.encode(request, 1) == wire(
        "00000001",  # BrokerId int32
        "000000000000002a",  # BrokerEpoch int64
        "00000000000003e8",  # CurrentMetadataOffset int64
        "00",  # WantFence bool
        "01",  # WantShutDown bool
        "01",  # one tagged field:
        "00 11",  # tag 0 (OfflineLogDirs), 17 bytes
        "02" + U1_HEX,  # compact array of one uuid
    )
    assert M.decode_request(63, 1, M.encode(request, 1)) == request
    # v0 has no OfflineLogDirs; in v1 an empty list is the default and is not written
    expected_v0 = wire("00000001", "000000000000002a", "00000000000003e8", "00", "01", "00")
    assert M.encode(request, 0) == expected_v0
    request.offline_log_dirs = []
    assert M.encode(request, 1) == expected_v0


def test_broker_heartbeat_response_v1() -> None:
    response = M.BrokerHeartbeatResponse(throttle_time_ms=0, error_code=0, is_caught_up=True, is_fenced=False,
                                         should_shut_down=False)
    assert M.encode(response, 1) == wire(
        "00000000",  # ThrottleTimeMs int32
        "0000",  # ErrorCode int16
        "01",  # IsCaughtUp bool
        "00",  # IsFenced bool
        "00",  # ShouldShutDown bool
        "00",  # no tagged fields
    )


# a DeleteTopics v6 request as a broker forwards it: request header v2, then the body
EMBEDDED = wire(
    "0014",  # RequestApiKey int16: DeleteTopics
    "0006",  # RequestApiVersion int16
    "00000007",  # CorrelationId int32
    "0003 61646d",  # ClientId: int16-length string "adm" (also in header v2)
    "00",  # header tagged fields
    "02",  # Topics: compact array of one DeleteTopicState
    "02 74",  # Name: compact nullable string "t"
    U2_HEX,  # TopicId uuid
    "00",  # DeleteTopicState tagged fields
    "00007530",  # TimeoutMs int32: 30000
    "00",  # tagged fields
)
# DefaultPrincipalData as Kafka serializes it for an Envelope: an int16 version, then the data
PRINCIPAL = wire(
    "0000",  # version 0
    "05 55736572",  # Type: compact string "User"
    "06 616c696365",  # Name: compact string "alice"
    "00",  # TokenAuthenticated bool
    "00",  # tagged fields
)


def test_envelope_request_v0() -> None:
    assert len(EMBEDDED) == 39 and len(PRINCIPAL) == 15
    request = M.EnvelopeRequest(request_data=EMBEDDED, request_principal=PRINCIPAL,
                                client_host_address=bytes([127, 0, 0, 1]))
    data = M.encode(request, 0)
    assert data == wire(
        "28" + EMBEDDED.hex(),  # RequestData: compact bytes, 39 + 1
        "10" + PRINCIPAL.hex(),  # RequestPrincipal: compact nullable bytes, 15 + 1
        "05 7f000001",  # ClientHostAddress: compact bytes, the 4 bytes of 127.0.0.1
        "00",  # tagged fields
    )
    back = M.decode_request(58, 0, data)
    assert back == request
    # what it carries decodes with the codecs of the forwarded request and of the principal
    header = decode_request_header(back.request_data)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (20, 6, 7, "adm")
    forwarded = M.decode_request(20, 6, back.request_data[header.body_offset:], strict=True)
    assert forwarded == M.DeleteTopicsRequest(topics=[M.DeleteTopicsRequest.DeleteTopicState(name="t", topic_id=U2)],
                                              timeout_ms=30000)
    principal = M.decode("DefaultPrincipalData", 0, back.request_principal[2:])
    assert principal == M.DefaultPrincipalData(type="User", name="alice", token_authenticated=False)
    # without a principal the field is null
    assert M.encode(M.EnvelopeRequest(request_data=b"", request_principal=None, client_host_address=b""), 0) == wire(
        "01", "00", "01", "00")


def test_alter_partition_request_v3() -> None:
    R = M.AlterPartitionRequest
    request = R(broker_id=2, broker_epoch=7, topics=[R.TopicData(topic_id=U2, partitions=[R.PartitionData(
        partition_index=0, leader_epoch=5, partition_epoch=9, leader_recovery_state=0,
        new_isr_with_epochs=[R.BrokerState(broker_id=2, broker_epoch=7), R.BrokerState(broker_id=3)])])])
    assert M.encode(request, 3) == wire(
        "00000002",  # BrokerId int32
        "0000000000000007",  # BrokerEpoch int64
        "02",  # Topics: one TopicData
        U2_HEX,  # TopicId uuid
        "02",  # Partitions: one PartitionData
        "00000000",  # PartitionIndex int32
        "00000005",  # LeaderEpoch int32
        "03",  # NewIsrWithEpochs: two BrokerStates
        "00000002 0000000000000007 00",  # BrokerId, BrokerEpoch, tagged fields
        "00000003 ffffffffffffffff 00",  # BrokerEpoch defaults to -1
        "00",  # LeaderRecoveryState int8
        "00000009",  # PartitionEpoch int32
        "00 00 00",  # tagged fields of PartitionData, TopicData, the request
    )
    # v2 carries the ISR as plain broker ids instead
    request.topics[0].partitions[0].new_isr = [2, 3]
    assert M.encode(request, 2) == wire(
        "00000002", "0000000000000007", "02", U2_HEX, "02", "00000000", "00000005",
        "03 00000002 00000003",  # NewIsr: compact array of two int32
        "00", "00000009", "00 00 00",
    )


def test_write_share_group_state_request_v1() -> None:
    R = M.WriteShareGroupStateRequest
    request = R(group_id="g", topics=[R.WriteStateData(topic_id=U1, partitions=[R.PartitionData(
        partition=0, state_epoch=1, leader_epoch=2, start_offset=10, delivery_complete_count=3,
        state_batches=[R.StateBatch(first_offset=10, last_offset=12, delivery_state=2, delivery_count=1)])])])

    def expected(delivery_complete_count: str) -> bytes:
        return wire(
            "02 67",  # GroupId: compact string "g"
            "02",  # Topics: one WriteStateData
            U1_HEX,  # TopicId uuid
            "02",  # Partitions: one PartitionData
            "00000000",  # Partition int32
            "00000001",  # StateEpoch int32
            "00000002",  # LeaderEpoch int32
            "000000000000000a",  # StartOffset int64
            delivery_complete_count,  # DeliveryCompleteCount int32 (v1, KIP-1226)
            "02",  # StateBatches: one StateBatch
            "000000000000000a",  # FirstOffset int64
            "000000000000000c",  # LastOffset int64
            "02",  # DeliveryState int8
            "0001",  # DeliveryCount int16
            "00 00 00 00",  # tagged fields of StateBatch, PartitionData, WriteStateData, the request
        )

    assert M.encode(request, 1) == expected("00000003")
    assert M.encode(request, 0) == expected("")


def test_read_share_group_state_summary_response_v1() -> None:
    R = M.ReadShareGroupStateSummaryResponse
    response = R(results=[R.ReadStateSummaryResult(topic_id=U1, partitions=[R.PartitionResult(
        partition=4, error_code=0, error_message=None, state_epoch=1, leader_epoch=2, start_offset=10,
        delivery_complete_count=5)])])
    assert M.encode(response, 1) == wire(
        "02",  # Results: one ReadStateSummaryResult
        U1_HEX,  # TopicId uuid
        "02",  # Partitions: one PartitionResult
        "00000004",  # Partition int32
        "0000",  # ErrorCode int16
        "00",  # ErrorMessage: null compact string
        "00000001",  # StateEpoch int32
        "00000002",  # LeaderEpoch int32
        "000000000000000a",  # StartOffset int64
        "00000005",  # DeliveryCompleteCount int32 (v1)
        "00 00 00",  # tagged fields
    )


def test_register_broker_record_v3() -> None:
    record = M.RegisterBrokerRecord(
        broker_id=1, incarnation_id=U2, broker_epoch=5, rack=None, fenced=True, log_dirs=[U1],
        end_points=[M.RegisterBrokerRecord.BrokerEndpoint(name="PLAINTEXT", host="h", port=9092, security_protocol=0)],
        features=[M.RegisterBrokerRecord.BrokerFeature(name="metadata.version", min_supported_version=1,
                                                       max_supported_version=27)])
    data = M.encode(record, 3)
    assert data == wire(
        "00000001",  # BrokerId int32
        "00",  # IsMigratingZkBroker bool (v2+)
        U2_HEX,  # IncarnationId uuid
        "0000000000000005",  # BrokerEpoch int64
        "02",  # EndPoints: one BrokerEndpoint
        "0a 504c41494e54455854",  # Name: compact string "PLAINTEXT"
        "02 68",  # Host: compact string "h"
        "2384",  # Port uint16: 9092
        "0000",  # SecurityProtocol int16
        "00",  # tagged fields
        "02",  # Features: one BrokerFeature
        "11 6d657461646174612e76657273696f6e",  # Name: compact string "metadata.version"
        "0001",  # MinSupportedVersion int16
        "001b",  # MaxSupportedVersion int16
        "00",  # tagged fields
        "00",  # Rack: null compact string
        "01",  # Fenced bool
        "00",  # InControlledShutdown bool (v1+)
        "01",  # one tagged field:
        "00 11",  # tag 0 (LogDirs), 17 bytes
        "02" + U1_HEX,  # compact array of one uuid
    )
    assert M.decode("RegisterBrokerRecord", 3, data) == record


def test_broker_registration_change_record_v2() -> None:
    record = M.BrokerRegistrationChangeRecord(broker_id=1, broker_epoch=5, fenced=-1)
    assert M.encode(record, 2) == wire(
        "00000001",  # BrokerId int32
        "0000000000000005",  # BrokerEpoch int64
        "01",  # one tagged field (InControlledShutdown 0 and LogDirs [] are their defaults):
        "00 01 ff",  # tag 0 (Fenced), 1 byte: int8 -1, unfenced
    )
    record.in_controlled_shutdown = 1
    assert M.encode(record, 2) == wire("00000001", "0000000000000005", "02", "00 01 ff", "01 01 01")
