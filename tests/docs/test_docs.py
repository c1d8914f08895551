"""The user guide stays true to the code: the configuration reference is the one generated from
the property definitions."""

from __future__ import annotations

from pathlib import Path

from broker import config

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "configuration.md"


def test_configuration_reference_is_current() -> None:
    assert REFERENCE.read_text() == config.markdown(), (
        "docs/configuration.md is out of date; regenerate it: "
        "python -m broker.config --markdown > docs/configuration.md")


def test_every_property_is_in_one_area() -> None:
    listed = [p.name for _, props in config.areas() for p in props]
    assert sorted(listed) == sorted(config.PROPS)
