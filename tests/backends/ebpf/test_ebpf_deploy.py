"""The ebpf backend's DaemonSet and image: schema-valid (kubernetes-validate, Kubernetes 1.32,
strict), its arguments accepted by the backend's own parser and pointing into the host's
cgroup v2 and bpffs mounts, the bpffs init step really mounting (in a mount namespace this
test creates), and the image building and carrying the BPF object."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path, PurePosixPath

import kubernetes_validate
import pytest
import yaml

from svcproxy.backends.ebpf import loader
from svcproxy.cli import build_parser
from tests.support.paths import REPO

ROOT = REPO
MANIFEST = ROOT / "deploy" / "ebpf-daemonset.yaml"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def daemonset(path: Path = MANIFEST) -> dict:
    (found,) = [d for d in docs(path) if d["kind"] == "DaemonSet"]
    return found


def host_mount(spec: dict, container: dict, host_path: str) -> dict:
    """The container's volumeMount of the hostPath volume ``host_path``."""
    (volume,) = [v["name"] for v in spec["volumes"]
                 if v.get("hostPath", {}).get("path") == host_path]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume]
    return mount


def test_manifest_is_valid_kubernetes() -> None:
    for doc in docs(MANIFEST):
        kubernetes_validate.validate(doc, "1.32", strict=True)


def test_args_are_the_backends_flags_and_point_into_the_host_mounts() -> None:
    spec = daemonset()["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True and spec["hostPID"] is False
    (main,) = spec["containers"]
    argv = [a.replace("$(SVCPROXY_API)", "10.0.0.10:12090").replace("$(NODE_NAME)", "node-a")
            for a in main["args"]]
    args = build_parser().parse_args(argv)  # SystemExit on any flag the backend lacks
    assert (args.command, args.backend) == ("backend", "ebpf")
    cgroup = host_mount(spec, main, "/sys/fs/cgroup")
    assert args.ebpf_cgroup == Path(cgroup["mountPath"]) != Path("/sys/fs/cgroup")
    bpffs = host_mount(spec, main, "/sys/fs/bpf")
    assert PurePosixPath(bpffs["mountPath"]) in PurePosixPath(args.ebpf_pin_dir).parents
    assert bpffs.get("readOnly") is not True
    assert main["livenessProbe"]["httpGet"] == {"path": "/livez", "port": 10256}
    assert main["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 10256}
    assert args.healthz_bind_address.endswith(":10256")


def test_privileges_bidirectional_only_where_kubernetes_allows_it() -> None:
    spec = daemonset()["spec"]["template"]["spec"]
    (main,) = spec["containers"]
    assert "privileged" not in main["securityContext"]
    caps = main["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"]
    assert {"BPF", "PERFMON", "NET_ADMIN", "SYS_ADMIN", "NET_RAW"} == set(caps["add"])
    (init,) = spec["initContainers"]
    assert host_mount(spec, init, "/sys/fs/bpf")["mountPropagation"] == "Bidirectional"
    assert init["securityContext"] == {"privileged": True}  # the API server's rule
    assert host_mount(spec, main, "/sys/fs/bpf")["mountPropagation"] == "HostToContainer"


def test_frontend_connection_is_the_backend_daemonsets() -> None:
    ours = daemonset()["spec"]["template"]["spec"]
    theirs = daemonset(ROOT / "deploy" / "backend-daemonset.yaml")["spec"]["template"]["spec"]
    assert ours["serviceAccountName"] == theirs["serviceAccountName"]

    def frontend(spec: dict) -> tuple:
        (c,) = spec["containers"]
        flags = sorted(a for a in c["args"] if a.startswith(("--api", "--node-name")))
        volumes = [v for v in spec["volumes"] if v["name"].startswith("frontend-")]
        return flags, c["env"], volumes

    assert frontend(ours) == frontend(theirs)


def test_init_step_mounts_a_bpffs_once(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for a mount namespace")
    (init,) = daemonset()["spec"]["template"]["spec"]["initContainers"]
    step = init["command"][-1]
    # A private mount namespace with an empty tmpfs over /sys/fs/bpf: the host's is untouched.
    script = (f"mount -t tmpfs none /sys/fs/bpf && ({step}) && ({step}) "
              "&& grep -c ' /sys/fs/bpf bpf ' /proc/mounts")
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1"


def test_image_compiles_and_carries_the_bpf_object_with_the_runtime_libbpf() -> None:
    build, runtime = (ROOT / "Dockerfile").read_text().split("\nFROM ", 2)[1:]
    assert "clang libbpf-dev" in build and "libbpf1" in runtime and "clang" not in runtime
    assert "python backends/ebpf/build.py --force" in build
    inside = loader.OBJECT.relative_to(Path(loader.__file__).parent)
    packaged = PurePosixPath("svcproxy/backends/ebpf", inside)
    assert f"getinfo('{packaged}')" in build
