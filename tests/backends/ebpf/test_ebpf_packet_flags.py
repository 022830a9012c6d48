"""``--ebpf-dsr`` and ``--ebpf-xdp`` as the backend's parser reads them (no kernel)."""

from __future__ import annotations

import argparse

import pytest

from svcproxy.backends.ebpf.cli import add_arguments
from svcproxy.backends.ebpf.packet_cli import packet_backend
from svcproxy.backends.ebpf.packet_loader import PacketLayout
from svcproxy.sdk import NodeConfig


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_arguments(parser)  # type: ignore[arg-type]
    parser.add_argument("--cleanup", action="store_true")
    return parser


def _layout(*argv: str) -> PacketLayout:
    """The packet path's layout of these flags (--cleanup: nothing is loaded)."""
    args = _parser().parse_args([*argv, "--cleanup"])
    return packet_backend(args, NodeConfig(node_name="n1")).layout


def test_dsr_and_xdp_are_off_unless_asked() -> None:
    layout = _layout()
    assert not layout.dsr and layout.xdp == "off"


def test_the_xdp_flag_alone_means_auto_and_a_mode_can_be_named() -> None:
    assert _layout("--ebpf-xdp").xdp == "auto"
    assert _layout("--ebpf-xdp", "--ebpf-dsr").xdp == "auto"
    assert _layout("--ebpf-xdp", "generic").xdp == "generic"
    assert _layout("--ebpf-xdp=native").xdp == "native"
    assert _layout("--ebpf-dsr").dsr


def test_an_unknown_xdp_mode_is_refused_with_the_modes(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--ebpf-xdp", "driver"])
    err = capsys.readouterr().err
    assert "--ebpf-xdp" in err and "'generic'" in err and "'native'" in err, err
