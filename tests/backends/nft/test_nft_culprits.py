"""Which service ports an nft error location points at (pure)."""

from __future__ import annotations

from svcproxy.backends.nft.culprits import named_in_error
from svcproxy.backends.nft.render import ServiceObjects
from tests.support.nft_fixtures import key

RULES = {
    key("a"): ServiceObjects(chains={"external-A-ns/a/tcp/http": ("goto x",)},
                           elements=(("service-ips", "10.96.0.1 . tcp . 80", "goto lb-1"),)),
    key("b"): ServiceObjects(sets={"affinity-60-B": "type ipv4_addr;"},
                           elements=(("service-ips", "10.96.0.2 . tcp . 80", "goto lb-1"),
                                     ("hairpin", "10.244.1.2 . 10.244.1.2", ""))),
}
TEXT = "\n".join([
    "add table ip svcproxy",
    "table ip svcproxy {",
    "\tset affinity-60-B { type ipv4_addr; }",
    "\tchain external-A-ns/a/tcp/http {",
    "\t\tgoto x",
    "\t}",
    "}",
    "add element ip svcproxy service-ips { 10.96.0.1 . tcp . 80 : goto lb-1, "
    "10.96.0.2 . tcp . 80 : goto lb-1 }",
])


def error_at(line: int, column: int) -> str:
    return f"/dev/stdin:{line}:{column}-{column + 5}: Error: Could not process rule: File exists"


def test_an_element_names_its_owner() -> None:
    line = TEXT.splitlines()[7]
    assert named_in_error(TEXT, error_at(8, line.index("10.96.0.2") + 1), [RULES]) == [key("b")]
    assert named_in_error(TEXT, error_at(8, line.index("10.96.0.1") + 1), [RULES]) == [key("a")]


def test_a_line_in_a_chain_or_set_names_its_owner() -> None:
    assert named_in_error(TEXT, error_at(5, 3), [RULES]) == [key("a")]
    assert named_in_error(TEXT, error_at(3, 2), [RULES]) == [key("b")]


def test_nothing_is_named_for_shared_objects_or_no_location() -> None:
    assert named_in_error(TEXT, error_at(1, 1), [RULES]) == []
    assert named_in_error(TEXT, "Error: Could not process rule: File exists", [RULES]) == []
    assert named_in_error(TEXT, error_at(99, 1), [RULES]) == []
