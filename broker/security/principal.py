"""Principals: who a connection is, as Kafka's DefaultKafkaPrincipalBuilder names it.

A principal is the string "<type>:<name>" (Kafka's KafkaPrincipal.toString), compared as a
string: "User:ANONYMOUS" on PLAINTEXT and on TLS without a client certificate, "User:<name>"
after SASL, and "User:<mapped DN>" with a client certificate, the certificate's subject
distinguished name in RFC 2253 form (as Java's X500Principal prints it) mapped by
`ssl.principal.mapping.rules` (SslPrincipalMapper's rule language: DEFAULT and
RULE:pattern/replacement/[LU], tried in order).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

USER_TYPE = "User"
ANONYMOUS = "User:ANONYMOUS"
WILDCARD_PRINCIPAL = "User:*"


def user(name: str) -> str:
    return "%s:%s" % (USER_TYPE, name)


def parse_principal(text: str) -> tuple[str, str]:
    """(type, name) of "type:name" (SecurityUtils.parseKafkaPrincipal); ValueError otherwise."""
    principal_type, sep, name = (text or "").partition(":")
    if not text or not sep:
        raise ValueError("expected a string in format principalType:principalName but got %s" % text)
    return principal_type, name


# ---------------------------------------------------------------------------------------------
# Distinguished names as Java's X500Principal.getName() (RFC 2253) writes them

# the attribute keywords RFC 2253 output uses; other attributes appear as OID=#<DER hex>
_KEYWORDS = {
    "commonName": "CN", "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
    "organizationName": "O", "organizationalUnitName": "OU", "streetAddress": "STREET",
    "domainComponent": "DC", "userId": "UID",
}
# OIDs and DER string tags of attributes Java prints in hex form
_OIDS = {
    "emailAddress": ("1.2.840.113549.1.9.1", 0x16), "serialNumber": ("2.5.4.5", 0x13),
    "title": ("2.5.4.12", 0x0C), "surname": ("2.5.4.4", 0x0C), "givenName": ("2.5.4.42", 0x0C),
    "initials": ("2.5.4.43", 0x0C), "generationQualifier": ("2.5.4.44", 0x0C), "pseudonym": ("2.5.4.65", 0x0C),
    "dnQualifier": ("2.5.4.46", 0x13), "businessCategory": ("2.5.4.15", 0x0C), "postalCode": ("2.5.4.17", 0x0C),
}
_ESCAPED = set(',+"\\<>;')


def _escape(value: str) -> str:
    out = []
    for i, ch in enumerate(value):
        if ch in _ESCAPED or (i == 0 and ch in "# ") or (i == len(value) - 1 and ch == " "):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def _der_length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def _attribute(name: str, value: str) -> str:
    keyword = _KEYWORDS.get(name)
    if keyword is not None:
        return "%s=%s" % (keyword, _escape(value))
    oid, tag = _OIDS.get(name, (name, 0x0C))
    data = value.encode()
    return "%s=#%s" % (oid, (bytes([tag]) + _der_length(len(data)) + data).hex())


def distinguished_name(subject: Any) -> str:
    """RFC 2253 text of a subject as `ssl.SSLSocket.getpeercert()` gives it (RDNs in certificate
    order, each a tuple of (attribute, value) pairs): most specific RDN first, multi-valued RDNs
    joined by "+"."""
    return ",".join("+".join(_attribute(k, v) for k, v in rdn) for rdn in reversed(subject))


# ---------------------------------------------------------------------------------------------
# ssl.principal.mapping.rules

_RULE = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(,\s*|$)")
_RULE_PARSER = re.compile(_RULE)
_BACK_REFERENCE = re.compile(r"\$(\d+)")


class NoMatchingRule(ValueError):
    pass


def _java_replacement(replacement: str, groups: int) -> Callable[[re.Match[str]], str]:
    """Java's Matcher.replaceAll replacement ($n group references, backslash escapes), after
    SslPrincipalMapper's rule that a reference to a missing group is literal text."""
    parts: list[str | int] = []
    i = 0
    while i < len(replacement):
        ch = replacement[i]
        if ch == "\\" and i + 1 < len(replacement):
            parts.append(replacement[i + 1])
            i += 2
            continue
        if ch == "$":
            m = _BACK_REFERENCE.match(replacement, i)
            if m is not None:
                digits = m.group(1)
                index = int(digits)
                if not digits.startswith("0"):
                    while index > groups and index >= 10:
                        index //= 10
                    if index > groups:  # a reference to no group is literal text
                        parts.append("$")
                        i += 1
                        continue
                # Java reads digits while the number still names a group
                ref, j = int(digits[0]), 1
                while j < len(digits) and ref * 10 + int(digits[j]) <= groups:
                    ref, j = ref * 10 + int(digits[j]), j + 1
                parts.append(ref)
                i += 1 + j
                continue
        parts.append(ch)
        i += 1

    def expand(m: re.Match[str]) -> str:
        return "".join(p if isinstance(p, str) else (m.group(p) or "") for p in parts)

    return expand


class _Rule:
    __slots__ = ("default", "pattern", "replacement", "lower", "upper", "text")

    def __init__(self, text: str, pattern: str | None = None, replacement: str = "", case: str = "") -> None:
        self.text = text
        self.default = pattern is None
        self.pattern = re.compile(pattern) if pattern is not None else None
        self.replacement = replacement
        self.lower = case == "L"
        self.upper = case == "U"

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        if self.pattern.fullmatch(dn) is None:
            return None
        result = self.pattern.sub(_java_replacement(self.replacement, self.pattern.groups), dn)
        if self.lower:
            return result.lower()
        if self.upper:
            return result.upper()
        return result


class SslPrincipalMapper:
    """Kafka's SslPrincipalMapper: the first rule that matches the DN names the principal."""

    def __init__(self, rules: str | None) -> None:
        self.rules: list[_Rule] = []
        for match in _RULE_SPLITTER.finditer((rules if rules is not None else "DEFAULT").strip()):
            text = match.group(1)
            parsed = _RULE_PARSER.match(text)
            if parsed is None or parsed.end() != len(text):
                raise ValueError("Invalid rule: %s" % text)
            if parsed.group(1) is not None:
                self.rules.append(_Rule(text))
            elif parsed.group(2) is not None:
                self.rules.append(_Rule(text, parsed.group(2), parsed.group(4), parsed.group(6)))
            if match.end() == len(rules or ""):
                break

    def name(self, dn: str) -> str:
        for rule in self.rules:
            result = rule.apply(dn)
            if result is not None:
                return result
        raise NoMatchingRule("No rules apply to %s, rules %s" % (dn, [r.text for r in self.rules]))
