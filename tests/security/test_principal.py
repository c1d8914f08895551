"""Principals: RFC 2253 distinguished names and ssl.principal.mapping.rules (SslPrincipalMapper)."""

from __future__ import annotations

import pytest

from broker.security.principal import NoMatchingRule, SslPrincipalMapper, distinguished_name, parse_principal

RULES = ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
         "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,"
         "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U,"
         "DEFAULT")


@pytest.mark.parametrize("dn, name", [
    ("CN=kafka1,OU=ServiceUsers,O=Org,C=US", "kafka1"),
    ("CN=Duke,OU=JavaSoft,O=Sun Microsystems,L=Santa Clara,ST=CA,C=US", "duke@javasoft"),
    ("CN=Foo,O=x", "FOO"),
    ("OU=JavaSoft,O=Sun Microsystems,C=US", "OU=JavaSoft,O=Sun Microsystems,C=US"),
])
def test_rules_apply_in_order(dn: str, name: str) -> None:
    assert SslPrincipalMapper(RULES).name(dn) == name


def test_missing_group_reference_is_literal_and_no_rule_fails() -> None:
    assert SslPrincipalMapper("RULE:^CN=(.*),OU=(.*)$/$1$3/").name("CN=a,OU=b") == "a$3"
    with pytest.raises(NoMatchingRule):
        SslPrincipalMapper("RULE:^CN=(.*)$/$1/").name("OU=x")
    with pytest.raises(ValueError):
        SslPrincipalMapper("RULE:^CN=(.*)$/$1/Lx")


def test_distinguished_name_is_rfc2253_most_specific_first() -> None:
    subject = ((("countryName", "US"),), (("organizationName", "A, Inc"),),
               (("commonName", "client"), ("emailAddress", "a@b.c")))
    assert distinguished_name(subject) == "CN=client+1.2.840.113549.1.9.1=#16056140622e63,O=A\\, Inc,C=US"


def test_parse_principal() -> None:
    assert parse_principal("User:CN=a,O=b") == ("User", "CN=a,O=b")
    with pytest.raises(ValueError):
        parse_principal("alice")
