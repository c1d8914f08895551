"""Pure parts of pyspark_kafka: option parsing, offset ranges, rate limits (no Spark, no broker)."""

from __future__ import annotations

import pytest

from pyspark_kafka.options import (
    Earliest,
    GlobalTimestamp,
    Latest,
    OptionError,
    SpecificOffsets,
    SpecificTimestamps,
    Subscribe,
    SubscribePattern,
    batch_source_options,
    offsets_from_json,
    offsets_to_json,
    sink_options,
    stream_source_options,
    time_string_as_ms,
    topic_matches,
)
from pyspark_kafka.planning import (
    DataLossError,
    OffsetRange,
    micro_batch_ranges,
    rate_limit,
    resolve_start,
    split_ranges,
)

BOOT = {"kafka.bootstrap.servers": "h:1"}


def test_defaults_and_precedence():
    s = stream_source_options({**BOOT, "subscribe": "a, b,"})
    assert s.strategy == Subscribe(("a", "b")) and s.starting == Latest() and s.fail_on_data_loss
    assert s.group_id.startswith("spark-kafka-source-")
    b = batch_source_options({**BOOT, "subscribePattern": "t-.*"})
    assert b.starting == Earliest() and b.ending == Latest() and b.group_id.startswith("spark-kafka-relation-")
    assert topic_matches(b.strategy, "xt-1") and not topic_matches(SubscribePattern("^t"), "xt")
    # a global timestamp wins over per-partition timestamps, which win over offsets
    both = {**BOOT, "subscribe": "a", "startingOffsets": "earliest",
            "startingOffsetsByTimestamp": '{"a":{"0":5}}'}
    assert batch_source_options(both).starting == SpecificTimestamps({("a", 0): 5}, False)
    assert batch_source_options({**both, "startingTimestamp": "7",
                                 "startingOffsetsByTimestampStrategy": "LATEST"}).starting == GlobalTimestamp(7, True)
    s = stream_source_options({**BOOT, "assign": '{"a":[0,1]}', "startingOffsets": '{"a":{"0":3,"1":-2}}',
                               "maxOffsetsPerTrigger": "10", "maxTriggerDelay": "30s", "includeHeaders": "TRUE"})
    assert s.starting == SpecificOffsets({("a", 0): 3, ("a", 1): -2})
    assert s.max_offsets_per_trigger == 10 and s.max_trigger_delay_ms == 30_000 and s.include_headers
    assert time_string_as_ms("15m") == 900_000 and time_string_as_ms("100") == 100


@pytest.mark.parametrize("options, message", [
    ({"subscribe": "a", "endingOffsets": "latest"}, "ending offset not valid in streaming queries"),
    ({"subscribe": "a", "endingTimestamp": "1"}, "ending timestamp not valid in streaming queries"),
    ({"subscribe": "a", "minOffsetsPerTrigger": "5", "maxOffsetsPerTrigger": "4"},
     "The value of minOffsetPerTrigger(5) is higher than the maxOffsetsPerTrigger(4)."),
    ({"subscribe": "a", "kafka.key.deserializer": "x"}, "Kafka option 'key.deserializer' is not supported"),
    ({"subscribe": "a", "startingTimestamp": "soon"}, "Expected a single long value, got soon"),
    ({"subscribe": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss must be 'true' or 'false'"),
])
def test_bad_stream_options(options, message):
    with pytest.raises(OptionError) as e:
        stream_source_options({**BOOT, **options})
    assert message in str(e.value)


def test_batch_offsets_checked_against_each_other():
    with pytest.raises(OptionError, match="startingOffsets for a-0 can't be latest"):
        batch_source_options({**BOOT, "subscribe": "a", "startingOffsets": '{"a":{"0":-1}}'})
    with pytest.raises(OptionError, match="The specified start offset 5 is greater than the end offset 3"):
        batch_source_options({**BOOT, "subscribe": "a", "startingOffsets": '{"a":{"0":5}}',
                              "endingOffsets": '{"a":{"0":3}}'})
    with pytest.raises(OptionError, match="should have the same topic-partitions"):
        batch_source_options({**BOOT, "subscribe": "a", "startingOffsets": '{"a":{"0":1}}',
                              "endingOffsets": '{"a":{"1":3}}'})


def test_sink_options():
    assert sink_options({**BOOT}, streaming=True).exactly_once
    assert not sink_options({**BOOT}, streaming=False).exactly_once
    eos = sink_options({**BOOT, "topic": " t ", "deliveryGuarantee": "exactly-once"}, streaming=True)
    assert eos.exactly_once and eos.topic == "t" and eos.transactional_id_prefix == "pyspark-kafka"
    with pytest.raises(OptionError, match="is for streaming writes"):
        sink_options({**BOOT, "deliveryGuarantee": "exactly-once"}, streaming=False)
    with pytest.raises(OptionError, match="Kafka option 'transactional.id' is not supported"):
        sink_options({**BOOT, "deliveryGuarantee": "exactly-once", "kafka.transactional.id": "x"}, streaming=True)
    with pytest.raises(OptionError, match="Kafka option 'value.serializer' is not supported"):
        sink_options({**BOOT, "kafka.value.serializer": "x"}, streaming=True)
    with pytest.raises(OptionError, match="Unknown option 'subscribe' for the Kafka sink"):
        sink_options({**BOOT, "subscribe": "x"}, streaming=True)


def test_offset_json_round_trip():
    offsets = {("b", 1): 5, ("a", 10): 7, ("a", 2): -2}
    as_json = offsets_to_json(offsets)
    assert list(as_json) == ["a", "b"] and list(as_json["a"]) == ["2", "10"]
    assert offsets_from_json(as_json) == offsets


def test_split_ranges_like_spark():
    ranges = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 0, 10), OffsetRange("t", 2, 5, 5)]
    assert split_ranges(ranges, None, None) == ranges[:2]
    split = split_ranges(ranges, 4, None)
    assert [r for r in split if r.partition == 1] == [ranges[1]]
    assert [(r.from_offset, r.until_offset) for r in split if r.partition == 0] == [(0, 33), (33, 66), (66, 100)]
    capped = split_ranges(ranges, None, 40)
    assert [(r.from_offset, r.until_offset) for r in capped if r.partition == 0] == [(0, 33), (33, 66), (66, 100)]


def test_rate_limit_shares_in_proportion():
    start = {("t", 0): 0, ("t", 1): 0}
    latest = {("t", 0): 90, ("t", 1): 10, ("t", 2): 100}
    limited = rate_limit(20, start, latest, {("t", 2): 0})
    assert limited == {("t", 0): 9, ("t", 1): 1, ("t", 2): 10}
    assert rate_limit(20, latest, latest, {}) == latest


def test_first_batch_start_and_data_loss():
    end = {("t", 0): 10, ("t", 1): 20}
    assert resolve_start({("t", 0): -1, ("t", 1): -2}, end, {("t", 1): 4}) == {("t", 0): 10, ("t", 1): 4}
    warnings: list[str] = []
    ranges = micro_batch_ranges({("t", 0): 3}, end, {("t", 1): 0}, True, warnings.append)
    assert ranges == [OffsetRange("t", 0, 3, 10), OffsetRange("t", 1, 0, 20)]
    with pytest.raises(DataLossError, match="Added partition t-1 starts from 4 instead of 0"):
        micro_batch_ranges({("t", 0): 3}, end, {("t", 1): 4}, True, warnings.append)
    micro_batch_ranges({("t", 0): 3, ("t", 5): 1}, end, {("t", 1): 0}, False, warnings.append)
    assert warnings and "Set(t-5) are gone" in warnings[0]
