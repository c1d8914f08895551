"""Feature flags (KIP-584, KIP-1022): the levels this broker serves and the cluster finalizes.

`SUPPORTED` is the one registry. Each entry is a feature this broker knows with the range of
levels it serves and the level a new cluster finalizes (Kafka's bootstrap level). ApiVersions
v3+ reports the ranges as SupportedFeatures and the finalized levels as FinalizedFeatures; the
finalized levels live in the metadata log as FeatureLevelRecords (written at the first start,
changed by UpdateFeatures) and gate behaviour the way Kafka gates it: with `group.version` 0 the
consumer-protocol APIs answer UNSUPPORTED_VERSION, as KafkaApis does.

A subsystem that starts serving a feature changes its one line here, for example when share
groups are served:

    "share.version": FeatureSpec(0, 1, bootstrap=1, needs={1: {METADATA_VERSION: 27}}),

and reads the finalized level with `broker.metadata.feature_level("share.version")`. A cluster
created before keeps its finalized level until UpdateFeatures raises it, as in Kafka.

Levels and rules are Kafka 4.2's (MetadataVersion 4.2-IV1 = 29; Feature.validateVersion for the
dependencies; FeatureControlManager.updateFeature for the checks of an update, in its order and
with its messages). kraft.version is the metadata quorum's own: 1 (a dynamic quorum of this one
voter), never written as a FeatureLevelRecord and never changed by UpdateFeatures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from protocol.errors import ErrorCode, KafkaError

METADATA_VERSION = "metadata.version"
KRAFT_VERSION = "kraft.version"
GROUP_VERSION = "group.version"
TRANSACTION_VERSION = "transaction.version"
SHARE_VERSION = "share.version"
ELR_VERSION = "eligible.leader.replicas.version"
STREAMS_VERSION = "streams.version"

# metadata.version levels Kafka 4.2 supports: level -> (release name, whether the level changed the
# metadata format: a downgrade across such a level would lose metadata and is refused)
METADATA_VERSIONS: dict[int, tuple[str, bool]] = {
    7: ("3.3-IV3", True), 8: ("3.4-IV0", True), 9: ("3.5-IV0", False), 10: ("3.5-IV1", False),
    11: ("3.5-IV2", True), 12: ("3.6-IV0", False), 13: ("3.6-IV1", True), 14: ("3.6-IV2", True),
    15: ("3.7-IV0", True), 16: ("3.7-IV1", False), 17: ("3.7-IV2", True), 18: ("3.7-IV3", False),
    19: ("3.7-IV4", False), 20: ("3.8-IV0", False), 21: ("3.9-IV0", False), 22: ("4.0-IV0", False),
    23: ("4.0-IV1", True), 24: ("4.0-IV2", False), 25: ("4.0-IV3", False), 26: ("4.1-IV0", False),
    27: ("4.1-IV1", False), 28: ("4.2-IV0", False), 29: ("4.2-IV1", False),
}
MINIMUM_METADATA_VERSION = min(METADATA_VERSIONS)
LATEST_METADATA_VERSION = max(METADATA_VERSIONS)
KRAFT_VERSION_LEVEL = 1

# UpdateFeatures upgrade types (FeatureUpdate.UpgradeType)
UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3


@dataclass(frozen=True)
class FeatureSpec:
    min_level: int
    max_level: int
    bootstrap: int  # the level a new cluster finalizes
    needs: Mapping[int, Mapping[str, int]] = field(default_factory=dict)  # level -> {feature: least level}


SUPPORTED: dict[str, FeatureSpec] = {
    METADATA_VERSION: FeatureSpec(MINIMUM_METADATA_VERSION, LATEST_METADATA_VERSION, LATEST_METADATA_VERSION),
    KRAFT_VERSION: FeatureSpec(0, 1, KRAFT_VERSION_LEVEL),
    GROUP_VERSION: FeatureSpec(0, 1, bootstrap=1, needs={1: {METADATA_VERSION: 22}}),  # KIP-848 consumer groups
    TRANSACTION_VERSION: FeatureSpec(0, 2, bootstrap=2),  # transactions v1 and v2 (KIP-890), broker/coordinator/txn
    SHARE_VERSION: FeatureSpec(0, 1, bootstrap=1),  # KIP-932 share groups (SV_1: no dependency)
    ELR_VERSION: FeatureSpec(0, 1, bootstrap=1, needs={1: {METADATA_VERSION: 23}}),  # KIP-966
    STREAMS_VERSION: FeatureSpec(0, 0, bootstrap=0),  # streams groups (KIP-1071): not served
}


def bootstrap_levels() -> dict[str, int]:
    """The FeatureLevelRecords of a new cluster: metadata.version first, then every feature whose
    bootstrap level is above 0 (kraft.version is the quorum's, not a record)."""
    levels = {METADATA_VERSION: SUPPORTED[METADATA_VERSION].bootstrap}
    for name, spec in SUPPORTED.items():
        if name not in (METADATA_VERSION, KRAFT_VERSION) and spec.bootstrap > 0:
            levels[name] = spec.bootstrap
    return levels


def supported_features(api_version: int) -> list[tuple[str, int, int]]:
    """(name, min, max) for ApiVersions; below v4 a feature whose minimum is 0 is left out, as
    Kafka does for older clients that cannot read a 0 minimum (KAFKA-17492)."""
    return [
        (name, spec.min_level, spec.max_level)
        for name, spec in SUPPORTED.items()
        if api_version >= 4 or spec.min_level > 0
    ]


def finalized_features(records: Mapping[str, int]) -> dict[str, int]:
    """The finalized levels as ApiVersions reports them: the records plus kraft.version, without
    the features at level 0."""
    levels = {**records, KRAFT_VERSION: KRAFT_VERSION_LEVEL}
    return {name: level for name, level in sorted(levels.items()) if level != 0}


def _range_text(spec: FeatureSpec) -> str:
    if spec.min_level == spec.max_level:
        return str(spec.min_level)
    return "%d-%d" % (spec.min_level, spec.max_level)


def _invalid(name: str, level: int, reason: str) -> KafkaError:
    return KafkaError(ErrorCode.INVALID_UPDATE_VERSION, "Invalid update version %d for feature %s. %s"
                      % (level, name, reason))


def _reason_not_supported(name: str, level: int, node_id: int) -> str | None:
    spec = SUPPORTED.get(name)
    what = "Local controller %d" % node_id
    if spec is None or spec.max_level == 0:
        if level == 0:
            return None
        return what + " does not support this feature."
    if not spec.min_level <= level <= spec.max_level:
        return what + " only supports versions " + _range_text(spec)
    return None


def _metadata_changed_between(low: int, high: int) -> bool:
    return any(METADATA_VERSIONS[v][1] for v in range(low + 1, high + 1))


def _dependency_error(name: str, level: int, proposed: Mapping[str, int]) -> str | None:
    """Feature.validateVersion: a level above 0 needs the minimum metadata.version, and the
    levels its definition depends on."""
    mv = proposed.get(METADATA_VERSION)
    if level >= 1 and (mv is None or mv < MINIMUM_METADATA_VERSION):
        return "%s could not be set to %d because it depends on %s=%d (%s)" % (
            name, level, METADATA_VERSION, MINIMUM_METADATA_VERSION, METADATA_VERSIONS[MINIMUM_METADATA_VERSION][0])
    spec = SUPPORTED.get(name)
    for other, least in (spec.needs.get(level, {}) if spec else {}).items():
        have = proposed.get(other)
        if have is None or have < least:
            return "%s could not be set to %d because it depends on %s level %d" % (name, level, other, least)
    return None


def validate_update(
    name: str, level: int, upgrade_type: int, current: Mapping[str, int], proposed: Mapping[str, int], node_id: int
) -> None:
    """FeatureControlManager.updateFeature's checks of one update, in its order; raises KafkaError."""
    if upgrade_type not in (UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
        raise _invalid(name, level, "The controller does not support the given upgrade type.")
    now = KRAFT_VERSION_LEVEL if name == KRAFT_VERSION else current.get(name, 0)
    if level < 0:
        raise _invalid(name, level, "A feature version cannot be less than 0.")
    reason = _reason_not_supported(name, level, node_id)
    if reason is not None:
        raise _invalid(name, level, reason)
    if level < now and upgrade_type == UPGRADE:
        raise _invalid(name, level, "Can't downgrade the version of this feature without setting the upgrade type "
                       "to either safe or unsafe downgrade.")
    if level > now and upgrade_type != UPGRADE:
        raise _invalid(name, level, "Can't downgrade to a newer version.")
    if name == METADATA_VERSION:
        if level < now and _metadata_changed_between(level, now):
            why = ("Unsafe metadata downgrade is not supported in this version." if upgrade_type == UNSAFE_DOWNGRADE
                   else "Refusing to perform the requested downgrade because it might delete metadata information.")
            raise KafkaError(ErrorCode.INVALID_UPDATE_VERSION, "Unsupported metadata.version downgrade from %d to %d. %s"
                             % (now, level, why))
    elif name == KRAFT_VERSION:
        if level != now and upgrade_type != UPGRADE:
            raise _invalid(name, level, "Can't downgrade the version of this feature.")
    elif name not in SUPPORTED:
        raise _invalid(name, level, "Feature %s not found." % name)
    else:
        error = _dependency_error(name, level, proposed)
        if error is not None:
            raise _invalid(name, level, error)


def plan_update(updates: list[tuple[str, int, int]], current: Mapping[str, int], node_id: int) -> dict[str, int]:
    """The FeatureLevelRecords (name -> level) of an UpdateFeatures request, all or nothing:
    the first failing update raises its KafkaError and nothing changes."""
    proposed = {**current, **{name: level for name, level, _ in updates}}
    changes: dict[str, int] = {}
    for name, level, upgrade_type in updates:
        validate_update(name, level, upgrade_type, current, proposed, node_id)
        if name != KRAFT_VERSION:
            changes[name] = level
    return changes
