"""Kubernetes' names as its validation reads them: DNS labels and subdomains, qualified
names (label and annotation keys, appProtocol), port names, domain names."""

from __future__ import annotations

import re
from typing import Any

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = re.compile(_LABEL)
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
QUALIFIED = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
IANA_SVC_NAME = re.compile(r"[-a-z0-9]+")


_MATCHED: dict[tuple[int, str], bool] = {}


def matches(pattern: re.Pattern[str], text: str) -> bool:
    """``pattern.fullmatch(text)``, remembered: node and port names repeat a lot."""
    key = (id(pattern), text)
    hit = _MATCHED.get(key)
    if hit is None:
        if len(_MATCHED) > 100_000:
            _MATCHED.clear()
        hit = _MATCHED[key] = pattern.fullmatch(text) is not None
    return hit


def is_qualified_name(text: str) -> bool:
    """A label or annotation key: [DNS-1123 subdomain prefix/]name of at most 63 characters."""
    prefix, slash, name = text.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return False
    return 0 < len(name) <= 63 and QUALIFIED.fullmatch(name) is not None


def is_fqdn(value: Any) -> bool:
    """IsFullyQualifiedDomainName: a DNS-1123 subdomain of two labels or more (each at
    most 63 characters), at most 253 characters once a trailing dot is dropped."""
    if not isinstance(value, str):
        return False
    name = value[:-1] if value.endswith(".") else value
    return 0 < len(name) <= 253 and "." in name and \
        DNS1123_SUBDOMAIN.fullmatch(name) is not None and \
        all(len(label) <= 63 for label in name.split("."))


def is_port_name(text: str) -> bool:
    """IANA_SVC_NAME: 1-15 of [-a-z0-9], a letter, no leading/trailing or double '-'."""
    return (0 < len(text) <= 15 and IANA_SVC_NAME.fullmatch(text) is not None
            and any("a" <= c <= "z" for c in text) and "--" not in text
            and text[0] != "-" and text[-1] != "-")


_APP_PROTOCOLS: dict[str, bool] = {}


def is_app_protocol(value: Any) -> bool:
    """An appProtocol Kubernetes allows (a qualified name: http, kubernetes.io/h2c),
    remembered: a cluster uses a few."""
    if type(value) is not str or len(value) > 317:  # a qualified name's longest
        return False
    ok = _APP_PROTOCOLS.get(value)
    if ok is None:
        if len(_APP_PROTOCOLS) >= 1000:
            _APP_PROTOCOLS.clear()
        ok = _APP_PROTOCOLS[value] = is_qualified_name(value)
    return ok
