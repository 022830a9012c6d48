"""Certificates made by the tests with ``cryptography`` (see svcproxy/devcerts.py)."""

from svcproxy.devcerts import CA, Issued

__all__ = ["CA", "Issued"]
