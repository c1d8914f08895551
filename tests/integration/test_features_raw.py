"""Feature flags with raw frames: ApiVersions' supported and finalized features, UpdateFeatures'
rules (Kafka's FeatureControlManager), the gating of the consumer protocol by group.version, the
ELR safety configs, and persistence across a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.metadata import features
from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import RawClient
from tests.integration.test_server_support import (  # noqa: F401  (fixtures)
    API_VERSIONS,
    BrokerThread,
    broker_thread_fixture,
    client_fixture,
)

UPDATE_FEATURES, CONSUMER_GROUP_HEARTBEAT, DESCRIBE_CONFIGS = 57, 68, 32
UPGRADE, SAFE, UNSAFE = 1, 2, 3


def api_versions(c: RawClient, version: int) -> Any:
    return c.call(API_VERSIONS, version, M.ApiVersionsRequest(client_software_name="t", client_software_version="1"))


def update(c: RawClient, updates: list[tuple[str, int, int]], version: int = 2, validate_only: bool = False) -> Any:
    R = M.UpdateFeaturesRequest
    keys = [R.FeatureUpdateKey(feature=n, max_version_level=level, upgrade_type=t, allow_downgrade=t != UPGRADE)
            for n, level, t in updates]
    return c.call(UPDATE_FEATURES, version, R(timeout_ms=60000, feature_updates=keys, validate_only=validate_only))


def finalized(c: RawClient) -> dict[str, tuple[int, int]]:
    response = api_versions(c, 4)
    return {f.name: (f.min_version_level, f.max_version_level) for f in response.finalized_features}


def test_api_versions_features(client: RawClient) -> None:
    v4 = api_versions(client, 4)
    supported = {f.name: (f.min_version, f.max_version) for f in v4.supported_features}
    assert supported == {
        "metadata.version": (7, 29), "kraft.version": (0, 1), "group.version": (0, 1),
        "transaction.version": (0, features.SUPPORTED["transaction.version"].max_level),
        "share.version": (0, features.SUPPORTED["share.version"].max_level),
        "eligible.leader.replicas.version": (0, 1), "streams.version": (0, 0),
    }
    assert finalized(client) == {
        "metadata.version": (29, 29), "kraft.version": (1, 1), "group.version": (1, 1),
        "eligible.leader.replicas.version": (1, 1),
        **{n: (lv, lv) for n in ("transaction.version", "share.version")
           if (lv := features.SUPPORTED[n].bootstrap) > 0},
    }
    assert v4.finalized_features_epoch >= 0
    # below v4 a feature whose minimum is 0 is left out (KAFKA-17492)
    v3 = api_versions(client, 3)
    assert [f.name for f in v3.supported_features] == ["metadata.version"]
    assert api_versions(client, 0).api_keys  # v0 has no features at all


def test_update_features_rules(client: RawClient) -> None:
    cases: list[tuple[list[tuple[str, int, int]], str]] = [
        ([("group.version", 2, UPGRADE)], "Invalid update version 2 for feature group.version. "
         "Local controller 1 only supports versions 0-1"),
        ([("streams.version", 1, UPGRADE)], "Invalid update version 1 for feature streams.version. "
         "Local controller 1 does not support this feature."),
        ([("no.such.feature", 1, UPGRADE)], "Invalid update version 1 for feature no.such.feature. "
         "Local controller 1 does not support this feature."),
        ([("group.version", 0, UPGRADE)], "Invalid update version 0 for feature group.version. Can't downgrade the "
         "version of this feature without setting the upgrade type to either safe or unsafe downgrade."),
        ([("group.version", -1, SAFE)], "Invalid update version -1 for feature group.version. "
         "A feature version cannot be less than 0."),
        ([("group.version", 0, 7)], "Invalid update version 0 for feature group.version. "
         "The controller does not support the given upgrade type."),
        ([("metadata.version", 22, SAFE)], "Unsupported metadata.version downgrade from 29 to 22. Refusing to perform "
         "the requested downgrade because it might delete metadata information."),
        ([("metadata.version", 22, UNSAFE)], "Unsupported metadata.version downgrade from 29 to 22. Unsafe metadata "
         "downgrade is not supported in this version."),
        ([("kraft.version", 0, SAFE)], "Invalid update version 0 for feature kraft.version. "
         "Can't downgrade the version of this feature."),
        # all or nothing: the valid first update is not applied either
        ([("group.version", 0, SAFE), ("metadata.version", 20, SAFE)],
         "Unsupported metadata.version downgrade from 29 to 20. Refusing to perform the requested downgrade "
         "because it might delete metadata information."),
    ]
    for updates, message in cases:
        for version in (0, 1, 2):
            if version == 0 and any(t not in (UPGRADE, SAFE) for _, _, t in updates):
                continue
            response = update(client, updates, version)
            assert (response.error_code, response.error_message) == (ErrorCode.INVALID_UPDATE_VERSION, message)
            assert response.results == []
    assert finalized(client)["group.version"] == (1, 1)


def test_downgrade_gates_the_consumer_protocol(broker_thread: BrokerThread, client: RawClient) -> None:
    ok = update(client, [("group.version", 0, SAFE)], version=1, validate_only=True)
    assert (ok.error_code, [(r.feature, r.error_code) for r in ok.results]) == (0, [("group.version", 0)])
    assert "group.version" in finalized(client)
    epoch = api_versions(client, 4).finalized_features_epoch
    assert update(client, [("group.version", 0, SAFE)]).error_code == 0
    assert "group.version" not in finalized(client)
    assert api_versions(client, 4).finalized_features_epoch > epoch
    R = M.ConsumerGroupHeartbeatRequest
    heartbeat = R(group_id="g", member_id="m" * 22, member_epoch=0, rebalance_timeout_ms=30000,
                  subscribed_topic_names=["t"], subscribed_topic_regex="", topic_partitions=[])
    response = client.call(CONSUMER_GROUP_HEARTBEAT, 1, heartbeat)
    assert response.error_code == ErrorCode.UNSUPPORTED_VERSION
    # group.version 1 needs metadata.version 22 at least, which the cluster has: the upgrade works
    assert update(client, [("group.version", 1, UPGRADE)], version=0).error_code == 0
    assert client.call(CONSUMER_GROUP_HEARTBEAT, 1, heartbeat).error_code == 0
    # the same level again is no change and no error
    assert update(client, [("group.version", 1, UPGRADE), ("kraft.version", 1, UPGRADE)]).error_code == 0


def test_elr_safety_configs(broker_thread: BrokerThread, client: RawClient) -> None:
    metadata = broker_thread.broker.metadata
    assert metadata.image.broker_configs == {"": {"min.insync.replicas": "1"}}
    assert update(client, [(features.ELR_VERSION, 0, SAFE)]).error_code == 0
    # with ELR off a per-broker value is allowed again and the cluster-level one may go
    R = M.IncrementalAlterConfigsRequest
    ops = [("1", "min.insync.replicas", 0, "1"), ("", "min.insync.replicas", 1, None)]
    request = R(validate_only=False, resources=[
        R.AlterConfigsResource(resource_type=4, resource_name=name, configs=[
            R.AlterableConfig(name=key, config_operation=op, value=value)])
        for name, key, op, value in ops])
    assert [r.error_code for r in client.call(44, 1, request).responses] == [0, 0]
    assert metadata.image.broker_configs == {"1": {"min.insync.replicas": "1"}, "": {}}
    # enabling ELR moves min.insync.replicas back to the cluster level
    assert update(client, [(features.ELR_VERSION, 1, UPGRADE)]).error_code == 0
    assert metadata.image.broker_configs == {"1": {}, "": {"min.insync.replicas": "1"}}


def test_levels_survive_restart(tmp_path: Path) -> None:
    with BrokerThread(tmp_path) as first:
        c = first.client()
        assert update(c, [("group.version", 0, SAFE)]).error_code == 0
        c.close()
    with BrokerThread(tmp_path) as second:
        c = second.client()
        got = finalized(c)
        c.close()
        assert "group.version" not in got and got["metadata.version"] == (29, 29)


@pytest.mark.parametrize("static", ["1", "2"])
def test_bootstrap_takes_the_static_min_insync_replicas(tmp_path: Path, static: str) -> None:
    with BrokerThread(tmp_path, **{"min.insync.replicas": static}) as bt:
        assert bt.broker.metadata.image.broker_configs == {"": {"min.insync.replicas": static}}
