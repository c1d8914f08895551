"""Definitions are read and their classes built on first use, once, whichever thread asks."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from protocol import codecs, messages
from protocol.codegen import MessageCodec
from protocol.schema import SCHEMA_DIR, load_message


def test_importing_builds_nothing() -> None:
    code = (
        "from protocol import codecs, messages\n"
        "assert not codecs.SPECS._made and not codecs.CODECS._made, codecs.CODECS\n"
        "assert messages.ProduceRequest is codecs.CODECS['ProduceRequest'].root_class\n"
        "assert set(codecs.CODECS._made) == {'ProduceRequest'}, codecs.CODECS._made\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_class_is_a_module_attribute_once_named() -> None:
    cls = messages.FetchRequest
    assert vars(messages)["FetchRequest"] is cls
    assert codecs.REQUESTS[1].root_class is cls
    assert codecs.codec_of(cls()) is codecs.CODECS["FetchRequest"]


def test_unknown_names() -> None:
    with pytest.raises(AttributeError):
        messages.NoSuchRequest  # noqa: B018
    with pytest.raises(KeyError):
        codecs.CODECS["NoSuchRequest"]
    assert codecs.REQUESTS.get(9999) is None
    assert 9999 not in codecs.REQUESTS and 0 in codecs.REQUESTS
    with pytest.raises(TypeError):
        codecs.codec_of(object())


def test_registries_list_every_definition() -> None:
    files = {p.stem for folder in ("messages", "records") for p in (SCHEMA_DIR / folder).glob("*.json")}
    assert set(codecs.CODECS) == files
    assert {c.spec.type for c in codecs.REQUESTS.values()} == {"request"}
    assert {c.spec.type for c in codecs.METADATA_RECORDS.values()} == {"metadata"}
    assert all(c.spec.api_key == key for key, c in codecs.RESPONSES.items())


def test_classes_built_once_across_threads() -> None:
    codec = MessageCodec(load_message(SCHEMA_DIR / "messages" / "ConsumerGroupHeartbeatResponse.json"))
    seen: list[dict[str, type]] = []
    start = threading.Barrier(8)

    def look() -> None:
        start.wait(timeout=10)
        seen.append(codec.classes)

    threads = [threading.Thread(target=look) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(seen) == 8 and all(classes is seen[0] for classes in seen)
