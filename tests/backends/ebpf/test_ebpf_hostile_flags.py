"""Hostile values of ``--ebpf-pod-devices`` and ``--ebpf-ct-gc-interval``: refused when the
backend starts, with a message saying what is valid, as the other flags are (no kernel).

Before: a pattern no device can match (``cali/*``, ``ve[th``, 16 characters) was taken
and silently attached nothing; a GC interval of 100000000h killed the GC thread at its
first wait (OverflowError: timestamp out of range) so no pass ever ran, and 1ns ran
passes back to back (a second of CPU each at 100,000 flows)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from svcproxy.backends.ebpf.cli import add_arguments


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)  # type: ignore[arg-type]
    return parser.parse_args(list(argv))


def _refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        _parse(*argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("pattern, why", [
    ("cali/*", "'/', ':' or whitespace"),
    ("eth0:1", "'/', ':' or whitespace"),
    ("cali *", "'/', ':' or whitespace"),
    ("ve[th", "'[' without its ']'"),
    ("lxc,ve[!]th", "'[' without its ']'"),
    ("averyveryverylongname", "names have at most 15"),
    ("a*b?????????????c", "names have at most 15"),
])
def test_a_pod_device_pattern_no_device_can_match_is_refused(
        capsys: pytest.CaptureFixture[str], pattern: str, why: str) -> None:
    err = _refusal(capsys, "--ebpf-pod-devices", pattern)
    assert "argument --ebpf-pod-devices:" in err and why in err, err
    assert "shell-style patterns of device names, comma-separated" in err, err


def test_pod_device_patterns_that_can_match_are_taken() -> None:
    args = _parse("--ebpf-pod-devices", "cali*, lxc[0-9a-f]*,tap?,[]]x,[!]]y,veth0123456789a")
    assert args.ebpf_pod_devices == ("cali*", "lxc[0-9a-f]*", "tap?", "[]]x", "[!]]y",
                                     "veth0123456789a")
    assert _parse("--ebpf-pod-devices", "").ebpf_pod_devices == ()


@pytest.mark.parametrize("value", ["-1s", "-0.5m", "500ms", "1ns", "169h", "100000000h",
                                   "garbage", "10", ""])
def test_a_gc_interval_out_of_range_or_garbage_is_refused(
        capsys: pytest.CaptureFixture[str], value: str) -> None:
    err = _refusal(capsys, f"--ebpf-ct-gc-interval={value}")  # '-1s' alone reads as a flag
    assert "argument --ebpf-ct-gc-interval:" in err, err
    assert "a duration from 1s to 168h0m0s (e.g. 30s, 1m, 10m), or 0 for no pass" in err, err


@pytest.mark.parametrize("value, seconds", [("0", 0.0), ("1s", 1.0), ("1m30s", 90.0),
                                            ("168h", 604800.0)])
def test_a_gc_interval_in_range_or_zero_is_taken(value: str, seconds: float) -> None:
    assert _parse("--ebpf-ct-gc-interval", value).ebpf_ct_gc_interval == seconds


def test_the_command_refuses_to_start() -> None:
    proc = subprocess.run([sys.executable, "-m", "svcproxy.cli", "backend", "ebpf",
                           "--ebpf-packet-path", "bpf", "--ebpf-ct-gc-interval=-5s"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc
    assert "--ebpf-ct-gc-interval: '-5s' is not a duration from 1s to 168h0m0s" in proc.stderr
