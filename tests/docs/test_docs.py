"""The user guide stays true to the code: the configuration reference is the one generated from
the property definitions, the property tables of the guides give the defaults those definitions
give, and every link between the pages leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

from broker import config

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "configuration.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
ROW = re.compile(r"^\|\s*`([^`|]+)`\s*\|\s*`([^`|]*)`\s*\|", re.M)  # | `name` | `default` | ...
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but `-` and `_` dropped, spaces made `-`."""
    text = FENCE.sub("", page.read_text())
    titles = re.findall(r"^#+\s+(.*)$", text, re.M)
    return {re.sub(r"[^a-z0-9 _-]", "", t.lower()).replace(" ", "-") for t in titles}


def test_configuration_reference_is_current() -> None:
    assert REFERENCE.read_text() == config.markdown(), (
        "docs/configuration.md is out of date; regenerate it: "
        "python -m broker.config --markdown > docs/configuration.md")


def test_every_property_is_in_one_area() -> None:
    listed = [p.name for _, props in config.areas() for p in props]
    assert sorted(listed) == sorted(config.PROPS)


def test_property_tables_give_the_defined_defaults() -> None:
    """A guide's row `| `name` | `default` | ...` about a broker property (not a group or topic
    config, not a default that names another property) shows the definition's default."""
    checked = 0
    for page in PAGES:
        if page == REFERENCE:
            continue
        for name, default in ROW.findall(page.read_text()):
            prop = config.PROPS.get(name)
            if prop is None or default in config.PROPS:
                continue
            assert default == config.default_text(prop), "%s: %s defaults to %s, not %s" % (
                page.name, name, config.default_text(prop), default)
            checked += 1
    assert checked >= 20  # the README's table and the guides' tables were read


def test_links_lead_to_pages_and_headings() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append("%s: %s (no such file)" % (page.name, target))
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append("%s: %s (no such heading)" % (page.name, target))
    assert broken == []
