"""Checkpoint files in Kafka's text format, written atomically."""

from __future__ import annotations

import json
import os

import pytest

from broker.log.checkpoint import (
    CLEAN_SHUTDOWN_FILE,
    CheckpointError,
    has_clean_shutdown,
    read_leader_epochs,
    read_offsets,
    remove_clean_shutdown,
    write_atomic,
    write_clean_shutdown,
    write_leader_epochs,
    write_offsets,
)


def test_offset_checkpoint_format(tmp_path) -> None:
    path = str(tmp_path / "recovery-point-offset-checkpoint")
    write_offsets(path, {("orders", 1): 42, ("orders", 0): 7, ("my-topic", 3): 0})
    assert open(path).read() == "0\n3\nmy-topic 3 0\norders 0 7\norders 1 42\n"
    assert read_offsets(path) == {("orders", 1): 42, ("orders", 0): 7, ("my-topic", 3): 0}
    assert not os.path.exists(path + ".tmp")


def test_leader_epoch_checkpoint_format(tmp_path) -> None:
    path = str(tmp_path / "leader-epoch-checkpoint")
    write_leader_epochs(path, [(0, 0), (3, 120)])
    assert open(path).read() == "0\n2\n0 0\n3 120\n"
    assert read_leader_epochs(path) == [(0, 0), (3, 120)]


def test_missing_and_empty_files_read_as_empty(tmp_path) -> None:
    assert read_offsets(str(tmp_path / "nope")) == {}
    (tmp_path / "empty").write_text("")
    assert read_offsets(str(tmp_path / "empty")) == {}
    (tmp_path / "kafka-empty").write_text("0\n0\n")
    assert read_offsets(str(tmp_path / "kafka-empty")) == {}


@pytest.mark.parametrize(
    "content",
    ["1\n1\nt 0 5\n", "x\n", "0\n2\nt 0 5\n", "0\n1\nt 0\n", "0\n1\nt zero 5\n", "0\nfoo\n"],
)
def test_corrupt_checkpoints_raise(tmp_path, content: str) -> None:
    path = tmp_path / "cp"
    path.write_text(content)
    with pytest.raises(CheckpointError):
        read_offsets(str(path))


def test_write_atomic_replaces_whole_file(tmp_path) -> None:
    path = str(tmp_path / "f")
    write_atomic(path, b"first version, long")
    write_atomic(path, b"second")
    assert open(path, "rb").read() == b"second"


def test_clean_shutdown_marker(tmp_path) -> None:
    d = str(tmp_path)
    assert not has_clean_shutdown(d)
    write_clean_shutdown(d, broker_epoch=17)
    assert has_clean_shutdown(d)
    assert json.loads((tmp_path / CLEAN_SHUTDOWN_FILE).read_text()) == {"version": 0, "brokerEpoch": 17}
    remove_clean_shutdown(d)
    assert not has_clean_shutdown(d)
    remove_clean_shutdown(d)  # idempotent


def test_partition_metadata_file(tmp_path) -> None:
    import uuid

    from broker.log.checkpoint import read_partition_metadata, write_partition_metadata

    topic_id = uuid.UUID("a7b2c2f0-0c4b-4c4e-9e35-2b0b1f3f9a10")
    write_partition_metadata(str(tmp_path), topic_id)
    text = (tmp_path / "partition.metadata").read_text()
    assert text == "version: 0\ntopic_id: p7LC8AxLTE6eNSsLHz-aEA"
    assert read_partition_metadata(str(tmp_path)) == topic_id
    assert read_partition_metadata(str(tmp_path / "missing")) is None
