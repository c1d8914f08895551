"""What KIP-848 consumer groups and KIP-932 share groups share (Kafka's ModernGroup): the group
epoch, the members in order of joining, the target assignment and its epoch, the subscribed
topics' metadata hash and when it is to be checked again."""

from __future__ import annotations

import enum
from typing import Any, Generic, TypeVar

from broker.coordinator.group.member import Assignment
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

MemberT = TypeVar("MemberT")


class ModernGroup(Generic[MemberT]):
    type: str  # the group type ListGroups and DescribeGroups report
    protocol_type: str

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.group_epoch = 0
        self.metadata_hash = 0
        self.assignment_epoch = 0
        self.members: dict[str, MemberT] = {}  # in order of joining
        self.target_assignment: dict[str, Assignment] = {}
        # In memory only: when the subscribed topics' metadata must be checked again.
        self.metadata_refresh_deadline = (0, 0)  # (deadline ms, group epoch); (0, 0): at the next heartbeat

    @property
    def state(self) -> enum.Enum:
        raise NotImplementedError

    def is_empty(self) -> bool:
        return not self.members

    def in_state(self, *states: Any) -> bool:
        return self.state in states

    def member_or_raise(self, member_id: str) -> MemberT:
        member = self.members.get(member_id)
        if member is None:
            raise KafkaError(ErrorCode.UNKNOWN_MEMBER_ID,
                             "Member %s is not a member of group %s." % (member_id, self.group_id))
        return member

    def subscribed_topic_names(self) -> set[str]:
        raise NotImplementedError

    def is_subscribed_to_topic(self, topic: str) -> bool:
        return topic in self.subscribed_topic_names()

    def has_metadata_expired(self, now_ms: int) -> bool:
        deadline, epoch = self.metadata_refresh_deadline
        return now_ms >= deadline or self.group_epoch < epoch

    def request_metadata_refresh(self) -> None:
        self.metadata_refresh_deadline = (0, 0)

    def listed(self) -> M.ListGroupsResponse.ListedGroup:
        return M.ListGroupsResponse.ListedGroup(group_id=self.group_id, protocol_type=self.protocol_type,
                                                group_state=self.state.value, group_type=self.type)

    def validate_delete_group(self) -> None:
        if self.members:
            raise KafkaError(ErrorCode.NON_EMPTY_GROUP)
