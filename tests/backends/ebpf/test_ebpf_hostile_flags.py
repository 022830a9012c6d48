"""Hostile values (0, negative, huge, garbage) of the ebpf backend's flags: refused when the
backend starts, with a message saying what is valid, or, for a valid kube-proxy value the
maps cannot hold (a --conntrack-* lifetime past 32 bits of seconds), clamped with one
warning (no kernel).

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


CT_FLAGS = ("--conntrack-tcp-timeout-established", "--conntrack-tcp-timeout-close-wait",
            "--conntrack-udp-timeout", "--conntrack-udp-timeout-stream")
LONGEST = 4294967295  # seconds: struct ct_timeouts holds u32 (bpf/ct.h)


@pytest.mark.parametrize("flag", CT_FLAGS)
@pytest.mark.parametrize("value", ["2562047h", "2562047h47m16s", "4294967296s",
                                   "9223372036854775807ns"])
def test_a_conntrack_lifetime_longer_than_the_map_holds_is_clamped_with_one_warning(
        caplog: pytest.LogCaptureFixture, flag: str, value: str) -> None:
    """Before: struct.error when the lifetimes were packed for the loader (the backend
    died at start on a duration kube-proxy takes)."""
    from svcproxy.backends.ebpf.packet_cli import ct_timeouts
    from svcproxy.backends.ebpf.packet_layout import CT_TIMEOUTS

    with caplog.at_level("WARNING", logger="svcproxy.backends.ebpf.packet_cli"):
        packed = CT_TIMEOUTS.unpack(ct_timeouts(_parse(flag, value)).pack())
    assert LONGEST in packed, packed
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert flag in warnings[0] and f"using {LONGEST}s" in warnings[0], warnings[0]


def test_the_longest_lifetime_the_map_holds_is_taken_as_it_is(
        caplog: pytest.LogCaptureFixture) -> None:
    from svcproxy.backends.ebpf.packet_cli import ct_timeouts

    with caplog.at_level("WARNING"):
        got = ct_timeouts(_parse("--conntrack-udp-timeout", f"{LONGEST}s"))
    assert got.udp == LONGEST and not caplog.records


def test_a_huge_lifetime_from_kube_proxys_config_file_is_clamped_too() -> None:
    """The config file sets the same attributes without the flags' parser."""
    from svcproxy.backends.ebpf.packet_cli import ct_timeouts
    from svcproxy.kubeproxy.cli import backend_namespace
    from svcproxy.kubeproxy.config import load_config
    from svcproxy.sdk.agent import add_agent_arguments

    config = load_config("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
                         "kind: KubeProxyConfiguration\nconntrack:\n"
                         "  tcpEstablishedTimeout: 2562047h\n")
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    add_arguments(parser)  # type: ignore[arg-type]
    ns = backend_namespace(config, "ebpf", parser, ["--node-ip", "192.0.2.1"])
    got = ct_timeouts(ns)
    assert got.tcp_established == LONGEST
    assert len(got.pack()) == 24


@pytest.mark.parametrize("flag", CT_FLAGS)
@pytest.mark.parametrize("value", ["-1s", "garbage", "10", "", "1x", "1000000000h",
                                   "9" * 400 + "h"])
def test_a_conntrack_lifetime_that_is_no_duration_or_negative_is_refused(
        capsys: pytest.CaptureFixture[str], flag: str, value: str) -> None:
    err = _refusal(capsys, f"{flag}={value}")
    assert f"argument {flag}:" in err, err
    assert "negative" in err or "invalid duration" in err, err


@pytest.mark.parametrize("flag", ["--ebpf-max-flows", "--ebpf-max-services",
                                  "--ebpf-max-endpoints"])
@pytest.mark.parametrize("value", ["0", "-1", "2147483649", "4294967301", str(1 << 70),
                                   "garbage", "1.5", ""])
def test_a_map_size_the_kernel_cannot_give_is_refused(
        capsys: pytest.CaptureFixture[str], flag: str, value: str) -> None:
    """Before: a size over 32 bits was cut to its low bits by ctypes (4294967301 made a
    map of 5 entries), garbage was refused without saying what is valid."""
    err = _refusal(capsys, f"{flag}={value}")
    assert f"argument {flag}: {value!r} is not a count of entries from 1 to 2147483648" in (
        err), err


@pytest.mark.parametrize("flag", ["--ebpf-max-flows", "--ebpf-max-services",
                                  "--ebpf-max-endpoints"])
def test_map_sizes_up_to_the_kernels_limit_are_taken(flag: str) -> None:
    dest = flag[2:].replace("-", "_")
    assert getattr(_parse(flag, "1"), dest) == 1
    assert getattr(_parse(flag, "2147483648"), dest) == 2147483648


@pytest.mark.parametrize("value", ["0", "-16381", "16380", "250", "65537", "1000003",
                                   "garbage", "", "16381.0"])
def test_a_maglev_table_size_that_is_no_prime_in_range_is_refused(
        capsys: pytest.CaptureFixture[str], value: str) -> None:
    err = _refusal(capsys, f"--ebpf-maglev-table-size={value}")
    assert (f"argument --ebpf-maglev-table-size: {value!r} is not a prime between 251 and "
            "65521") in err, err


@pytest.mark.parametrize("value", ["eth0/1", "eth0:1", "eth 0", "averyveryverylongname",
                                   "..", "lo,.", "\u00e9" * 8])
def test_a_device_name_the_kernel_never_gives_is_refused(
        capsys: pytest.CaptureFixture[str], value: str) -> None:
    """Before: taken, and no device was ever attached."""
    err = _refusal(capsys, f"--ebpf-devices={value}")
    assert "argument --ebpf-devices:" in err and "is no device name" in err, err
    assert "names of 1 to 15 characters without '/', ':' or whitespace" in err, err


def test_device_names_are_taken() -> None:
    assert _parse("--ebpf-devices", "eth0, bond0.100,veth0123456789a").ebpf_devices == (
        "eth0", "bond0.100", "veth0123456789a")
    assert _parse("--ebpf-devices", "").ebpf_devices == ()


@pytest.mark.parametrize("flag, value", [("--ebpf-xdp", "sometimes"),
                                         ("--ebpf-lb-algorithm", "roundrobin"),
                                         ("--ebpf-packet-path", "ipvs")])
def test_a_choice_flag_names_its_choices(capsys: pytest.CaptureFixture[str], flag: str,
                                         value: str) -> None:
    err = _refusal(capsys, f"{flag}={value}")
    assert f"argument {flag}: invalid choice: '{value}' (choose from" in err, err
