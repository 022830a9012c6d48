"""The documentation as a reader meets it: the site builds with no broken link or page
left out of its navigation, and the README stays a short map whose links all lead
somewhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

ROOT = REPO
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """mkdocs --strict fails on a link to a missing page or anchor and on a page that is
    in docs/ but not in mkdocs.yml's nav."""
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "backends" / "nft" / "index.html").exists()


def test_the_readme_is_a_short_map() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "bash scripts/setup.sh" in readme and "bash scripts/test.sh" in readme


def test_every_relative_link_of_the_top_level_pages_exists() -> None:
    """README.md, CONTRIBUTING.md and the backends' READMEs are read outside the site
    (on a forge, in a checkout): their links must resolve there."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *ROOT.glob("backends/*/README.md")]
    missing = [f"{page.relative_to(ROOT)}: {target}"
               for page in pages for target in LINK.findall(page.read_text())
               if "://" not in target and not (page.parent / target).exists()]
    assert missing == []


def test_every_hook_the_agent_reads_from_a_backend_is_in_its_docstring() -> None:
    """A backend author reads ``help(Backend)``: each optional attribute the node agent or
    the SDK looks up on a backend (``getattr(backend, "...")``) is explained there."""
    from svcproxy.sdk import Backend

    hook = re.compile(r'getattr\((?:self\._)?backend, "(\w+)"')
    read = {name for path in (ROOT / "svcproxy").rglob("*.py")
            for name in hook.findall(path.read_text())} - {"name"}
    assert read, "no hook found: the pattern no longer matches the code"
    missing = sorted(name for name in read if f"``{name}" not in (Backend.__doc__ or ""))
    assert missing == [], f"document these in svcproxy.sdk.Backend's docstring: {missing}"


def _exit_messages() -> dict[str, str]:
    """The start of every message a command exits with (``SystemExit("...")``, the CLIs'
    ``_fail("...")``, ``parser.error("...")``): up to its first placeholder, without the
    ``svcproxy: [error: ]`` prefix, 40 characters at most -> where it is raised."""
    import ast

    found: dict[str, str] = {}
    for folder in ("svcproxy", "frontend", "backends"):
        for path in (ROOT / folder).rglob("*.py"):
            if "v1" in path.relative_to(ROOT).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                func = node.func
                name = func.id if isinstance(func, ast.Name) else \
                    func.attr if isinstance(func, ast.Attribute) else ""
                if name not in ("SystemExit", "_fail", "error") or \
                        (name == "error" and not isinstance(func, ast.Attribute)) or \
                        (name == "error" and getattr(func.value, "id", "") != "parser"):
                    continue
                arg = node.args[0]
                parts = arg.values if isinstance(arg, ast.JoinedStr) else [arg]
                first = parts[0]
                if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                    continue
                text = first.value.removeprefix("svcproxy: ").removeprefix("error: ")
                if len(text) >= 8:
                    found[text[:40]] = f"{path.relative_to(ROOT)}:{node.lineno}"
    return found


def test_troubleshooting_explains_every_message_a_command_exits_with() -> None:
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    messages = _exit_messages()
    assert len(messages) > 20, "the scan no longer finds the commands' exit messages"
    missing = {text: where for text, where in messages.items() if text not in page}
    assert missing == {}, f"add these to docs/troubleshooting.md: {missing}"
