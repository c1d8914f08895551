"""AlterShareGroupOffsets on the group coordinator shard (no runtime, manual clock), as Kafka 4.2's
GroupMetadataManager.alterShareGroupOffsets: a share group that does not exist yet is created
(KAFKA-19662); a group with members, or of another type, is refused."""

from __future__ import annotations

from typing import Any

import pytest

from broker.coordinator.group import share_admin
from broker.coordinator.group.records import SHARE_GROUP_STATE_PARTITION_METADATA
from broker.coordinator.group.share_group import ShareGroup, ShareGroupState
from broker.coordinator.result import CoordinatorResult
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from tests.share.test_share_membership import T1, T2, ShareHarness

E = ErrorCode
R = M.AlterShareGroupOffsetsRequest


def alter(h: ShareHarness, group_id: str, offsets: dict[tuple[str, int], int]) -> share_admin.AlterResult:
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), offset in offsets.items():
        by_topic.setdefault(topic, []).append(R.AlterShareGroupOffsetsRequestPartition(
            partition_index=partition, start_offset=offset))
    request = R(group_id=group_id, topics=[R.AlterShareGroupOffsetsRequestTopic(topic_name=t, partitions=ps)
                                           for t, ps in by_topic.items()])

    def op(s: Any, now: int) -> CoordinatorResult[Any]:
        records, result = share_admin.alter_offsets(s.groups, group_id, request, s.consumer.metadata)
        return CoordinatorResult(records=records, response=result)

    result: share_admin.AlterResult = h.call(op)
    return result


def errors(result: share_admin.AlterResult) -> dict[tuple[str, int], int]:
    return {(t.topic_name, p.partition_index): p.error_code for t in result.response.responses for p in t.partitions}


def test_altering_the_offsets_of_a_group_that_does_not_exist_creates_it() -> None:
    h = ShareHarness()
    before = len(h.log)
    result = alter(h, "new", {("t1", 0): 5, ("t1", 7): 1, ("t2", 2): 0})
    assert errors(result) == {("t1", 0): E.NONE, ("t1", 7): E.UNKNOWN_TOPIC_OR_PARTITION, ("t2", 2): E.NONE}
    assert (result.state_epoch, result.offsets) == (0, {(T1, 0): 5, (T2, 2): 0})
    # one record, the share-partition metadata; replaying it makes the group (epoch 0, empty)
    assert [int.from_bytes(key[:2], "big") for key, _ in h.log[before:]] == [SHARE_GROUP_STATE_PARTITION_METADATA]
    group = h.group("new")
    assert isinstance(group, ShareGroup)
    assert (group.group_epoch, group.state, group.members) == (0, ShareGroupState.EMPTY, {})
    assert group.initialized_partitions() == {(T1, 0), (T2, 2)}
    listed = h.shard.list_groups([], ["share"])
    assert [(g.group_id, g.group_state, g.group_type) for g in listed] == [("new", "Empty", "share")]
    described = h.shard.share_group_describe(["new"])[0]
    assert (described.error_code, described.group_state, described.group_epoch, described.members) == (
        E.NONE, "Empty", 0, [])
    # it survives a reload, and its first member is assigned what was initialized without asking again
    assert h.reload().group("new").initialized_partitions() == {(T1, 0), (T2, 2)}
    joined = h.hb("m1", 0, ["t1"], group="new")
    assert joined.member_epoch == 1
    assert {(T1, 0), (T2, 2)} <= h.group("new").initialized_partitions()


def test_a_new_group_is_made_only_when_a_named_topic_exists() -> None:
    h = ShareHarness()
    assert errors(alter(h, "nothing", {})) == {}
    assert errors(alter(h, "unknown", {("no-such-topic", 0): 1})) == {("no-such-topic", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
    assert "nothing" not in h.shard.groups and "unknown" not in h.shard.groups
    # a known topic, even with no partition in range, writes the record (as Kafka's initializing map)
    assert errors(alter(h, "out-of-range", {("t1", 9): 1})) == {("t1", 9): E.UNKNOWN_TOPIC_OR_PARTITION}
    assert h.group("out-of-range").initialized_partitions() == set()


def test_a_group_with_members_or_of_another_type_is_refused() -> None:
    h = ShareHarness()
    h.hb("m1", 0, ["t1"], group="busy")
    with pytest.raises(KafkaError) as err:
        alter(h, "busy", {("t1", 0): 0})
    assert (err.value.code, err.value.message) == (E.NON_EMPTY_GROUP, "The group is not empty.")
    h.commit("classic", {("t1", 0): 5})
    with pytest.raises(KafkaError) as err:
        alter(h, "classic", {("t1", 0): 0})
    assert (err.value.code, err.value.message) == (E.GROUP_ID_NOT_FOUND, "Group classic is not a share group.")
    # the group that left is empty again: altered, at its own epoch
    h.hb("m1", -1, group="busy")
    assert alter(h, "busy", {("t1", 1): 3}).state_epoch == h.group("busy").group_epoch > 0
