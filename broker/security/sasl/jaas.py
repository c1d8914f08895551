"""JAAS configuration text as Kafka's `sasl.jaas.config` holds it.

    org.apache.kafka.common.security.plain.PlainLoginModule required
        username="admin" password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";

One or more entries, each a login module class, a control flag (required, requisite,
sufficient, optional) and key=value options (quoted or bare words), ended by ';'. // and /* */
comments are skipped. Errors carry Kafka's messages and never an option's value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN = re.compile(
    r"""\s+|//[^\n]*|/\*.*?\*/|(?P<quoted>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')|(?P<word>[^\s=;"'/]+)|(?P<punct>[=;])""",
    re.S,
)
FLAGS = ("required", "requisite", "sufficient", "optional")


@dataclass
class JaasEntry:
    login_module: str
    flag: str
    options: dict[str, str] = field(default_factory=dict)


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text[1:-1])


def _tokens(text: str) -> list[tuple[str, str]]:
    out = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError("Unexpected character in JAAS config at position %d" % pos)
        pos = m.end()
        if m.group("quoted") is not None:
            out.append(("value", _unquote(m.group("quoted"))))
        elif m.group("word") is not None:
            out.append(("value", m.group("word")))
        elif m.group("punct") is not None:
            out.append(("punct", m.group("punct")))
    return out


def parse_jaas(text: str) -> list[JaasEntry]:
    tokens = _tokens(text)
    entries = []
    i = 0
    while i < len(tokens):
        kind, module = tokens[i]
        if kind != "value":
            raise ValueError("Login module not specified in JAAS config")
        i += 1
        if i >= len(tokens):
            raise ValueError("Login module control flag not specified in JAAS config")
        flag = tokens[i][1]
        if flag.lower() not in FLAGS:
            raise ValueError("Invalid login module control flag '%s' in JAAS config" % flag)
        i += 1
        entry = JaasEntry(module, flag.lower())
        while i < len(tokens) and tokens[i] != ("punct", ";"):
            key = tokens[i][1]
            if (i + 2 >= len(tokens) or tokens[i + 1] != ("punct", "=") or tokens[i + 2][0] != "value"):
                raise ValueError("Value not specified for key '%s' in JAAS config" % key)
            entry.options[key] = tokens[i + 2][1]
            i += 3
        if i >= len(tokens):
            raise ValueError("JAAS config entry not terminated by semi-colon")
        i += 1
        entries.append(entry)
    if not entries:
        raise ValueError("Login module not specified in JAAS config")
    return entries
