"""Certificates made by the tests with ``cryptography`` (see svcproxy/cli/devcerts.py)."""

from svcproxy.cli.devcerts import CA, Issued

__all__ = ["CA", "Issued"]
