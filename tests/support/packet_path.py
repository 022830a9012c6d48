"""What a test of the ebpf packet path needs on the machine, as its module's marks."""

from __future__ import annotations

import os
import shutil

import pytest

from svcproxy.backends.ebpf.packet_loader import OBJECT


def missing(*tools: str) -> str:
    """Why the packet path cannot be tested here ("" when it can)."""
    if os.geteuid() != 0:
        return "needs root"
    absent = [tool for tool in tools if shutil.which(tool) is None]
    if absent:
        return "needs " + " and ".join("iproute2" if t == "ip" else t for t in tools)
    if not OBJECT.exists():
        return f"{OBJECT} not built (python -m svcproxy.backends.ebpf.build)"
    return ""


def marks(*tools: str) -> list[pytest.MarkDecorator]:
    """A module's ``pytestmark``: network namespaces, skipped where ``missing`` says."""
    why = missing(*tools)
    return [pytest.mark.netns, pytest.mark.skipif(bool(why), reason=why)]
