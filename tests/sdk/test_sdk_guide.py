"""docs/writing-a-backend.md, built as its reader would: a separate package, pip-installed
into a fresh virtualenv, listed and run by ``svcproxy backend files`` against a real
frontend process, and its own tests run there.

The files are the guide's code blocks (a fence like ```python svcproxy-files/cli.py names
its file), so the guide cannot drift from what works. The virtualenv is layered on the
project's environment (a .pth adds its site-packages, where svcproxy is installed from
this checkout, with its dependencies): offline, and seconds instead of a download. The
example is installed with pip as its own distribution, without an index.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.lab.processes import stop
from tests.support.paths import REPO

ROOT = REPO
GUIDE = ROOT / "docs" / "writing-a-backend.md"
SVCPROXY = Path(sys.executable).parent / "svcproxy"
FENCE = re.compile(r"^```(\w+) (svcproxy-files/\S+)\n(.*?)^```$", re.S | re.M)


def guide_files() -> dict[str, str]:
    """The guide's files: path (under svcproxy-files/) -> content."""
    return {path: body for _, path, body in FENCE.findall(GUIDE.read_text())}


def test_the_guide_names_every_file_of_the_example() -> None:
    assert set(guide_files()) == {
        "svcproxy-files/pyproject.toml", "svcproxy-files/svcproxy_files/__init__.py",
        "svcproxy-files/svcproxy_files/backend.py", "svcproxy-files/svcproxy_files/cli.py",
        "svcproxy-files/manifests/web.yaml", "svcproxy-files/tests/test_files.py"}


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(python of a fresh virtualenv with the guide's example installed, its source)."""
    tmp = tmp_path_factory.mktemp("guide")
    for path, body in guide_files().items():
        (tmp / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp / path).write_text(body)
    env_dir = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    ours = sysconfig.get_path("purelib")
    Path(site, "00-svcproxy-env.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-index", "--no-deps", "--no-build-isolation",
                    str(tmp / "svcproxy-files")], check=True, timeout=300)
    yield python, tmp / "svcproxy-files"


def test_the_example_is_an_installed_distribution(venv: tuple[Path, Path]) -> None:
    python, source = venv
    where = subprocess.run(
        [python, "-c", "import svcproxy_files, importlib.metadata as m; "
         "print(svcproxy_files.__file__); print(m.version('svcproxy-files'))"],
        cwd=source.parent, check=True, capture_output=True, text=True).stdout.split()
    assert not where[0].startswith(str(source)) and where[1] == "0.1.0"


def test_svcproxy_backend_lists_it(venv: tuple[Path, Path]) -> None:
    python, _ = venv
    listing = subprocess.run([python, SVCPROXY, "backend"], check=True, capture_output=True,
                             text=True, timeout=60).stdout
    row = next(line for line in listing.splitlines() if line.startswith("files "))
    assert "svcproxy-files 0.1.0" in row and "an example backend" in row
    assert {"dump", "nft", "iptables", "ipvs"} <= {line.split()[0] for line in
                                                   listing.splitlines()}


def test_the_guides_own_tests_pass(venv: tuple[Path, Path]) -> None:
    python, source = venv
    done = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(source / "tests")], cwd=source.parent, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_it_runs_against_a_real_frontend(venv: tuple[Path, Path], tmp_path: Path) -> None:
    """The guide's "Install it and run it", with both processes real."""
    python, source = venv
    manifests, out = tmp_path / "manifests", tmp_path / "files"
    manifests.mkdir()
    web = (source / "manifests" / "web.yaml").read_text()
    (manifests / "web.yaml").write_text(web)
    api = f"unix://{tmp_path / 'svcproxy.sock'}"
    frontend = subprocess.Popen(
        [python, SVCPROXY, "frontend", "--manifests", str(manifests), "--listen", api,
         "--metrics-bind-address", ""], stderr=subprocess.PIPE, text=True)
    backend = subprocess.Popen(
        [python, SVCPROXY, "backend", "files", "--api", api, "--node-name", "node-a",
         "--files-dir", str(out), "--min-sync-period", "0", "--healthz-bind-address", "",
         "--metrics-bind-address", ""], stderr=subprocess.PIPE, text=True)
    web_file = out / "shop_web_http_tcp"
    try:
        eventually(lambda: text(web_file)
                   == "10.96.0.10:80/TCP -> 10.244.1.5:8080 10.244.2.5:8080\n", backend)
        (manifests / "web.yaml").write_text(web.replace("port: 80,", "port: 81,"))
        eventually(lambda: text(web_file)
                   == "10.96.0.10:81/TCP -> 10.244.1.5:8080 10.244.2.5:8080\n", backend)
        (manifests / "web.yaml").unlink()
        eventually(lambda: not web_file.exists(), backend)
    finally:
        stop(backend)
        stop(frontend)
    assert backend.returncode == 0, backend.stderr.read() if backend.stderr else ""


def test_a_bad_flag_value_is_refused_as_the_guide_shows(venv: tuple[Path, Path]) -> None:
    """The guide's "Rejecting a bad flag value": usage, the flag's error, status 2."""
    python, _ = venv
    done = subprocess.run([python, SVCPROXY, "backend", "files", "--files-dir", "files"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    said = done.stderr.strip().splitlines()
    assert said[0].startswith("usage: svcproxy backend files [-h]")
    assert said[-1] in GUIDE.read_text()
    assert said[-1].endswith("argument --files-dir: 'files' is not an absolute path")


def text(path: Path) -> str | None:
    """A file's text; None while it is missing (a rebuild removes every file first)."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def eventually(check: object, proc: subprocess.Popen[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if proc.poll() is not None:
            raise AssertionError(f"backend exited: {proc.stderr.read() if proc.stderr else ''}")
        assert time.monotonic() < deadline, "the backend did not program the files in time"
        time.sleep(0.05)


def test_extraction_finds_named_blocks_only() -> None:
    text = "```python svcproxy-files/a.py\nx = 1\n```\n```python\nnot = 'a file'\n```\n"
    assert {p: b for _, p, b in FENCE.findall(text)} == {"svcproxy-files/a.py": "x = 1\n"}
    assert os.path.exists(GUIDE)


MYPY_CONFIG = """[mypy]
strict = True
follow_imports = silent
[mypy-svcproxy.v1.*]
ignore_errors = True
[mypy-grpc.*,yaml.*]
ignore_missing_imports = True
"""


def mypy(source: Path, *paths: str) -> subprocess.CompletedProcess[str]:
    config = source / "mypy.ini"
    config.write_text(MYPY_CONFIG)
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(config),
                           "--no-incremental", *paths], cwd=source, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, MYPYPATH=str(ROOT)))


def test_the_example_type_checks_strictly_against_the_sdk(venv: tuple[Path, Path]) -> None:
    """The SDK is typed: a backend checks under mypy --strict, and a misuse is caught."""
    _, source = venv
    (source / "misuse.py").write_text(
        "from svcproxy.sdk import Delta, ServicePortKey\n"
        "def count(delta: Delta[ServicePortKey, str]) -> int:\n"
        "    return delta.set\n")
    done = mypy(source, "svcproxy_files", "tests", "misuse.py")
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and errors[0].startswith("misuse.py:3: error"), done.stdout
