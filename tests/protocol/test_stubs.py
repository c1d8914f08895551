"""protocol/messages.pyi, the type stub of the generated message classes, matches the schemas,
and tells the truth about the classes built at run time."""

from __future__ import annotations

from pathlib import Path

from protocol import messages, stubs
from protocol.codecs import CODECS

STUB = Path(stubs.__file__).with_name("messages.pyi")


def test_stub_is_current() -> None:
    assert STUB.read_text() == stubs.render(), "regenerate: python -m protocol.stubs > protocol/messages.pyi"


def test_stub_names_every_class_and_field() -> None:
    text = STUB.read_text()
    for name, codec in CODECS.items():
        root = codec.root_class
        assert getattr(messages, name) is root
        assert "class %s(MessageBase):" % name in text
        for struct_name, cls in codec.classes.items():
            if cls is not root:
                assert getattr(root, struct_name) is cls  # nested as the stub declares it
            for attr in cls.FIELDS:  # type: ignore[attr-defined]
                assert "%s: " % attr in text


def test_field_types() -> None:
    spec = CODECS["OffsetCommitRequest"].spec
    fields = {f.attr: f for s in spec.structs.values() for f in s.fields} | {f.attr: f for f in spec.root.fields}
    root = spec.root
    assert stubs.field_type(root, fields["group_id"]) == "str"
    assert stubs.field_type(root, fields["group_instance_id"]) == "str | None"
    assert stubs.field_type(root, fields["committed_metadata"]) == "str | None"
    assert stubs.field_type(root, fields["topic_id"]) == "uuid.UUID"
    assert stubs.field_type(root, fields["topics"]) == "list[OffsetCommitRequest.OffsetCommitRequestTopic]"
    produce = CODECS["ProduceRequest"].spec
    records = next(f for s in produce.structs.values() for f in s.fields if f.attr == "records")
    assert stubs.field_type(produce.root, records) == "Any"
    # a request's records are the bytes decoded (a view into the frame), or null
    assert stubs.field_type(produce.root, records, request=True) == "bytes | bytearray | memoryview | None"


INDEX = Path(stubs.__file__).with_name("schema_index.py")


def test_index_is_current() -> None:
    assert INDEX.read_text() == stubs.render_index(), (
        "regenerate: python -m protocol.stubs index > protocol/schema_index.py"
    )
